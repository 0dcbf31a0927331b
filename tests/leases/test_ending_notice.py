"""Before-end notices (issue 48): a lease's `notify_before_s` before its end, the tick sends one `lease.ending`
event on the feed; never twice (not on a second tick, not after a restart: the end it was sent for is stored with
the event); an extension moves the end and gets a notice of its own; 0 asks for none; the default is the server's."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from leases import actions
from leases.models import Lease, Reservation
from slotkeeper.models import Event
from tests.leases.conftest import vm

pytestmark = pytest.mark.django_db


def submit(client, name, **extra):
    body = {"name": name, "type": "immediate", "duration_s": 600, "nodes": [vm(cores=1, mem=1024)], **extra}
    response = client.post("/api/leases/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def end_of(lease_id):
    return Reservation.objects.get(lease_id=lease_id, kind="vm", status__in=("scheduled", "active")).end


def notices(lease_id):
    return list(Event.objects.filter(type="lease.ending", lease_id=lease_id).order_by("id"))


def test_the_notice_is_sent_once_at_its_time(operator, fleet):
    lease = submit(operator, "job", notify_before_s=120)
    assert lease["notify_before_s"] == 120
    end = end_of(lease["id"])
    assert actions.notify_ending(end - timedelta(seconds=200)) == 0 and not notices(lease["id"])
    assert actions.notify_ending(end - timedelta(seconds=110)) == 1
    sent = notices(lease["id"])
    assert len(sent) == 1 and sent[0].data["notify_before_s"] == 120
    assert sent[0].data["end"] == end.isoformat() and 109 <= sent[0].data["in_s"] <= 111
    # Later ticks, and a restarted process (nothing in memory), send it no more.
    assert actions.notify_ending(end - timedelta(seconds=60)) == 0
    assert Lease.objects.get(pk=lease["id"]).ending_notified_for == end
    assert len(notices(lease["id"])) == 1


def test_an_extension_gets_a_notice_of_its_own(operator, fleet):
    lease = submit(operator, "job", notify_before_s=120)
    end = end_of(lease["id"])
    actions.notify_ending(end - timedelta(seconds=100))
    response = operator.post(f"/api/leases/{lease['id']}/extend", {"by_s": 600}, format="json")
    assert response.status_code == 200, response.content
    new_end = end_of(lease["id"])
    assert actions.notify_ending(new_end - timedelta(seconds=300)) == 0
    assert actions.notify_ending(new_end - timedelta(seconds=100)) == 1
    assert [e.data["end"] for e in notices(lease["id"])] == [end.isoformat(), new_end.isoformat()]


def test_zero_asks_for_none_and_the_default_is_the_servers(operator, fleet, settings):
    quiet = submit(operator, "quiet", notify_before_s=0)
    settings.SLOTKEEPER = {**settings.SLOTKEEPER, "NOTIFY_BEFORE_S": 300}
    default = submit(operator, "default")
    assert default["notify_before_s"] == 300
    end = max(end_of(quiet["id"]), end_of(default["id"]))
    actions.notify_ending(end - timedelta(seconds=1))
    assert not notices(quiet["id"]) and len(notices(default["id"])) == 1


def test_a_lease_whose_end_passed_while_the_server_was_down_gets_none(operator, fleet):
    lease = submit(operator, "job", notify_before_s=120)
    end = end_of(lease["id"])
    assert actions.notify_ending(end + timedelta(seconds=5)) == 0
    assert not notices(lease["id"])


@pytest.mark.parametrize("value", [-1, 86_401, "10", 1.5, True])
def test_a_bad_notice_is_a_400(operator, fleet, value):
    body = {"name": "x", "type": "immediate", "duration_s": 600, "nodes": [vm()], "notify_before_s": value}
    assert operator.post("/api/leases/", body, format="json").status_code == 400
    assert not Lease.objects.exists()


def test_the_tick_sends_it(operator, fleet):
    from leases.instances.actions import periodic

    lease = submit(operator, "job", notify_before_s=86_400)
    periodic.tick(timezone.now())
    assert len(notices(lease["id"])) == 1


def test_the_slot_table_counts_down_to_the_ends_whose_notice_went_out(operator, fleet):
    from tests.console.conftest import signed_in

    soon = submit(operator, "soon", notify_before_s=86400)  # its notice is due at once
    later = submit(operator, "later", notify_before_s=60)
    browser = signed_in("vera", "viewer")

    def countdown() -> str:
        found = re.search(
            r'<details class="ending-soon".*?</details>', browser.get("/slots/").content.decode(), re.S
        )
        return found[0] if found else ""

    assert countdown() == "", "no notice has gone out yet"
    assert actions.notify_ending(timezone.now()) == 1
    shown = countdown()
    assert f"lease {soon['id']} soon</a> ends in <strong data-countdown>" in shown
    assert "1 lease sent its before-end notice" in shown and f"next: lease {soon['id']} soon in" in shown
    assert f"lease {later['id']} later" not in shown
    response = operator.post(f"/api/leases/{soon['id']}/cancel", {"reason": "done early"}, format="json")
    assert response.status_code == 200, response.content
    assert countdown() == "", "a lease that ended counts down no more"


def test_an_end_within_the_minute_counts_down_as_less_than_a_minute(operator, fleet):
    """`timeuntil` said "0 minutes" for an end under a minute away: the countdown read "in 0 minutes"."""
    from tests.console.conftest import signed_in

    soon = submit(operator, "soon", duration_s=30, notify_before_s=86400)
    assert actions.notify_ending(timezone.now()) == 1
    shown = signed_in("vera", "viewer").get("/slots/").content.decode()
    assert f"next: lease {soon['id']} soon in <span data-countdown>less than a minute</span>" in shown
    assert "0 minutes" not in shown
