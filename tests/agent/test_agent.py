"""The reconcile loop, driven one step at a time with an injected clock and a fake server."""

import logging
import sys
import threading
import time

import pytest
import requests

from fleet.agent.agent import EXIT_REFUSED, Agent
from fleet.agent.client import Backoff, ServerClient
from fleet.agent.drivers import ProcessDriver, SimDriver
from fleet.agent.health import Health
from fleet.agent.state import StateStore

NODE = 5
HEALTH = Health(mem_total_mib=61440, mem_used_mib=6144, disk_free_gib=869.0, cpu_pct=12.5, load1=0.4)


class Answer:
    def __init__(self, status_code, body):
        self.status_code = status_code
        self._body = body

    def json(self):
        return self._body


class FakeServer:
    """Plays the server's two node endpoints; `instances` is what it assigns, `heartbeats` what it received."""

    def __init__(self, *instances):
        self.instances = list(instances)
        self.heartbeats = []
        self.status_code = 200
        self.down = False
        self.fenced = False

    def request(self, method, url, *, headers, json, timeout):
        if self.down:
            raise requests.ConnectionError("connection refused")
        if self.status_code != 200:
            return Answer(self.status_code, {"detail": "Invalid token."})
        if self.fenced:
            return Answer(409, {"detail": "node 5 was declared dead (PSU) and is fenced", "code": "fenced"})
        if url.endswith(f"/api/nodes/{NODE}/assignments"):
            return Answer(200, {"node": NODE, "instances": self.instances})
        if url.endswith(f"/api/nodes/{NODE}/heartbeat"):
            self.heartbeats.append(json)
            return Answer(200, {"status": "online", "server_time": "2025-01-01T00:00:00Z"})
        return Answer(404, {})

    def reported(self, instance_id):
        return next(i for i in self.heartbeats[-1]["instances"] if i["id"] == instance_id)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class CountingSim(SimDriver):
    """The sim driver, counting starts: the only honest way to assert "never started twice"."""

    def __init__(self):
        self.starts = []

    def start(self, assignment, now):
        self.starts.append((assignment.id, assignment.generation))
        return super().start(assignment, now)


def sim(instance_id="7-1-0", generation=0, desired="running", groups=(), **sim_spec):
    return {
        "id": instance_id,
        "generation": generation,
        "desired_state": desired,
        "driver": "sim",
        "spec": {"sim": sim_spec} if sim_spec else {},
        "resources": {"mem_mib": 1024},
        "groups": list(groups),
    }


def web_group(members_here=(), hard=True, max_per_node=1):
    return {
        "name": "web",
        "policy": "anti_affinity",
        "hard": hard,
        "max_per_node": max_per_node,
        "members_here": list(members_here),
    }


def make_agent(tmp_path, server, driver=None, clock=None, drivers=None):
    state = StateStore(tmp_path)
    state.load()
    agent = Agent(
        ServerClient("http://console", NODE, "node-secret", server),
        drivers or {"sim": driver or CountingSim()},
        state,
        lambda: HEALTH,
        tmp_path,
        clock=clock or Clock(),
        wall_clock=lambda: 1700000000.0,
    )
    agent.recover()
    return agent


def test_an_assigned_instance_is_started_and_reported_running_with_the_hosts_health(tmp_path):
    server = FakeServer(sim())
    driver = CountingSim()
    make_agent(tmp_path, server, driver).step()
    assert driver.starts == [("7-1-0", 0)]
    beat = server.heartbeats[-1]
    assert (beat["mem_total_mib"], beat["mem_used_mib"], beat["disk_free_gib"]) == (61440, 6144, 869.0)
    assert server.reported("7-1-0") | {"log_tail": None} == {
        "id": "7-1-0",
        "generation": 0,
        "status": "running",
        "exit_code": None,
        "log_tail": None,
        "detail": "",
    }


def test_a_running_instance_is_not_started_again_on_the_next_step(tmp_path):
    server = FakeServer(sim())
    driver = CountingSim()
    agent = make_agent(tmp_path, server, driver)
    for _ in range(3):
        agent.step()
    assert driver.starts == [("7-1-0", 0)]


def test_across_an_agent_restart_a_started_instance_is_reported_lost_and_not_started_twice(tmp_path):
    server = FakeServer(sim())
    make_agent(tmp_path, server).step()

    driver = CountingSim()
    restarted = make_agent(tmp_path, server, driver)
    restarted.step()
    assert driver.starts == [], "the same (id, generation) never runs twice on one node"
    report = server.reported("7-1-0")
    assert report["status"] == "exited" and report["exit_code"] is None
    assert report["detail"].startswith("lost:")

    server.instances = [sim(generation=1)]
    restarted.step()
    assert driver.starts == [("7-1-0", 1)], "a NEW generation from the server starts it again"
    assert server.reported("7-1-0")["status"] == "running"


