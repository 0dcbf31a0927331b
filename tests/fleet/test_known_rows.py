"""The fleet read fetches again only the node rows that changed since this process last read them (PostgreSQL,
fleet/known_rows.py), and every read gives exactly what a full read gives: through every kind of change, inside
transactions that wrote, and on SQLite, where every read is a full one."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from fleet import known_rows, placement
from fleet.models import Node
from tests.conftest import requires_postgres


@pytest.fixture(autouse=True)
def _nothing_known():
    known_rows.forget()
    yield
    known_rows.forget()


def full_read() -> list[tuple]:
    """The fleet as the queryset reads it, every row, through Django's own converters."""
    return list(placement._fleet_query())


def rows() -> list[tuple]:
    got = placement._fleet_rows()
    return [(*row[:7], None if row[7] is None else float(row[7]), *row[8:]) for row in got]


def add_nodes(n: int, start: int = 0) -> list[Node]:
    now = timezone.now()
    return Node.objects.bulk_create(
        Node(
            name=f"node-{i:03d}", token_digest=f"t{i}", cpu_cores=16, mem_total_mib=61440, disk_total_gib=1000,
            capabilities=["kvm"] if i % 3 else [], status="online", last_heartbeat_at=now if i % 5 else None,
            obs_mem_total_mib=61440, obs_mem_used_mib=4000 + i, obs_disk_free_gib=500.5, obs_cpu_pct=3.0,
            idle_baseline_mib=3500 if i % 2 else None,
        )
        for i in range(start, start + n)
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_every_read_equals_a_full_read_through_changes_of_every_kind():
    nodes = add_nodes(40)
    first, last = nodes[0].pk, nodes[-1].pk
    changes = [
        lambda: None,
        lambda: Node.objects.filter(pk=first).update(obs_mem_used_mib=9000, last_heartbeat_at=timezone.now()),
        lambda: Node.objects.filter(pk__gt=first + 10).update(obs_mem_used_mib=F("obs_mem_used_mib") + 1),
        lambda: Node.objects.filter(pk=first + 3).update(status="draining", drain_reason="disk swap"),
        lambda: Node.objects.filter(pk=first + 4).update(capabilities=["kvm", "gpu"], name="renamed"),
        lambda: add_nodes(2, start=100),
        lambda: Node.objects.filter(pk=last).delete(),
        lambda: Node.objects.filter(pk__lt=first + 5).delete(),
        lambda: None,
    ]
    assert rows() == full_read()
    for change in changes:
        change()
        assert rows() == full_read()


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_read_fetches_again_only_the_rows_that_changed():
    nodes = add_nodes(50)
    rows()
    before = (known_rows.stats.partial, known_rows.stats.fetched)
    assert rows() == full_read()
    assert (known_rows.stats.partial, known_rows.stats.fetched) == (
        before[0] + 1,
        before[1],
    )  # nothing changed
    Node.objects.filter(pk__in=[nodes[7].pk, nodes[30].pk]).update(obs_cpu_pct=99.0)
    assert rows() == full_read()
    assert known_rows.stats.fetched == before[1] + 2


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_every_read_is_the_plain_full_one(django_assert_num_queries):
    """A row a transaction wrote twice keeps one xmin while its contents change: inside a transaction (a planning
    pass) the fleet read is the one plain statement, and it remembers nothing."""
    (node,) = add_nodes(1)
    rows()
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(obs_mem_used_mib=1)
        with django_assert_num_queries(1):
            got = rows()
        assert got == full_read()
        Node.objects.filter(pk=node.pk).update(obs_mem_used_mib=2)
        assert rows() == full_read() and rows()[0][9] == 2
        transaction.set_rollback(True)
    assert rows() == full_read() and rows()[0][9] == 4000  # rolled back: the committed row again


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_asked_inside_a_transaction_that_wrote_the_row_cache_reads_every_row_and_remembers_none():
    """The second guard, should a read inside a transaction come to fleet/known_rows.py all the same: a savepoint's
    writes give the whole transaction an id, which the list of versions reports."""
    (node,) = add_nodes(1)
    rows()
    with transaction.atomic():
        with transaction.atomic():
            Node.objects.filter(pk=node.pk).update(obs_mem_used_mib=1)
            full = known_rows.stats.full
            assert placement._changed_rows(connection)[0][9] == 1
            Node.objects.filter(pk=node.pk).update(obs_mem_used_mib=2)
            assert placement._changed_rows(connection)[0][9] == 2
            assert known_rows.stats.full == full + 2
        transaction.set_rollback(True)
    assert rows() == full_read() and rows()[0][9] == 4000


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_when_most_rows_changed_the_read_is_one_plain_statement():
    add_nodes(10)
    rows()
    full = known_rows.stats.full
    Node.objects.update(obs_cpu_pct=F("obs_cpu_pct") + 1)  # every node heartbeated since
    assert rows() == full_read()
    assert known_rows.stats.full == full + 1


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_read_fetches_every_row_again_when_the_last_full_read_is_old(monkeypatch):
    add_nodes(3)
    rows()
    full = known_rows.stats.full
    rows()
    assert known_rows.stats.full == full
    monkeypatch.setattr(known_rows, "FULL_EVERY_S", 0.0)
    assert rows() == full_read()
    assert known_rows.stats.full == full + 1


@requires_postgres
@pytest.mark.django_db(transaction=True)
def test_a_row_changed_and_then_deleted_between_the_two_statements_is_gone(monkeypatch):
    nodes = add_nodes(5)
    victim = nodes[2].pk
    rows()
    Node.objects.filter(pk=victim).update(obs_cpu_pct=50.0)
    real = known_rows.read

    def racing(connection, versions, every, some):
        def deleted_first(ids):
            Node.objects.filter(pk=victim).delete()  # another process, between the version list and the fetch
            return some(ids)

        return real(connection, versions, every, deleted_first)

    monkeypatch.setattr(known_rows, "read", racing)
    assert rows() == full_read()
    assert victim not in [row[0] for row in rows()]
