"""Writing the report directory: tables (Parquet and CSV), PNG plots, report.md.

Layout of ``out``::

    report.md            the report, linking everything below
    summary.csv          one row per purgatory and kind
    plots/*.png          figures
    tables/*.parquet     every table, also as tables/*.csv
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pandas as pd

from aiopurgatory.analysis import plots
from aiopurgatory.analysis.bench_records import bench_rates, load_bench
from aiopurgatory.analysis.job import RELATIVE_ERROR, Progress, TraceAnalysis, analyze
from aiopurgatory.analysis.sweep import SWEEP_METRICS, run_sweep

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SUMMARY_COLUMNS", "ReportInputs", "build_report", "write_report"]

SUMMARY_COLUMNS: Final = (
    "purgatory",
    "kind",
    "operations",
    "completed",
    "expired",
    "cancelled",
    "closed",
    "timeout_rate",
    "latency_p50_ms",
    "latency_p90_ms",
    "latency_p99_ms",
    "latency_p999_ms",
    "lateness_p50_ms",
    "lateness_p99_ms",
    "lateness_max_ms",
    "early_expiries",
    "throughput_per_s",
)


REPORT_COLUMNS: Final = (
    ("purgatory", "purgatory"),
    ("kind", "kind"),
    ("operations", "ops"),
    ("timeout_rate", "timeout rate"),
    ("latency_p50_ms", "p50 ms"),
    ("latency_p99_ms", "p99 ms"),
    ("latency_p999_ms", "p99.9 ms"),
    ("lateness_p99_ms", "late p99 ms"),
    ("lateness_max_ms", "late max ms"),
    ("early_expiries", "early"),
)
"""Summary columns in report.md (summary.csv has them all), with their headers."""


@dataclass(frozen=True, slots=True)
class ReportInputs:
    """What goes into a report besides the traces."""

    bench: tuple[Path, ...] = ()
    """``python -m bench --json`` files to include."""
    sweep: bool = False
    """Run the tick x wheel-size sweep on Spark and include it."""
    sweep_operations: int = 20_000
    title: str = "aiopurgatory trace report"
    preamble: str = ""
    """Markdown placed under the title (for example what produced the traces)."""


def build_report(
    spark: SparkSession,
    paths: Sequence[str],
    out: Path,
    inputs: ReportInputs = ReportInputs(),
    *,
    progress: Progress | None = None,
) -> Path:
    """Analyse the traces under ``paths`` and write the report into ``out``."""
    step = progress or (lambda _: None)
    began = time.perf_counter()
    analysis = analyze(spark, paths, progress=step)
    sweep = None
    if inputs.sweep:
        step("tick x wheel size sweep")
        sweep = run_sweep(spark, operations=inputs.sweep_operations)
    bench = load_bench(inputs.bench) if inputs.bench else None
    step("writing tables, plots and report")
    seconds = time.perf_counter() - began
    return write_report(
        analysis, out, inputs, spark=_describe(spark), sweep=sweep, bench=bench, seconds=seconds
    )


def write_report(
    analysis: TraceAnalysis,
    out: Path,
    inputs: ReportInputs = ReportInputs(),
    *,
    spark: str = "",
    sweep: pd.DataFrame | None = None,
    bench: pd.DataFrame | None = None,
    seconds: float | None = None,
) -> Path:
    """Write tables, plots, ``summary.csv`` and ``report.md``; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    tables = {
        "summary": analysis.summary,
        "timeline": analysis.timeline,
        "latency_cdf": analysis.latency_cdf,
        "lateness_histogram": analysis.lateness,
    }
    figures = plots.plot_trace(analysis, out / "plots")
    rates = None
    if sweep is not None:
        tables["sweep"] = sweep
        figures |= plots.plot_sweep(sweep, out / "plots")
    if bench is not None:
        rates = bench_rates(bench)
        tables["bench_rates"] = rates
        if not rates.empty:
            figures["bench_rates"] = plots.plot_bench_rates(
                rates, out / "plots" / "bench_rates.png"
            )
    for name, table in tables.items():
        _write_table(table, out / "tables", name)
    summary = analysis.summary[list(SUMMARY_COLUMNS)]
    summary.to_csv(out / "summary.csv", index=False)
    text = _markdown(analysis, inputs, summary, figures, tables, spark, sweep, rates, seconds, out)
    path = out / "report.md"
    path.write_text(text, encoding="utf-8")
    return path


