"""``python -m bench ceiling``: the highest request rate each implementation sustains.

Kafka's purgatory workload (the ``purgatory`` suite: Poisson arrivals, 200 ms timeout,
a lognormal completion latency per scenario) at rising offered rates (times ``step``) from
``start``, until a run misses the bar:

* it achieves at least :data:`ACHIEVED_PCT` % of the offered rate,
* p99 expiry lateness is at most :data:`P99_MS` ms,
* nothing expires early, finishes twice or is left unfinished.

Each rate is held (``--hold steady``, the default) for ``seconds`` (4 s at full size) or
``requests`` requests (a million), whichever comes first, after ``warmup`` seconds of
the same requests (1 s) that are not counted: a step of 1.5 s ends before the pending
set and the collector's older generations reach their steady state. Each run's record
(every step of the search, the ceiling's and the failing rate's) carries the counted
window's collections per generation (``gc0``-``gc2``, with the longest pause
``gc_pause_max_ms``) and the loop's longest stall (``stall_max_ms``: the lateness of a
1 ms probe callback, which sees what an expiring operation sees on either loop).
``--hold short`` (``--short``) is the step the figures were published with before
(1.5 s at full size, no warm-up, no cap on requests); ``--hold steady,short`` runs both
searches in one run, and the table shows them side by side.

When a rate passes and the next one up fails (when ``start`` already fails, the search
steps down instead), the search bisects that bracket geometrically ``refine`` times (the
rate tried is the geometric mean of the highest pass and the lowest failure), so the
1.25-step grid's 244k → 305k gap narrows to about 6% with ``refine`` = 2. The ceiling is the
highest rate that passed, ``failed_at_per_s`` the lowest that failed above it, and every
run the search made is kept in the record's ``steps``. Beside every scenario the table
prints Kafka's JVM purgatory from ``shared/anchors/kafka-jvm-purgatory.jsonl`` judged by
the same bar, and its highest sustained rate whatever its lateness, with the ratios
ours ÷ JVM. ``--plot OUT.svg`` draws expiry lateness against offered rate from the steps
(:func:`bench.report.ceiling_plot`); ``--records FILE...`` prints the table and draws the
plot of saved records without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from .common import GC_MODES, LOOPS, Record, Value

ACHIEVED_PCT: Final = 99.5
P99_MS: Final = 5.0
ANCHOR_ENV: Final = "AIOPURGATORY_ANCHORS"
"""A directory holding ``kafka-jvm-purgatory.jsonl`` (default: ../shared/anchors)."""

SIZES: Final[dict[str, dict[str, float]]] = {
    # start rate, step, highest rate tried, seconds of counted requests per step (at
    # most ``requests`` of them) after ``warmup`` seconds not counted, runs that judge
    # a rate whose first run fails (the majority decides, see search), and bisections
    # of the bracket between the highest pass and the first failure
    "full": {
        "start": 100_000,
        "step": 1.25,
        "max_rate": 800_000,
        "seconds": 4.0,
        "requests": 1_000_000,
        "warmup": 1.0,
        "confirm": 3,
        "refine": 2,
    },
    "quick": {
        "start": 50_000,
        "step": 1.5,
        "max_rate": 400_000,
        "seconds": 1.0,
        "requests": 1_000_000,
        "warmup": 0.5,
        "confirm": 1,
        "refine": 1,
    },
    "smoke": {
        "start": 2_000,
        "step": 1.5,
        "max_rate": 4_500,
        "seconds": 0.1,
        "requests": 1_000_000,
        "warmup": 0.05,
        "confirm": 1,
        "refine": 1,
    },
}
SHORT_SECONDS: Final[dict[str, float]] = {"full": 1.5, "quick": 0.5, "smoke": 0.1}
"""``--hold short``: the step each size had before the steady hold (no warm-up, no cap
on requests), whatever ``--seconds``, ``--warmup`` and ``--requests`` say."""
HOLDS: Final = ("steady", "short")
DEFAULT_GC: Final = "on"
"""GC off doubles the run (about 10 minutes at full size): ``--gc on,off`` asks for it."""
LOWEST: Final = 1_000
"""A search stepping down stops here: the implementation sustains nothing useful."""

RunStep = Callable[[str, str, str, dict[str, int | float | str]], Record]
"""(impl, loop, gc, params) -> the ``purgatory`` suite's record of one run."""

