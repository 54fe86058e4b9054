"""The ``report`` command: analyse traces on Spark and write the report, one line on error.

What ``aiopurgatory report`` runs (:mod:`aiopurgatory.cli`, which adds ``demo``, ``trace
synth`` and ``kafka``) and what ``spark-submit`` runs through
:mod:`aiopurgatory.analysis.submit`: both take the arguments :func:`add_report_arguments`
declares and run :func:`run_command` over :func:`report_command`.

Ground rules: this module sits below both of its callers and imports neither (the
command line imports it, never the other way round). Importing it imports no Spark,
pandas or tqdm (each function imports what it needs when it runs), so that the command
line parses its arguments, prints ``--help`` and runs ``kafka`` without the
``analysis`` extra. A user's mistake (:class:`UserError`, or an :class:`AnalysisError`)
ends as one line on stderr and exit status 1; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

__all__ = [
    "SWEEP_OPERATIONS",
    "UserError",
    "add_common_arguments",
    "add_report_arguments",
    "main",
    "report_command",
    "report_command_from",
    "run_command",
]

SWEEP_OPERATIONS: Final = 5_000
"""Operations per simulation in the report's sweep (a smaller sweep than the default)."""


class UserError(Exception):
    """Reported as one line, exit status 1."""


def add_common_arguments(sub: argparse.ArgumentParser, default_out: Path | None) -> None:
    """``--out``, ``--master`` and ``--bench``: the options of every command that reports."""
    sub.add_argument(
        "--out",
        type=Path,
        default=default_out,
        required=default_out is None,
        metavar="DIR",
        help="report directory"
        + (f" (default ./{default_out})" if default_out is not None else ""),
    )
    sub.add_argument(
        "--master",
        metavar="URL",
        help="Spark master (default local[*]; ignored under spark-submit or SPARK_REMOTE)",
    )
    sub.add_argument(
        "--bench",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="include `python -m bench ... --json FILE` records (repeatable)",
    )


def add_report_arguments(report_parser: argparse.ArgumentParser) -> None:
    """The ``report`` command's arguments: trace directories, the common options,
    ``--sweep`` and ``--profile``."""
    report_parser.add_argument(
        "traces", nargs="+", metavar="TRACE_DIR", help="trace directory (local path or URI)"
    )
    add_common_arguments(report_parser, None)
    report_parser.add_argument(
        "--sweep", action="store_true", help="also run the tick x wheel-size sweep"
    )
    report_parser.add_argument(
        "--profile",
        action="store_true",
        help="print the time of each step and Spark stage (event log in DIR/spark-events)",
    )


