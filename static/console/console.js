// Live console: one websocket per page carrying small "something changed" events. Each live region re-fetches
// its own fragment (hx-trigger="<event> from:body"). On (re)connect the page first subscribes, then re-fetches
// everything ("resync"), so nothing that changed while disconnected is missed. When the socket is down (closed
// with 4013 while Redis is away, or the server is gone), a 5 s polling fallback triggers the same resync; it
// stops once the server says hello again. Batches are numbered: a page that sees a number skipped missed a batch and
// resyncs the same way.
//
// A fragment is morphed into the page (idiomorph), not swapped whole, and not at all when it renders the same
// bytes as the last one: a re-render used to replace the element the operator was on, dropping focus to <body>
// several times a second, closing tooltips and losing selections.
(function () {
  "use strict";
  let socket = null;
  let paused = false;
  let missed = false;
  let retry = 0;
  let pollTimer = null;
  let lastUpdate = null;
  let lastSeq = null;  // the number of the last batch heard (slotkeeper/livewire.py)
  let utc = true;  // times in UTC (or the browser's zone): the "t" toggle
  const $ = (id) => document.getElementById(id);
  // The longest wait between reconnection attempts: a console comes back within this of Redis returning.
  const MAX_RETRY_MS = 8000;
  const TRY_AGAIN_LATER = 4013;  // slotkeeper/consumers.py: "try again later" (1013 cannot be sent by Daphne)

  function setState(text, cls) {
    const el = $("live-state");
    if (el) { el.textContent = text; el.className = cls || "muted"; }
  }

  // At most one re-fetch per event kind per GAP_MS, leading AND trailing: the first change goes at once, and
  // changes during the gap are folded into one more re-fetch at its end. (htmx's own `throttle:` modifier drops
  // the events inside its window, so a change right after another could stay invisible until the next one.)
  const GAP_MS = 500;
  const lastFired = {};
  const trailing = {};

  function dispatch(name, detail) {
    lastFired[name] = Date.now();
    document.body.dispatchEvent(new CustomEvent(name, { detail: detail || {} }));
  }

  function fire(name, detail) {
    if (paused) { missed = true; return; }
    const wait = (lastFired[name] || 0) + GAP_MS - Date.now();
    if (wait <= 0) { dispatch(name, detail); return; }
    if (!trailing[name]) {
      trailing[name] = setTimeout(function () { trailing[name] = null; dispatch(name, {}); }, wait);
    }
  }

  function resync() { fire("resync"); }

  function startPolling() {
    if (!pollTimer) pollTimer = setInterval(resync, 5000);
  }

  function stopPolling() {
    if (pollTimer) { clearInterval(pollTimer); pollTimer = null; }
  }

  function connect() {
    if (!document.querySelector("[data-live]")) {
      // Nothing here changes live (a placement report is the record of one decision): say so, rather than
      // "connecting…" for as long as the page is open, and offer no pause for updates that never come.
      setState("not live on this page", "muted");
      const toggle = $("live-toggle");
      if (toggle) toggle.hidden = true;
      return;
    }
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(scheme + "://" + location.host + "/ws/console/");
    lastSeq = null;  // numbers belong to one socket's hub: a new socket starts from its hello
    // Subscribed only when the server says hello: a socket the server accepts and then closes with 4013 (the
    // channel layer is away) must not count as back, or every console would retry twice a second.
    socket.onmessage = function (msg) {
      let data;
      try { data = JSON.parse(msg.data); } catch (e) { return; }
      if (data.event === "hello") {
        retry = 0;
        lastSeq = typeof data.seq === "number" ? data.seq : null;
        stopPolling();
        document.body.dataset.liveHellos = String(Number(document.body.dataset.liveHellos || 0) + 1);
        if (!paused) setState("live", "ok");
        resync();
        return;
      }
      if (data.event !== "batch") return;
      // The hub numbers its batches; a number that does not follow the last one means a batch never reached this
      // page (the channel layer dropped a broadcast, or the server skipped this socket while it lagged). Which
      // fragments it would have touched is unknown, so re-fetch them all.
      if (typeof data.seq === "number") {
        const gap = lastSeq !== null && data.seq !== lastSeq + 1;
        lastSeq = data.seq;
        if (gap) {
          document.body.dataset.liveGaps = String(Number(document.body.dataset.liveGaps || 0) + 1);
          resync();
          return;
        }
      }
      const changed = data.changed || {};
      for (const kind of Object.keys(changed)) {
        if (kind !== "hello") fire(kind, { items: changed[kind] });
      }
    };
    socket.onclose = function (ev) {
      document.body.dataset.liveClose = String(ev.code);
      if (ev.code === 4401) { setState("signed out", "warn"); return; }
      if (!paused) setState(ev.code === TRY_AGAIN_LATER ? "live channel away (polling)" : "reconnecting… (polling)", "warn");
      startPolling();
      retry = Math.min(retry + 1, 6);
      const wait = Math.min(MAX_RETRY_MS, 500 * Math.pow(2, retry));
      setTimeout(connect, Math.round(wait * (0.5 + Math.random() / 2)));
    };
  }

  // -- morphing: keep the operator's place -------------------------------------------------------------------

  // FNV-1a over the fragment, without the per-render CSRF masks (a form's token differs on every render).
  function fingerprint(text) {
    const s = text.replace(/name="csrfmiddlewaretoken" value="[^"]*"/g, "");
    let h = 0x811c9dc5;
    for (let i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 0x01000193); }
    return (h >>> 0).toString(16) + ":" + s.length;
  }
  const lastPrint = new Map();

  function configureMorph() {
    if (!window.Idiomorph) return;
    // The value of the field the operator is typing in stays theirs.
    Idiomorph.defaults.ignoreActiveValue = true;
    // The operator's own state wins over the server's default: which <details> are open, and which element of
    // a keyboard grid holds the tab stop.
    // And which boxes they ticked in a live list: a refresh asked before a tick comes back without it (the
    // reschedules' bulk approval lost the first of two ticked boxes that way, on a busy fleet).
    Idiomorph.defaults.callbacks.beforeAttributeUpdated = function (name, el) {
      if (name === "open" && el.tagName === "DETAILS") return false;
      if (name === "checked" && el.type === "checkbox" && el.closest("[data-live]")) return false;
      if (name === "tabindex" && el.hasAttribute("data-roving")) return false;
      return true;
    };
    // A <time> shows local time when the operator asked for it: leave it alone while its instant is the same.
    Idiomorph.defaults.callbacks.beforeNodeMorphed = function (oldNode, newNode) {
      if (oldNode.nodeType === 1 && oldNode.tagName === "TIME" && newNode.nodeType === 1 &&
          oldNode.getAttribute("datetime") === newNode.getAttribute("datetime") && oldNode.dataset.utc) {
        return false;
      }
      refreshFocusedWords(oldNode, newNode);
      return true;
    };
  }

  function beforeSwap(e) {
    const target = e.detail.target;
    if (!target || !target.id || !target.hasAttribute("data-live") || !e.detail.shouldSwap) return;
    // A region's own refresh that asked for another state than the region shows now is stale: a pager link moved it
    // on while the refresh was on its way, and page 1 landed after page 2, under page 2's URL.
    const asked = e.detail.requestConfig;
    if (asked && asked.elt === target && asked.verb === "get" && target.getAttribute("hx-get") &&
        asked.path !== target.getAttribute("hx-get")) {
      e.detail.shouldSwap = false;
      return;
    }
    const print = fingerprint(e.detail.serverResponse || "");
    lastUpdate = Date.now();
    if (lastPrint.get(target.id) === print) {
      e.detail.shouldSwap = false;  // the same bytes as last time: nothing to change, so change nothing
      document.body.dataset.unchangedSkips = String(Number(document.body.dataset.unchangedSkips || 0) + 1);
      return;
    }
    lastPrint.set(target.id, print);
    rememberGridFocus(target);
  }

  // -- keyboard grids (the slot table): one tab stop, arrow keys between cells ---------------------------------

  let lostFocus = null;

  function cellsOf(row) { return Array.from(row.querySelectorAll("[data-roving]")); }

  function centre(el) {
    const box = el.getBoundingClientRect();
    return box.left + box.width / 2;
  }

  function moveTo(grid, el) {
    if (!el) return;
    grid.querySelectorAll('[data-roving][tabindex="0"]').forEach(function (o) { if (o !== el) o.setAttribute("tabindex", "-1"); });
    el.setAttribute("tabindex", "0");
    el.focus();
  }

  function nearestIn(row, x) {
    const cells = cellsOf(row);
    const bars = cells.filter(function (c) { return c.hasAttribute("data-bar"); });
    if (!bars.length) return cells[0];
    let best = bars[0];
    for (const b of bars) { if (Math.abs(centre(b) - x) < Math.abs(centre(best) - x)) best = b; }
    return best;
  }

  function gridKeys(e) {
    const cell = e.target.closest && e.target.closest("[data-roving]");
    const grid = cell && cell.closest("[data-grid]");
    if (!grid || e.altKey || e.metaKey) return;
    const rows = Array.from(grid.querySelectorAll("[role=row]"));
    const row = cell.closest("[role=row]");
    const cells = cellsOf(row);
    const i = cells.indexOf(cell);
    const r = rows.indexOf(row);
    let next = null;
    if (e.key === "ArrowRight") next = cells[i + 1];
    else if (e.key === "ArrowLeft") next = cells[i - 1];
    else if (e.key === "Home") next = e.ctrlKey ? cellsOf(rows[0])[0] : cells[0];
    else if (e.key === "End") next = e.ctrlKey ? cellsOf(rows[rows.length - 1]).pop() : cells[cells.length - 1];
    else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      const other = rows[r + (e.key === "ArrowDown" ? 1 : -1)];
      if (other) next = cell.hasAttribute("data-bar") ? nearestIn(other, centre(cell)) : cellsOf(other)[0];
    } else return;
    e.preventDefault();
    e.stopPropagation();
    moveTo(grid, next);
  }

  // A morph keeps a focused cell that still exists; one that went away (its reservation ended) hands focus to the
  // nearest cell of its row rather than to <body>.
  function rememberGridFocus(target) {
    const active = document.activeElement;
    lostFocus = null;
    if (!active || !active.hasAttribute || !active.hasAttribute("data-roving") || !target.contains(active)) return;
    const row = active.closest("[role=row]");
    lostFocus = { el: active, row: row && row.getAttribute("data-node"), x: centre(active) };
  }

  function fixGridFocus() {
    document.querySelectorAll("[data-grid]").forEach(function (grid) {
      if (lostFocus && !document.contains(lostFocus.el)) {
        const row = grid.querySelector('[role=row][data-node="' + CSS.escape(lostFocus.row || "") + '"]');
        if (row) moveTo(grid, nearestIn(row, lostFocus.x));
      }
      // Exactly one tab stop, whatever came and went.
      const stops = grid.querySelectorAll('[data-roving][tabindex="0"]');
      if (!stops.length) { const first = grid.querySelector("[data-roving]"); if (first) first.setAttribute("tabindex", "0"); }
    });
    lostFocus = null;
  }


  // -- the fleet board: a live update is a patch of the rows on screen ------------------------------------------
  //
  // The board does not re-fetch its table when something changes. It tells the server which rows it shows and
  // their versions (data-key, data-v), and is sent only the rows that are new or changed, the page's order when
  // it moved, and the totals and pager when they changed (leases/instances/board.py). Each changed row is morphed
  // into the one on screen, so every other row is the very same element, and a focused link, a selection or the
  // scroll position stays where it was. One patch at a time: changes heard while one is on its way are folded
  // into one more, sent when it is back. When no patch can be had (a 400, a session gone), the whole table is
  // fetched again the old way ("board-refresh").
  let boardBusy = false;
  let boardAgain = false;
  let boardSkew = 0;  // the server's clock less this browser's, in seconds: ages count up from the server's time

  function boardTable() { return document.querySelector("#fleet-table[data-patch]"); }

  function bump(name, by) {
    document.body.dataset[name] = String(Number(document.body.dataset[name] || 0) + (by === undefined ? 1 : by));
  }

  function patchBoard() {
    const table = boardTable();
    if (!table) return;
    if (boardBusy) { boardAgain = true; return; }
    boardBusy = true;
    const rows = table.querySelectorAll("#fleet-rows > tr[data-key]");
    const summary = $("fleet-summary");
    const pager = $("fleet-pager");
    const params = new URLSearchParams({
      have: Array.from(rows, function (tr) { return tr.dataset.key + "." + (tr.dataset.v || ""); }).join(","),
      sv: summary ? summary.dataset.v : "",
      pv: pager ? pager.dataset.v : "",
    });
    const url = table.dataset.patch + (table.dataset.patch.indexOf("?") < 0 ? "?" : "&") + params;
    fetch(url, { headers: { "HX-Request": "true" }, credentials: "same-origin", redirect: "manual" })
      .then(function (r) {
        if (!r.ok || !r.headers.get("X-Board-Patch")) throw new Error("no patch: " + r.status);
        return r.text();
      })
      .then(function (text) {
        // The table was replaced meanwhile (another sort, page or filter): that render is newer than this patch.
        if (boardTable() === table) applyBoardPatch(table, text);
      })
      .catch(function () { if (table.isConnected) htmx.trigger(table, "board-refresh"); })
      .finally(function () {
        boardBusy = false;
        if (boardAgain) { boardAgain = false; patchBoard(); }
      });
  }

  function place(body, tr, before) {
    // moveBefore keeps a moved element's focus and state where the browser has it; insertBefore drops focus.
    if (body.moveBefore) body.moveBefore(tr, before); else body.insertBefore(tr, before);
  }

  function applyBoardPatch(table, text) {
    const holder = document.createElement("template");
    holder.innerHTML = text;
    const patch = holder.content.querySelector("template[data-board-patch]");
    const body = $("fleet-rows");
    if (!patch || !body) throw new Error("not a board patch");
    const active = document.activeElement;
    let changed = 0;
    patch.content.querySelectorAll("tr[data-key]").forEach(function (tr) {
      const old = body.querySelector(':scope > tr[data-key="' + CSS.escape(tr.dataset.key) + '"]');
      if (old) Idiomorph.morph(old, tr); else body.appendChild(document.importNode(tr, true));
      changed++;
    });
    if (patch.hasAttribute("data-order")) {
      const keys = patch.dataset.order ? patch.dataset.order.split(",") : [];
      const byKey = new Map(Array.from(body.children, function (tr) { return [tr.dataset.key, tr]; }));
      let at = body.firstElementChild;
      for (const key of keys) {
        const tr = byKey.get(key);
        if (!tr) continue;
        byKey.delete(key);
        if (tr === at) at = at.nextElementSibling; else place(body, tr, at);
      }
      byKey.forEach(function (tr) { tr.remove(); });
    }
    // Focus stays on the element it was on, wherever its row went (insertBefore would have dropped it).
    if (active && active !== document.activeElement && active.isConnected && body.contains(active)) {
      active.focus({ preventScroll: true });
    }
    holder.content.querySelectorAll("#fleet-summary, #fleet-pager").forEach(function (part) {
      const el = $(part.id);
      if (el) Idiomorph.morph(el, part);
    });
    boardSkew = Number(patch.dataset.now) - Date.now() / 1000 || 0;
    lastPrint.delete(table.id);  // what is on screen is no longer the last fragment fetched
    lastUpdate = Date.now();
    bump("boardPatches");
    bump("boardRowsPatched", changed);
    showTimes(utc);
    tickBoardAges();
    document.body.dispatchEvent(new CustomEvent("board-patched", { detail: { rows: changed } }));
  }

  // A health age as fleet.views.age_words writes it.
  function ageWords(seconds) {
    const s = Math.max(0, Math.round(seconds));
    if (s < 120) return s + " s";
    if (s < 120 * 60) return Math.floor(s / 60) + " min";
    if (s < 48 * 3600) return Math.floor(s / 3600) + " h";
    return Math.floor(s / 86400) + " d";
  }

  // Ages count up here, once a second: a row is not sent again only because time passed.
  function tickBoardAges() {
    const table = boardTable();
    if (!table) return;
    const now = Date.now() / 1000 + boardSkew;
    const staleAfter = Number(table.dataset.staleAfter || 30);
    table.querySelectorAll("[data-seen]").forEach(function (td) {
      const age = Math.max(0, now - Number(td.dataset.seen));
      const text = ageWords(age);
      if (td.textContent !== text) td.textContent = text;
      if (td.classList.contains("warn") !== age > staleAfter) td.classList.toggle("warn", age > staleAfter);
    });
  }

  function boardRendered() {
    const table = boardTable();
    if (table && table.dataset.now) boardSkew = Number(table.dataset.now) - Date.now() / 1000 || 0;
  }

  // -- the slot table: a live update is a patch of the rows that changed (issue 46, item 2) ---------------------------
  //
  // Like the board, the slot table does not re-fetch its loaded row pages when something changes. It posts what it
  // shows: the window it was drawn for (a window following now moves between requests, and bars drawn for another
  // would not line up), its node count, whether it draws the now line, and the versions of its row pages, rows and
  // sections (leases/slot_patch.py). It is sent the rows whose version moved, each morphed into the row of the same
  // id (every other row stays the very same element, so focus, selection and scroll stay put), the frame of a page
  // whose rows' heights moved, the now line's x, and the sections whose version moved. One patch at a time, a burst
  // folded into one more; when no patch can be had (409: nodes came or went, the window moved; a 400; a session gone)
  // the table is fetched whole the old way ("slots-refresh").
  let slotsBusy = false;
  let slotsAgain = false;

  function slotTable() { return document.querySelector("#slot-table[data-patch]"); }

  function slotsShown(table) {
    const version = function (id) { const el = $(id); return el ? el.dataset.v || "" : ""; };
    return new URLSearchParams({
      at: table.dataset.window,
      nodes: table.dataset.nodes,
      now_line: table.querySelector("svg[data-page] > line.now") ? "1" : "0",
      pages: Array.from(table.querySelectorAll("svg[data-page]"), function (svg) { return svg.dataset.v || ""; }).join(","),
      rows: Array.from(table.querySelectorAll("svg[data-page] > [role=row][data-v]"), function (row) {
        return row.id.replace("slot-row-", "") + "." + row.dataset.v;
      }).join(","),
      summary: version("slot-summary"),
      ending: version("slot-ending"),
      forecast: version("slot-estimates"),
    });
  }

  function csrfToken() {
    try { return JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRFToken"] || ""; } catch (e) { return ""; }
  }

  function patchSlots() {
    const table = slotTable();
    if (!table) return;
    if (slotsBusy) { slotsAgain = true; return; }
    slotsBusy = true;
    // What the patch was asked for: a table re-rendered meanwhile (a row's "+N more", a forecast page) is newer.
    const asked = table.dataset.patch + " " + table.dataset.window;
    fetch(table.dataset.patch, {
      method: "POST", body: slotsShown(table), credentials: "same-origin", redirect: "manual",
      headers: { "HX-Request": "true", "X-CSRFToken": csrfToken() },
    })
      .then(function (r) {
        if (!r.ok || !r.headers.get("X-Slot-Patch")) throw new Error("no patch: " + r.status);
        return r.text();
      })
      .then(function (text) {
        if (slotTable() === table && table.dataset.patch + " " + table.dataset.window === asked) applySlotPatch(table, text);
      })
      .catch(function () { if (table.isConnected) htmx.trigger(table, "slots-refresh"); })
      .finally(function () {
        slotsBusy = false;
        if (slotsAgain) { slotsAgain = false; patchSlots(); }
      });
  }

  function applySlotPatch(table, text) {
    const holder = document.createElement("template");
    holder.innerHTML = text;
    const patch = holder.content.querySelector("template[data-slot-patch]");
    const parts = patch && patch.content.querySelector("svg[data-patched-rows]");
    if (!parts) throw new Error("not a slot-table patch");
    const frames = Array.from(parts.querySelectorAll(":scope > svg[data-page]"));
    const rows = Array.from(parts.querySelectorAll(":scope > [role=row]"));
    const sections = Array.from(holder.content.querySelectorAll("#slot-summary, #slot-ending, #slot-estimates"));
    // Every part must have its place on screen before anything is changed: a patch is applied whole or not at all.
    for (const part of frames.concat(rows, sections)) {
      const el = $(part.id);
      if (!el || !table.contains(el)) throw new Error("nowhere to put " + part.id);
    }
    rememberGridFocus(table);
    for (const frame of frames) {
      const page = $(frame.id);
      ["viewBox", "width", "height", "data-v"].forEach(function (name) { page.setAttribute(name, frame.getAttribute(name)); });
      Idiomorph.morph(page.querySelector(":scope > g.backdrop"), frame.querySelector(":scope > g.backdrop"));
      const line = page.querySelector(":scope > line.now");
      if (line) line.setAttribute("y2", frame.getAttribute("height"));
    }
    for (const row of rows) Idiomorph.morph($(row.id), row);
    const x = patch.dataset.nowX;
    if (x) {
      table.querySelectorAll("svg[data-page] > line.now").forEach(function (line) {
        line.setAttribute("x1", x); line.setAttribute("x2", x);
      });
      const mark = table.querySelector("svg.axis path.now-mark");
      if (mark) mark.setAttribute("d", mark.getAttribute("d").replace(/^M[\d.]+/, "M" + x));
    }
    for (const part of sections) Idiomorph.morph($(part.id), part);
    fixGridFocus();
    countInView();  // in this task: the footer, if it was sent, says "loaded" until counted again
    lastPrint.delete(table.id);  // what is on screen is no longer the last fragment fetched
    lastUpdate = Date.now();
    showTimes(utc);
    bump("slotPatches");
    bump("slotRowsPatched", rows.length);
    document.body.dispatchEvent(new CustomEvent("slots-patched", { detail: { rows: rows.length, frames: frames.length } }));
  }

  function togglePause() {
    paused = !paused;
    const btn = $("live-toggle");
    if (btn) { btn.textContent = paused ? "Resume" : "Pause"; btn.setAttribute("aria-pressed", String(paused)); }
    if (paused) { setState("paused", "warn"); return; }
    setState(pollTimer ? "reconnecting… (polling)" : "live", pollTimer ? "warn" : "ok");
    if (missed) { missed = false; resync(); }
  }

  function tickAge() {
    tickBoardAges();
    const el = $("live-age");
    if (!el) return;
    el.textContent = lastUpdate ? Math.round((Date.now() - lastUpdate) / 1000) + " s ago" : "–";
  }

  function showTimes(utc) {
    document.querySelectorAll("time[datetime]").forEach(function (t) {
      const d = new Date(t.getAttribute("datetime"));
      if (isNaN(d)) return;
      if (!t.dataset.utc) t.dataset.utc = t.textContent;
      t.textContent = utc ? t.dataset.utc : d.toLocaleString();
    });
    // A zone named beside times rather than inside them (the slot table's window) follows them.
    document.querySelectorAll("[data-zone]").forEach(function (z) { z.textContent = utc ? "UTC" : "local time"; });
  }

  document.addEventListener("DOMContentLoaded", function () {
    lastUpdate = Date.now();
    utc = localStorage.getItem("slotkeeper.tz") !== "local";
    const tz = $("tz-toggle");
    function toggleTz() {
      utc = !utc; localStorage.setItem("slotkeeper.tz", utc ? "utc" : "local");
      if (tz) tz.textContent = utc ? "UTC" : "Local";
      showTimes(utc);
    }
    if (tz) {
      tz.textContent = utc ? "UTC" : "Local";
      tz.addEventListener("click", toggleTz);
    }
    showTimes(utc);
    configureMorph();
    document.body.addEventListener("htmx:beforeSwap", beforeSwap);
    // A live refresh of a paged table (the slot table's rows come in pages as they scroll into view) re-renders as
    // many pages as this browser has loaded, so a morph does not drop the rows the operator scrolled to.
    document.body.addEventListener("htmx:configRequest", function (e) {
      // The table's own refresh, and the links inside it that re-render it in place (a row's "+N more", the
      // queue forecast's pages).
      const paged = e.detail.elt && e.detail.elt.closest && e.detail.elt.closest("[data-paged]");
      if (paged) {
        e.detail.parameters.pages = String(Math.max(1, paged.querySelectorAll("[data-page]").length));
      }
      // The table's own refresh asks for what it shows now: htmx keeps the URL its trigger was set up with, and a
      // refresh fired in the moment between a row's "+N more" being swapped in and htmx setting the table up again
      // asked for the old state, and folded the row back.
      if (paged && paged === e.detail.elt && paged.getAttribute("hx-get")) e.detail.path = paged.getAttribute("hx-get");
      // So does any live region's own refresh (the lease list's keeps the page it shows): a refresh fired between
      // a pager link's swap and htmx setting the region up again re-fetched the page before.
      const own = e.detail.elt;
      if (own && own.hasAttribute && own.hasAttribute("data-live") && e.detail.verb === "get" && own.getAttribute("hx-get")) {
        e.detail.path = own.getAttribute("hx-get");
      }
    });
    document.body.addEventListener("htmx:afterSwap", function () { lastUpdate = Date.now(); showTimes(utc); boardRendered(); });
    // Paused means nothing on the page moves: a live region's own refresh (the slot table's every 30 s while it
    // follows now, its fetch when a patch cannot be had) waits for Resume, like the events (fire) do. A request
    // of a control inside a region (a row's "+N more", a filter) is the operator's and goes.
    document.body.addEventListener("htmx:beforeRequest", function (e) {
      const elt = e.detail.elt;
      if (paused && elt && elt.hasAttribute && elt.hasAttribute("data-live")) { e.preventDefault(); missed = true; }
    });
    // The board's live updates are patches (above); its filter form leaves out what is empty, so the URL it
    // pushes is as short as the one a link would have.
    ["node-changed", "slots-changed", "resync"].forEach(function (name) {
      document.body.addEventListener(name, patchBoard);
    });
    // So are the slot table's (above).
    ["slots-changed", "lease-changed", "node-changed", "resync"].forEach(function (name) {
      document.body.addEventListener(name, patchSlots);
    });
    document.body.addEventListener("htmx:configRequest", function (e) {
      const elt = e.detail.elt;
      if (!elt || !elt.hasAttribute || !elt.hasAttribute("data-board-filters")) return;
      for (const name of Object.keys(e.detail.parameters)) {
        if (e.detail.parameters[name] === "") delete e.detail.parameters[name];
      }
    });
    boardRendered();
    document.body.addEventListener("htmx:afterSettle", fixGridFocus);
    document.addEventListener("keydown", gridKeys, true);
    const btn = $("live-toggle");
    if (btn) btn.addEventListener("click", togglePause);
    document.addEventListener("keydown", shortcutKey);  // the keyboard: its own block below
    setInterval(tickAge, 1000);
    connect();
  });

  // -- said to screen readers, kept in the URL -------------------------------------------------------------------
  //
  // #announce is the page's polite live region: what a key or an in-place control did, when it changes nothing a
  // screen reader would otherwise read out. setParam keeps a view's state in its URL as it changes in place.

  let saying = null;

  function announce(text) {
    const region = $("announce");
    if (!region || !text) return;
    // Emptied first, then filled a moment later: the same words twice in a row are read twice.
    region.textContent = "";
    clearTimeout(saying);
    saying = setTimeout(function () { region.textContent = text; }, 60);
  }

  function setParam(name, value) {
    const url = new URL(location.href);
    if (value) url.searchParams.set(name, value); else url.searchParams.delete(name);
    if (url.href !== location.href) history.replaceState(history.state, "", url.href);
  }

  // -- the slot table: what is in view, a row's "+N more", the forecast's pages and fold (issue 46, item 3) ------

  // ignoreActiveValue keeps what is typed in a focused field, and so idiomorph leaves the focused element's children
  // alone, whatever it is: a row's "+N more", focused, still said "+3 more" once it had expanded the row (its label
  // and aria-expanded had changed). A focused element that holds no typing (a link) gets its new words; it stays the
  // same element, so it stays focused.
  function refreshFocusedWords(oldNode, newNode) {
    if (oldNode !== document.activeElement || oldNode === document.body || oldNode.nodeType !== 1) return;
    if (oldNode.matches("input, textarea, select, [contenteditable]") || oldNode.querySelector("input, textarea, select")) return;
    if (oldNode.innerHTML !== newNode.innerHTML) oldNode.replaceChildren(...Array.from(newNode.cloneNode(true).childNodes));
  }


  function countInView() {
    const box = document.querySelector("#slot-table .slot-scroll");
    const out = document.querySelector("#slot-summary [data-in-view]");
    if (!box || !out) return;
    const rows = box.querySelectorAll("[role=row][data-node]");
    const total = Number(out.dataset.total || 0);
    if (!rows.length || !total) return;
    const axis = box.querySelector("svg.axis");
    const frame = box.getBoundingClientRect();
    const top = Math.max(frame.top + (axis ? axis.getBoundingClientRect().height : 0), 0);
    const bottom = Math.min(frame.bottom, window.innerHeight);
    // Rows are in order top to bottom: two binary searches, not a rectangle per row on every scroll.
    const first = search(rows, function (r) { return r.getBoundingClientRect().bottom > top + 1; });
    const last = search(rows, function (r) { return r.getBoundingClientRect().top >= bottom - 1; }) - 1;
    const matching = out.dataset.filtered ? " matching the filter" : "";
    let text;
    if (first > last || first >= rows.length) text = "No node row in view: scroll the table";
    else {
      const a = Number(rows[first].getAttribute("aria-rowindex"));
      const b = Number(rows[last].getAttribute("aria-rowindex"));
      text = a === 1 && b === total ? "All " + total + " node" + (total === 1 ? "" : "s") + matching + " in view"
        : "Nodes " + a + "–" + b + " of " + total + matching + " in view; scroll the table for the rest";
    }
    if (out.textContent !== text) out.textContent = text;
  }

  // The first index whose row passes `test`, for a test false then true along the rows.
  function search(rows, test) {
    let lo = 0, hi = rows.length;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (test(rows[mid])) hi = mid; else lo = mid + 1; }
    return lo;
  }

  let inViewFrame = null;
  function countSoon() {
    if (inViewFrame) return;
    inViewFrame = requestAnimationFrame(function () { inViewFrame = null; countInView(); });
  }

  function afterTableRequest(e) {
    // The element that asked (detail.elt is the one swapped into: the table).
    const elt = e.detail.requestConfig && e.detail.requestConfig.elt;
    if (!elt || !elt.id) return;
    if (elt.hasAttribute("data-expand")) {
      // Morphed, the control is the same element (its id), focused still, with its new words.
      const control = $(elt.id);
      if (control) announce(control.getAttribute("data-said"));
    } else if (elt.hasAttribute("data-forecast-page")) {
      const where = $("forecast-page");
      if (where) {
        announce(where.getAttribute("data-said"));
        // At the first or last page its link is gone: focus stays in the pager, not on <body>.
        if (!document.activeElement || document.activeElement === document.body) where.focus();
      }
    }
  }

  // Links that carry the slot table's state get the fold the operator just chose, so a zoom or a pan keeps it.
  function keepForecastFold(open) {
    setParam("forecast", open ? null : "closed");
    document.querySelectorAll("#slot-nav a[href]").forEach(function (a) {
      const url = new URL(a.href);
      if (open) url.searchParams.delete("forecast"); else url.searchParams.set("forecast", "closed");
      a.setAttribute("href", url.pathname + url.search);
    });
    const state = $("slot-filter-state");
    if (state) {
      let input = state.querySelector("input[name=forecast]");
      if (open && input) input.remove();
      if (!open && !input) {
        input = document.createElement("input");
        input.type = "hidden"; input.name = "forecast"; input.value = "closed";
        state.prepend(input);
      }
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.addEventListener("toggle", function (e) {
      if (e.target && e.target.id === "slot-estimates") keepForecastFold(e.target.open);
    }, true);
    // Counted again in the task that swapped the footer in, so the server's "loaded" never shows in between (a
    // reader, or a test, saw it flip back for a frame at every live refresh); and once more when it has settled.
    document.body.addEventListener("htmx:afterSwap", countInView);
    document.body.addEventListener("htmx:afterSettle", function (e) { afterTableRequest(e); countSoon(); });
    document.addEventListener("scroll", countSoon, { capture: true, passive: true });
    window.addEventListener("resize", countSoon);
    countInView();
  });

  // -- the keyboard (issue 46, item 4) ---------------------------------------------------------------------------
  //
  // Single keys (the `?` sheet lists them all: templates/_shortcuts.html), `g` then a letter to go to a page
  // (the first a[data-goto] with that letter: the nav's, or the sheet's for pages the nav does not show), and
  // a[data-key] links followed by their key (the slot table's pan and zoom). They can be switched off per person
  // (slotkeeper/preferences.py): body[data-shortcuts] says which. Everything a key does is said in #announce.

  // How long `g` waits for its letter, measured between the two keys' own timestamps (when they were pressed), not
  // by a timer: on a page busy laying out a live update a timer could fire after the letter was pressed and before
  // its keydown ran, and the letter would be dropped.
  const GO_WAIT_MS = 1500;
  let goSince = null;

  function shortcutsOn() { return document.body.dataset.shortcuts !== "off"; }

  function typing(el) {
    return !!(el && el.closest && el.closest("input, textarea, select, [contenteditable], [contenteditable=true]"));
  }

  function endGo() { goSince = null; }

  function openSheet() {
    const sheet = $("shortcuts");
    if (sheet && !sheet.open) sheet.showModal();
  }

  function shortcutKey(e) {
    if (e.defaultPrevented || e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) return;
    if (!shortcutsOn() || document.querySelector("dialog[open]")) { endGo(); return; }
    const key = e.key;
    if (goSince !== null && e.timeStamp - goSince > GO_WAIT_MS) endGo();
    if (goSince !== null) {
      endGo();
      if (key === "Escape" || key === "Shift") return;
      const target = document.querySelector('a[data-goto="' + CSS.escape(key.toLowerCase()) + '"]');
      e.preventDefault();
      if (target) { announce("Going to " + target.textContent.trim()); target.click(); }
      else announce("No page on g " + key + ": the sheet (?) lists them");
      return;
    }
    if (key === "g") {
      e.preventDefault();
      goSince = e.timeStamp;
      announce("Go to: press a page's letter");
      return;
    }
    if (key === "?") { e.preventDefault(); openSheet(); return; }
    if (key === "/") {
      const field = document.querySelector("[data-search]");
      if (field) { e.preventDefault(); field.focus(); }
      return;
    }
    if (key === "p") {
      const pause = $("live-toggle");
      if (pause && !pause.hidden) pause.click(); else announce("Nothing on this page is live");
      return;
    }
    if (key === "t") { const tz = $("tz-toggle"); if (tz) tz.click(); return; }
    const name = key === "=" ? "+" : key;
    const link = document.querySelector('a[data-key="' + CSS.escape(name) + '"]');
    if (link) { e.preventDefault(); link.click(); return; }
    if ((name === "+" || name === "-") && $("slot-nav")) {
      announce(name === "+" ? "Already at the closest zoom" : "Already at the widest zoom");
    }
  }

  // The sheet's switch: on at once in this page, kept for the account by a POST (204).
  function switchShortcuts(on) {
    document.body.dataset.shortcuts = on ? "on" : "off";
    endGo();
    const form = $("shortcuts-form");
    if (form) form.elements.on.value = on ? "0" : "1";  // what the no-JavaScript button would ask next
    announce(on ? "Keyboard shortcuts on" : "Keyboard shortcuts off: single keys do nothing until turned on again here");
    if (!form) return;
    const body = new URLSearchParams({ on: on ? "1" : "0" });
    const token = form.elements.csrfmiddlewaretoken ? form.elements.csrfmiddlewaretoken.value : "";
    fetch(form.action, {
      method: "POST", body: body, credentials: "same-origin",
      headers: { "HX-Request": "true", "X-CSRFToken": token, "Content-Type": "application/x-www-form-urlencoded" },
    }).then(function (r) {
      if (!r.ok) throw new Error(String(r.status));
      document.body.dataset.shortcutsSaved = on ? "on" : "off";
    }).catch(function () { announce("The setting was not saved: it holds in this page only"); });
  }

  function zoneShown() {
    const tz = $("tz-toggle");
    return tz && tz.textContent.trim() === "Local" ? "local" : "utc";
  }

  // A link's zone wins over the one this browser kept (and is kept from then on, as if `t` had been pressed), so a
  // link shows a colleague the times as its sender saw them. The URL names the zone when it is local time, or when
  // it already named one: a URL without `tz` is UTC, the console's default, and stays as short as a link to it.
  function zoneFromUrl() {
    const wanted = new URL(location.href).searchParams.get("tz");
    const tz = $("tz-toggle");
    if (tz && (wanted === "utc" || wanted === "local") && wanted !== zoneShown()) tz.click();
    sayZone();
  }

  function sayZone() {
    const named = new URL(location.href).searchParams.has("tz");
    setParam("tz", zoneShown() === "local" || named ? zoneShown() : null);
  }

  document.addEventListener("DOMContentLoaded", function () {
    const sheetButton = $("shortcuts-button");
    if (sheetButton) sheetButton.addEventListener("click", openSheet);
    const on = $("shortcuts-on");
    if (on) on.addEventListener("change", function () { switchShortcuts(on.checked); });
    const pause = $("live-toggle");
    if (pause) pause.addEventListener("click", function () {
      announce(pause.getAttribute("aria-pressed") === "true" ? "Live updates paused" : "Live updates resumed");
    });
    zoneFromUrl();
    const tz = $("tz-toggle");
    if (tz) tz.addEventListener("click", function () {
      sayZone();
      announce(zoneShown() === "local" ? "Times in local time" : "Times in UTC");
    });
    // A URL htmx pushed or replaced (a filter, a forecast page) names the zone too.
    ["htmx:pushedIntoHistory", "htmx:replacedInHistory"].forEach(function (name) {
      document.body.addEventListener(name, sayZone);
    });
  });
})();
