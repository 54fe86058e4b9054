"""The ``aiopurgatory`` command: ``demo``, ``report``, ``trace synth`` and ``kafka``.

``aiopurgatory demo`` runs the broker simulator (:mod:`aiopurgatory.kafka.simulator`, part
of the package: no source checkout needed) with tracing on, then the Spark job, and
writes the report.
``aiopurgatory report TRACE_DIR... --out DIR`` runs the job on existing traces
(``--profile``: the time of each step and Spark stage). ``aiopurgatory trace synth
--rows N --out DIR`` writes a synthetic trace. ``aiopurgatory kafka --port 0`` runs the
Kafka-protocol broker for tests (:mod:`aiopurgatory.kafka.cli`, the ``kafka`` extra).
Mistakes a user can make end in one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from aiopurgatory.purgatory import OperationObserver

__all__ = ["Workload", "broker_workload", "main"]

Workload = Callable[[float, "OperationObserver"], Awaitable[object]]
"""A demo workload: run purgatories for ``duration`` loop seconds, reporting to the observer."""

DEFAULT_OUT: Final = Path("purgatory-report")
DEFAULT_DURATION: Final = 10.0
SWEEP_OPERATIONS: Final = 5_000
"""Operations per simulation in the demo's sweep (a smaller sweep than the default)."""


class UserError(Exception):
    """Reported as one line, exit status 1."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "kafka":
        from aiopurgatory.kafka.cli import run

        run(args, args.kafka_parser)  # until SIGINT or SIGTERM
        return 0
    try:
        if args.command == "trace":
            report = synth_command(args.rows, args.out, rate=args.rate, seed=args.seed)
        elif args.command == "demo":
            report = demo(
                args.duration,
                args.out,
                master=args.master,
                sweep=args.sweep,
                bench=tuple(args.bench),
            )
        else:
            report = report_command(
                args.traces,
                args.out,
                master=args.master,
                sweep=args.sweep,
                bench=tuple(args.bench),
                profile=args.profile,
            )
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
    print(f"{'trace' if args.command == 'trace' else 'report'}: {report}")
    return 0


def version_text() -> str:
    """The version, and a line telling which build of the hot path is loaded."""
    import aiopurgatory

    build = "compiled (Cython)" if aiopurgatory.COMPILED else "pure Python"
    return f"aiopurgatory {aiopurgatory.__version__}\n{build}"


class _VersionAction(argparse.Action):
    """``--version``: two lines as they are (argparse's own action would re-wrap them)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(
            option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(version_text())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiopurgatory",
        description="Kafka's request purgatory for asyncio: trace analysis on Spark.",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the version and which build is loaded (compiled or pure Python), then exit",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sub: argparse.ArgumentParser, default_out: Path | None) -> None:
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

    demo_parser = commands.add_parser(
        "demo", help="trace the broker simulator, analyse it on Spark, write a report"
    )
    demo_parser.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION,
        metavar="SECONDS",
        help=f"how long the simulator runs (default {DEFAULT_DURATION:g})",
    )
    common(demo_parser, DEFAULT_OUT)
    demo_parser.add_argument(
        "--no-sweep",
        dest="sweep",
        action="store_false",
        help="skip the tick x wheel-size sweep",
    )
    report_parser = commands.add_parser("report", help="analyse existing traces on Spark")
    report_parser.add_argument(
        "traces", nargs="+", metavar="TRACE_DIR", help="trace directory (local path or URI)"
    )
    common(report_parser, None)
    report_parser.add_argument(
        "--sweep", action="store_true", help="also run the tick x wheel-size sweep"
    )
    report_parser.add_argument(
        "--profile",
        action="store_true",
        help="print the time of each step and Spark stage (event log in DIR/spark-events)",
    )
    # The broker's options need no kio: it is imported when the broker runs.
    from aiopurgatory.kafka.cli import add_arguments as kafka_arguments

    kafka_parser = commands.add_parser(
        "kafka",
        help="run the Kafka-protocol broker for tests (the kafka extra)",
        description="A Kafka-protocol broker on aiopurgatory, for tests "
        "(the same as python -m aiopurgatory.kafka).",
    )
    kafka_arguments(kafka_parser)
    kafka_parser.set_defaults(kafka_parser=kafka_parser)
    trace_parser = commands.add_parser("trace", help="trace files: synth")
    trace_commands = trace_parser.add_subparsers(dest="trace_command", required=True)
    synth = trace_commands.add_parser(
        "synth",
        help="write a synthetic trace (Poisson arrivals, log-normal completions, timeouts)",
    )
    synth.add_argument("--rows", type=int, required=True, metavar="N", help="operations")
    synth.add_argument("--out", type=Path, required=True, metavar="DIR", help="trace directory")
    synth.add_argument(
        "--rate", type=float, default=50_000.0, help="arrivals per second (default 50000)"
    )
    synth.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return parser