STEP_FIELDS: Final = (
    "achieved_per_s",
    "achieved_pct",
    "late_p50_ms",
    "late_p99_ms",
    "late_p999_ms",
    "cpu_s_per_1m",
    "requests",
    "window_s",
    "gc0",
    "gc1",
    "gc2",
    "gc_pause_max_ms",
    "stall_max_ms",
)
"""What a ceiling record keeps of each run, beside its ``rate`` and ``passed``: the
counted window's requests, length, collections per generation, longest collection and
longest loop stall (None in runs made before they were measured)."""

RUN_FIELDS: Final = tuple(
    f for f in STEP_FIELDS if f not in ("achieved_per_s", "achieved_pct", "requests")
)
"""What the record keeps of the ceiling's deciding run: the :data:`STEP_FIELDS` but its
achieved rate and its request count."""
FAILED_FIELDS: Final = (
    "achieved_per_s",
    "achieved_pct",
    "late_p99_ms",
    "cpu_s_per_1m",
    "gc0",
    "gc1",
    "gc2",
    "gc_pause_max_ms",
    "stall_max_ms",
)
"""What it keeps of the lowest failing rate's (as ``failed_*``)."""

Step = dict[str, int | float | bool | None]
"""One run of a search: ``rate``, the :data:`STEP_FIELDS`, and ``passed`` (the bar)."""

CeilingRecord = dict[str, Value | list[Step]]
"""A ceiling record: a flat record, plus ``steps`` (absent from records before them)."""


def verdict(record: Record) -> str | None:
    """Why a ``purgatory`` record misses the bar, or None when it passes."""
    if "error" in record:
        return f"error: {record['error']}"
    if record.get("unfinished") or record.get("doubles"):
        return "unfinished or doubly finished requests"
    if record.get("early"):
        return f"{record['early']} expired early"
    achieved = record.get("achieved_pct")
    if not isinstance(achieved, int | float) or achieved < ACHIEVED_PCT:
        return f"achieved {achieved}% of the offered rate"
    p99 = record.get("late_p99_ms")
    if isinstance(p99, int | float) and p99 > P99_MS:
        return f"p99 lateness {p99} ms"
    return None


