"""The capacity model, checked end to end through the REST API on a fresh database (issue 11, "Done when").

Kept apart from the test suite and run by hand; it prints what it did and what it checked, and exits non-zero on
any disagreement:

    .venv/bin/python bench/capacity_scenario.py [--keep]     # --keep: leave the database and Daphne's log in /tmp

What it does, over HTTP only (a live Daphne on a fresh SQLite file, no embedded loop, so nothing moves between the
requests but the clock; the operator's token from `manage.py issue_token`, the nodes' from their registration):

1. Registers four nodes with known declared totals and heartbeats each once while idle with a known used memory,
   which each remembers as its host baseline; drains one of them.
2. Submits leases that would fit the declared totals but not allocatable capacity (declared less the 4,096 MiB host
   reserve less the remembered baseline, never below 2,048 MiB), one at a time; between two of them a node reports
   more memory used than its baseline and its plan, so the now-gate applies to work starting now but not to an
   advance reservation.

Then it checks, against its own small model of docs/capacity.md (not the server's code):

- `allocatable` on GET /api/nodes/{id}/ is declared less the reserves and the baseline;
- each decision (placed, or 409 rejected) is the one written in the scenario, and where a placed lease went;
- every verdict of each lease's stored report (GET /api/placement/reports/?subject=lease:ID): `holds` is how many
  of the lease's VMs the node could take over the report's window given the reservations made before it (read from
  GET /api/slots/) and, for work starting now, the now-gate; `fit` is `holds > 0`; the reason code is the model's
  (too_small when larger than allocatable, draining, at_capacity when busy now, reserved when busy later in the
  window); `numbers.allocatable` is the model's allocatable; the chosen nodes are the lease's own;
- at every instant where the slot table changes, each node's sum of live reservations (GET /api/slots/) is within
  its allocatable capacity, and `committed` on the node resource is that sum now.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slotkeeper.shutdown import DAPHNE_TIMEOUTS  # noqa: E402
from tests.console.live import free_port, stop, wait_healthy  # noqa: E402

# The model (docs/capacity.md), written out here rather than imported, so the scenario checks the server's figures
# against an independent statement of the rule.
HOST_RESERVE_MIB = 4096
BASELINE_FLOOR_MIB = 2048
DISK_RESERVE_GIB = 20
GiB = 1024


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cores: int
    mem_mib: int
    disk_gib: int
    idle_used_mib: int  # what its first (idle) heartbeat reports: the remembered baseline
    drain: bool = False

    @property
    def allocatable(self) -> dict[str, int]:
        baseline = max(self.idle_used_mib, BASELINE_FLOOR_MIB)
        return {
            "cpu": self.cores * 100,
            "mem": max(self.mem_mib - HOST_RESERVE_MIB - baseline, 0),
            "disk": max(self.disk_gib - DISK_RESERVE_GIB, 0),
        }


NODES = [
    NodeSpec("alpha", 8, 16 * GiB, 200, 3000),  # allocatable 9,288 MiB
    NodeSpec("bravo", 16, 32 * GiB, 500, 6144),  # allocatable 22,528 MiB
    NodeSpec("charlie", 4, 8 * GiB, 100, 1024),  # baseline below the floor: allocatable 2,048 MiB
    NodeSpec("delta", 8, 16 * GiB, 200, 2500, drain=True),  # drained: no new work
]


@dataclass
class Step:
    """A lease to submit: `vms` x (cores, MiB, GiB), from now or from `start_in_h` hours on, and what the model
    says must happen to it (`expect`: "placed" or "rejected"; `on`: the nodes a placed lease must use)."""

    name: str
    why: str
    vms: int
    cores: float
    mem_mib: int
    duration_h: float
    expect: str
    on: set[str] = field(default_factory=set)
    start_in_h: float | None = None
    # Before submitting: heartbeats (node -> used MiB) sent with work committed on the node.
    heartbeats: dict[str, int] = field(default_factory=dict)


STEPS = [
    Step("L1", "12 GiB fits alpha's 16 GiB declared, not its 9,288 MiB allocatable; only bravo allocates it",
         1, 2, 12 * GiB, 1, "placed", {"bravo"}),
    Step("L2", "14 GiB fits alpha (16 GiB) and bravo (32 - 12 GiB) declared; neither allocates it now",
         1, 2, 14 * GiB, 1, "rejected"),
    Step("L3", "bravo now reports 4 GiB above its baseline and plan: the now-gate leaves it 6 GiB, so alpha",
         1, 1, 8 * GiB, 1, "placed", {"alpha"}, heartbeats={"bravo": 6144 + 12 * GiB + 4 * GiB}),
    Step("L4", "an advance reservation in 2 h: bravo allocates 20 GiB then, today's observation aside",
         1, 2, 20 * GiB, 1, "placed", {"bravo"}, start_in_h=2),
    Step("L5", "2 x 4 GiB at 2.5 h: bravo is reserved by L4, alpha allocates both",
         2, 1, 4 * GiB, 1, "placed", {"alpha"}, start_in_h=2.5),
    Step("L6", "3 x 4 GiB now: declared totals hold 7 (alpha 2, bravo 5); allocatable now holds 1 (bravo)",
         3, 1, 4 * GiB, 1, "rejected"),
]  # fmt: skip

DISK_GIB = 20  # every VM's disk


class Api:
    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, dict]:
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def ok(self, method: str, path: str, token: str, body: dict | None = None) -> dict:
        status, data = self.call(method, path, token, body)
        if status >= 300:
            raise SystemExit(f"{method} {path} answered {status}: {json.dumps(data)[:500]}")
        return data


class Checks:
    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed = 0

    def expect(self, ok: bool, what: str) -> None:
        if ok:
            self.passed += 1
        else:
            self.failed.append(what)
            print(f"    DISAGREE: {what}")


# --- the server --------------------------------------------------------------------------------------------------


def environment(db: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
    env.update(
        DJANGO_SETTINGS_MODULE="slotkeeper.settings",
        DATABASE_URL=f"sqlite:///{db}",
        SECRET_KEY="capacity-scenario-only",
        EMBEDDED_LOOP="0",  # no tick: nothing changes between requests but what the scenario sends
        SLOTKEEPER_OFFLINE_AFTER_S="3600",
        SLOTKEEPER_HEALTH_MAX_AGE_S="3600",
        LOG_LEVEL="WARNING",
        PYTHONUNBUFFERED="1",
    )
    return env


def start_server(workdir: Path) -> tuple[Api, str, subprocess.Popen]:
    env = environment(workdir / "scenario.sqlite3")
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v", "0"], env=env, cwd=ROOT, check=True)
    issued = subprocess.run(
        [*manage, "issue_token", "scenario", "--role", "operator", "--name", "capacity scenario"],
        env=env, cwd=ROOT, check=True, capture_output=True, text=True,
    )  # fmt: skip
    token = issued.stdout.strip().splitlines()[-1]
    port = free_port()
    log = open(workdir / "daphne.log", "w")  # noqa: SIM115 (open while the server runs)
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), *DAPHNE_TIMEOUTS,
         "slotkeeper.asgi:application"],
        env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
    except RuntimeError:
        stop(process)
        raise
    return Api(url), token, process


# --- the model ---------------------------------------------------------------------------------------------------


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def vec(cores: float, mem: int, disk: int) -> dict[str, int]:
    return {"cpu": round(cores * 100), "mem": mem, "disk": disk}


@dataclass
class Booking:
    """A live reservation as GET /api/slots/ shows it, sized from its lease's VMs: what it holds on each node."""

    lease: int
    start: datetime
    end: datetime
    per_node: dict[int, dict[str, int]]


