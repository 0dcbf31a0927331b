"""Haizea configuration files (INI), so that replay runs a trace under the configuration it was studied with.

This module owns which options exist (Haizea 1.0/1.1's, SEMANTICS §5, plus Slotkeeper's own), checks each
value against its type or its valid values, and hands them on as raw strings under Haizea's names: what an
option *means* is the scheduler's business. A misspelt option is refused, with the section's known options,
because Haizea would refuse it too and a silently ignored "backfiling: off" would replay the wrong experiment.

Multi-configuration files ([multi], [common:<section>], [<profile>:<section>]) expand into one config per
profile, trace and injection, as haizea-generate-configs does. PURE: no Django.
"""

from __future__ import annotations

import configparser
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from leases.traces import parse_resources


class ConfigError(Exception):
    """An unusable config; str() names the file and, where known, the line."""


def _check_int(value: str) -> None:
    int(value)


def _check_float(value: str) -> None:
    float(value)


_BOOLEANS = {"1", "yes", "true", "on", "0", "no", "false", "off"}


def _check_bool(value: str) -> None:
    if value.lower() not in _BOOLEANS:
        raise ValueError("not a boolean (true/false, yes/no, on/off, 1/0)")


def _check_datetime(value: str) -> None:
    datetime.strptime(value, "%Y-%m-%d %H:%M:%S")


def _check_resources(value: str) -> None:
    if value != "in-tracefile" and not value.startswith("file:"):
        parse_resources(value)


def _one_of(*valid: str) -> Callable[[str], None]:
    def check(value: str) -> None:
        if value not in valid:
            raise ValueError(f"not one of {', '.join(valid)}")

    return check


def _any(value: str) -> None:
    """Free text (paths, policy names that may be class paths)."""


INT, FLOAT, BOOL, DATETIME = _check_int, _check_float, _check_bool, _check_datetime
TIMEDELTA = _check_int  # Haizea writes time deltas as whole seconds (SEMANTICS §5).

# Haizea 1.0 and 1.1's options, section by section, with the check each value must pass.
HAIZEA_OPTIONS: dict[str, dict[str, Callable[[str], None]]] = {
    "general": {
        "loglevel": _one_of("STATUS", "INFO", "DEBUG", "VDEBUG"),
        "logfile": _any,
        "mode": _one_of("simulated", "opennebula"),
        "lease-preparation": _one_of("unmanaged", "imagetransfer"),
        "lease-failure-handling": _one_of("cancel", "exit", "exit-raise"),
        "persistence-file": _any,
    },
    "scheduling": {
        "mapper": _any,
        "policy-admission": _any,
        "policy-preemption": _any,
        "policy-host-selection": _any,
        "policy-pricing": _any,
        "wakeup-interval": TIMEDELTA,
        "backfilling": _one_of("off", "aggressive", "conservative", "intermediate"),
        "backfilling-reservations": INT,
        "suspension": _one_of("none", "serial-only", "all"),
        "suspend-rate": FLOAT,
        "resume-rate": FLOAT,
        "suspendresume-exclusion": _one_of("local", "global"),
        "scheduling-threshold-factor": INT,
        "force-scheduling-threshold": TIMEDELTA,
        "override-suspend-time": INT,
        "override-resume-time": INT,
        "migration": _one_of("no", "yes", "yes-notransfer"),
        "non-schedulable-interval": TIMEDELTA,
        "shutdown-time": TIMEDELTA,
        "enactment-overhead": TIMEDELTA,
        "max-delay-duration": INT,
        "max-delay-vm": INT,
        "max-delay-action": _any,
    },
    "simulation": {
        "clock": _one_of("simulated", "real"),
        "starttime": DATETIME,
        "resources": _check_resources,
        "imagetransfer-bandwidth": INT,
        "stop-when": _one_of("all-leases-done", "besteffort-submitted", "besteffort-done", "exact"),
        "stop-when-time": _any,
        "status-message-interval": INT,
        "sanity-check": BOOL,
    },
    "deploy-imagetransfer": {
        "transfer-mechanism": _one_of("unicast", "multicast"),
        "avoid-redundant-transfers": BOOL,
        "force-imagetransfer-time": TIMEDELTA,
        "diskimage-reuse": _one_of("none", "image-caches"),
        "diskimage-cache-size": INT,
    },
    "tracefile": {
        "tracefile": _any,
        "injectionfile": _any,
        "imagefile": _any,
        "annotationfile": _any,
        "runtime-slowdown-overhead": FLOAT,
        "add-overhead": _one_of("none", "besteffort", "all"),
        "bootshutdown-overhead": TIMEDELTA,
        "override-memory": INT,
    },
}

