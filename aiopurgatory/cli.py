"""The ``aiopurgatory`` command: ``demo``, ``report``, ``trace synth`` and ``kafka``.

``aiopurgatory demo`` runs the broker simulator (:mod:`aiopurgatory.kafka.simulator`, part
of the package: no source checkout needed) with tracing on, then the Spark job, and
writes the report.
``aiopurgatory report TRACE_DIR... --out DIR`` runs the job on existing traces
(``--profile``: the time of each step and Spark stage). ``aiopurgatory trace synth
--rows N --out DIR`` writes a synthetic trace. ``aiopurgatory kafka --port 0`` runs the
Kafka-protocol broker for tests (:mod:`aiopurgatory.kafka.cli`, the ``kafka`` extra).
Mistakes a user can make end in one line on stderr and exit status 1. The report itself
(its arguments, the Spark job's steps, the one-line errors) is
:mod:`aiopurgatory.analysis.command`, which spark-submit runs too.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

# The report command lives below this module (spark-submit runs it without the rest of
# the command line); UserError and report_command keep their old names here.
from aiopurgatory.analysis.command import (
    UserError,
    add_common_arguments,
    add_report_arguments,
    report_command,
    report_command_from,
    run_command,
)

if TYPE_CHECKING:
    from aiopurgatory.purgatory import OperationObserver

__all__ = ["Workload", "broker_workload", "main"]

Workload = Callable[[float, "OperationObserver"], Awaitable[object]]
"""A demo workload: run purgatories for ``duration`` loop seconds, reporting to the observer."""

DEFAULT_OUT: Final = Path("purgatory-report")
DEFAULT_DURATION: Final = 10.0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "kafka":
        from aiopurgatory.kafka.cli import run

        run(args, args.kafka_parser)  # until SIGINT or SIGTERM
        return 0
    if args.command == "trace":
        return run_command(
            lambda: synth_command(args.rows, args.out, rate=args.rate, seed=args.seed), "trace"
        )
    if args.command == "demo":
        return run_command(
            lambda: demo(
                args.duration,
                args.out,
                master=args.master,
                sweep=args.sweep,
                bench=tuple(args.bench),
            ),
            "report",
        )
    return run_command(lambda: report_command_from(args), "report")


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
    add_common_arguments(demo_parser, DEFAULT_OUT)
    demo_parser.add_argument(
        "--no-sweep",
        dest="sweep",
        action="store_false",
        help="skip the tick x wheel-size sweep",
    )
    add_report_arguments(commands.add_parser("report", help="analyse existing traces on Spark"))
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