def bookings(
    api: Api, token: str, frm: datetime, to: datetime, sizes: dict[int, list[dict]]
) -> list[Booking]:
    q = f"?start={frm.isoformat().replace('+00:00', 'Z')}&end={to.isoformat().replace('+00:00', 'Z')}"
    out = []
    for r in api.ok("GET", f"/api/slots/{q}", token)["reservations"]:
        if r["status"] not in ("scheduled", "active"):
            continue
        if r["kind"] != "vm":
            raise SystemExit(
                f"reservation {r['rid']} is a {r['kind']}: this scenario sizes VM reservations only"
            )
        vms = sizes[r["lease"]]
        per_node: dict[int, dict[str, int]] = {}
        for vnode, node in r["nodes"].items():
            v = vms[int(vnode) - 1]
            held = per_node.setdefault(node, {"cpu": 0, "mem": 0, "disk": 0})
            for k, x in vec(v["cpu_cores"], v["mem_mib"], v["disk_gib"]).items():
                held[k] += x
        out.append(Booking(r["lease"], parse(r["start"]), parse(r["end"]), per_node))
    return out


def used(books: list[Booking], node: int, at: datetime) -> dict[str, int]:
    total = {"cpu": 0, "mem": 0, "disk": 0}
    for b in books:
        if b.start <= at < b.end and node in b.per_node:
            for k, x in b.per_node[node].items():
                total[k] += x
    return total


