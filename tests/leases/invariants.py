"""Invariant queries over the database, used by the concurrency tests: no node is overcommitted at any instant."""

from __future__ import annotations

from django.db import connection


def overcommitted_instants() -> list[tuple]:
    """Every (node, instant, cpu, mem) where live allocations exceed the node's declared capacity.

    Usage on a node only rises at an allocation's start, so checking each start instant covers every instant.
    """
    sql = """
        SELECT a.node_id, a.start, SUM(b.cpu) AS cpu, SUM(b.mem_mib) AS mem, n.cpu_cores * 100, n.mem_total_mib
        FROM leases_allocation a
        JOIN leases_allocation b ON b.node_id = a.node_id AND b.live AND b.start <= a.start AND b.end > a.start
        JOIN fleet_node n ON n.id = a.node_id
        WHERE a.live
        GROUP BY a.node_id, a.start, n.cpu_cores, n.mem_total_mib
        HAVING SUM(b.cpu) > n.cpu_cores * 100 OR SUM(b.mem_mib) > n.mem_total_mib
    """
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()
