"""Recovery on a full fleet (issue 45): a reschedule proposal holds its room, so a lease that held capacity before its
node died does not lose it to newcomers; where nothing fits at once the proposal waits and gets the room as it frees,
before the queue does; every approval then lands, the group stays apart, no node is ever overcommitted, and a
re-admitted node counts nothing for the instances that moved away.

Four nodes of 4 cores and 8 GiB allocatable, time simulated: the test drives the tick as the periodic loop would."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import actions as fleet_actions
from fleet.models import Node
from leases import actions, reads
from leases.instances.actions import nodes as node_actions
from leases.instances.actions import periodic, reschedules
from leases.instances.models import Reschedule
from leases.models import Group, Instance, Reservation
from slotkeeper.domain import DomainError
from tests.leases.conftest import vm
from tests.leases.instances.helpers import report_all
from tests.leases.invariants import overcommitted_instants

pytestmark = pytest.mark.django_db


def submit(now, name, *, type="immediate", duration_s=3600, cores=1, mem=1024, groups=()):
    spec = actions.LeaseSpec(
        name=name, type=type, duration_s=duration_s, vnodes=[vm(cores=cores, mem=mem)], groups=tuple(groups)
    )
    return actions.do_submit_lease(None, spec, now=now)


def node_of(lease) -> int:
    return Instance.objects.get(lease=lease, state__in=["placed", "running"]).node_id


def test_a_proposal_holds_its_room_against_newcomers_and_its_approval_lands(fleet):
    now = timezone.now()
    Group.objects.create(name="web", policy="anti_affinity", hard=True)
    web0 = submit(now, "web-0", groups=["web"]).lease
    web1 = submit(now, "web-1", groups=["web"]).lease
    assert node_of(web0) != node_of(web1)
    # Two more VMs beside web-0, then room everywhere else for its node's three.
    dead = node_of(web0)
    for i in range(2):
        submit(now, f"batch-{i}")
    report_all(now)
    on_dead = Instance.objects.filter(node_id=dead, state__in=["placed", "running"]).count()
    node_actions.do_declare_dead(None, dead, reason="PSU failed", now=now)
    proposals = list(Reschedule.objects.filter(status="pending"))
    assert len(proposals) == on_dead and all(p.proposed_node_id and p.hold_rid for p in proposals)
    web_move = next(p for p in proposals if p.lease_id == web0.pk)
    assert web_move.proposed_node_id != node_of(web1), "a held room counts for the group as a placed one"
    # Newcomers fill every core there is; none takes the held room.
    t = now
    for i in range(20):
        t += timedelta(seconds=5)
        report_all(t)
        submit(t, f"filler-{i}", type="best_effort", cores=1, mem=512)
        periodic.tick(t)
        assert overcommitted_instants() == []
    results = reschedules.do_approve(None, [p.pk for p in proposals], now=t)
    assert all(r.ok for r in results), [r.message for r in results]
    assert {r.node for r in results if r.id == web_move.pk} == {web_move.proposed_node.name}
    assert not Reservation.objects.filter(kind="hold", status="active").exists()
    assert overcommitted_instants() == []


def test_with_no_room_at_once_the_room_is_held_from_when_it_frees_before_newcomers(fleet):
    now = timezone.now()
    # The whole fleet's 16 cores: the doomed node's four for an hour, the rest for ten minutes.
    doomed = submit(now, "doomed", cores=4, mem=2048).lease
    dead = node_of(doomed)
    short = [submit(now, f"short-{i}", cores=4, mem=1024, duration_s=600).lease for i in range(3)]
    assert all(s.state == "active" for s in short)
    early = submit(now, "early-newcomer", type="best_effort", cores=4, mem=1024).lease
    assert Reservation.objects.get(lease=early).start == now + timedelta(seconds=600)  # backfilling's future
    report_all(now)
    node_actions.do_declare_dead(None, dead, reason="PSU failed", now=now)
    [proposal] = Reschedule.objects.filter(status="pending")
    # No room now; the newer best-effort lease's future reservation made way, and the room is held from then.
    hold = Reservation.objects.get(rid=proposal.hold_rid)
    assert (hold.kind, hold.status, hold.start) == ("hold", "scheduled", now + timedelta(seconds=600))
    assert "when it frees" in proposal.message
    [again] = Reservation.objects.filter(lease=early, status="scheduled")
    assert set(again.nodes.values()).isdisjoint(hold.nodes.values()), (
        "planned again beside the hold, not on it"
    )
    # Approving it before then is refused with the reason, and keeps the hold.
    with pytest.raises(DomainError, match="held from"):
        reschedules.do_approve(None, [proposal.pk], now=now + timedelta(seconds=60))
    t = now
    for i in range(8):
        t += timedelta(seconds=90)
        for n in Node.objects.exclude(pk=dead):
            fleet_actions.do_heartbeat(
                n, fleet_actions.HealthReport(n.mem_total_mib, 1000, 90.0, 1.0, 0.1), now=t
            )
        submit(t, f"newcomer-{i}", type="best_effort", cores=4, mem=1024)
        periodic.tick(t)
        assert overcommitted_instants() == []
    [result] = reschedules.do_approve(None, [proposal.pk], now=t)
    assert result.ok, result.message
    assert overcommitted_instants() == []


def test_a_readmitted_node_counts_nothing_for_instances_that_moved_away(fleet, admin):
    now = timezone.now()
    lease = submit(now, "mover", cores=2, mem=4096).lease
    dead = node_of(lease)
    report_all(now)
    assert reads.committed_now(now, [dead])[dead][1] == 4096
    node_actions.do_declare_dead(None, dead, reason="kernel panic", now=now)
    # Its lost vnode left the dead node's reservation at once: nothing is committed there any more.
    assert dead not in reads.committed_now(now, [dead])
    [proposal] = Reschedule.objects.filter(status="pending")
    [result] = reschedules.do_approve(None, [proposal.pk], now=now)
    assert result.ok
    fleet_actions.do_readmit(None, dead, reason="PSU replaced", now=now)
    assert dead not in reads.committed_now(now, [dead])
    body = admin.get(f"/api/nodes/{dead}/").json()
    assert body["committed"]["mem_mib"] == 0, body["committed"]


def test_a_rejected_proposal_gives_its_room_back(fleet):
    now = timezone.now()
    lease = submit(now, "mover", cores=2, mem=4096).lease
    dead = node_of(lease)
    report_all(now)
    node_actions.do_declare_dead(None, dead, reason="kernel panic", now=now)
    [proposal] = Reschedule.objects.filter(status="pending")
    target = proposal.proposed_node_id
    assert reads.committed_now(now, [target])[target][1] == 4096
    reschedules.do_reject(None, proposal.pk, now=now, reason="not needed")
    assert target not in reads.committed_now(now, [target])
    assert Reservation.objects.get(rid=proposal.hold_rid).status == "cancelled"


def test_an_expired_hold_is_released_and_proposed_again(fleet, settings):
    settings.SLOTKEEPER = {**settings.SLOTKEEPER, "RESCHEDULE_HOLD_S": 60}
    now = timezone.now()
    lease = submit(now, "mover", cores=2, mem=4096).lease
    dead = node_of(lease)
    report_all(now)
    node_actions.do_declare_dead(None, dead, reason="kernel panic", now=now)
    [proposal] = Reschedule.objects.filter(status="pending")
    first = proposal.hold_rid
    later = now + timedelta(seconds=61)
    for n in Node.objects.exclude(pk=dead):
        fleet_actions.do_heartbeat(
            n, fleet_actions.HealthReport(n.mem_total_mib, 1000, 90.0, 1.0, 0.1), now=later
        )
    periodic.tick(later)
    proposal.refresh_from_db()
    assert proposal.hold_rid not in (None, first) and proposal.version == 2
    assert "earlier hold expired" in proposal.message
    assert Reservation.objects.get(rid=first).status == "cancelled"
    assert Reservation.objects.filter(kind="hold", status="active").count() == 1


def test_a_new_member_of_the_group_is_kept_off_a_node_whose_room_is_held_for_another(fleet):
    now = timezone.now()
    Group.objects.create(name="web", policy="anti_affinity", hard=True)
    web0 = submit(now, "web-0", groups=["web"]).lease
    dead = node_of(web0)
    report_all(now)
    node_actions.do_declare_dead(None, dead, reason="PSU failed", now=now)
    [proposal] = Reschedule.objects.filter(status="pending")
    # Two more members: one on each node that is neither dead nor holding web-0's room.
    placed = [submit(now, f"web-{i}", groups=["web"]).lease for i in (1, 2)]
    nodes = {node_of(lease) for lease in placed}
    assert proposal.proposed_node_id not in nodes and dead not in nodes and len(nodes) == 2
    # A fourth has nowhere to go: the held node counts as taken.
    fourth = submit(now, "web-3", groups=["web"])
    assert not fourth.decision.accepted
