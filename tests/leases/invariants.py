"""Invariant queries over the database, used by the concurrency tests: no node is overcommitted at any instant."""

from __future__ import annotations

from django.db import connection

from fleet.nodestate import BASELINE_FLOOR_MIB, HOST_RESERVE_MIB


def overcommitted_instants() -> list[tuple]:
    """Every (node, instant, cpu, mem) where live allocations exceed the node's allocatable capacity (declared
    less the host reserve and the remembered baseline, never below the floor: docs/capacity.md).

    Usage on a node only rises at an allocation's start, so checking each start instant covers every instant.
    """
    # The instants come from a DISTINCT subquery: joining allocations to allocations directly counted every
    # overlapping allocation once per allocation starting at the same instant, and reported false overcommits
    # whenever a batch gave several reservations one start (found by bench_burst).
    sql = """
        SELECT t.node_id, t.start, SUM(b.cpu) AS cpu, SUM(b.mem_mib) AS mem, MIN(n.cpu), MIN(n.mem)
        FROM (SELECT DISTINCT node_id, start FROM leases_allocation WHERE live) t
        JOIN leases_allocation b ON b.node_id = t.node_id AND b.live AND b.start <= t.start AND b.end > t.start
        JOIN (
            SELECT id, cpu_cores * 100 AS cpu,
                   mem_total_mib - %(reserve)s - CASE WHEN COALESCE(idle_baseline_mib, 0) > %(floor)s
                                                    THEN idle_baseline_mib ELSE %(floor)s END AS mem
            FROM fleet_node
        ) n ON n.id = t.node_id
        GROUP BY t.node_id, t.start
        HAVING SUM(b.cpu) > MIN(n.cpu) OR SUM(b.mem_mib) > MIN(n.mem)
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, {"reserve": HOST_RESERVE_MIB, "floor": BASELINE_FLOOR_MIB})
        return cursor.fetchall()
