"""`manage.py replay`: run Haizea workloads through the scheduler and print their metrics.

    replay TRACE [--config INI] [--inject FILE] [--json] [--csv FILE] [--plot FILE.svg]
    replay --sweep MULTI.conf [--jobs N] [--json] [--csv FILE]

A config's [tracefile] tracefile and injectionfile are used when TRACE or --inject are not given; paths written
for another disk are looked for beside the config and under the shared Haizea material by their trailing parts.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from leases.haizea_config import ConfigError, HaizeaConfig, read_config, read_multi_config
from leases.replay import (
    SWEEP_COLUMNS,
    ForecastAccuracy,
    Metrics,
    ReplayResult,
    SweepRow,
    as_json,
    load_workload,
    locate,
    replay,
    setup,
    sweep,
    sweep_record,
    sweep_runs,
    timeline,
)
from leases.traces import Trace, TraceError
from slotkeeper import shared

# Every shipped Haizea config starts its clock here; used when no config (or no starttime) is given.
DEFAULT_START = datetime(2006, 11, 25, 13, 0, 0, tzinfo=UTC)
PLOT_HINT = "--plot needs matplotlib, an optional extra: pip install 'slotkeeper[plot]'"


class Command(BaseCommand):
    help = "Replay a Haizea workload (LWF or SWF, plus AR injections) on a simulated clock and print its metrics."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("trace", nargs="?", help="trace file; wins over the config's tracefile")
        parser.add_argument("--config", help="Haizea INI config (scheduling options, resources, starttime)")
        parser.add_argument(
            "--inject", metavar="FILE", help="AR injection file; wins over the config's injectionfile"
        )
        parser.add_argument(
            "--sweep",
            metavar="CONFIG",
            help="Haizea multi-config: replay every profile x trace x injection, one result line each",
        )
        parser.add_argument(
            "--jobs", type=int, default=0, help="worker processes for --sweep (default: one per core)"
        )
        parser.add_argument("--json", action="store_true", help="print exactly one JSON object")
        parser.add_argument(
            "--csv", metavar="FILE", help="write the metrics as a CSV table (one row per run)"
        )
        parser.add_argument(
            "--plot", metavar="FILE.svg", help="draw utilisation and queue length over time (one run)"
        )
        parser.add_argument(
            "--forecast-accuracy",
            action="store_true",
            help="also measure the queue forecast: each best-effort lease's estimated start at submission "
            "against its actual start (slower: a forecast at every step with new queued leases)",
        )
        parser.add_argument(
            "--exact-runtimes",
            action="store_true",
            help="every lease runs its whole requested duration (no early ends)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["sweep"]:
            if options["plot"] or options["trace"] or options["config"] or options["inject"]:
                raise CommandError("--sweep takes its traces and configs from the multi-config alone")
            self._sweep(options)
            return
        haizea = _config(options["config"])
        roots = _roots(options["config"])
        # A file named on the command line is taken as given; one named in a config may need locating.
        tracefile = options["trace"] or (haizea and haizea.tracefile and locate(haizea.tracefile, roots))
        injectionfile = options["inject"] or (
            haizea and haizea.injectionfile and locate(haizea.injectionfile, roots)
        )
        if not tracefile:
            raise CommandError("no trace: give TRACE or a config whose [tracefile] names one")
        trace = _workload(Path(tracefile), Path(injectionfile) if injectionfile else None)
        try:
            capacities, config = setup(trace, haizea)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        start = (haizea.starttime if haizea else None) or DEFAULT_START
        plot = _pyplot() if options["plot"] else None  # refuse before a long replay, not after it
        cpu = time.process_time()
        accuracy = ForecastAccuracy() if options["forecast_accuracy"] else None
        result = replay(
            trace,
            capacities,
            config,
            progress=self._progress(len(trace.leases)),
            label=lambda t: (start + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S"),
            accuracy=accuracy,
            exact_runtimes=options["exact_runtimes"],
        )
        if options["csv"]:
            row = SweepRow(haizea.profile if haizea else None, Path(trace.path).stem, trace.injection,
                           result.metrics, result.steps, time.process_time() - cpu)  # fmt: skip
            _write_csv(options["csv"], [row])
        if plot is not None:
            _plot(plot, result, options["plot"])
        if options["json"]:
            out = as_json(result, start)
            if accuracy is not None:
                out["forecast_accuracy"] = accuracy.summary()
            self.stdout.write(json.dumps(out))
        else:
            self._print(result)
            if accuracy is not None:
                self._print_accuracy(accuracy, options["exact_runtimes"])

    # -- sweep -------------------------------------------------------------------------------------------

    def _sweep(self, options: dict[str, Any]) -> None:
        path = options["sweep"]
        try:
            configs = read_multi_config(path)
            runs = sweep_runs(configs, _roots(path))
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror}") from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        for run in runs:
            for f in (run.tracefile, run.injectionfile):
                if f and not Path(f).is_file():
                    raise CommandError(
                        f"{path}: {f} not found (looked beside the config and under {shared.HAIZEA})"
                    )
        jobs = options["jobs"] or os.cpu_count() or 1
        try:
            rows = sweep(runs, jobs=jobs, progress=self._bar())
        except (TraceError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        if options["csv"]:
            _write_csv(options["csv"], rows)
        if options["json"]:
            self.stdout.write(json.dumps({"sweep": path, "runs": [sweep_record(r) for r in rows]}))
            return
        for row in rows:
            self.stdout.write(_line(row))

    def _bar(self) -> Any:
        tty = sys.stderr.isatty()

        def report(done: int, total: int) -> None:
            width = 30
            filled = width * done // total
            bar = f"sweep [{'#' * filled}{'.' * (width - filled)}] {done}/{total} runs"
            # On a terminal the bar redraws in place; in a log it is one line per finished run.
            self.stderr.write(("\r" + bar) if tty else bar, ending="\n" if done == total or not tty else "")
            self.stderr.flush()

        return report

    # -- single run ----------------------------------------------------------------------------------------

    def _progress(self, total: int) -> Any:
        last = [time.monotonic()]

        def report(t: float, submitted: int, _: int) -> None:
            if time.monotonic() - last[0] >= 1.0:
                last[0] = time.monotonic()
                self.stderr.write(f"replay: t={t / 86400:.2f} days, {submitted}/{total} leases submitted")

        return report

    def _print_accuracy(self, accuracy: ForecastAccuracy, exact: bool) -> None:
        a = accuracy.summary()
        runs = "exact run times" if exact else "the trace's run times (early ends)"
        self.stdout.write(
            f"  queue forecast, {runs}: estimated start at submission against the actual start "
            f"(no estimate {a['no_estimate']}, never started {a['never_started']})"
        )
        parts = (
            ("every best-effort lease", a),
            ("queued at submission", a["queued"]),
            ("  of those with a likely range, the estimate", a["likely_baseline"]),
            ("  the likely start (calibrated)", a["likely"]),
        )
        for label, part in parts:
            if not part["leases"]:
                self.stdout.write(f"    {label}: none")
                continue
            self.stdout.write(
                f"    {label} ({part['leases']}): within 1 min {part['within_1_min']:.1%}, 10 min "
                f"{part['within_10_min']:.1%}, 1 h {part['within_1_h']:.1%}; absolute error median "
                f"{part['median_abs_error_s']:.0f} s, p90 {part['p90_abs_error_s']:.0f} s"
            )
        if a["likely"]["leases"]:
            self.stdout.write(
                f"    actual start inside the likely range: {a['likely']['range_coverage']:.1%}"
            )

    def _print(self, result: ReplayResult) -> None:
        m = result.metrics
        injected = f" + {len(result.trace.injected)} injected from {result.trace.injection}"
        extra = injected if result.trace.injection else ""
        self.stdout.write(f"{result.trace.name}{extra}: {m.leases} leases, {result.steps} steps")
        for key, value in vars(m).items():
            self.stdout.write(f"  {key}: {'-' if value is None else round(value, 3)}")


def _line(row: SweepRow) -> str:
    m: Metrics = row.metrics
    days = "-" if m.last_best_effort_end_s is None else f"{m.last_best_effort_end_s / 86400:.2f}"
    wait = "-" if m.mean_wait_s is None else f"{m.mean_wait_s:.0f}"
    slow = "-" if m.mean_bounded_slowdown is None else f"{m.mean_bounded_slowdown:.1f}"
    return (
        f"{row.profile or '-'} {row.trace} {row.injection or '(no injection)'}: {m.leases} leases, "
        f"ARs {m.ar_accepted} accepted / {m.ar_rejected} rejected, last best-effort end {days} days, "
        f"mean wait {wait} s, bounded slowdown {slow}, utilisation {m.utilisation:.3f} "
        f"({row.cpu_s:.1f} s CPU)"
    )


def _write_csv(path: str, rows: list[SweepRow]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=SWEEP_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in sweep_record(row).items()})


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a server
        import matplotlib.pyplot as plt
    except ImportError:
        raise CommandError(PLOT_HINT) from None
    return plt


def _plot(plt: Any, result: ReplayResult, path: str) -> None:
    rows = timeline(result.scheduler)
    days = [t / 86400 for t, _, _ in rows]
    fig, (util_ax, queue_ax) = plt.subplots(2, 1, sharex=True, figsize=(10, 5))
    util_ax.step(days, [u for _, u, _ in rows], where="post", linewidth=0.6)
    util_ax.set_ylabel("CPU utilisation")
    util_ax.set_ylim(0, 1.05)
    queue_ax.step(days, [q for _, _, q in rows], where="post", linewidth=0.6, color="tab:orange")
    queue_ax.set_ylabel("queued leases")
    queue_ax.set_xlabel("days since the trace start")
    title = result.trace.name + (f" + {result.trace.injection}" if result.trace.injection else "")
    util_ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, format="svg")
    plt.close(fig)


def _roots(config_path: str | None) -> list[Path]:
    """Where a config's foreign paths are looked for: beside it, above it, then the shared Haizea material."""
    roots = (
        [Path(config_path).resolve().parent, Path(config_path).resolve().parent.parent] if config_path else []
    )
    return [*roots, shared.HAIZEA]


def _config(path: str | None) -> HaizeaConfig | None:
    if not path:
        return None
    try:
        return read_config(path)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"{path}: {exc.strerror}") from None


def _workload(tracefile: Path, injectionfile: Path | None) -> Trace:
    try:
        return load_workload(tracefile, injectionfile)
    except (TraceError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"{exc.filename}: {exc.strerror}") from None
