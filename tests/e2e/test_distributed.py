"""The distributed run end to end (issue 6): a lease runs a real command on a node, a killed process is restarted,
a killed agent's node dies and its work is moved once an operator approves, and consoles on both Daphne
processes see the same events."""

from __future__ import annotations

import pytest

from tests.e2e.harness import SLEEPER, Api, Cluster, consoles, instance_processes, lease_body, say, wait_for

# One cluster and one e2e database for all of them: under pytest-xdist they run on one worker, in turn.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e"), pytest.mark.timeout(180)]


@pytest.fixture
def submit(cluster: Cluster):
    """Submits leases through the API and cancels them afterwards, so each test leaves the fleet empty."""
    submitted: list[int] = []

    def run(body: dict, api: Api | None = None) -> int:
        response = (api or cluster.api(0)).post("/api/leases/", body)
        assert response.status_code == 201, response.text
        submitted.append(response.json()["id"])
        return submitted[-1]

    yield run
    for lease_id in submitted:
        cluster.api(1).post(f"/api/leases/{lease_id}/cancel", {"reason": "end of test"})


def running(api: Api, lease_id: int, *, other_than: dict | None = None) -> dict | None:
    """The lease's running instance, or None; `other_than` skips an earlier instance (same id or same node)."""
    for inst in api.results("/api/instances/", lease=lease_id, state="running"):
        if other_than is None or inst["iid"] != other_than["iid"]:
            return inst
    return None


def test_a_lease_runs_a_real_command_on_the_node_its_instance_is_placed_on(cluster: Cluster, submit):
    api = cluster.api(0)
    lease_id = submit(lease_body("e2e-runs-a-command"))
    inst = wait_for(lambda: running(api, lease_id), 30, f"lease {lease_id}'s instance to run")
    say(f"lease {lease_id} runs as {inst['iid']} on {inst['node']}")

    [proc] = wait_for(
        lambda: instance_processes(cluster.tmp).get(inst["iid"]), 10, f"a process for {inst['iid']}"
    )
    assert proc.cmdline() == SLEEPER
    # The process belongs to the agent of the node the server placed the instance on, not to any agent.
    assert proc.cwd().startswith(str(cluster.agent_of(inst["node_id"]).work_dir))


def test_a_killed_instance_process_is_restarted_as_a_new_generation(cluster: Cluster, submit):
    api = cluster.api(0)
    lease_id = submit(lease_body("e2e-restarted"))
    first = wait_for(lambda: running(api, lease_id), 30, f"lease {lease_id}'s instance to run")
    [proc] = wait_for(lambda: instance_processes(cluster.tmp).get(first["iid"]), 10, "its process")

    proc.kill()
    say(f"killed {first['iid']} (pid {proc.pid})")

    second = wait_for(lambda: running(api, lease_id, other_than=first), 30, "a new generation running")
    assert second["generation"] > first["generation"]
    assert second["node_id"] == first["node_id"]
    [new_proc] = wait_for(lambda: instance_processes(cluster.tmp).get(second["iid"]), 10, "the new process")
    assert new_proc.pid != proc.pid
    detail = api.get(f"/api/instances/{second['iid']}/")
    decisions = [(r["decision"], r["reason"]) for r in detail["restarts"]]
    assert any(d == "restart" and "exit code -9" in why for d, why in decisions), decisions


def test_a_killed_agent_makes_its_node_dead_and_an_approved_reschedule_runs_the_work_elsewhere(
    cluster: Cluster, submit
):
    api = cluster.api(0)
    lease_id = submit(lease_body("e2e-rescheduled"))
    lost = wait_for(lambda: running(api, lease_id), 30, f"lease {lease_id}'s instance to run")
    agent = cluster.agent_of(lost["node_id"])
    agent.proc.kill9()
    say(f"killed the agent of {agent.name}; its node should go offline, then dead")
    try:
        seen: list[str] = []

        def dead() -> bool:
            status = api.get(f"/api/nodes/{agent.node_id}/")["status"]
            seen.append(status)
            return status == "dead"

        wait_for(dead, 40, f"{agent.name} to be declared dead", interval=0.2)
        sweeps = [a for (a,) in cluster.sql(AUDIT_OF_NODE, str(agent.node_id))]
        # A sweep can find the node past both limits at once; the audit still records both steps, in order.
        assert sweeps[-2:] == ["node.offline", "node.dead"], (sweeps, seen)

        proposal = wait_for(
            lambda: next(
                (
                    r
                    for r in api.results("/api/reschedules/", status="pending")
                    if r["instance"] == lost["iid"]
                ),
                None,
            ),
            20,
            f"a pending reschedule of {lost['iid']}",
        )
        assert proposal["cause"] == "node_dead"
        assert proposal["proposed_node"] not in (None, agent.name)

        response = cluster.api(1).post(f"/api/reschedules/{proposal['id']}/approve")
        assert response.status_code == 200, response.text
        approval = response.json()
        assert approval["ok"] is True, approval
        say(f"approved: {approval['message']}")

        moved = wait_for(lambda: running(api, lease_id, other_than=lost), 30, "the work running elsewhere")
        assert moved["iid"] == approval["new_instance"]
        assert moved["node_id"] != agent.node_id
        [proc] = wait_for(lambda: instance_processes(cluster.tmp).get(moved["iid"]), 10, "its new process")
        assert proc.cwd().startswith(str(cluster.agent_of(moved["node_id"]).work_dir))
    finally:
        cluster.restart_agent(agent)
        wait_for(lambda: api.get(f"/api/nodes/{agent.node_id}/")["status"] == "online", 30, "the node back")


AUDIT_OF_NODE = (
    "SELECT action FROM slotkeeper_auditentry WHERE target_type = 'node' AND target_id = %s"
    " AND action IN ('node.offline', 'node.dead') ORDER BY at, id"
)


def test_consoles_on_both_daphnes_see_the_same_events(cluster: Cluster, submit):
    with consoles(cluster) as (a, b):
        node = cluster.agents[0].node_id
        # Heartbeats reach the second Daphne only; the first relays them through Redis.
        for console in (a, b):
            wait_for(
                lambda c=console: c.saw("node-changed", node=node), 10, f"node-changed on {console.base}"
            )

        mark_a, mark_b = a.mark(), b.mark()
        via_first = submit(lease_body("e2e-seen-via-first", driver="sim"), cluster.api(0))
        via_second = submit(lease_body("e2e-seen-via-second", driver="sim"), cluster.api(1))
        for console, mark in ((a, mark_a), (b, mark_b)):
            for lease_id in (via_first, via_second):
                wait_for(
                    lambda c=console, m=mark, i=lease_id: c.saw("lease-changed", m, lease=i),
                    10,
                    f"lease-changed of lease {lease_id} on {console.base}",
                )
        assert a.hellos == b.hellos == 1
