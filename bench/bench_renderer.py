"""Benchmark the API's JSON renderer on a 1,000-node placement report's answer.

What a full `POST /api/leases/` or `GET /api/leases/{id}/` answer renders: 1,000 verdict rows shaped as
`VerdictSerializer` writes them, their sentences naming a window with an en dash as the live service's do. Timed
in the same run, as CPU per answer (`thread_time`, median of `--rounds` rounds of `--repeat` calls):

- orjson alone: `orjson.dumps` with the renderer's options, the floor;
- both scans: orjson, then U+2028 and U+2029 escaped with two `bytes.replace` (the renderer before the
  twenty-second session; the baseline);
- the renderer: `FastJSONRenderer.render` as the API runs it (it scans only when a byte of either character is
  in the answer);
- the renderer with a non-ASCII node name ("é" holds the byte 0xA9): the path that still scans.

    .venv/bin/python bench/bench_renderer.py [--nodes 1000] [--repeat 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def answer(nodes: int, name: str = "node-{:04d}") -> dict:
    window = ("2026-12-05T06:00:00Z", "2026-12-05T08:00:00Z")
    reason = (
        "2 cores free now of 32 cores allocatable; one VM needs 4 cores over 2026-12-05 06:00 UTC–08:00 UTC"
    )
    rows = [
        {
            "node": name.format(i),
            "node_id": i,
            "fit": False,
            "holds": 0,
            "slots": 0,
            "reason_code": "at_capacity",
            "reason": reason,
            "rank": None,
            "chosen": False,
            "headroom": None,
            "blockers": [],
            "numbers": {
                "dimension": "cpu",
                "need": 4.0,
                "free": 2.0,
                "allocatable": 32.0,
                "window_start": window[0],
                "window_end": window[1],
            },
        }
        for i in range(nodes)
    ]
    return {"id": 1, "state": "active", "report": {"outcome": "placed", "verdicts": rows}}


def cpu_ms(call: Callable[[], object], repeat: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        t = time.thread_time()
        for _ in range(repeat):
            call()
        samples.append((time.thread_time() - t) * 1000 / repeat)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "slotkeeper.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-not-secret")
    import django

    django.setup()
    import orjson
    from rest_framework.utils import encoders

    from slotkeeper.renderers import _OPTIONS, FastJSONRenderer

    renderer = FastJSONRenderer()
    data, accented = answer(args.nodes), answer(args.nodes, "nœud-é-{:04d}")
    default = encoders.JSONEncoder().default
    size = len(renderer.render(data, "application/json"))

    def both_scans() -> bytes:
        out = orjson.dumps(data, default=default, option=_OPTIONS)
        return out.replace("\u2028".encode(), b"\\u2028").replace("\u2029".encode(), b"\\u2029")

    assert both_scans() == renderer.render(data, "application/json")
    print(
        f"API JSON renderer, a {args.nodes:,}-node report's answer ({size / 1024:,.0f} KiB), CPU per answer"
    )
    figures = [
        ("orjson alone (the floor)", lambda: orjson.dumps(data, default=default, option=_OPTIONS)),
        ("orjson and both scans (baseline)", both_scans),
        ("FastJSONRenderer.render", lambda: renderer.render(data, "application/json")),
        ("the same, a name holding 0xA9 ('é')", lambda: renderer.render(accented, "application/json")),
    ]
    for label, call in figures:
        print(f"  {label:<40}{cpu_ms(call, args.repeat, args.rounds):8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