def search(
    run: RunStep,
    impl: str,
    loop: str,
    gc: str,
    scenario: str,
    keys: str,
    *,
    start: float,
    step: float,
    max_rate: float,
    seconds: float,
    confirm: float = 1,
    refine: float = 0,
    warmup: float = 0.0,
    requests: float | None = None,
    hold: str = "steady",
) -> CeilingRecord:
    """One ceiling: up from ``start`` while runs pass (down while they fail), then
    ``refine`` geometric bisections between the highest pass and the lowest failure.

    With ``confirm`` = 3, a rate whose first run fails is run again until two runs
    agree: it passes when most of its runs pass, as the JVM anchor's three runs per
    rate are judged by their medians. On a shared machine one run can miss the bar
    because something else took the CPU for a few milliseconds. Bisection judges its
    rates the same way, and stops early once the bracket is narrower than 1 request/s.

    Each run issues ``warmup`` seconds of requests it does not count, then counts
    ``seconds`` of them, or ``requests`` if fewer (None: no cap). ``hold`` only names
    the choice in the record (``steady`` or ``short``).
    """
    if step <= 1.0:
        raise ValueError(f"step must be > 1, got {step!r}")
    runs = int(confirm)
    if runs != confirm or runs < 1 or runs % 2 == 0:
        raise ValueError(f"confirm must be an odd number of runs >= 1, got {confirm!r}")
    bisections = int(refine)
    if bisections != refine or bisections < 0:
        raise ValueError(f"refine must be a whole number of bisections >= 0, got {refine!r}")
    if seconds <= 0 or warmup < 0 or (requests is not None and requests < 1):
        raise ValueError(f"need seconds > 0, warmup >= 0, requests >= 1: {seconds, warmup}")

    steps: list[Step] = []

    def attempt(rate: int) -> Record:
        params: dict[str, int | float | str] = {
            "scenario": scenario,
            "keys": keys,
            "rate": rate,
            "requests": max(1, round(min(rate * seconds, requests or math.inf))),
            "max_seconds": seconds,
            "warmup": warmup,
            "batch": 64,
        }
        record = run(impl, loop, gc, params)
        summary: Step = {"rate": rate}
        for metric in STEP_FIELDS:
            value = record.get(metric)
            summary[metric] = value if isinstance(value, int | float) else None
        summary["passed"] = verdict(record) is None
        steps.append(summary)
        return record

    def judge(rate: int) -> tuple[Record, bool]:
        """The rate's deciding record, and whether the rate passed."""
        first = attempt(rate)
        if verdict(first) is None or runs == 1:
            return first, verdict(first) is None
        need = runs // 2 + 1
        passes, fails, passed = 0, 1, first
        while passes < need and fails < need:
            record = attempt(rate)
            if verdict(record) is None:
                passes += 1
                passed = record
            else:
                fails += 1
        return (passed, True) if passes >= need else (first, False)

    # Rates are whole requests per second; the bracket is kept as floats so that the
    # coarse grid stays geometric (100k, 125k, 156,250, 195,312.5, ...).
    best: Record | None = None
    best_rate = 0.0
    failed: Record | None = None
    failed_rate = 0.0
    rate = start
    while rate <= max_rate:
        record, ok = judge(round(rate))
        if ok:
            best, best_rate = record, rate
            rate *= step
        else:
            failed, failed_rate = record, rate
            break
    if best is None:  # the start rate already fails: look below it
        rate = start / step
        while rate >= LOWEST:
            record, ok = judge(round(rate))
            if ok:
                best, best_rate = record, rate
                break
            failed, failed_rate = record, rate  # the lowest failure so far
            rate /= step
    refined = 0
    if best is not None and failed is not None:
        for _ in range(bisections):
            middle = math.sqrt(best_rate * failed_rate)
            if round(middle) in (round(best_rate), round(failed_rate)):
                break  # the bracket is already one request/s wide
            record, ok = judge(round(middle))
            refined += 1
            if ok:
                best, best_rate = record, middle
            else:
                failed, failed_rate = record, middle
    out: CeilingRecord = {
        "suite": "ceiling",
        "impl": impl,
        "loop": loop,
        "gc": gc,
        "scenario": scenario,
        "keys": keys,
        "hold": hold,
        "hold_s": seconds,
        "hold_requests": None if requests is None else int(requests),
        "warmup_s": warmup,
        "ceiling_per_s": round(best_rate) if best else 0,
        "tried": len(steps),
        "refined": refined,
        "failed_at_per_s": round(failed_rate) if failed else None,
        "failed_because": verdict(failed) if failed else None,
    }
    for metric in RUN_FIELDS:
        out[metric] = best.get(metric) if best else None
    # What the lowest failing rate did: its achieved rate times its CPU per request is
    # the share of a core the process got, which says whether CPU or stalls bound it;
    # its collections and its longest stall say what set its tail.
    for metric in FAILED_FIELDS:
        out["failed_" + metric] = failed.get(metric) if failed else None
    out["steps"] = steps
    return out


# -- Kafka's JVM purgatory, judged by the same bar ---------------------------------------


def anchor_path() -> Path:
    base = os.environ.get(ANCHOR_ENV)
    root = Path(base) if base else Path(__file__).resolve().parents[2] / "shared" / "anchors"
    return root / "kafka-jvm-purgatory.jsonl"