def test_across_an_agent_restart_a_still_running_process_is_adopted_not_started_again(tmp_path):
    command = [sys.executable, "-c", "import time\nprint('up', flush=True)\ntime.sleep(60)"]
    server = FakeServer(
        {
            "id": "7-1-0",
            "generation": 0,
            "desired_state": "running",
            "driver": "process",
            "spec": {"command": command, "stop_grace_s": 0},
        }
    )
    first = make_agent(tmp_path, server, drivers={"process": ProcessDriver(tmp_path)}, clock=time.monotonic)
    first.step()
    pid = first.entries["7-1-0"].handle.pid

    second = make_agent(tmp_path, server, drivers={"process": ProcessDriver(tmp_path)}, clock=time.monotonic)
    try:
        second.step()
        assert second.entries["7-1-0"].handle.pid == pid
        assert server.reported("7-1-0")["status"] == "running"
    finally:
        server.instances[0]["desired_state"] = "stopped"
        for _ in range(200):
            second.step()
            if server.reported("7-1-0")["status"] == "stopped":
                break
            time.sleep(0.02)
    assert server.reported("7-1-0")["status"] == "stopped"


def test_a_crash_is_reported_with_its_exit_code_and_left_for_the_server_to_restart(tmp_path):
    server = FakeServer(sim(crash_after_s=5, exit_code=3))
    driver = CountingSim()
    clock = Clock()
    agent = make_agent(tmp_path, server, driver, clock)
    agent.step()
    clock.now += 6
    agent.step()
    agent.step()
    report = server.reported("7-1-0")
    assert (report["status"], report["exit_code"]) == ("exited", 3)
    assert report["log_tail"][-1] == "sim: crashing after 5 s with exit code 3"
    assert driver.starts == [("7-1-0", 0)], "the agent has no restart policy of its own"


def test_a_hard_anti_affinity_limit_refuses_the_start_and_says_why(tmp_path):
    server = FakeServer(sim(groups=[web_group(members_here=["8-1-0"])]))
    driver = CountingSim()
    make_agent(tmp_path, server, driver).step()
    assert driver.starts == []
    report = server.reported("7-1-0")
    assert report["status"] == "failed"
    assert report["detail"] == "anti_affinity: group 'web' allows 1 per node and 8-1-0 already here"


def test_the_late_check_counts_what_the_agent_itself_already_runs(tmp_path):
    # The server's members_here is empty for both: it placed them in one burst (seed 002's two evacuations).
    server = FakeServer(sim("7-1-0", groups=[web_group()]), sim("8-1-0", groups=[web_group()]))
    driver = CountingSim()
    make_agent(tmp_path, server, driver).step()
    assert driver.starts == [("7-1-0", 0)]
    assert server.reported("8-1-0")["detail"].startswith(
        "anti_affinity: group 'web' allows 1 per node and 7-1-0"
    )


def test_a_refused_start_stays_refused_until_the_server_sends_a_new_generation(tmp_path):
    server = FakeServer(sim(groups=[web_group(members_here=["8-1-0"])]))
    driver = CountingSim()
    agent = make_agent(tmp_path, server, driver)
    agent.step()
    server.instances = [sim(groups=[web_group()])]
    agent.step()
    assert driver.starts == [], "the refusal is this generation's outcome"
    server.instances = [sim(generation=1, groups=[web_group()])]
    agent.step()
    assert driver.starts == [("7-1-0", 1)]


def test_a_start_waits_for_a_group_member_that_is_being_stopped_here(tmp_path):
    old = sim("8-1-0", groups=[web_group()])
    server = FakeServer(old)
    driver = CountingSim()
    agent = make_agent(tmp_path, server, driver)
    agent.step()
    agent.entries["8-1-0"].handle.poll = lambda now: agent.entries["8-1-0"].last  # ignores SIGTERM for now
    server.instances = [
        sim("8-1-0", desired="stopped", groups=[web_group()]),
        sim("7-1-0", groups=[web_group()]),
    ]
    agent.step()
    assert server.reported("7-1-0")["status"] == "starting"
    assert server.reported("7-1-0")["detail"] == "waiting for a group member on this node to stop"
    del agent.entries["8-1-0"].handle.poll
    agent.step()
    agent.step()
    assert driver.starts == [("8-1-0", 0), ("7-1-0", 0)]


def test_a_malformed_assignment_is_reported_failed_and_the_rest_still_run(tmp_path):
    broken = {"id": "9-1-0", "generation": 0, "desired_state": "running", "driver": "process", "spec": {}}
    server = FakeServer(broken, sim())
    driver = CountingSim()
    make_agent(tmp_path, server, driver).step()
    assert driver.starts == [("7-1-0", 0)]
    report = server.reported("9-1-0")
    assert report["status"] == "failed"
    assert (
        report["detail"]
        == "malformed assignment: spec.command is empty: the process driver has nothing to run"
    )


