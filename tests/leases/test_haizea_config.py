"""Haizea configuration files: every shipped config, and the ones that must be refused (no database)."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from leases.haizea_config import KNOWN_OPTIONS, ConfigError, read_config, read_multi_config
from leases.slottable import Res
from leases.traces import parse_resources
from slotkeeper import shared

CONFIGS = shared.HAIZEA / "configs"
START = datetime(2006, 11, 25, 13, 0, tzinfo=UTC)  # every Haizea test config starts its clock here

# file -> (resources, backfilling, policy-preemption, suspension, suspend-rate, migration, enactment-overhead)
CONFIG_FACTS = {
    "blue-144.conf": ("144 CPU:100,Memory:1024", "aggressive", "ar-preempts-everything", "all", "50", "no", "0"),
    "haizea-1.0-tests-base_config_simulator.conf": (
        "in-tracefile", "aggressive", "ar-preempts-everything", "all", "32", "yes", "2",
    ),
    "haizea-1.1-tests-base_config_simulator.conf": (
        "in-tracefile", "aggressive", "ar-preempts-everything", "all", "32", "yes", "0",
    ),
    "quickstart-sample_trace-equivalent.conf": (
        "in-tracefile", "aggressive", "ar-preempts-everything", "all", "32", "yes", None,
    ),
}  # fmt: skip
MULTI = "haizea-1.0-sample_multi.conf"
PRE_1_0 = "hpdc2008-blue-30days-24h.conf"
CONFIG_FILES = sorted(CONFIGS.iterdir())


def test_the_config_listing_is_the_one_the_facts_describe():
    assert sorted(p.name for p in CONFIG_FILES) == sorted([*CONFIG_FACTS, MULTI, PRE_1_0])


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.name for p in CONFIG_FILES])
def test_every_shipped_config_reads_or_says_why_not(path):
    if path.name == MULTI:
        with pytest.raises(ConfigError, match="multi-configuration file"):
            read_config(path)
        return
    if path.name == PRE_1_0:
        with pytest.raises(ConfigError, match=r"pre-1.0 Haizea experiment file \(\[profiles\], \[traces\]"):
            read_config(path)
        return
    resources, backfilling, preemption, suspension, rate, migration, overhead = CONFIG_FACTS[path.name]
    config = read_config(path)
    options = config.scheduling_options()
    assert (config.starttime, config.resources) == (START, resources)
    assert (options["backfilling"], options["policy-preemption"], options["suspension"]) == (
        backfilling, preemption, suspension,
    )  # fmt: skip
    assert (options["suspend-rate"], options["resume-rate"], options["migration"]) == (rate, rate, migration)
    assert options.get("enactment-overhead") == overhead
    assert options["imagetransfer-bandwidth"] == "100"


def test_the_1_0_test_config_overrides_the_suspend_time_and_the_1_1_one_does_not():
    old = read_config(CONFIGS / "haizea-1.0-tests-base_config_simulator.conf")
    new = read_config(CONFIGS / "haizea-1.1-tests-base_config_simulator.conf")
    assert old.get("scheduling", "override-suspend-time") == "0"
    assert new.get("scheduling", "override-suspend-time") is None
    assert new.get("simulation", "sanity-check") == "true"


def test_the_tracefile_is_kept_as_written_for_the_replay_command_to_override():
    config = read_config(CONFIGS / "haizea-1.1-tests-base_config_simulator.conf")
    assert config.tracefile == "/home/borja/Eclipse Workspace/haizea/tests/preemption.lwf"
    assert config.injectionfile is None  # commented out in the file


def test_blue_144_has_no_tracefile_because_replay_names_the_swf():
    config = read_config(CONFIGS / "blue-144.conf")
    assert config.tracefile is None
    assert parse_resources(config.resources or "") == (Res(cpu=100, mem=1024),) * 144


def test_accounting_is_accepted_and_dropped():
    config = read_config(CONFIGS / "haizea-1.0-tests-base_config_simulator.conf")
    assert "accounting" not in config.options
    assert config.get("general", "lease-failure-handling") == "exit-raise"


# ------------------------------------------------------------------------------------------ multi-configuration


def test_the_sample_multi_config_expands_to_4_profiles_by_2_traces_by_3_injection_choices():
    configs = read_multi_config(CONFIGS / MULTI)
    assert len(configs) == 24
    assert [c.profile for c in configs[::6]] == [
        "nobackfilling",
        "backfilling",
        "backfilling+SR",
        "backfilling+SR+M",
    ]
    assert [(c.tracefile, c.injectionfile) for c in configs[:3]] == [
        ("/usr/share/haizea/traces/multi/withprematureend.lwf", "/usr/share/haizea/traces/multi/inj1.lwf"),
        ("/usr/share/haizea/traces/multi/withprematureend.lwf", "/usr/share/haizea/traces/multi/inj2.lwf"),
        ("/usr/share/haizea/traces/multi/withprematureend.lwf", None),  # the uninjected baseline
    ]


@pytest.mark.parametrize(
    ("profile", "backfilling", "suspension", "migration"),
    [
        ("nobackfilling", "off", "none", "no"),
        ("backfilling", "aggressive", "none", "no"),
        ("backfilling+SR", "aggressive", "all", "no"),
        ("backfilling+SR+M", "aggressive", "all", "yes"),
    ],
)
def test_a_profile_overlays_the_common_sections(profile, backfilling, suspension, migration):
    config = next(c for c in read_multi_config(CONFIGS / MULTI) if c.profile == profile)
    options = config.scheduling_options()
    assert (options["backfilling"], options["suspension"], options["migration"]) == (
        backfilling, suspension, migration,
    )  # fmt: skip
    assert (options["suspend-rate"], config.resources) == ("50", "4  CPU:100 Memory:1024")
    assert config.starttime == START


def test_a_plain_config_is_not_a_multi_config():
    with pytest.raises(ConfigError, match="no \\[multi\\] section"):
        read_multi_config(CONFIGS / "blue-144.conf")


def test_the_pre_1_0_experiment_file_is_no_multi_config_either():
    with pytest.raises(ConfigError, match=r"pre-1\.0"):
        read_multi_config(CONFIGS / PRE_1_0)


# ------------------------------------------------------------------------------------------ refusals


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.conf"
    path.write_text(text)
    return path


BASE = "[general]\nmode: simulated\n\n[scheduling]\nsuspension: all\n"


def test_an_unknown_option_is_refused_with_its_line_and_the_known_options(tmp_path):
    path = write(tmp_path, BASE + "backfiling: off\n")
    with pytest.raises(ConfigError) as caught:
        read_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:6: [scheduling] backfiling is not an option; known options: mapper, ")
    assert message.endswith(", max-delay-action, migration-bandwidth")
    assert "\n" not in message


def test_an_unknown_section_is_refused_with_the_known_sections(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown section \[schedule\]; known sections: \[general\], "):
        read_config(write(tmp_path, BASE + "[schedule]\nbackfilling: off\n"))


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("backfilling: sometimes", "not one of off, aggressive, conservative, intermediate"),
        ("suspend-rate: fast", "could not convert string to float"),
        ("backfilling-reservations: 4.5", "invalid literal for int"),
        ("enactment-overhead: 2s", "invalid literal for int"),
        ("migration-bandwidth: lots", "invalid literal for int"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused(tmp_path, line, problem):
    with pytest.raises(ConfigError, match=f":6: \\[scheduling\\] {line.split(':')[0]} = .*{problem}"):
        read_config(write(tmp_path, BASE + line + "\n"))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[simulation]\nstarttime: 25/11/2006\n", "does not match format"),
        ("[simulation]\nresources: four nodes\n", "is not '<nodes> CPU:<amount>"),
        ("[simulation]\nsanity-check: maybe\n", "not a boolean"),
        ("[general]\nmode: opennebula-ish\n", "not one of simulated, opennebula"),
    ],
)
def test_other_sections_check_their_values_too(tmp_path, text, problem):
    with pytest.raises(ConfigError, match=problem):
        read_config(write(tmp_path, text))


def test_slotkeepers_migration_bandwidth_is_a_scheduling_option(tmp_path):
    config = read_config(write(tmp_path, BASE + "migration-bandwidth: 1000\n"))
    assert config.scheduling_options() == {"suspension": "all", "migration-bandwidth": "1000"}
    assert "migration-bandwidth" in KNOWN_OPTIONS["scheduling"]


def test_a_file_that_is_not_ini_names_its_line(tmp_path):
    with pytest.raises(ConfigError, match=r"x.conf:1: File contains no section headers"):
        read_config(write(tmp_path, "mode: simulated\n"))


def test_a_missing_option_falls_back_to_the_given_default(tmp_path):
    config = read_config(write(tmp_path, BASE))
    assert config.get("scheduling", "backfilling", "aggressive") == "aggressive"
    assert config.get("simulation", "clock") is None
    assert config.starttime is None


def test_a_typo_in_a_multi_config_profile_names_its_line(tmp_path):
    text = "[multi]\ntracedir: /t\ntracefiles: a.lwf\ndatadir: /d\n\n[fast:scheduling]\nsuspension: all\nbackfiling: off\n"
    with pytest.raises(ConfigError, match=r"x.conf:8: \[scheduling\] backfiling is not an option"):
        read_multi_config(write(tmp_path, text))