def run_command(command: Callable[[], Path], wrote: str) -> int:
    """Run ``command``; print ``"{wrote}: PATH"`` of what it wrote and return the exit status.

    A user's mistake, or a missing extra, is one line on stderr and status 1; an
    interrupt is status 130.
    """
    try:
        path = command()
    except KeyboardInterrupt:
        print("aiopurgatory: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from aiopurgatory.analysis.errors import AnalysisError

        if isinstance(exc, ImportError):
            hint = " (install the analysis extra: pip install '.[analysis]' in a checkout)"
        elif isinstance(exc, UserError | AnalysisError):
            hint = ""
        else:
            raise
        print(f"aiopurgatory: error: {exc}{hint}", file=sys.stderr)
        return 1
    print(f"{wrote}: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``report TRACE_DIR... --out DIR``, as the command line's: what
    :mod:`aiopurgatory.analysis.submit` runs under spark-submit."""
    parser = argparse.ArgumentParser(
        prog="aiopurgatory.analysis.submit",
        description="The report command of aiopurgatory, for spark-submit.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_report_arguments(commands.add_parser("report", help="analyse existing traces on Spark"))
    args = parser.parse_args(argv)
    return run_command(lambda: report_command_from(args), "report")


def report_command_from(args: argparse.Namespace) -> Path:
    """:func:`report_command` with the parsed arguments of :func:`add_report_arguments`."""
    return report_command(
        args.traces,
        args.out,
        master=args.master,
        sweep=args.sweep,
        bench=tuple(args.bench),
        profile=args.profile,
    )


def report_command(
    traces: Sequence[str],
    out: Path,
    *,
    master: str | None = None,
    sweep: bool = False,
    bench: tuple[Path, ...] = (),
    preamble: str = "",
    profile: bool = False,
) -> Path:
    """Analyse ``traces`` on Spark and write the report into ``out``.

    With ``profile``, prints to stderr the wall time of each step and, from Spark's event
    log (a session started here writes it to ``out/spark-events``), of each stage.
    """
    from aiopurgatory.analysis.class_cache import default_class_cache
    from aiopurgatory.analysis.job import check_local_traces
    from aiopurgatory.analysis.report import ReportInputs, build_report
    from aiopurgatory.analysis.session import check_environment, spark_session

    check_environment()
    check_local_traces(traces)
    for path in bench:
        if not path.is_file():
            raise UserError(f"benchmark records not found: {path}")
    inputs = ReportInputs(
        bench=bench, sweep=sweep, sweep_operations=SWEEP_OPERATIONS, preamble=preamble
    )
    out.mkdir(parents=True, exist_ok=True)
    events = out / "spark-events" if profile else None
    if events is not None and events.is_dir():
        shutil.rmtree(events)
    with _Steps() as steps:
        steps("starting Spark")
        with spark_session(
            master=master,
            log_file=out / "spark.log",
            event_log=events,
            class_cache=default_class_cache(),
        ) as spark:
            report = build_report(spark, traces, out, inputs, progress=steps)
            steps("stopping Spark")
    if events is not None:
        _print_profile(steps.times, events, out)
    return report


def _print_profile(times: list[tuple[str, float]], events: Path, out: Path) -> None:
    import pandas as pd

    from aiopurgatory.analysis.eventlog import format_stages, stage_times

    rows = int(pd.read_csv(out / "summary.csv")["operations"].sum())
    total = sum(seconds for _, seconds in times)
    lines = ["profile: wall seconds per step"]
    lines += [f"  {name:<36} {seconds:8.2f}" for name, seconds in times]
    lines.append(f"  {'total':<36} {total:8.2f}   ({rows:,} rows, {rows / total:,.0f} rows/s)")
    lines.append("profile: Spark stages (from the event log)")
    lines += ["  " + line for line in format_stages(stage_times(events)).splitlines()]
    print("\n".join(lines), file=sys.stderr)


class _Steps:
    """A progress line for the Spark job: the current step and the time elapsed."""

    __slots__ = ("_bar", "_began", "_count", "_step", "times")

    def __init__(self) -> None:
        self._bar: Any = None
        self._count = 0
        self._began = time.perf_counter()
        self._step: tuple[str, float] | None = None
        self.times: list[tuple[str, float]] = []
        """(step, wall seconds) of every finished step."""

    def _finish_step(self) -> None:
        now = time.perf_counter()
        if self._step is not None:
            self.times.append((self._step[0], now - self._step[1]))
        self._step = None

    def __enter__(self) -> _Steps:
        from tqdm import tqdm

        self._bar = tqdm(
            desc="spark job",
            bar_format="{desc}: {n} steps, {elapsed} elapsed",
            file=sys.stderr,
            disable=None,  # only on a terminal
        )
        return self

    def __call__(self, step: str) -> None:
        self._finish_step()
        self._step = (step, time.perf_counter())
        if self._count:
            self._bar.update(1)
        self._count += 1
        self._bar.set_description_str(f"spark job: {step}")

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._finish_step()
        if exc_type is None:
            self._bar.update(1)
            seconds = time.perf_counter() - self._began
            self._bar.set_description_str(f"spark job: done in {seconds:.1f} s")
        else:
            self._bar.leave = False  # the error line says what happened
        self._bar.close()
