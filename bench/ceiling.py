"""``python -m bench ceiling``: the highest request rate each implementation sustains.

Kafka's purgatory workload (the ``purgatory`` suite: Poisson arrivals, 200 ms timeout,
a lognormal completion latency per scenario) at rising offered rates (times ``step``) from
``start``, until a run misses the bar:

* it achieves at least :data:`ACHIEVED_PCT` % of the offered rate,
* p99 expiry lateness is at most :data:`P99_MS` ms,
* nothing expires early, finishes twice or is left unfinished.

The ceiling is the highest rate that passed (when ``start`` already fails, the search
steps down instead). Beside every scenario the table prints Kafka's JVM purgatory from
``shared/anchors/kafka-jvm-purgatory.jsonl`` judged by the same bar, and its highest
sustained rate whatever its lateness, with the ratios ours ÷ JVM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Final

from .common import GC_MODES, LOOPS, Record

ACHIEVED_PCT: Final = 99.5
P99_MS: Final = 5.0
ANCHOR_ENV: Final = "AIOPURGATORY_ANCHORS"
"""A directory holding ``kafka-jvm-purgatory.jsonl`` (default: ../shared/anchors)."""

SIZES: Final[dict[str, dict[str, float]]] = {
    # start rate, step, highest rate tried, seconds of requests per step, and runs that
    # judge a rate whose first run fails (the majority decides, see search)
    "full": {"start": 100_000, "step": 1.25, "max_rate": 800_000, "seconds": 1.5, "confirm": 3},
    "quick": {"start": 50_000, "step": 1.5, "max_rate": 400_000, "seconds": 0.5, "confirm": 1},
    "smoke": {"start": 2_000, "step": 1.5, "max_rate": 4_500, "seconds": 0.1, "confirm": 1},
}
LOWEST: Final = 1_000
"""A search stepping down stops here: the implementation sustains nothing useful."""

RunStep = Callable[[str, str, str, dict[str, int | float | str]], Record]
"""(impl, loop, gc, params) -> the ``purgatory`` suite's record of one run."""


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
) -> Record:
    """One ceiling: up from ``start`` while runs pass (down while they fail).

    With ``confirm`` = 3, a rate whose first run fails is run again until two runs
    agree: it passes when most of its runs pass, as the JVM anchor's three runs per
    rate are judged by their medians. On a shared machine one run can miss the bar
    because something else took the CPU for a few milliseconds.
    """
    if step <= 1.0:
        raise ValueError(f"step must be > 1, got {step!r}")
    runs = int(confirm)
    if runs != confirm or runs < 1 or runs % 2 == 0:
        raise ValueError(f"confirm must be an odd number of runs >= 1, got {confirm!r}")

    def attempt(rate: float) -> Record:
        params: dict[str, int | float | str] = {
            "scenario": scenario,
            "keys": keys,
            "rate": round(rate),
            "requests": max(1, round(rate * seconds)),
            "max_seconds": seconds,
            "batch": 64,
        }
        return run(impl, loop, gc, params)

    steps: list[Record] = []

    def judge(rate: float) -> tuple[Record, bool]:
        """The rate's deciding record, and whether the rate passed."""
        first = attempt(rate)
        steps.append(first)
        if verdict(first) is None or runs == 1:
            return first, verdict(first) is None
        need = runs // 2 + 1
        passes, fails, passed = 0, 1, first
        while passes < need and fails < need:
            record = attempt(rate)
            steps.append(record)
            if verdict(record) is None:
                passes += 1
                passed = record
            else:
                fails += 1
        return (passed, True) if passes >= need else (first, False)

    best: Record | None = None
    failed: Record | None = None
    rate = start
    while rate <= max_rate:
        record, ok = judge(rate)
        if ok:
            best = record
            rate *= step
        else:
            failed = record
            break
    if best is None:  # the start rate already fails: look below it
        rate = start / step
        while rate >= LOWEST:
            record, ok = judge(rate)
            if ok:
                best = record
                break
            rate /= step
    out: Record = {
        "suite": "ceiling",
        "impl": impl,
        "loop": loop,
        "gc": gc,
        "scenario": scenario,
        "keys": keys,
        "ceiling_per_s": best["rate"] if best else 0,
        "tried": len(steps),
        "failed_at_per_s": failed["rate"] if failed else None,
        "failed_because": verdict(failed) if failed else None,
    }
    for metric in ("late_p50_ms", "late_p99_ms", "late_p999_ms", "cpu_s_per_1m"):
        out[metric] = best.get(metric) if best else None
    # What the first failing rate did: its achieved rate times its CPU per request is
    # the share of a core the process got, which says whether CPU or stalls bound it.
    for metric in ("achieved_per_s", "achieved_pct", "late_p99_ms", "cpu_s_per_1m"):
        out["failed_" + metric] = failed.get(metric) if failed else None
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


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, int) and value >= 10_000:
        return f"{value / 1000:.0f}k"
    return str(value)