def jvm_anchor(lines: Iterable[str]) -> dict[str, dict[str, float]]:
    """Per scenario: the JVM's ceiling by our bar and its highest sustained rate.

    Each rate was run three times; a rate passes when the medians of its runs do.
    """
    runs: dict[tuple[str, float], list[dict[str, float]]] = {}
    for line in lines:
        if line.lstrip().startswith("{"):  # the file ends with a DONE line
            row = json.loads(line)
            runs.setdefault((row["label"], float(row["rate"])), []).append(row)
    out: dict[str, dict[str, float]] = {}
    for (scenario, rate), rows in sorted(runs.items()):
        achieved = statistics.median(r["actual_rate"] / r["target_rate"] for r in rows)
        p99 = statistics.median(r["late_ms_p99"] for r in rows)
        sustained = statistics.median(r["actual_rate"] for r in rows)
        entry = out.setdefault(scenario, {"ceiling_per_s": 0.0, "max_sustained_per_s": 0.0})
        if 100 * achieved >= ACHIEVED_PCT and p99 <= P99_MS:
            entry["ceiling_per_s"] = max(entry["ceiling_per_s"], rate)
            entry["cpu_s_per_1m_at_ceiling"] = statistics.median(r["cpu_s_per_1M"] for r in rows)
        entry["max_sustained_per_s"] = max(entry["max_sustained_per_s"], sustained)
    return out


def load_jvm_anchor() -> dict[str, dict[str, float]] | None:
    path = anchor_path()
    if not path.exists():
        return None
    return jvm_anchor(path.read_text().splitlines())


def jvm_lateness(lines: Iterable[str]) -> dict[str, list[tuple[float, float, float, bool]]]:
    """Per scenario, per offered rate (ascending): the medians of the JVM's runs' p50
    and p99 expiry lateness in ms, and whether the rate passes the bar (as in
    :func:`jvm_anchor`), as ``(rate, p50, p99, passed)``.

    The offered rate is the anchor's target; above about 200k/s the JVM achieves less.
    """
    runs: dict[tuple[str, float], list[dict[str, float]]] = {}
    for line in lines:
        if line.lstrip().startswith("{"):  # the file ends with a DONE line
            row = json.loads(line)
            runs.setdefault((row["label"], float(row["rate"])), []).append(row)
    out: dict[str, list[tuple[float, float, float, bool]]] = {}
    for (scenario, rate), rows in sorted(runs.items()):
        achieved = statistics.median(r["actual_rate"] / r["target_rate"] for r in rows)
        p50 = statistics.median(r["late_ms_p50"] for r in rows)
        p99 = statistics.median(r["late_ms_p99"] for r in rows)
        passed = 100 * achieved >= ACHIEVED_PCT and p99 <= P99_MS
        out.setdefault(scenario, []).append((rate, p50, p99, passed))
    return out


def load_jvm_lateness() -> dict[str, list[tuple[float, float, float, bool]]] | None:
    """:func:`jvm_lateness` of the anchor at :func:`anchor_path`, or None without it."""
    path = anchor_path()
    if not path.exists():
        return None
    return jvm_lateness(path.read_text().splitlines())


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, int) and value >= 10_000:
        return f"{value / 1000:.0f}k"
    return str(value)


def _hold(record: Mapping[str, object]) -> str:
    """``steady 4 s`` or ``short 1.5 s``; records made before the steady hold were all
    short steps (``short``)."""
    hold = record.get("hold")
    if hold is None:
        return "short"
    seconds = record.get("hold_s")
    return f"{hold} {seconds:g} s" if isinstance(seconds, int | float) else str(hold)


def _collector(record: Mapping[str, object], prefix: str = "") -> str:
    """``gc0/gc1/gc2, stall ms`` of a run, ``-`` where it was not measured."""
    counts = [record.get(f"{prefix}gc{g}") for g in range(3)]
    stall = record.get(prefix + "stall_max_ms")
    if all(c is None for c in counts) and stall is None:
        return "-"
    text = "/".join("-" if c is None else str(c) for c in counts)
    return f"{text}, {_fmt(stall)}"