def test_a_garbled_assignment_for_a_running_instance_does_not_stop_it(tmp_path):
    server = FakeServer(sim())
    agent = make_agent(tmp_path, server)
    agent.step()
    server.instances = [sim() | {"generation": "zero"}]
    agent.step()
    assert agent.entries["7-1-0"].stop_reason is None
    report = server.reported("7-1-0")
    assert report["status"] == "running"
    assert "malformed assignment: generation" in report["detail"]


def test_a_start_that_fails_is_reported_with_the_os_error_and_the_agent_carries_on(tmp_path):
    server = FakeServer(
        {
            "id": "7-1-0",
            "generation": 0,
            "desired_state": "running",
            "driver": "process",
            "spec": {"command": ["slotkeeper-no-such-command-xyz"]},
        },
        sim("8-1-0"),
    )
    agent = make_agent(tmp_path, server, drivers={"process": ProcessDriver(tmp_path), "sim": SimDriver()})
    agent.step()
    agent.step()
    report = server.reported("7-1-0")
    assert report["status"] == "failed"
    assert "No such file or directory" in report["detail"]
    assert server.reported("8-1-0")["status"] == "running"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda server: server.instances.__setitem__(0, sim(desired="stopped")), "desired_state is stopped"),
        (lambda server: server.instances.clear(), "no longer assigned to this node"),
    ],
    ids=["desired stopped", "no longer assigned"],
)
def test_an_instance_the_server_no_longer_wants_is_stopped(tmp_path, change, reason):
    server = FakeServer(sim())
    agent = make_agent(tmp_path, server)
    agent.step()
    change(server)
    agent.step()
    assert agent.entries["7-1-0"].stop_reason == reason
    agent.step()
    assert server.instances == [] or server.reported("7-1-0")["status"] == "stopped"
    assert "7-1-0" not in agent.entries or agent.entries["7-1-0"].last.status == "stopped"


def test_a_new_generation_replaces_the_old_one_only_after_it_has_stopped(tmp_path):
    server = FakeServer(sim())
    driver = CountingSim()
    agent = make_agent(tmp_path, server, driver)
    agent.step()
    server.instances = [sim(generation=1)]
    agent.step()
    assert driver.starts == [("7-1-0", 0)]
    assert server.reported("7-1-0")["detail"] == "waiting for generation 0 to stop"
    agent.step()
    assert driver.starts == [("7-1-0", 0), ("7-1-0", 1)]


def test_a_revoked_token_stops_the_loop_with_a_clear_message(tmp_path, caplog):
    server = FakeServer(sim())
    server.status_code = 401
    agent = make_agent(tmp_path, server)
    with caplog.at_level(logging.ERROR, logger="slotkeeper.agent"):
        code = agent.run(threading.Event(), interval=0.01)
    assert code == EXIT_REFUSED
    assert caplog.records[-1].fields["error"] == "token revoked or invalid for node 5"


def test_while_the_server_is_away_the_agent_backs_off_and_its_instances_keep_running(tmp_path):
    server = FakeServer(sim())
    clock = Clock()
    agent = make_agent(tmp_path, server, clock=clock)
    agent.step()
    server.down = True
    backoff = Backoff(base_s=1.0, cap_s=8.0, rng=lambda: 1.0)
    delays = [agent._sync_or_delay(clock.now, 5.0, backoff) for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert agent.entries["7-1-0"].live and agent.entries["7-1-0"].stop_reason is None
    server.down = False
    assert agent._sync_or_delay(clock.now, 5.0, backoff) == 5.0
    assert backoff.failures == 0


def test_a_fenced_node_stops_every_instance_starts_none_and_keeps_asking(tmp_path):
    # An operator declared the node dead while its agent still ran: its work is moved elsewhere, so nothing here
    # may go on running (no instance runs twice), and the agent waits to be re-admitted instead of exiting.
    server = FakeServer(sim(), sim("8-1-0"))
    clock = Clock()
    driver = CountingSim()
    agent = make_agent(tmp_path, server, driver=driver, clock=clock)
    agent.step()
    assert len(driver.starts) == 2
    server.fenced = True
    backoff = Backoff(base_s=1.0, cap_s=8.0, rng=lambda: 1.0)
    assert agent._sync_or_delay(clock.now, 5.0, backoff) == 5.0
    assert all(e.stop_reason and "fenced" in e.stop_reason for e in agent.entries.values())
    assert agent.server_status == "fenced"
    for _ in range(3):
        clock.now += 5
        agent.poll_local(clock.now)
        assert agent._sync_or_delay(clock.now, 5.0, backoff) == 5.0
    assert len(driver.starts) == 2, "a fenced agent starts nothing"
    server.fenced = False
    server.instances = [sim("9-1-0")]
    clock.now += 5
    assert agent._sync_or_delay(clock.now, 5.0, backoff) == 5.0
    assert driver.starts[-1] == ("9-1-0", 0)
