"""Heartbeats, drains and sweeps racing on PostgreSQL leave every node consistent."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from fleet import actions
from fleet.models import Node
from leases.instances.actions import nodes as node_actions
from slotkeeper.domain import DomainError
from tests.conftest import requires_postgres

pytestmark = [requires_postgres, pytest.mark.django_db(transaction=True)]


def test_racing_heartbeats_drains_and_sweeps_leave_consistent_nodes():
    now = timezone.now()
    ids = []
    for i in range(6):
        node, _ = actions.do_register_node(
            None, name=f"n{i}", cpu_cores=8, mem_total_mib=32768, disk_total_gib=100, capabilities=[], now=now
        )
        ids.append(node.pk)
    errors: list[BaseException] = []
    stop = time.monotonic() + 4.0

    def worker(kind: int) -> None:
        rng = random.Random(kind)
        try:
            while time.monotonic() < stop:
                node_id = rng.choice(ids)
                # Clocks jump between "fresh" and "40 s late" so sweeps keep finding silent nodes.
                at = timezone.now() + timedelta(seconds=rng.choice([0, 40, 100]))
                try:
                    if kind % 3 == 0:
                        node = Node.objects.get(pk=node_id)
                        report = actions.HealthReport(
                            mem_total_mib=32768,
                            mem_used_mib=rng.randint(0, 32768),
                            disk_free_gib=50.0,
                            cpu_pct=10.0,
                            load1=0.5,
                        )
                        node_actions.do_heartbeat(node, report, now=at)
                    elif kind % 3 == 1:
                        if rng.random() < 0.5:
                            node_actions.do_drain(None, node_id, reason="race test", now=at)
                        else:
                            actions.do_undrain(None, node_id, reason="race test", now=at)
                    else:
                        node_actions.sweep(at)
                except DomainError:
                    pass
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for node in Node.objects.filter(pk__in=ids):
        # The invariants: a draining node has a reason; a node with a drain reason is draining, or offline / dead
        # (a drained node that went silent keeps its reason so it returns as draining); every status is known.
        assert node.status in {"online", "draining", "offline", "dead"}
        if node.status == "draining":
            assert node.drain_reason
        if node.status == "online":
            assert not node.drain_reason, (
                f"{node.name} is online but still has drain reason {node.drain_reason!r}"
            )
