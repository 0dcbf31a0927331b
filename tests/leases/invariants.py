"""Invariant queries over the database, used by the concurrency tests: no node is overcommitted at any instant."""

from __future__ import annotations

from django.db import connection


def overcommitted_instants() -> list[tuple]:
    """Every (node, instant, cpu, mem) where live allocations exceed the node's declared capacity.

    Usage on a node only rises at an allocation's start, so checking each start instant covers every instant.
    """
    # The instants come from a DISTINCT subquery: joining allocations to allocations directly counted every
    # overlapping allocation once per allocation starting at the same instant, and reported false overcommits
    # whenever a batch gave several reservations one start (found by bench_burst).
    sql = """
        SELECT t.node_id, t.start, SUM(b.cpu) AS cpu, SUM(b.mem_mib) AS mem, n.cpu_cores * 100, n.mem_total_mib
        FROM (SELECT DISTINCT node_id, start FROM leases_allocation WHERE live) t
        JOIN leases_allocation b ON b.node_id = t.node_id AND b.live AND b.start <= t.start AND b.end > t.start
        JOIN fleet_node n ON n.id = t.node_id
        GROUP BY t.node_id, t.start, n.cpu_cores, n.mem_total_mib
        HAVING SUM(b.cpu) > n.cpu_cores * 100 OR SUM(b.mem_mib) > n.mem_total_mib
    """
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()
