"""``python -m bench SUITE [options] [--json FILE]``: run a suite and print its table.

``python -m bench all [--quick|--smoke]`` runs every suite, on both loops, GC on and
off, for the build loaded (``wheel``), the pure-Python fallback (``pure``) and the
baselines, in one run. ``python -m bench summarize FILE...`` prints the tables of
saved JSON records. ``python -m bench ceiling`` finds the highest rate each
implementation sustains on Kafka's purgatory workload (:mod:`bench.ceiling`).
``python -m bench kafka`` measures the Kafka-protocol broker (aiopurgatory.kafka, bench/kafka.py)
driven by aiokafka; ``bench all`` leaves it out unless ``--suites`` names it.
``python -m bench loop`` counts call_later+cancel pairs per CPU second on the stock
loop and the wheel loop (:mod:`bench.loop`); ``python -m bench loop-server`` loads an
aiohttp server holding idle keep-alive connections with wrk, on each loop
(:mod:`bench.loop_server`).
``python -m bench allocs`` counts what the library allocates per registration and per
finish, per build (:mod:`bench.allocs`).
``python -m bench redis-fanout`` compares wake-ups through Redis pub/sub with one
``XREAD BLOCK`` per waiter, and runs the subscriptions on a 3-primary Redis Cluster
too (:mod:`bench.redis_fanout`).
Every case runs on a fresh event loop; with ``--isolate`` (always
for ``memory``, and for every implementation once ``pure`` is among them) in a fresh
interpreter too. Implementations alternate within each repeat, so all of them share
the machine's noise alike.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import platform
import sys
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import aiopurgatory

from . import ceiling
from .common import (
    GC_MODES,
    LOOPS,
    SMOKE_TABLE_BITS,
    TABLE_BITS,
    GcMode,
    Params,
    Record,
    loop_factory,
    run_child,
    use_table_bits,
)
from .impls import DEFAULT_IMPLS, FLOOR, HOOKS, IMPLS, PURE
from .report import ceiling_plot, render
from .timeouts import DEFAULT_IMPLS as TIMEOUT_DEFAULT_IMPLS
from .timeouts import IMPLS as TIMEOUT_IMPLS
from .workloads import SUITES

SIZES = ("full", "quick", "smoke")

# Per suite: option -> (type, default per size in SIZES order). List options take
# comma-separated values and expand into one case per value.
OPTIONS: dict[str, dict[str, tuple[type, tuple[Any, Any, Any]]]] = {
    "timer": {
        "pending": (int, ([1_000, 10_000, 100_000, 1_000_000], [1_000, 100_000], [1_000])),
        "seconds": (float, (3.0, 1.0, 0.1)),
    },
    "churn": {
        "pending": (int, ([1_000, 100_000, 1_000_000], [1_000, 100_000], [1_000])),
        "seconds": (float, (3.0, 1.0, 0.1)),
        "min_turnovers": (float, (5.0, 1.0, 1.0)),
        "max_seconds": (float, (60.0, 10.0, 1.0)),
    },
    "expiry": {
        "pattern": (str, (["spread", "shared"], ["spread", "shared"], ["spread", "shared"])),
        "n": (int, ([100_000], [20_000], [2_000])),
        "spread": (float, (1.0, 1.0, 0.1)),
        "lead": (float, (1.0, 0.5, 0.1)),
    },
    "purgatory": {
        "scenario": (str, (["low", "high"], ["low", "high"], ["low"])),
        "keys": (str, (["shared"], ["shared"], ["shared", "unique"])),
        "rate": (int, ([10_000, 25_000, 50_000, 100_000, 200_000], [10_000, 50_000], [5_000])),
        "requests": (int, (1_000_000, 50_000, 500)),
        "max_seconds": (float, (30.0, 2.0, 0.1)),
        "warmup": (float, (0.0, 0.0, 0.0)),
        "batch": (int, (64, 64, 64)),
    },
    "idle": {
        "scenario": (str, (["empty", "one_far", "after_burst"],) * 3),
        "seconds": (float, (10.0, 1.0, 0.1)),
    },
    "memory": {
        "pending": (int, ([100_000, 1_000_000], [10_000], [1_000])),
        "cycle": (int, (10_000_000, 200_000, 2_000)),
    },
    "timeouts": {
        "api": (str, (["timeout", "call_later", "wait_for"],) * 3),
        "pending": (int, ([1_000, 10_000, 100_000], [1_000, 100_000], [1_000])),
        "seconds": (float, (2.0, 0.5, 0.05)),
    },
}
"""``memory`` cycles ``cycle`` operations through its first ``pending`` size only.
``churn`` times ``seconds`` and on until the pending set has turned over
``min_turnovers`` times (never past ``max_seconds``); ``purgatory`` issues ``warmup``
seconds of requests it does not count before its ``requests`` (see :mod:`bench.ceiling`
for the steady hold of the ceiling's search)."""

SUITE_IMPLS: dict[str, tuple[str, ...]] = {
    "timeouts": TIMEOUT_IMPLS,
    "timer": (*IMPLS, FLOOR),
    "churn": (*IMPLS, FLOOR, HOOKS),
}
SUITE_DEFAULT_IMPLS: dict[str, tuple[str, ...]] = {"timeouts": TIMEOUT_DEFAULT_IMPLS}
"""Suites that compare other implementations than :data:`bench.impls.IMPLS`."""

ISOLATED = frozenset({"memory"})

ALL_OPTIONS: Final[dict[str, dict[str, str]]] = {
    "timer": {"pending": "1000,100000,1000000", "seconds": "1.0"},
    "churn": {
        "pending": "1000,100000,1000000",
        "seconds": "1.0",
        "min_turnovers": "3",
        "max_seconds": "30",
    },
    "expiry": {"n": "100000"},
    "purgatory": {"rate": "50000,100000", "requests": "300000", "max_seconds": "3"},
    "idle": {"seconds": "2.0"},
    "memory": {"pending": "100000", "cycle": "200000"},
    "timeouts": {"pending": "1000,100000", "seconds": "1.0"},
}
"""``bench all`` (full size): the sizes the README's tables quote, in about 30 minutes.

A task per operation (``task``) is left out at 1M pending: it alone would take longer.
"""


KAFKA_OPTIONS: Final[dict[str, tuple[type, tuple[Any, Any, Any]]]] = {
    "records": (int, (20_000, 5_000, 500)),
    "samples": (int, (300, 100, 20)),
    "idle": (int, (10_000, 2_000, 100)),
    "seconds": (float, (5.0, 2.0, 1.0)),
    "clients": (int, (2, 2, 2)),
    "transactions": (int, (500, 200, 30)),
    "starts": (int, (10, 5, 3)),
    "compact_records": (int, (1_000_000, 200_000, 20_000)),
}
"""The ``kafka`` suite: records per throughput run, latency samples, idle consumers,
seconds each idle phase is measured, client processes the idle consumers use,
transactions (of 10 records) per client, broker starts timed each way, records the
log cleaner compacts."""

KAFKA_BENCH: Final = Path(__file__).resolve().parent / "kafka.py"


@dataclass(frozen=True)
class Case:
    suite: str
    impl: str
    loop: str
    gc: str
    repeat: int
    params: dict[str, int | float | str]
    python: str = ""
    """The interpreter to run it in (``--python``); empty: this one."""
    table_bits: int = TABLE_BITS
    """The draw tables' size, 2**table_bits (fewer at the smoke size)."""


def run_case(case: Case) -> Record:
    """Run one case on a fresh loop under its GC mode; returns its record."""
    gc_mode = GcMode(case.gc)
    workload = SUITES[case.suite]
    if case.impl == PURE and aiopurgatory.COMPILED:
        raise RuntimeError("the pure implementation must run with AIOPURGATORY_NO_EXTENSIONS=1")
    record: Record = {
        "suite": case.suite,
        "impl": case.impl,
        "build": "compiled" if aiopurgatory.COMPILED else "pure",
        "loop": case.loop,
        "gc": case.gc,
        "repeat": case.repeat,
        "python": platform.python_version(),
        **case.params,
    }
    use_table_bits(case.table_bits)
    gc_mode.enter()
    try:
        with asyncio.Runner(loop_factory=loop_factory(case.loop)) as runner:
            record.update(runner.run(workload(case.impl, case.params, gc_mode)))
    finally:
        gc_mode.exit()
        use_table_bits(TABLE_BITS)
    return record


def run_isolated(case: Case) -> Record:
    """Run one case in a fresh interpreter (clean RSS, allocator and GC state)."""
    env = dict(os.environ)
    if case.impl == PURE:
        env["AIOPURGATORY_NO_EXTENSIONS"] = "1"
    argv = [case.python or sys.executable, "-m", "bench", "_case", json.dumps(asdict(case))]
    child = run_child(argv, env)
    if child.returncode:
        raise RuntimeError(child.stderr.strip().splitlines()[-1] if child.stderr else "failed")
    record: Record = json.loads(child.stdout)
    return record


def _split(kind: type, text: str) -> list[Any]:
    return [kind(part) for part in text.split(",") if part]


def _grid(suite: str, args: argparse.Namespace) -> list[Params]:
    """Every combination of the suite's list options (cycling only at the first size)."""
    grids: list[Params] = [{}]
    for name in OPTIONS[suite]:
        value = getattr(args, name)
        values = value if isinstance(value, list) else [value]
        grids = [{**grid, name: v} for grid in grids for v in values]
    if suite == "memory":
        first = grids[0]["pending"]
        grids = [{**g, "cycle": g["cycle"] if g["pending"] == first else 0} for g in grids]
    return grids


def cases(suite: str, args: argparse.Namespace) -> list[Case]:
    loops = list(LOOPS) if args.loop == "both" else [args.loop]
    gcs = ["on", "off"] if args.gc == "both" else _split(str, args.gc)
    if set(gcs) - set(GC_MODES):
        raise SystemExit(f"--gc takes {', '.join(GC_MODES)} or both, got {args.gc!r}")
    impls = _split(str, args.impl)
    unknown = set(impls) - set(SUITE_IMPLS.get(suite, IMPLS))
    if unknown:
        raise SystemExit(f"unknown implementation(s): {', '.join(sorted(unknown))}")
    pythons = interpreters(getattr(args, "python", None) or "")
    out = []
    # The expiry suite takes the table's first n draws: a smoke run given a larger n
    # keeps a table that holds them.
    need = max((int(p.get("n", 0)) for p in _grid(suite, args)), default=0)
    smoke = getattr(args, "smoke", False)
    bits = max(SMOKE_TABLE_BITS, (need - 1).bit_length()) if smoke else TABLE_BITS
    for repeat in range(args.repeat):
        order = impls[repeat % len(impls) :] + impls[: repeat % len(impls)]
        for params in _grid(suite, args):
            for loop in loops:
                for gc in gcs:
                    out += [
                        Case(suite, impl, loop, gc, repeat, params, python, bits)
                        for python in pythons
                        for impl in order
                    ]
    return out


def interpreters(spec: str) -> list[str]:
    """``--python``: comma-separated versions (``3.12``) or interpreter paths, as paths
    ("" for this interpreter). A version other than this one's is the checkout's
    ``.venv-3.X`` (``make test`` makes it, with the bench extra and the compiled build)."""
    this = f"{sys.version_info[0]}.{sys.version_info[1]}"
    out = []
    for part in _split(str, spec):
        if part == this:
            out.append("")
        elif part.replace(".", "").isdigit():
            venv = Path(__file__).resolve().parent.parent / f".venv-{part}" / "bin" / "python"
            if not venv.exists():
                raise SystemExit(f"--python {part}: no {venv} (make build-{part} makes it)")
            out.append(str(venv))
        else:
            out.append(part)
    return out or [""]


def _progress(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr (when it is a terminal), or None."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    tqdm.monitor_interval = 0  # no monitor thread beside the measured loop
    return tqdm(total=total, unit="case", file=sys.stderr, disable=None)


def run_suite(
    suite: str, args: argparse.Namespace, *, saved: Sequence[Record] = ()
) -> list[Record]:
    """Run every case of ``suite``; with ``args.json``, save ``saved`` + records so far."""
    todo = [case for case in cases(suite, args) if not _too_slow(case, args)]
    # The pure-Python build cannot share an interpreter with the compiled one; then
    # every implementation gets a fresh interpreter, so that all run alike.
    isolate = (
        args.isolate or suite in ISOLATED or any(case.impl == PURE or case.python for case in todo)
    )
    bar = _progress(len(todo), not args.no_progress)
    records: list[Record] = []
    for case in todo:
        if bar is not None:
            bar.set_description(f"{suite} {case.impl} {case.loop} gc={case.gc}")
        try:
            records.append(run_isolated(case) if isolate else run_case(case))
        except Exception as exc:  # keep the other cases' results
            traceback.print_exc(file=sys.stderr)
            records.append({**_ident(case), **case.params, "error": repr(exc)})
        if args.json:  # after every case, so a long run interrupted keeps its results
            _save(args.json, [*saved, *records])
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return records


def _too_slow(case: Case, args: argparse.Namespace) -> bool:
    """In ``bench all``: a task per operation at 1M pending takes minutes to set up."""
    pending = case.params.get("pending", 0)
    return getattr(args, "all", False) and case.impl == "task" and int(pending) >= 1_000_000


def _save(name: str, records: Sequence[Record]) -> None:
    with open(name, "w", encoding="utf-8") as file:
        json.dump(records, file, indent=1, allow_nan=False)


def _ident(case: Case) -> Record:
    return {"suite": case.suite, "impl": case.impl, "loop": case.loop, "gc": case.gc}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = top.add_subparsers(dest="suite", required=True, metavar="SUITE")
    for suite, options in OPTIONS.items():
        doc = SUITES[suite].__doc__
        p = sub.add_parser(suite, help=doc, description=doc)
        p.add_argument("--loop", choices=[*LOOPS, "both"], default="asyncio")
        p.add_argument(
            "--gc",
            default="on",
            help="comma-separated cyclic GC modes of: on, off, freeze (gc.freeze() after"
            " set-up); both = on,off",
        )
        impls = SUITE_IMPLS.get(suite, IMPLS)
        p.add_argument(
            "--impl",
            default=",".join(SUITE_DEFAULT_IMPLS.get(suite, DEFAULT_IMPLS)),
            help="comma-separated, of: " + ", ".join(impls),
        )
        size = p.add_mutually_exclusive_group()
        size.add_argument("--quick", action="store_true", help="small sizes (well under a minute)")
        size.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
        p.add_argument("--repeat", type=int, default=1, help="runs of every case (tables: medians)")
        p.add_argument("--json", metavar="FILE", help="write the records as a JSON list")
        p.add_argument("--markdown", action="store_true", help="print Markdown tables")
        p.add_argument("--isolate", action="store_true", help="each case in a fresh interpreter")
        p.add_argument(
            "--python",
            metavar="VERSIONS",
            help="comma-separated CPython versions (3.12: the checkout's .venv-3.12) or"
            " interpreter paths to run every case in, alternating (default: this one)",
        )
        p.add_argument("--no-progress", action="store_true")
        for name, (kind, _) in options.items():
            flag = "--" + name.replace("_", "-")
            p.add_argument(flag, dest=name, metavar=kind.__name__.upper(), help="default by size")
    kafka = sub.add_parser(
        "kafka",
        help="the Kafka-protocol broker driven by aiokafka: throughput, latency, transactions,"
        " start time, idle consumers",
        description=_kafka_doc(),
    )
    size = kafka.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    size.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    kafka.add_argument("--repeat", type=int, default=1, help="runs (tables: medians)")
    kafka.add_argument("--json", metavar="FILE", help="write the records as a JSON list")
    kafka.add_argument("--markdown", action="store_true", help="print Markdown tables")
    kafka.add_argument("--no-progress", action="store_true", help="(no progress bar anyway)")
    for name, (kind, _) in KAFKA_OPTIONS.items():
        kafka.add_argument("--" + name, metavar=kind.__name__.upper(), help="default by size")
    every = sub.add_parser(
        "all",
        help="every suite: wheel (as built), pure, heap and task; both loops; GC on and off",
    )
    size = every.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true")
    size.add_argument("--smoke", action="store_true")
    every.add_argument("--repeat", type=int, default=1)
    every.add_argument("--json", metavar="FILE")
    every.add_argument("--markdown", action="store_true")
    every.add_argument("--no-progress", action="store_true")
    every.add_argument("--suites", default=",".join(OPTIONS), help="comma-separated subset")
    # Parsed by bench.ceiling itself; listed here for --help.
    sub.add_parser("ceiling", help=ceiling.__doc__.splitlines()[0] if ceiling.__doc__ else None)
    sub.add_parser(
        "loop",
        help="call_later+cancel pairs per CPU second, stock loop vs wheel loop"
        " (bench.loop; its own options)",
    )
    sub.add_parser(
        "allocs",
        help="what the library allocates per registration and per finish, per build"
        " (bench.allocs; its own options)",
    )
    sub.add_parser(
        "redis-fanout",
        help="parked polls over 4 workers woken through Redis: one subscription per process"
        " against one XREAD BLOCK per waiter, and on a 3-primary Redis Cluster"
        " (bench.redis_fanout; its own options)",
    )
    summarize = sub.add_parser("summarize", help="print the tables of saved JSON records")
    summarize.add_argument("files", nargs="+")
    summarize.add_argument("--markdown", action="store_true")
    return top


def _kafka_doc() -> str:
    return (
        "Starts python -m aiopurgatory.kafka as a subprocess and drives it with aiokafka:"
        " records/s produced and consumed end to end (acks=1 and all), produce-to-consume"
        " latency with a parked consumer, commits/s of --transactions transactions of 10"
        " records (aiokafka; confluent-kafka too when installed) with the broker's CPU per"
        " commit, the time from nothing to a broker answering Metadata (median of --starts:"
        " in-process, the fixture's thread, a subprocess; a container's start cited from"
        " KIP-974, not run), and the broker's CPU and RSS with --idle"
        " consumers long-polling (max wait 500 ms; then parked, max wait 30 s). Sizes"
        " (records/samples/idle/seconds/transactions/starts): full 20000/300/10000/5/500/10,"
        " --quick 5000/100/2000/2/200/5, --smoke 500/20/100/1/30/3. Linux (reads /proc);"
        " needs aiokafka and kio."
    )


def _apply_sizes(args: argparse.Namespace) -> None:
    size = SIZES.index("smoke" if args.smoke else "quick" if args.quick else "full")
    options = KAFKA_OPTIONS if args.suite == "kafka" else OPTIONS[args.suite]
    for name, (kind, defaults) in options.items():
        given = getattr(args, name)
        default = defaults[size]
        if given is None:
            setattr(args, name, default)
        elif isinstance(default, list):
            setattr(args, name, _split(kind, given))
        else:
            setattr(args, name, kind(given))


def run_all(args: argparse.Namespace) -> list[Record]:
    """Every suite of ``args.suites`` in one run (JSON saved after each case)."""
    records: list[Record] = []
    for suite in _split(str, args.suites):
        if suite == "kafka":
            argv = ["kafka"] + (["--quick"] if args.quick else ["--smoke"] if args.smoke else [])
            sub = parser().parse_args([*argv, "--repeat", str(args.repeat)])
            _apply_sizes(sub)
            sub.json = args.json
            done = len(records)
            records += run_kafka(sub, saved=records)
            print(f"kafka: {len(records) - done} runs", file=sys.stderr)
            continue
        if suite not in OPTIONS:
            raise SystemExit(f"unknown suite {suite!r}")
        impls = ",".join(SUITE_IMPLS.get(suite, IMPLS))
        argv = [suite, "--loop", "both", "--gc", "both", "--impl", impls]
        argv += ["--repeat", str(args.repeat), "--no-progress"]
        if args.quick or args.smoke:
            argv.append("--quick" if args.quick else "--smoke")
        else:
            for name, value in ALL_OPTIONS.get(suite, {}).items():
                argv += ["--" + name.replace("_", "-"), value]
        sub = parser().parse_args(argv)
        _apply_sizes(sub)
        sub.json = args.json
        sub.no_progress = args.no_progress
        sub.all = True
        done = len(records)
        records += run_suite(suite, sub, saved=records)
        print(f"{suite}: {len(records) - done} cases", file=sys.stderr)
    return records


def _kafka_bench() -> Any:
    """bench/kafka.py, loaded from its file only when asked for (it needs aiokafka)."""
    spec = importlib.util.spec_from_file_location("kafka_broker_bench", KAFKA_BENCH)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {KAFKA_BENCH}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flatten(prefix: str, values: dict[str, Any], into: Record) -> Record:
    """Nested results as flat record fields (``idle_polling_answers_per_s``), NaN as None."""
    for name, value in values.items():
        key = f"{prefix}_{name}" if prefix else name
        if isinstance(value, dict):
            _flatten(key, value, into)
        elif isinstance(value, float) and not math.isfinite(value):
            into[key] = None
        else:
            into[key] = value
    return into


def run_kafka(args: argparse.Namespace, *, saved: Sequence[Record] = ()) -> list[Record]:
    """The ``kafka`` suite: ``args.repeat`` runs of the broker bench, one record each."""
    for name in ("records", "samples", "clients", "transactions", "starts", "repeat"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.idle < 0 or not 0 < args.seconds <= 10:
        raise SystemExit(f"--idle must be >= 0 and --seconds in (0, 10], got {args.seconds}")
    bench = _kafka_bench()
    try:
        import uvloop  # noqa: F401  (the broker runs on uvloop when it is installed)
    except ImportError:
        loop = "asyncio"
    else:
        loop = "uvloop"
    params: Params = {name: getattr(args, name) for name in KAFKA_OPTIONS}
    records: list[Record] = []
    for repeat in range(args.repeat):
        ident: Record = {"suite": "kafka", "impl": "wheel", "loop": loop, "gc": "on"}
        try:
            results = bench.run(
                args.records,
                args.samples,
                args.idle,
                args.seconds,
                args.clients,
                transactions=args.transactions,
                starts=args.starts,
                compact_records=args.compact_records,
            )
        except Exception as exc:  # keep the other runs' results
            traceback.print_exc(file=sys.stderr)
            records.append({**ident, **params, "repeat": repeat, "error": repr(exc)})
        else:
            print(f"kafka run {repeat + 1}:\n{bench.format_results(results)}\n")
            record: Record = {
                **ident,
                "build": "compiled" if aiopurgatory.COMPILED else "pure",
                "repeat": repeat,
                **params,
            }
            records.append(_flatten("", results, record))
        if args.json:
            _save(args.json, [*saved, *records])
    return records


def _ceiling_step(impl: str, loop: str, gc: str, params: dict[str, int | float | str]) -> Record:
    """One run of the purgatory suite for :mod:`bench.ceiling` (its errors recorded)."""
    case = Case("purgatory", impl, loop, gc, 0, params)
    try:
        return run_isolated(case) if impl == PURE else run_case(case)
    except Exception as exc:
        return {**_ident(case), **params, "error": repr(exc)}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_case"]:  # the child side of run_isolated
        fields = json.loads(argv[1])
        print(json.dumps(run_case(Case(**fields)), allow_nan=False))
        return 0
    if argv[:1] == ["ceiling"]:
        return ceiling.main(argv[1:], _ceiling_step, ceiling_plot)
    if argv[:1] == ["loop"]:
        from . import loop

        return loop.main(argv[1:])
    if argv[:1] == ["loop-server"]:  # imported here: it needs aiohttp (and wrk)
        from . import loop_server

        return loop_server.main(argv[1:])
    if argv[:1] == ["allocs"]:
        from . import allocs

        return allocs.main(argv[1:])
    if argv[:1] == ["redis-fanout"]:  # imported here: it needs redis-py and redis-server
        from . import redis_fanout

        return redis_fanout.main(argv[1:])
    args = parser().parse_args(argv)
    if args.suite == "summarize":
        records: list[Record] = []
        for name in args.files:
            with open(name, encoding="utf-8") as file:
                records += json.load(file)
        print(render(records, markdown=args.markdown))
        return 0
    if args.suite == "kafka":
        _apply_sizes(args)
        records = run_kafka(args)
        print(render(records, markdown=args.markdown))
        return 1 if any("error" in r for r in records) else 0
    if args.suite == "all":
        records = run_all(args)
        print(render(records, markdown=args.markdown))
        return 1 if any("error" in r for r in records) else 0
    _apply_sizes(args)
    records = run_suite(args.suite, args)
    print(render(records, markdown=args.markdown))
    return 1 if any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