def free_over(books: list[Booking], node: int, cap: dict[str, int], start: datetime, end: datetime) -> dict:
    """The least free capacity of each dimension at any instant of [start, end)."""
    instants = {start} | {b.start for b in books if start < b.start < end}
    free = dict(cap)
    for t in instants:
        u = used(books, node, t)
        for k in free:
            free[k] = min(free[k], cap[k] - u[k])
    return free


def copies(need: dict[str, int], free: dict[str, int]) -> int:
    return min(max(free[k], 0) // need[k] for k in need if need[k] > 0)


@dataclass
class Decided:
    step: Step
    lease: int
    status: int
    at: datetime  # just before the request
    state: str


# --- the scenario ------------------------------------------------------------------------------------------------


def run(api: Api, token: str, checks: Checks) -> None:
    print("nodes (declared; idle heartbeat = remembered baseline; allocatable = declared - 4,096 - max(baseline, "
          "2,048) MiB, disk - 20 GiB):")  # fmt: skip
    ids: dict[str, int] = {}
    tokens: dict[str, str] = {}
    for n in NODES:
        body = {"name": n.name, "cpu_cores": n.cores, "mem_total_mib": n.mem_mib, "disk_total_gib": n.disk_gib,
                "capabilities": ["kvm"]}  # fmt: skip
        made = api.ok("POST", "/api/nodes/", token, body)
        ids[n.name], tokens[n.name] = made["id"], made["token"]
        heartbeat(api, ids[n.name], tokens[n.name], n, n.idle_used_mib)
        if n.drain:
            api.ok(
                "POST", f"/api/nodes/{ids[n.name]}/drain", token, {"reason": "capacity scenario: cordoned"}
            )
    spec = {n.name: n for n in NODES}
    names = {v: k for k, v in ids.items()}
    for n in NODES:
        got = api.ok("GET", f"/api/nodes/{ids[n.name]}/", token)
        a = got["allocatable"]
        model = n.allocatable
        print(f"  {n.name:<8} {n.cores:>2} cores {n.mem_mib:>6,} MiB {n.disk_gib:>4} GiB; baseline "
              f"{got['idle_baseline_mib']:>5,} MiB; allocatable {a['cpu_cores']:g} cores {a['mem_mib']:>6,} MiB "
              f"{a['disk_gib']} GiB; {got['status']}")  # fmt: skip
        checks.expect(
            got["idle_baseline_mib"] == n.idle_used_mib, f"{n.name}: baseline {got['idle_baseline_mib']}"
        )
        checks.expect(
            (round(a["cpu_cores"] * 100), a["mem_mib"], a["disk_gib"])
            == (model["cpu"], model["mem"], model["disk"]),
            f"{n.name}: allocatable {a} on the node resource, the model says {model}",
        )
        checks.expect(
            got["status"] == ("draining" if n.drain else "online"), f"{n.name}: status {got['status']}"
        )

    decided: list[Decided] = []
    sizes: dict[int, list[dict]] = {}
    print("\nleases (each would fit the declared totals):")
    for step in STEPS:
        for name, used_mib in step.heartbeats.items():
            heartbeat(api, ids[name], tokens[name], spec[name], used_mib)
        at = datetime.now(UTC)
        body = {
            "name": step.name,
            "type": "immediate" if step.start_in_h is None else "advance_reservation",
            "duration_s": step.duration_h * 3600,
            "nodes": [{"cpu_cores": step.cores, "mem_mib": step.mem_mib, "disk_gib": DISK_GIB}] * step.vms,
        }
        if step.start_in_h is not None:
            start = (at + timedelta(hours=step.start_in_h)).replace(microsecond=0)
            body["start"] = start.isoformat().replace("+00:00", "Z")
        status, answer = api.call("POST", "/api/leases/", token, body)
        lease_id = answer.get("id") or answer.get("lease")
        if lease_id is None:
            raise SystemExit(f"{step.name}: POST /api/leases/ answered {status}: {json.dumps(answer)[:400]}")
        lease = api.ok("GET", f"/api/leases/{lease_id}/", token)
        sizes[lease_id] = lease["nodes"]
        decided.append(Decided(step, lease_id, status, at, lease["state"]))
        placed_on = sorted({names[n] for r in lease["reservations"] for n in r["nodes"].values()})
        print(f"  {step.name} (lease {lease_id}) {step.vms} x ({step.cores:g} cpu, {step.mem_mib:,} MiB)"
              f"{' at +' + format(step.start_in_h, 'g') + ' h' if step.start_in_h else ' now'}: HTTP {status}, "
              f"{lease['state']}{' on ' + ', '.join(placed_on) if placed_on else ''}\n      {step.why}\n"
              f"      message: {lease['message']}")  # fmt: skip
        outcome = (
            "placed" if status == 201 and lease["reservations"] else "rejected" if status == 409 else "?"
        )
        checks.expect(
            outcome == step.expect, f"{step.name}: {outcome} (HTTP {status}), the model says {step.expect}"
        )
        if step.expect == "placed":
            checks.expect(
                set(placed_on) == step.on, f"{step.name}: on {placed_on}, the model says {sorted(step.on)}"
            )

    # The slot table as the API shows it, over every window the scenario touched.
    first = min(d.at for d in decided) - timedelta(minutes=1)
    books = bookings(api, token, first, first + timedelta(hours=6), sizes)
    caps = {ids[n.name]: n.allocatable for n in NODES}
    print("\nreports (per node: holds / fit / reason code; the model's holds in brackets where they differ):")
    for d in decided:
        check_report(api, token, d, books, caps, spec, names, observed_at(d, spec), checks)
    check_slot_sums(api, token, books, caps, names, checks)


def observed_at(d: Decided, spec: dict[str, NodeSpec]) -> dict[str, int]:
    """The used memory each node last reported before decision `d` (the now-gate charges what exceeds its
    baseline and what the plan holds there now)."""
    last: dict[str, int] = {n: s.idle_used_mib for n, s in spec.items()}
    for step in STEPS[: STEPS.index(d.step) + 1]:
        last.update(step.heartbeats)
    return last


def heartbeat(api: Api, node_id: int, token: str, n: NodeSpec, used_mib: int) -> None:
    body = {"mem_total_mib": n.mem_mib, "mem_used_mib": used_mib, "disk_free_gib": float(n.disk_gib),
            "cpu_pct": 5.0, "load1": 0.1, "instances": []}  # fmt: skip
    api.ok("POST", f"/api/nodes/{node_id}/heartbeat", token, body)


def check_report(
    api, token, d: Decided, books, caps, spec, names, observed: dict[str, int], checks: Checks
) -> None:
    reports = api.ok("GET", f"/api/placement/reports/?subject=lease:{d.lease}", token)
    reports = reports.get("results", reports)
    checks.expect(len(reports) == 1, f"{d.step.name}: {len(reports)} reports for the submission")
    if not reports:
        return
    rep = reports[-1]
    step = d.step
    need = vec(step.cores, step.mem_mib, DISK_GIB)
    rows = rep["verdicts"]
    window = next((r["numbers"] for r in rows if r.get("numbers", {}).get("window_start")), None)
    start, end = parse(window["window_start"]), parse(window["window_end"])
    created = parse(rep["created_at"])
    # Work from now: the window starts at the decision's instant, which the report writes to the second.
    now_window = start <= created
    if now_window and created - start < timedelta(seconds=1):
        start = created
    # What was on the table when this lease was decided: every earlier lease's reservations.
    before = [b for b in books if b.lease < d.lease]
    own = sorted({names[n] for b in books if b.lease == d.lease for n in b.per_node})
    print(
        f"  {step.name} {rep['outcome']}: {rep['summary']}\n      counts {rep['counts']}; chosen {rep['chosen']}"
    )
    checks.expect(rep["outcome"] == step.expect, f"{step.name}: report outcome {rep['outcome']}")
    checks.expect(
        sorted(rep["chosen"]) == own, f"{step.name}: report chose {rep['chosen']}, the lease holds {own}"
    )
    for row in sorted(rows, key=lambda r: r["node"]):
        name, node = row["node"], row["node_id"]
        cap = caps[node]
        free = free_over(before, node, cap, start, end)
        if now_window:
            planned = used(before, node, start)["mem"]
            base = max(spec[name].idle_used_mib, BASELINE_FLOOR_MIB)
            free["mem"] -= max(0, observed[name] - base - planned)
        if spec[name].drain:
            holds, code = 0, "draining"
        elif any(need[k] > cap[k] for k in need):
            holds, code = 0, "too_small"
        else:
            holds = min(copies(need, free), step.vms)
            code = None
            if not holds:
                busy_now = now_window and not copies(
                    need, free_now(before, node, cap, start, observed[name], spec[name])
                )
                code = "at_capacity" if busy_now else "reserved"
        text = f"{row['holds']}/{'fit' if row['fit'] else 'unfit'}/{row['reason_code'] or '-'}"
        model = (
            "" if (row["holds"], row["reason_code"]) == (holds, code) else f" [model {holds}/{code or '-'}]"
        )
        star = " ★" if row.get("chosen") else ""
        print(f"      {name:<8} {text:<24}{model}{star}  {row['reason'] or ''}")
        checks.expect(
            row["holds"] == holds, f"{step.name} {name}: holds {row['holds']}, the model says {holds}"
        )
        checks.expect(
            row["fit"] == (row["holds"] > 0),
            f"{step.name} {name}: fit {row['fit']} with holds {row['holds']}",
        )
        checks.expect(
            row["reason_code"] == code,
            f"{step.name} {name}: code {row['reason_code']}, the model says {code}",
        )
        checks.expect(bool(row["fit"]) or bool(row["reason"]), f"{step.name} {name}: unfit without a reason")
        checks.expect(
            row.get("chosen", False) == (name in own), f"{step.name} {name}: chosen {row.get('chosen')}"
        )
        nums = row.get("numbers") or {}
        if code not in ("draining",) and nums:
            dim = nums["dimension"]
            want = cap[dim] / 100 if dim == "cpu" else cap[dim]
            checks.expect(
                nums["allocatable"] == want,
                f"{step.name} {name}: numbers.allocatable {nums['allocatable']} {dim}, the model says {want}",
            )
    if step.expect == "rejected":
        checks.expect(
            sum(r["holds"] for r in rows) < step.vms, f"{step.name}: rejected although the fleet holds enough"
        )


def free_now(before, node, cap, at, observed_mib, n: NodeSpec) -> dict[str, int]:
    u = used(before, node, at)
    free = {k: cap[k] - u[k] for k in cap}
    free["mem"] -= max(0, observed_mib - max(n.idle_used_mib, BASELINE_FLOOR_MIB) - u["mem"])
    return free


def check_slot_sums(api, token, books: list[Booking], caps, names, checks: Checks) -> None:
    """Each node's sum of live reservations at every instant the table changes is within allocatable, and the node
    resource's `committed` is the sum now."""
    print("\nslot table per node (sum of live reservations, MiB; allocatable in brackets):")
    instants = sorted({b.start for b in books})
    now = datetime.now(UTC)
    for node, cap in sorted(caps.items(), key=lambda kv: names[kv[0]]):
        cells = []
        for t in instants:
            u = used(books, node, t)
            cells.append(f"{t:%H:%M} {u['mem']:>6,}")
            checks.expect(
                all(u[k] <= cap[k] for k in cap), f"{names[node]} at {t}: holds {u}, allocatable {cap}"
            )
        got = api.ok("GET", f"/api/nodes/{node}/", token)
        c, u = got["committed"], used(books, node, now)
        print(
            f"  {names[node]:<8} [{cap['mem']:>6,}]  "
            + "  ".join(cells)
            + f"   committed now {c['mem_mib']:,}"
        )
        checks.expect(
            (round(c["cpu_cores"] * 100), c["mem_mib"], c["disk_gib"]) == (u["cpu"], u["mem"], u["disk"]),
            f"{names[node]}: committed {c} on the node resource, the slot table holds {u} now",
        )
        checks.expect(not got["over_allocatable"], f"{names[node]}: flagged over allocatable")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the database and Daphne's log")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="slotkeeper_scenario_"))
    api, token, process = start_server(workdir)
    checks = Checks()
    started = time.perf_counter()
    try:
        run(api, token, checks)
    finally:
        stop(process)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{checks.passed} checks agree with the model, {len(checks.failed)} disagree "
          f"({time.perf_counter() - started:.1f} s){'; files in ' + str(workdir) if args.keep else ''}")  # fmt: skip
    if checks.failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
