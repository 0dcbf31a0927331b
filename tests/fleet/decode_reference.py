"""The report decoder as it was before it read column by column (fleet/reports.py `decode`, commit 73fd7d3),
kept to check the faster one against: the API's answer is a contract, and it must not change by a byte."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fleet import reports


def decode(
    stored: Any, names: Mapping[int, str], when: Callable[[float], str] = lambda t: reports._iso(t)
) -> list[dict[str, Any]]:
    """One dict per node in rank order (chosen first, then fit by rank, then the rest by name). A list stored
    before reports were compact is returned as it is."""
    if not reports.is_compact(stored):
        return list(stored or ())
    b = {k: reports._unpacked(v) if k in reports._PACKED else v for k, v in stored.items()}
    start, end = b["start"], b["end"]
    window = (when(start), when(end)) if start is not None and end is not None else (None, None)
    chosen = set(b["chosen"])
    need = b["need"]
    headroom = b.get("headroom")
    rows = []
    for i, node in enumerate(b["node"]):
        dim = reports.DIMENSIONS[b["dim"][i]]
        wanted = need[dim] if isinstance(need, dict) else need[i]
        code = b["codes"][b["code"][i]] if b["code"][i] >= 0 else None
        holds = b["holds"][i]
        blockers = b["blockers"].get(str(node), [])
        numbers = {
            "dimension": dim,
            "need": reports._user(dim, wanted),
            "free": reports._user(dim, b["free"][i]),
            "allocatable": reports._user(dim, b["alloc"][i]) if b["alloc"][i] >= 0 else None,
            "window_start": window[0],
            "window_end": window[1],
        }
        note = (
            b["texts"][b["note"][i]]
            if "note" in b and b["note"][i] >= 0
            else b.get("notes", {}).get(str(node))
        )
        rows.append(
            {
                "node": names.get(node, f"node {node}"),
                "node_id": node,
                "fit": holds > 0,
                "holds": holds,
                "slots": holds,
                "reason_code": code,
                "reason": note
                or (
                    reports.sentence(code, dim, wanted, b["free"][i], b["alloc"][i], blockers, window)
                    if code
                    else None
                ),
                "rank": b["rank"][i] or None,
                "chosen": node in chosen,
                "headroom": headroom[i] if headroom else None,
                "blockers": blockers,
                "numbers": numbers,
            }
        )
    rows.sort(key=lambda r: (not r["chosen"], not r["fit"], r["rank"] or 1 << 30, r["node"]))
    return rows