def _failed_next(record: Mapping[str, object]) -> str:
    because = record.get("failed_because")
    if not because:
        return "-"
    at = record.get("failed_at_per_s")
    return f"{_fmt(at)}: {because}" if isinstance(at, int | float) else str(because)


def render(
    records: Sequence[Mapping[str, object]],
    anchor: dict[str, dict[str, float]] | None,
    *,
    markdown: bool = False,
) -> str:
    """The ceiling table, with the JVM's figures and ratios per scenario.

    Records written before the refinement and the steps (no ``steps``, no ``refined``)
    render alike: the table reads only the fields every ceiling record has.
    """
    head = (
        "scenario",
        "keys",
        "impl",
        "loop",
        "gc",
        "hold",
        "ceiling/s",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "cpu s/1M",
        "gc 0/1/2, stall ms",
        "failed next",
        "its gc 0/1/2, stall ms",
        "JVM ceiling/s",
        "ours÷JVM",
        "JVM max/s",
        "ours÷JVM max",
    )
    rows: list[tuple[str, ...]] = []

    def order(r: Mapping[str, object]) -> tuple[str, ...]:
        return (*(str(r.get(k)) for k in head[:5]), _hold(r))

    for r in sorted(records, key=order):
        jvm = (anchor or {}).get(str(r.get("scenario")), {})
        ours = r.get("ceiling_per_s")
        if not isinstance(ours, int | float):
            ours = 0
        ceiling, top = jvm.get("ceiling_per_s"), jvm.get("max_sustained_per_s")
        rows.append(
            (
                *(str(r.get(k)) for k in head[:5]),
                _hold(r),
                _fmt(ours),
                _fmt(r.get("late_p50_ms")),
                _fmt(r.get("late_p99_ms")),
                _fmt(r.get("late_p999_ms")),
                _fmt(r.get("cpu_s_per_1m")),
                _collector(r),
                _failed_next(r),
                _collector(r, "failed_"),
                _fmt(round(ceiling)) if ceiling is not None else "-",
                f"{ours / ceiling:.1f}x" if ceiling else "-",
                _fmt(round(top)) if top is not None else "-",
                f"{ours / top:.2f}x" if top else "-",
            )
        )
    lines = ["## ceiling", ""]
    lines.append(
        f"the highest offered rate with >= {ACHIEVED_PCT}% achieved, p99 expiry lateness"
        f" <= {P99_MS} ms, nothing early; JVM: Kafka's purgatory by the same bar"
        " (shared/anchors), and its highest sustained rate whatever its lateness; hold:"
        " seconds counted per rate (steady: after a warm-up; short: the step published"
        " before); gc 0/1/2: collections per generation in the counted window; stall: the"
        " loop's longest, in ms"
    )
    lines.append("")
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    else:
        widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
        for row in [head, *rows]:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    if anchor is None:
        where = "shared/anchors/kafka-jvm-purgatory.jsonl" if markdown else str(anchor_path())
        lines += ["", f"(no JVM anchor: {where} not found)"]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench ceiling", description=__doc__)
    p.add_argument("--impl", default="wheel,heap", help="comma-separated implementations")
    p.add_argument("--loop", choices=[*LOOPS, "both"], default="both")
    p.add_argument(
        "--gc",
        default=DEFAULT_GC,
        help=f"comma-separated, of {', '.join(GC_MODES)} (default: {DEFAULT_GC})",
    )
    p.add_argument("--scenario", default="low,high")
    p.add_argument("--keys", default="shared,unique")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true")
    size.add_argument("--smoke", action="store_true")
    hold = p.add_mutually_exclusive_group()
    hold.add_argument(
        "--hold",
        default="steady",
        help="comma-separated, of: steady (--seconds of counted requests after --warmup,"
        " at most --requests), short (the step published before: 1.5 s at full size, no"
        " warm-up); steady,short runs both (default: steady)",
    )
    hold.add_argument("--short", action="store_true", help="--hold short")
    for name in SIZES["full"]:
        kind = int if name in ("refine", "requests") else float
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, help="default by size")
    p.add_argument("--json", metavar="FILE", help="write the records as a JSON list")
    p.add_argument(
        "--plot",
        metavar="OUT.svg",
        help="draw expiry lateness against offered rate (bench.report.ceiling_plot; needs"
        " matplotlib, in the docs extra)",
    )
    p.add_argument(
        "--records",
        metavar="FILE",
        nargs="+",
        help="run nothing: print the table (and --plot) of these saved records",
    )
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    return p


