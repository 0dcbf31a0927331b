"""A preview while a pass is under way, with real threads on PostgreSQL: it never answers from the scheduler the pass
has changed and not committed (leases/planning/reading.py `consulting`)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.utils import timezone

from leases import actions as lease_actions
from leases.planning import passes, restore
from leases.scheduler import LeaseRequest
from leases.slottable import Res
from tests.conftest import requires_postgres

pytestmark = [requires_postgres, pytest.mark.django_db(transaction=True)]

ASK = {"mem_mib": 4096, "disk_gib": 0, "cpu_cores": 4, "capabilities": [], "count": 4, "preferred_node": None}


class Undone(Exception):
    pass


def test_a_preview_during_a_pass_answers_from_the_committed_plan_never_the_half_written_one(fleet):
    with passes.planning(timezone.now()):
        pass  # committed (autocommit outside): this process now caches the scheduler
    assert restore._cache.value is not None
    changed, go = threading.Event(), threading.Event()
    answers: list[dict] = []
    errors: list[BaseException] = []

    def pass_that_fails() -> None:
        try:
            with passes.planning(timezone.now()) as plan:
                # The whole fleet taken in memory, by a request that will never commit.
                taker = LeaseRequest(
                    id=10**9, type="immediate", submit=plan.t, start=None, duration=3600,
                    vnodes=(Res(cpu=400, mem=4096),) * 4, preemptible=False,
                )  # fmt: skip
                assert plan.scheduler.submit(taker, plan.t, plan.excluded).accepted
                changed.set()
                go.wait(10)
                raise Undone
        except Undone:
            pass
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def preview() -> None:
        try:
            answers.append(lease_actions.do_preview(None, ASK, now=timezone.now())[0])
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    passing = threading.Thread(target=pass_that_fails)
    passing.start()
    assert changed.wait(10)
    asking = threading.Thread(target=preview)
    asking.start()
    asking.join(0.5)
    assert asking.is_alive(), "the preview answered while the pass held a scheduler it had changed"
    go.set()
    passing.join(10)
    asking.join(10)
    assert not errors, errors
    (answer,) = answers
    assert answer["outcome"] == "placed" and len(answer["nodes"]) == 4  # the committed plan: every node free
    again, _ = lease_actions.do_preview(None, ASK, now=timezone.now())
    assert (again["outcome"], again["nodes"], verdicts(again)) == (
        answer["outcome"],
        answer["nodes"],
        verdicts(answer),
    )


def verdicts(body: dict) -> list[tuple]:
    # The window's times move with the clock between the two previews; the verdicts do not.
    return [(v["node"], v["fit"], v["holds"], v["reason_code"], v["chosen"]) for v in body["verdicts"]]
