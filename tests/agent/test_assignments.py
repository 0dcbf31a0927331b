"""Assignments are validated whole before anything runs, and the late group check counts members by identity."""

import copy

import pytest

from fleet.agent.assignments import (
    Group,
    MalformedAssignment,
    anti_affinity_refusal,
    parse_assignment,
    parse_batch,
)

# The example the server API documents, verbatim in shape.
DOCUMENTED = {
    "id": "7-1-0",
    "lease": 7,
    "vnode": 1,
    "generation": 0,
    "desired_state": "running",
    "driver": "process",
    "spec": {"command": ["sleep", "30"], "env": {"K": "V"}, "cwd": None, "stop_grace_s": 10},
    "resources": {"cpu_cores": 1, "mem_mib": 1024, "disk_gib": 1},
    "groups": [
        {"name": "web", "policy": "anti_affinity", "hard": True, "max_per_node": 1, "members_here": ["8-1-0"]}
    ],
}


def with_change(path: str, value: object) -> dict:
    raw = copy.deepcopy(DOCUMENTED)
    *parents, last = path.split(".")
    target = raw
    for key in parents:
        target = target[key] if not key.isdigit() else target[int(key)]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return raw


DELETE = object()


def test_the_documented_assignment_parses_into_values():
    a = parse_assignment(DOCUMENTED, default_driver="sim")
    assert (a.id, a.lease, a.vnode, a.generation, a.desired_state, a.driver) == (
        "7-1-0",
        7,
        1,
        0,
        "running",
        "process",
    )
    assert a.spec.command == ("sleep", "30")
    assert a.spec.env == {"K": "V"}
    assert a.spec.stop_grace_s == 10.0
    assert a.resources["mem_mib"] == 1024
    assert a.groups == (Group("web", "anti_affinity", True, 1, ("8-1-0",)),)


@pytest.mark.parametrize(
    ("path", "value", "names"),
    [
        ("spec.command", [], "spec.command"),
        ("spec.command", "sleep 30", "spec.command"),
        ("spec.command", ["sleep", 30], "spec.command"),
        ("spec.env", {"K": 1}, "spec.env"),
        ("spec.cwd", 5, "spec.cwd"),
        ("spec.stop_grace_s", -1, "stop_grace_s"),
        ("generation", True, "generation"),
        ("generation", -1, "generation"),
        ("generation", DELETE, "generation"),
        ("desired_state", "paused", "desired_state"),
        ("driver", "docker", "driver"),
        ("id", "../../etc/passwd", "id"),
        ("id", 7, "id"),
        ("groups", {"name": "web"}, "groups"),
        ("groups.0.hard", "yes", "hard"),
        ("groups.0.max_per_node", 0, "max_per_node"),
        ("groups.0.members_here", [8], "members_here"),
        ("resources.mem_mib", "1 GiB", "resources.mem_mib"),
    ],
)
def test_a_malformed_field_is_refused_with_its_name(path, value, names):
    with pytest.raises(MalformedAssignment, match=names.replace(".", r"\.")):
        parse_assignment(with_change(path, value), default_driver="process")


def test_the_sim_driver_needs_no_command_and_reads_its_failure_injection():
    raw = {
        "id": "9-0-0",
        "generation": 2,
        "desired_state": "running",
        "driver": "sim",
        "spec": {"sim": {"crash_after_s": 5}},
    }
    a = parse_assignment(raw, default_driver="process")
    assert a.spec.command == ()
    assert a.spec.sim.crash_after_s == 5.0
    assert a.spec.sim.exit_code == 1


def test_a_missing_driver_falls_back_to_the_agents_default():
    raw = with_change("driver", DELETE)
    assert parse_assignment(raw, default_driver="sim").driver == "sim"


def test_a_batch_keeps_the_good_assignments_and_names_the_bad_one():
    bad = with_change("spec.command", [])
    bad["id"] = "7-2-0"
    good = copy.deepcopy(DOCUMENTED)
    batch = parse_batch({"node": 5, "instances": [bad, good, "junk"]}, default_driver="process")
    assert [a.id for a in batch.valid] == ["7-1-0"]
    assert batch.rejected[0].instance_id == "7-2-0"
    assert batch.rejected[0].detail.startswith("malformed assignment: spec.command is empty")
    assert batch.rejected[1].instance_id is None, "an entry without a usable id cannot be reported by id"


def test_an_id_listed_twice_is_refused_the_second_time():
    batch = parse_batch({"instances": [DOCUMENTED, DOCUMENTED]}, default_driver="process")
    assert len(batch.valid) == 1
    assert "listed twice" in batch.rejected[0].detail


def test_an_answer_without_an_instances_list_is_malformed_as_a_whole():
    with pytest.raises(MalformedAssignment):
        parse_batch({"node": 5}, default_driver="process")


def group_assignment(instance_id: str, group: Group):
    raw = copy.deepcopy(DOCUMENTED)
    raw["id"] = instance_id
    raw["groups"] = [
        {
            "name": group.name,
            "policy": group.policy,
            "hard": group.hard,
            "max_per_node": group.max_per_node,
            "members_here": list(group.members_here),
        }
    ]
    return parse_assignment(raw, default_driver="process")


@pytest.mark.parametrize(
    ("policy", "hard", "limit", "local", "server_says", "refused"),
    [
        ("anti_affinity", True, 1, [], [], False),
        ("anti_affinity", True, 1, [], ["8-1-0"], True),
        ("anti_affinity", True, 1, ["8-1-0"], [], True),
        # The same member known to both sides is ONE member: adding would refuse this legal start.
        ("anti_affinity", True, 2, ["8-1-0"], ["8-1-0"], False),
        ("anti_affinity", True, 2, ["8-1-0"], ["9-1-0"], True),
        # The instance itself, listed by the server as placed here, does not count against itself.
        ("anti_affinity", True, 1, [], ["7-1-0"], False),
        ("anti_affinity", False, 1, ["8-1-0"], ["9-1-0"], False),
        ("affinity", True, 1, ["8-1-0"], [], False),
    ],
)
def test_the_late_check_refuses_only_a_start_past_a_hard_anti_affinity_limit(
    policy, hard, limit, local, server_says, refused
):
    a = group_assignment("7-1-0", Group("web", policy, hard, limit, tuple(server_says)))
    refusal = anti_affinity_refusal(a, {"web": local})
    assert (refusal is not None) == refused
    if refused:
        assert refusal.startswith("anti_affinity: group 'web' allows")
