"""Host health comes from psutil; simulated health drifts within bounds and charges young instances lightly."""

from fleet.agent.health import SimulatedHealth, read_host_health


def test_host_health_reads_plausible_numbers_for_the_work_dir(tmp_path):
    health = read_host_health(tmp_path)
    assert health.mem_total_mib > health.mem_used_mib > 0
    assert health.disk_free_gib > 0
    assert 0.0 <= health.cpu_pct <= 100.0
    assert health.load1 >= 0.0
    assert set(health.as_payload()) == {"mem_total_mib", "mem_used_mib", "disk_free_gib", "cpu_pct", "load1"}


def test_a_young_simulated_instance_holds_an_eighth_of_its_claim_and_all_of_it_after_a_minute():
    # morpheus in seed 001: two young 8 GiB VMs showed ~1 GiB each, so observed memory under-states commitment.
    claims = [(8192.0, 0.0)]
    sim = SimulatedHealth(31757, 8, 312.0, seed=3, claims=lambda: claims)
    idle = SimulatedHealth(31757, 8, 312.0, seed=3)
    young = sim().mem_used_mib - idle().mem_used_mib
    assert 1000 <= young <= 1100
    claims[:] = [(8192.0, 120.0)]
    idle()
    assert 8100 <= sim().mem_used_mib - idle().mem_used_mib <= 8300


def test_simulated_health_drifts_but_stays_within_its_bounds():
    sim = SimulatedHealth(61440, 16, 869.0, seed=1)
    readings = [sim() for _ in range(2000)]
    used = {r.mem_used_mib for r in readings}
    assert len(used) > 100, "the numbers move over time"
    assert all(0.05 * 61440 <= u <= 0.15 * 61440 + 1 for u in used)
    assert all(0.0 <= r.cpu_pct <= 100.0 for r in readings)
