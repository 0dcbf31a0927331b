// Live console: one websocket per page carrying small "something changed" events. Each live region re-fetches
// its own fragment (hx-trigger="<event> from:body"). On (re)connect the page first subscribes, then re-fetches
// everything ("resync"), so nothing that changed while disconnected is missed. When the socket is down, a 5 s
// polling fallback triggers the same resync; it stops once the socket is back.
(function () {
  "use strict";
  let socket = null;
  let paused = false;
  let missed = false;
  let retry = 0;
  let pollTimer = null;
  let lastUpdate = null;
  const $ = (id) => document.getElementById(id);

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
    if (!document.querySelector("[data-live]")) return;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    socket = new WebSocket(scheme + "://" + location.host + "/ws/console/");
    socket.onopen = function () {
      retry = 0;
      stopPolling();
      setState("live", "ok");
      resync();
    };
    socket.onmessage = function (msg) {
      let data;
      try { data = JSON.parse(msg.data); } catch (e) { return; }
      const events = data.event === "batch" ? data.events : [data];
      const seen = new Set();
      for (const ev of events) {
        if (!ev.event || ev.event === "hello" || seen.has(ev.event)) continue;
        seen.add(ev.event);
        fire(ev.event, ev);
      }
    };
    socket.onclose = function (ev) {
      if (ev.code === 4401) { setState("signed out", "warn"); return; }
      setState("reconnecting… (polling)", "warn");
      startPolling();
      retry = Math.min(retry + 1, 6);
      setTimeout(connect, Math.round(500 * Math.pow(2, retry) * (0.5 + Math.random() / 2)));
    };
  }

  function togglePause() {
    paused = !paused;
    const btn = $("live-toggle");
    if (btn) { btn.textContent = paused ? "Resume" : "Pause"; btn.setAttribute("aria-pressed", String(paused)); }
    if (paused) { setState("paused", "warn"); return; }
    setState(socket && socket.readyState === 1 ? "live" : "reconnecting…", socket && socket.readyState === 1 ? "ok" : "warn");
    if (missed) { missed = false; resync(); }
  }

  function tickAge() {
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
  }

  document.addEventListener("DOMContentLoaded", function () {
    lastUpdate = Date.now();
    let utc = localStorage.getItem("slotkeeper.tz") !== "local";
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
    document.body.addEventListener("htmx:afterSwap", function () { lastUpdate = Date.now(); showTimes(utc); });
    const btn = $("live-toggle");
    if (btn) btn.addEventListener("click", togglePause);
    document.addEventListener("keydown", function (e) {
      if (e.target.matches("input, textarea, select") || e.ctrlKey || e.metaKey || e.altKey) return;
      const link = document.querySelector('a[data-key="' + CSS.escape(e.key) + '"]');
      if (e.key === "/") { const s = document.querySelector("[data-search]"); if (s) { e.preventDefault(); s.focus(); } }
      else if (e.key === "?") { const d = $("shortcuts"); if (d) d.showModal(); }
      else if (e.key === "p") { togglePause(); }
      else if (e.key === "t") { toggleTz(); }
      else if (link) { link.click(); }
    });
    setInterval(tickAge, 1000);
    connect();
  });
})();
