"""`manage.py replay TRACE [--config INI] [--json]`: run a Haizea trace through the scheduler and print metrics."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leases.haizea_config import ConfigError, HaizeaConfig, read_config
from leases.replay import ReplayResult, as_json, replay, setup
from leases.traces import Trace, TraceError, read_trace

# Every shipped Haizea config starts its clock here; used when no config (or no starttime) is given.
DEFAULT_START = datetime(2006, 11, 25, 13, 0, 0, tzinfo=UTC)


class Command(BaseCommand):
    help = "Replay a Haizea workload (LWF or SWF) on a simulated clock and print its metrics."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("trace", nargs="?", help="trace file; wins over the config's tracefile")
        parser.add_argument("--config", help="Haizea INI config (scheduling options, resources, starttime)")
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        haizea = _config(options["config"])
        trace = _trace(options["trace"] or (haizea.tracefile if haizea else None))
        try:
            capacities, config = setup(trace, haizea)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        start = (haizea.starttime if haizea else None) or DEFAULT_START
        result = replay(
            trace,
            capacities,
            config,
            progress=self._progress(len(trace.leases)),
            label=lambda t: (start + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S"),
        )
        if options["json"]:
            self.stdout.write(json.dumps(as_json(result, start)))
        else:
            self._print(result)

    def _progress(self, total: int) -> Any:
        last = [time.monotonic()]

        def report(t: float, submitted: int, _: int) -> None:
            if time.monotonic() - last[0] >= 1.0:
                last[0] = time.monotonic()
                self.stderr.write(f"replay: t={t / 86400:.2f} days, {submitted}/{total} leases submitted")

        return report

    def _print(self, result: ReplayResult) -> None:
        m = result.metrics
        self.stdout.write(f"{result.trace.name}: {m.leases} leases, {result.steps} steps")
        for key, value in vars(m).items():
            self.stdout.write(f"  {key}: {'-' if value is None else round(value, 3)}")


def _config(path: str | None) -> HaizeaConfig | None:
    if not path:
        return None
    try:
        return read_config(path)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"{path}: {exc.strerror}") from None


def _trace(path: str | None) -> Trace:
    if not path:
        raise CommandError("no trace: give TRACE or a config whose [tracefile] names one")
    try:
        return read_trace(path)
    except TraceError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"{path}: {exc.strerror}") from None
