"""The command line: --once, registration and the saved identity, exit codes, JSON logs, the simulated fleet."""

import json
import stat
import threading
import time

import pytest
import requests

from fleet.agent.main import JsonLineFormatter, SimProfile, main, run_simulated_agents


class Answer:
    def __init__(self, status_code, body):
        self.status_code = status_code
        self._body = body

    def json(self):
        return self._body


class FakeServer:
    def __init__(self, status_code=200):
        self.status_code = status_code
        self.heartbeats = {}
        self.lock = threading.Lock()
        self.registrations = []

    def request(self, method, url, *, headers, json, timeout):
        if self.status_code != 200:
            return Answer(self.status_code, {"detail": "Invalid token."})
        if url.endswith("/api/nodes/"):
            self.registrations.append((headers["Authorization"], json))
            return Answer(201, {"id": 12, "name": json["name"], "token": "node-secret-12"})
        if url.endswith("/assignments"):
            return Answer(200, {"instances": []})
        node = int(url.split("/")[-2])
        with self.lock:
            self.heartbeats.setdefault(node, []).append(json)
        return Answer(200, {"status": "online", "server_time": "2025-01-01T00:00:00Z"})


def base_args(tmp_path):
    return ["--server", "http://console", "--work-dir", str(tmp_path), "--once"]


def test_once_sends_one_heartbeat_with_the_hosts_health_and_exits_0(tmp_path):
    server = FakeServer()
    code = main([*base_args(tmp_path), "--node-id", "5", "--token", "t"], transport=server)
    assert code == 0
    [beat] = server.heartbeats[5]
    assert beat["mem_total_mib"] > beat["mem_used_mib"] > 0
    assert beat["instances"] == []


def test_register_saves_the_token_privately_and_the_next_run_uses_it(tmp_path, capsys):
    server = FakeServer()
    args = [*base_args(tmp_path), "--register", "tank", "--operator-token", "op", "--capability", "gpu"]
    assert main(args, transport=server) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["id"], printed["token"]) == (12, "node-secret-12")
    auth, fields = server.registrations[0]
    assert auth == "Bearer op"
    assert fields["name"] == "tank" and fields["capabilities"] == ["gpu"] and fields["cpu_cores"] >= 1
    token_file = tmp_path / "node-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert main(base_args(tmp_path), transport=server) == 0
    assert len(server.heartbeats[12]) == 2, "the saved id and token are the defaults"


def test_registering_an_already_registered_work_dir_is_refused(tmp_path):
    (tmp_path / "node-token").write_text("old\n")
    code = main(
        [*base_args(tmp_path), "--register", "tank", "--operator-token", "op"], transport=FakeServer()
    )
    assert code == 2


def test_no_identity_at_all_is_a_usage_error(tmp_path):
    assert main(base_args(tmp_path), transport=FakeServer()) == 2


def test_a_revoked_token_exits_3_with_a_json_line_that_says_so(tmp_path, capsys):
    code = main(
        [*base_args(tmp_path), "--node-id", "5", "--token", "t"], transport=FakeServer(status_code=401)
    )
    assert code == 3
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[-1]["event"] == "node-refused"
    assert lines[-1]["error"] == "token revoked or invalid for node 5"


def test_an_unreadable_state_file_exits_4_before_anything_starts(tmp_path):
    (tmp_path / "agent-state.json").write_text("{")
    server = FakeServer()
    assert main([*base_args(tmp_path), "--node-id", "5", "--token", "t"], transport=server) == 4
    assert server.heartbeats == {}


def test_a_log_line_is_one_json_object_with_its_fields():
    import logging

    record = logging.LogRecord("slotkeeper.agent", logging.WARNING, __file__, 1, "start-refused", None, None)
    record.fields = {"node": 5, "instance": "7-1-0"}
    line = json.loads(JsonLineFormatter().format(record))
    assert line["event"] == "start-refused" and line["level"] == "warning" and line["instance"] == "7-1-0"


def simulated_heartbeats(tmp_path, nodes, sizes=None) -> dict[int, list[dict]]:
    """Runs a simulated fleet until every node has sent two heartbeats; returns them per node."""
    server = FakeServer()
    stop = threading.Event()
    threads = run_simulated_agents(
        "http://console",
        nodes,
        stop,
        interval=0.05,
        work_root=tmp_path,
        transport_factory=lambda: server,
        sizes=sizes,
    )
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(len(server.heartbeats.get(n, [])) >= 2 for n, _ in nodes):
        time.sleep(0.02)
    stop.set()
    for thread in threads:
        thread.join(timeout=2)
    assert not any(t.is_alive() for t in threads), "the fleet stops with its event"
    return server.heartbeats


def test_the_simulated_fleet_heartbeats_every_node_with_its_own_simulated_health(tmp_path):
    beats = simulated_heartbeats(tmp_path, [(1, "a"), (2, "b")])
    # node 1 is "architect" (60 GiB), node 2 "morpheus" (31757 MiB): measured sizes, not this host's.
    assert beats[1][0]["mem_total_mib"] == 61440
    assert beats[2][0]["mem_total_mib"] == 31757


def test_a_simulated_node_reports_the_size_it_was_registered_with(tmp_path):
    """The demo's nodes declare their sizes; a simulated machine of another size (a profile picked by node id)
    made the placer measure gpu-01 (128 GiB declared) against 31 GiB observed, and call it full."""
    beats = simulated_heartbeats(
        tmp_path, [(4, "d"), (5, "e")], {4: SimProfile("gpu-01", 131072, 32, 1800.0)}
    )
    assert beats[4][0]["mem_total_mib"] == 131072
    assert beats[4][0]["mem_used_mib"] < 131072 * 0.2, "an idle machine of that size"
    assert beats[5][0]["mem_total_mib"] == 31757, "a node without a declared size: a profile"


@pytest.mark.parametrize("flag", ["--interval", "--log-tail-lines"])
def test_numeric_flags_reject_words(tmp_path, flag):
    with pytest.raises(SystemExit):
        main([*base_args(tmp_path), flag, "often"], transport=FakeServer())


def test_requests_is_the_default_transport_and_an_unreachable_server_exits_1(tmp_path):
    # Port 9 (discard) on localhost refuses connections; the agent must say so, not crash.
    code = main(
        [
            "--server",
            "http://127.0.0.1:9",
            "--work-dir",
            str(tmp_path),
            "--once",
            "--node-id",
            "5",
            "--token",
            "t",
        ]
    )
    assert code == 1
    assert requests.Session  # the real client was exercised above
