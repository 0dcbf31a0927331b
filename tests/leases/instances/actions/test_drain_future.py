"""Future reservations on a node that is drained (or dies) are planned again within one tick, not at their start
(issue 45): a best-effort lease goes elsewhere, an advance reservation keeps its window on another node, and one
that no other node can hold says so on the lease, in the audit feed and as an alert. Drain progress says what the
drain is doing from its first second."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.models import Node
from leases import actions
from leases.instances import reads
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import periodic
from leases.models import Alert, Reservation
from tests.leases.conftest import vm
from tests.leases.instances.helpers import report_all

pytestmark = pytest.mark.django_db

WHOLE = vm(cores=4, mem=8192)


def submit(name, type_, duration_s, now, *, start=None, vnodes=1):
    spec = actions.LeaseSpec(
        name=name, type=type_, duration_s=duration_s, vnodes=[WHOLE] * vnodes, start=start
    )
    return actions.do_submit_lease(None, spec, now=now).lease


def nodes_of(lease) -> set[int]:
    return {int(n) for r in Reservation.objects.filter(lease=lease, kind="vm").exclude(status="cancelled")
            for n in r.nodes.values()}  # fmt: skip


def test_a_drained_nodes_future_reservations_move_within_one_tick(fleet):
    now = timezone.now()
    later = submit("later", "advance_reservation", 600, now, start=now + timedelta(hours=2))
    target = next(iter(nodes_of(later)))
    node_actions.do_drain(None, target, reason="kernel upgrade", now=now)
    report_all(now)
    periodic.tick(now + timedelta(seconds=1))
    moved = nodes_of(later)
    assert target not in moved and len(moved) == 1
    later.refresh_from_db()
    assert later.state == "ready" and "runs" in later.message
    step = later.events.order_by("-pk").first()
    assert step.message.startswith("moved from") and "is draining" in step.message


def test_an_advance_reservation_no_other_node_can_hold_is_flagged_with_why(fleet):
    now = timezone.now()
    # The whole fleet in two hours, and then one node is drained: its share has nowhere else to go.
    wide = submit("wide", "advance_reservation", 600, now, start=now + timedelta(hours=2), vnodes=4)
    node = next(iter(nodes_of(wide)))
    node_actions.do_drain(None, node, reason="rack move", now=now)
    report_all(now)
    periodic.tick(now + timedelta(seconds=1))
    wide.refresh_from_db()
    assert node in nodes_of(wide)
    assert "no other node holds its window" in wide.message and "is draining" in wide.message
    alert = Alert.objects.get(kind="reservation_stranded")
    assert alert.lease_id == wide.pk
    # Said once: the next tick adds no second alert.
    periodic.tick(now + timedelta(seconds=2))
    assert Alert.objects.get(kind="reservation_stranded").count == 1


def test_drain_progress_names_each_moves_phase_from_the_first_second(fleet):
    now = timezone.now()
    lease = submit("web", "immediate", 3600, now)
    node = next(iter(nodes_of(lease)))
    report_all(now)
    node_actions.do_drain(None, node, reason="kernel upgrade", now=now, deadline=now + timedelta(hours=1))
    progress = reads.drain_progress(Node.objects.get(pk=node))
    [move] = progress["moves"]
    assert move["phase"] == "waiting" and move["said"].startswith(f"room held on {move['target']}")
    assert progress["counts"]["waiting"] == 1 and progress["in_flight"] == 0
    # The tick approves it (max_parallel 2): it is moving until its new instance runs.
    periodic.tick(now + timedelta(seconds=1))
    progress = reads.drain_progress(Node.objects.get(pk=node))
    assert progress["moves"][0]["phase"] == "moving" and progress["in_flight"] == 1
