"""The state file remembers every (instance, generation) started, survives restarts, and is written atomically."""

import json

import pytest

from fleet.agent import state as state_module
from fleet.agent.state import StartRecord, StateStore, StateUnreadable


def test_a_started_generation_is_remembered_by_the_next_agent(tmp_path):
    first = StateStore(tmp_path)
    first.record_start(StartRecord("7-1-0", 2, "process", 1700000000.0, pid=4242, pid_started_at=1.5))
    second = StateStore(tmp_path)
    second.load()
    assert second.get("7-1-0") == StartRecord(
        "7-1-0", 2, "process", 1700000000.0, pid=4242, pid_started_at=1.5
    )


@pytest.mark.parametrize(
    ("offered", "may_start"),
    [(1, False), (2, False), (3, True)],
    ids=["an older generation", "the same generation", "a new generation"],
)
def test_only_a_newer_generation_may_start_again(tmp_path, offered, may_start):
    store = StateStore(tmp_path)
    store.record_start(StartRecord("7-1-0", 2, "sim", 0.0))
    assert store.may_start("7-1-0", offered) is may_start
    assert store.may_start("8-1-0", 0), "an instance never seen may start"


def test_an_outcome_is_recorded_and_survives_a_reload(tmp_path):
    store = StateStore(tmp_path)
    store.record_start(StartRecord("7-1-0", 0, "process", 0.0))
    store.update("7-1-0", status="exited", exit_code=3, detail="exit code 3")
    reloaded = StateStore(tmp_path)
    reloaded.load()
    record = reloaded.get("7-1-0")
    assert (record.status, record.exit_code, record.detail) == ("exited", 3, "exit code 3")


def test_the_file_is_replaced_whole_and_no_temp_file_is_left_behind(tmp_path):
    store = StateStore(tmp_path)
    store.record_start(StartRecord("7-1-0", 0, "process", 0.0))
    store.record_start(StartRecord("8-1-0", 0, "process", 0.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent-state.json"]
    body = json.loads((tmp_path / "agent-state.json").read_text())
    assert body["version"] == 1
    assert {r["instance_id"] for r in body["started"]} == {"7-1-0", "8-1-0"}


def test_a_missing_file_is_a_fresh_node(tmp_path):
    store = StateStore(tmp_path)
    store.load()
    assert store.records() == []


@pytest.mark.parametrize(
    "content",
    [
        '{"version": 1, "started": [',
        '{"version": 99, "started": []}',
        '{"version": 1, "started": [{"x": 1}]}',
        "[]",
    ],
    ids=["truncated", "unknown version", "unknown fields", "not an object"],
)
def test_an_unreadable_file_refuses_to_guess(tmp_path, content):
    (tmp_path / "agent-state.json").write_text(content)
    with pytest.raises(StateUnreadable, match="refusing to start instances that may already run"):
        StateStore(tmp_path).load()


def test_pruning_drops_the_oldest_ended_records_and_never_a_live_one(tmp_path, monkeypatch):
    monkeypatch.setattr(state_module, "MAX_RECORDS", 3)
    store = StateStore(tmp_path)
    store.record_start(StartRecord("live", 0, "sim", 0.0))
    for i in range(4):
        store.record_start(StartRecord(f"done-{i}", 0, "sim", float(i + 1), status="exited"))
    assert sorted(r.instance_id for r in store.records()) == ["done-2", "done-3", "live"]