def read_records(names: Iterable[str | Path]) -> list[CeilingRecord]:
    """The ceiling records of saved JSON files (other suites' and errors left out)."""
    out: list[CeilingRecord] = []
    for name in names:
        with open(name, encoding="utf-8") as file:
            data = json.load(file)
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise SystemExit(f"{name}: expected a JSON list of benchmark records")
        out += [r for r in data if r.get("suite") == "ceiling" and "error" not in r]
    return out


Plotter = Callable[..., "bytes | None"]
"""``bench.report.ceiling_plot``: (records, jvm lateness, *, source) -> SVG bytes or None.
Handed in by ``bench.__main__``, which stands above both modules: the report reads
this module's bar and anchor, so this module does not import the report."""


def _plot(
    plot: Plotter | None, records: Sequence[Mapping[str, object]], out: str, source: str | None
) -> None:
    if plot is None:
        raise SystemExit("--plot needs a plotter (python -m bench ceiling passes the report's)")
    data = plot(records, load_jvm_lateness(), source=source)
    if data is None:
        raise SystemExit("no ceiling records to plot")
    Path(out).write_bytes(data)
    print(f"wrote {out}", file=sys.stderr)


def main(argv: Sequence[str], run: RunStep, plot: Plotter | None = None) -> int:
    """The ``ceiling`` command: ``run`` makes one purgatory run, ``plot`` draws ``--plot``."""
    args = parser().parse_args(argv)
    if args.records:
        records = read_records(args.records)
        print(render(records, load_jvm_anchor(), markdown=args.markdown))
        if args.plot:
            _plot(plot, records, args.plot, ", ".join(Path(n).name for n in args.records))
        return 0
    name = "smoke" if args.smoke else "quick" if args.quick else "full"
    size = SIZES[name]
    # "is None": --refine 0 is a choice, not a missing option
    knobs: dict[str, Any] = {
        name: default if getattr(args, name) is None else getattr(args, name)
        for name, default in size.items()
    }
    holds = ["short"] if args.short else [h for h in args.hold.split(",") if h]
    if not holds or set(holds) - set(HOLDS):
        raise SystemExit(f"--hold takes {', '.join(HOLDS)}, got {args.hold!r}")
    by_hold = {
        "steady": knobs,
        "short": {**knobs, "seconds": SHORT_SECONDS[name], "warmup": 0.0, "requests": None},
    }
    loops = list(LOOPS) if args.loop == "both" else [args.loop]
    records = []
    for scenario in args.scenario.split(","):
        for keys in args.keys.split(","):
            for loop in loops:
                for gc in args.gc.split(","):
                    for impl in args.impl.split(","):
                        for hold in holds:
                            record = search(
                                run, impl, loop, gc, scenario, keys, hold=hold, **by_hold[hold]
                            )
                            records.append(record)
                            print(
                                f"ceiling {scenario} {keys} {impl} {loop} gc={gc} {hold}:"
                                f" {record['ceiling_per_s']}/s ({record['tried']} runs)",
                                file=sys.stderr,
                            )
                            if args.json:
                                with open(args.json, "w", encoding="utf-8") as file:
                                    json.dump(records, file, indent=1, allow_nan=False)
    print(render(records, load_jvm_anchor(), markdown=args.markdown))
    if args.plot:
        _plot(plot, records, args.plot, Path(args.json).name if args.json else None)
    return 0