def _write_table(table: pd.DataFrame, directory: Path, name: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    table.to_parquet(directory / f"{name}.parquet", index=False)
    table.to_csv(directory / f"{name}.csv", index=False)


def _describe(spark: SparkSession) -> str:
    try:
        master = spark.conf.get("spark.master") or "?"
    except Exception:  # Spark Connect may not expose the master
        master = "Spark Connect"
    return f"Spark {spark.version} on {master}"


def _fmt(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        if value == 0 or abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(frame: pd.DataFrame, columns: Sequence[str], headers: Sequence[str]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in frame[list(columns)].itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(_plain(v)) for v in row) + " |")
    return lines


def _plain(value: object) -> object:
    """numpy scalars as Python ints and floats."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _markdown(
    analysis: TraceAnalysis,
    inputs: ReportInputs,
    summary: pd.DataFrame,
    figures: dict[str, Path],
    tables: dict[str, pd.DataFrame],
    spark: str,
    sweep: pd.DataFrame | None,
    rates: pd.DataFrame | None,
    seconds: float | None,
    out: Path,
) -> str:
    def link(name: str, alt: str) -> list[str]:
        return [f"![{alt}]({figures[name].relative_to(out).as_posix()})", ""]

    start = dt.datetime.fromtimestamp(analysis.start_wall_ns / 1e9, tz=dt.UTC)
    early = int(summary["early_expiries"].sum())
    lines = [f"# {inputs.title}", ""]
    if inputs.preamble:
        lines += [inputs.preamble, ""]
    lines += [
        f"- traces: {', '.join(f'`{s}`' for s in analysis.sources)}",
        f"- operations: {analysis.operations:,} over {analysis.duration_s:,.2f} s,"
        f" from {start:%Y-%m-%d %H:%M:%S} UTC",
        f"- early expiries: **{early}** (an expired operation finishing before its deadline;"
        " must be 0)",
    ]
    if spark:
        timing = f" in {seconds:.1f} s" if seconds is not None else ""
        lines.append(f"- computed with {spark}{timing}")
    lines += [
        "",
        "## Summary",
        "",
        "Latency is finished - created for operations completed by their condition"
        f" (percentiles within {RELATIVE_ERROR:.1%} of the value); timeout rate is"
        " expired / operations; lateness is finished - deadline for expired operations.",
        "",
        *_table(summary, [c for c, _ in REPORT_COLUMNS], [h for _, h in REPORT_COLUMNS]),
        "",
        "Every column, with p90 and the outcome counts: [summary.csv](summary.csv).",
        "",
        "## Throughput and expirations over time",
        "",
        *link("throughput", "throughput and expirations over time"),
        "## Pending operations over time",
        "",
        "Registered and not yet finished at the end of each bin (from created and finished"
        " times; operations still pending when recording stopped are not in the trace).",
        "",
        *link("pending", "pending operations over time"),
        "## Completion latency",
        "",
        *link("latency_cdf", "completion latency CDF"),
        "## Expiry lateness",
        "",
        *link("lateness", "expiry lateness histogram"),
    ]
    if sweep is not None:
        lines += _sweep_section(sweep, link)
    if rates is not None:
        lines += ["## Benchmarks: target against achieved rate", ""]
        if rates.empty:
            lines += ["The benchmark records hold no `purgatory` suite runs.", ""]
        else:
            lines += link("bench_rates", "target against achieved rate")
            lines += [*_table(rates, list(rates.columns), list(rates.columns)), ""]
    lines += ["## Tables", ""]
    lines += [
        f"- {name}: [Parquet](tables/{name}.parquet), [CSV](tables/{name}.csv)" for name in tables
    ]
    return "\n".join(lines) + "\n"


def _sweep_section(sweep: pd.DataFrame, link: Callable[[str, str], list[str]]) -> list[str]:
    lines = [
        "## Sensitivity to tick and wheel size",
        "",
        "Each (scenario, tick, wheel size) ran as one Spark task: a timing wheel driven in"
        " virtual time, the way the timer drives it, over a generated workload. Coarser"
        " ticks mean fewer wake-ups and later expiries (lateness stays under one tick, never"
        " negative); small wheels cascade more (re-insertions per operation) but keep the"
        " expiration heap small.",
        "",
    ]
    for metric, alt in SWEEP_METRICS:
        lines += link(f"sweep_{metric}", alt)
    early = int(sweep["early"].sum())
    lines += [f"Early expiries across the sweep: **{early}**.", ""]
    return lines