# Slotkeeper's own options. Haizea 1.1 moves suspended VMs' memory at the image-transfer bandwidth; a fleet's
# migration network is usually not its image repository's, so it gets its own figure (Mbit/s).
SLOTKEEPER_OPTIONS: dict[str, dict[str, Callable[[str], None]]] = {
    "scheduling": {"migration-bandwidth": INT},
}

# Sections Haizea knows that say nothing about scheduling (statistics files, the OpenNebula connection): read
# without complaint and dropped.
IGNORED_SECTIONS = frozenset({"accounting", "opennebula"})

KNOWN_OPTIONS: dict[str, tuple[str, ...]] = {
    section: tuple(HAIZEA_OPTIONS.get(section, {})) + tuple(SLOTKEEPER_OPTIONS.get(section, {}))
    for section in HAIZEA_OPTIONS
}

# The [simulation] options the scheduler needs besides [scheduling]: Haizea 1.1 also times migrations by it.
_SCHEDULER_SIMULATION_OPTIONS = ("imagetransfer-bandwidth",)


@dataclass(frozen=True)
class HaizeaConfig:
    path: str
    options: Mapping[str, Mapping[str, str]]
    profile: str | None = None  # the profile a multi-configuration file expanded this config from

    def get(self, section: str, option: str, default: str | None = None) -> str | None:
        return self.options.get(section, {}).get(option, default)

    @property
    def starttime(self) -> datetime | None:
        """The simulated clock's start. Haizea's is a naive local time; it is read as UTC so that it compares
        with the aware datetimes everywhere else and replays the same on every machine."""
        value = self.get("simulation", "starttime")
        return None if value is None else datetime.strptime(value, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)

    @property
    def resources(self) -> str | None:
        return self.get("simulation", "resources")

    @property
    def tracefile(self) -> str | None:
        """As written: the path is on the author's disk, so the replay command supplies the real one."""
        return self.get("tracefile", "tracefile")

    @property
    def injectionfile(self) -> str | None:
        return self.get("tracefile", "injectionfile")

    def scheduling_options(self) -> dict[str, str]:
        """[scheduling] plus the [simulation] options the scheduler needs, under Haizea's names."""
        options = dict(self.options.get("scheduling", {}))
        for name in _SCHEDULER_SIMULATION_OPTIONS:
            value = self.get("simulation", name)
            if value is not None:
                options[name] = value
        return options


def _parse_ini(path: str) -> configparser.RawConfigParser:
    # strict=False: Haizea's Python 2 ConfigParser merged repeated sections rather than refusing the file.
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except configparser.Error as e:
        line = getattr(e, "lineno", None)
        raise ConfigError(f"{path}:{line or 1}: {' '.join(e.message.split())}") from None
    return parser


def _line_of(path: str, section: str, option: str) -> int:
    """The line of `option` in `section`, for messages (configparser does not keep positions)."""
    current = None
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            text = line.strip()
            if text.startswith("[") and text.endswith("]"):
                # A multi-configuration file writes [profile:section]; the option is looked for in any of them.
                current = text[1:-1].strip().rpartition(":")[2]
            elif current == section and text.partition(":")[0].partition("=")[0].strip().lower() == option:
                return lineno
    return 1