def synth_command(rows: int, out: Path, *, rate: float = 50_000.0, seed: int = 0) -> Path:
    """Write a synthetic trace of ``rows`` operations into ``out``."""
    if rows < 1:
        raise UserError(f"--rows must be >= 1, got {rows}")
    if not rate > 0:
        raise UserError(f"--rate must be > 0, got {rate:g}")
    from aiopurgatory.analysis.synthetic import generate_trace

    return generate_trace(out, rows, rate=rate, seed=seed)


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


def demo(
    duration: float,
    out: Path,
    *,
    master: str | None = None,
    sweep: bool = True,
    bench: tuple[Path, ...] = (),
    workload: Workload | None = None,
) -> Path:
    """Trace ``workload`` (default: the broker simulator), then write its report."""
    from aiopurgatory.analysis.session import check_environment

    if not duration > 0:
        raise UserError(f"--duration must be > 0, got {duration:g}")
    check_environment()  # before the workload runs
    if workload is None:
        workload, name = broker_workload, "the broker simulator (`aiopurgatory.kafka.simulator`)"
    else:
        name = f"`{getattr(workload, '__name__', 'the workload')}`"
    traces = out / "traces"
    if traces.is_dir():  # the previous demo's traces: do not mix runs
        for old in traces.glob("trace-*.parquet"):
            old.unlink()
    rows = _record(workload, duration, traces)
    if not rows:
        raise UserError("the workload finished no operation: nothing to report")
    preamble = (
        f"Traces of {name} running {duration:g} s"
        f" with tracing on: {rows:,} operations in `{traces}`."
    )
    return report_command(
        [str(traces)], out, master=master, sweep=sweep, bench=bench, preamble=preamble
    )


async def broker_workload(duration: float, observer: OperationObserver) -> object:
    """The broker simulator, :mod:`aiopurgatory.kafka.simulator`, for ``duration`` seconds."""
    from aiopurgatory.kafka.simulator import SimulationConfig, run_simulation

    return await run_simulation(SimulationConfig(duration=duration), observer=observer)


def _record(workload: Workload, duration: float, traces: Path) -> int:
    """Run ``workload`` under a trace recorder with a progress bar; returns rows written."""
    from tqdm import tqdm

    from aiopurgatory.trace import TraceRecorder

    async def run() -> int:
        loop = asyncio.get_running_loop()
        with (
            TraceRecorder(traces, clock=loop.time) as recorder,
            tqdm(
                total=round(duration, 1),
                desc="broker simulator",
                unit="s",
                bar_format="{desc}: {bar} {n:.1f}/{total:.1f} s",
                file=sys.stderr,
                disable=None,  # only on a terminal
            ) as bar,
        ):
            start = loop.time()
            task = asyncio.ensure_future(workload(duration, recorder))
            while not task.done():
                await asyncio.wait([task], timeout=0.1)
                bar.n = round(min(loop.time() - start, duration), 1)
                bar.refresh()
            await task
        return recorder.rows_written

    return asyncio.run(run())


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