def render(records: Sequence[Record], anchor: dict[str, dict[str, float]] | None) -> str:
    """The ceiling table, with the JVM's figures and ratios per scenario."""
    head = (
        "scenario",
        "keys",
        "impl",
        "loop",
        "gc",
        "ceiling/s",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "cpu s/1M",
        "failed next",
        "JVM ceiling/s",
        "ours÷JVM",
        "JVM max/s",
        "ours÷JVM max",
    )
    rows: list[tuple[str, ...]] = [head]
    for r in sorted(records, key=lambda r: tuple(str(r[k]) for k in head[:5])):
        jvm = (anchor or {}).get(str(r["scenario"]), {})
        ours = r["ceiling_per_s"]
        assert isinstance(ours, int | float)
        ceiling, top = jvm.get("ceiling_per_s"), jvm.get("max_sustained_per_s")
        rows.append(
            (
                *(str(r[k]) for k in head[:5]),
                _fmt(ours),
                _fmt(r["late_p50_ms"]),
                _fmt(r["late_p99_ms"]),
                _fmt(r["late_p999_ms"]),
                _fmt(r["cpu_s_per_1m"]),
                str(r["failed_because"] or "-"),
                _fmt(round(ceiling)) if ceiling is not None else "-",
                f"{ours / ceiling:.1f}x" if ceiling else "-",
                _fmt(round(top)) if top is not None else "-",
                f"{ours / top:.2f}x" if top else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["## ceiling", ""]
    lines.append(
        f"the highest offered rate with >= {ACHIEVED_PCT}% achieved, p99 expiry lateness"
        f" <= {P99_MS} ms, nothing early; JVM: Kafka's purgatory by the same bar"
        " (shared/anchors), and its highest sustained rate whatever its lateness"
    )
    lines.append("")
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    if anchor is None:
        lines.append(f"(no JVM anchor at {anchor_path()})")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench ceiling", description=__doc__)
    p.add_argument("--impl", default="wheel,heap", help="comma-separated implementations")
    p.add_argument("--loop", choices=[*LOOPS, "both"], default="both")
    p.add_argument("--gc", default="on,off", help=f"comma-separated, of {', '.join(GC_MODES)}")
    p.add_argument("--scenario", default="low,high")
    p.add_argument("--keys", default="shared,unique")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true")
    size.add_argument("--smoke", action="store_true")
    for name in ("start", "step", "max_rate", "seconds", "confirm"):
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=float)
    p.add_argument("--json", metavar="FILE", help="write the records as a JSON list")
    return p


def main(argv: Sequence[str], run: RunStep) -> int:
    args = parser().parse_args(argv)
    size = SIZES["smoke" if args.smoke else "quick" if args.quick else "full"]
    knobs = {name: getattr(args, name) or default for name, default in size.items()}
    loops = list(LOOPS) if args.loop == "both" else [args.loop]
    records: list[Record] = []
    for scenario in args.scenario.split(","):
        for keys in args.keys.split(","):
            for loop in loops:
                for gc in args.gc.split(","):
                    for impl in args.impl.split(","):
                        record = search(run, impl, loop, gc, scenario, keys, **knobs)
                        records.append(record)
                        print(
                            f"ceiling {scenario} {keys} {impl} {loop} gc={gc}:"
                            f" {record['ceiling_per_s']}/s",
                            file=sys.stderr,
                        )
                        if args.json:
                            with open(args.json, "w", encoding="utf-8") as file:
                                json.dump(records, file, indent=1, allow_nan=False)
    print(render(records, load_jvm_anchor()))
    return 0