def _checked_section(path: str, section: str, items: Mapping[str, str]) -> dict[str, str]:
    if section not in KNOWN_OPTIONS:
        known = ", ".join(f"[{s}]" for s in (*KNOWN_OPTIONS, *sorted(IGNORED_SECTIONS)))
        raise ConfigError(f"{path}: unknown section [{section}]; known sections: {known}")
    checks = {**HAIZEA_OPTIONS[section], **SLOTKEEPER_OPTIONS.get(section, {})}
    for option, value in items.items():
        where = f"{path}:{_line_of(path, section, option)}: [{section}] {option}"
        if option not in checks:
            raise ConfigError(f"{where} is not an option; known options: {', '.join(KNOWN_OPTIONS[section])}")
        try:
            checks[option](value)
        except ValueError as e:
            raise ConfigError(f"{where} = {value!r}: {e}") from None
    return dict(items)


def _options(path: str, sections: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    return {
        name: _checked_section(path, name, items)
        for name, items in sections.items()
        if name not in IGNORED_SECTIONS
    }


def _is_multi(parser: configparser.RawConfigParser) -> bool:
    return parser.has_section("multi") or any(":" in s for s in parser.sections())


def _refuse_pre_1_0(path: str, parser: configparser.RawConfigParser) -> None:
    # The HPDC'08 experiment files predate Haizea 1.0: other sections and option names ("nodes", "bandwidth",
    # "suspendresume-rate"). Saying so beats a list of unknown options that all look like typos.
    if parser.has_section("profiles"):
        raise ConfigError(f"{path}: a pre-1.0 Haizea experiment file ([profiles], [traces], pre-1.0 option "
                          "names), which Haizea 1.x cannot read either")  # fmt: skip


def read_config(path: str | Path) -> HaizeaConfig:
    """A Haizea configuration file; ConfigError for an unknown section or option, or a wrong value."""
    path = str(path)
    parser = _parse_ini(path)
    _refuse_pre_1_0(path, parser)
    if _is_multi(parser):
        raise ConfigError(
            f"{path}: a multi-configuration file ([multi], [profile:section]); use read_multi_config"
        )
    sections = {name: dict(parser.items(name)) for name in parser.sections()}
    return HaizeaConfig(path=path, options=_options(path, sections))


# ------------------------------------------------------------------------------------ multi-configuration


def _files(parser: configparser.RawConfigParser, directory: str, files: str) -> list[str]:
    folder = parser.get("multi", directory)
    return [f"{folder}/{name}" for name in parser.get("multi", files).split()]


def _optional_files(parser: configparser.RawConfigParser, directory: str, files: str) -> list[str | None]:
    # Haizea also runs every trace with no injection at all: the baseline the injected runs are compared with.
    return [*_files(parser, directory, files), None] if parser.has_option("multi", directory) else [None]


def _profiles(parser: configparser.RawConfigParser) -> list[str]:
    names = [s.split(":", 1)[0] for s in parser.sections() if ":" in s]
    return [p for p in dict.fromkeys(names) if p != "common"]


def _profile_sections(parser: configparser.RawConfigParser, profile: str) -> dict[str, dict[str, str]]:
    """The common sections overlaid with the profile's own, keyed by the plain section name."""
    merged: dict[str, dict[str, str]] = {}
    for prefix in ("common", profile):
        for name in parser.sections():
            owner, _, section = name.partition(":")
            if owner == prefix:
                merged.setdefault(section, {}).update(parser.items(name))
    return merged


def read_multi_config(path: str | Path) -> tuple[HaizeaConfig, ...]:
    """One config per profile, trace and injection (including none), in file order, as haizea-generate-configs
    writes them; the trace and injection paths are the file's, to be mapped onto this disk by the caller."""
    path = str(path)
    parser = _parse_ini(path)
    _refuse_pre_1_0(path, parser)
    if not parser.has_section("multi"):
        raise ConfigError(f"{path}: no [multi] section, so not a multi-configuration file; use read_config")
    configs = []
    for profile in _profiles(parser):
        sections = _profile_sections(parser, profile)
        for trace in _files(parser, "tracedir", "tracefiles"):
            for injection in _optional_files(parser, "injectiondir", "injectionfiles"):
                tracefile = {"tracefile": trace} | ({"injectionfile": injection} if injection else {})
                options = _options(path, sections | {"tracefile": sections.get("tracefile", {}) | tracefile})
                configs.append(HaizeaConfig(path=path, options=options, profile=profile))
    return tuple(configs)
