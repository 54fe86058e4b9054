"""PNG figures of the analysis tables (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pandas as pd

from aiopurgatory.analysis.job import LATENESS_BINS, TraceAnalysis
from aiopurgatory.analysis.sweep import SWEEP_METRICS

__all__ = [
    "plot_bench_rates",
    "plot_latency_cdf",
    "plot_lateness",
    "plot_pending",
    "plot_sweep",
    "plot_throughput",
    "plot_trace",
]

MAX_LINES: Final = 10
"""Groups drawn per figure: the busiest ones."""
DPI: Final = 110


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _groups(
    frame: pd.DataFrame, order: list[tuple[str, str]]
) -> Iterator[tuple[str, pd.DataFrame]]:
    """(label, rows) for each group of ``frame`` in ``order``."""
    by_group = dict(iter(frame.groupby(["purgatory", "kind"], sort=False)))
    for key in order[:MAX_LINES]:
        rows = by_group.get(key)
        if rows is not None:
            yield f"{key[0]}/{key[1]}", rows


def _order(analysis: TraceAnalysis) -> list[tuple[str, str]]:
    ranked = analysis.summary.sort_values("operations", ascending=False)
    return list(zip(ranked["purgatory"], ranked["kind"], strict=True))


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _pyplot().close(fig)
    return path


def _label(ax: Any, title: str, xlabel: str, ylabel: str, legend_at: str) -> None:
    """A panel's title, its axes' labels and a small legend at ``legend_at``."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small", loc=legend_at)


def plot_throughput(analysis: TraceAnalysis, path: Path) -> Path:
    """Finished operations and expirations per second over time."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for label, rows in _groups(analysis.timeline, _order(analysis)):
        top.plot(rows["t_s"], rows["throughput_per_s"], label=label, linewidth=1)
        bottom.plot(rows["t_s"], rows["expired_per_s"], label=label, linewidth=1)
    top.set_ylabel("finished ops/s")
    top.set_title(f"Throughput and expirations ({_bin_label(analysis.bin_seconds)} bins)")
    top.legend(fontsize="small", loc="upper right")
    bottom.set_ylabel("expired ops/s")
    bottom.set_xlabel("seconds since the first operation")
    return _save(fig, path)


def plot_pending(analysis: TraceAnalysis, path: Path) -> Path:
    """Operations registered and not yet finished, at the end of each bin."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    for label, rows in _groups(analysis.timeline, _order(analysis)):
        ax.plot(rows["t_s"], rows["pending"], label=label, linewidth=1)
    _label(ax, "Pending operations", "seconds since the first operation", "pending", "upper right")
    return _save(fig, path)


def plot_latency_cdf(analysis: TraceAnalysis, path: Path) -> Path:
    """Completion latency (condition path) as a CDF, latency on a log axis."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    for label, rows in _groups(analysis.latency_cdf, _order(analysis)):
        ax.plot(rows["latency_ms"].clip(lower=1e-3), rows["quantile"], label=label)
    ax.set_xscale("log")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    _label(
        ax,
        "Completion latency CDF (completed operations)",
        "latency (ms, log scale)",
        "fraction completed within",
        "lower right",
    )
    return _save(fig, path)


def plot_lateness(analysis: TraceAnalysis, path: Path) -> Path:
    """Histogram of finished - deadline for expired operations."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = analysis.lateness_bin_ms
    early = int(analysis.summary["early_expiries"].sum())
    for label, rows in _groups(analysis.lateness, _order(analysis)):
        left = [max(low, -width) for low in rows["low_ms"]]
        ax.bar(left, rows["count"], width=width, align="edge", alpha=0.6, label=label)
    if (analysis.lateness["bin"] >= LATENESS_BINS).any():
        ax.set_xlabel("lateness (ms); the last bar holds everything later")
    else:
        ax.set_xlabel("lateness (ms)")
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_title(f"Expiry lateness (finished - deadline); early expiries: {early}")
    ax.set_ylabel("expired operations")
    if len(analysis.lateness):
        ax.legend(fontsize="small", loc="upper right")
    return _save(fig, path)


def plot_trace(analysis: TraceAnalysis, directory: Path) -> dict[str, Path]:
    """Every trace figure, by name."""
    return {
        "throughput": plot_throughput(analysis, directory / "throughput.png"),
        "pending": plot_pending(analysis, directory / "pending.png"),
        "latency_cdf": plot_latency_cdf(analysis, directory / "latency_cdf.png"),
        "lateness": plot_lateness(analysis, directory / "lateness.png"),
    }


def plot_sweep(results: pd.DataFrame, directory: Path) -> dict[str, Path]:
    """Cost and precision against tick, one panel per scenario, a line per wheel size."""
    plt = _pyplot()
    scenarios = list(dict.fromkeys(results["scenario"]))
    paths: dict[str, Path] = {}
    for metric, title in SWEEP_METRICS:
        fig, axes = plt.subplots(
            1, len(scenarios), figsize=(4 * len(scenarios), 3.6), squeeze=False, sharey=True
        )
        for ax, scenario in zip(axes[0], scenarios, strict=True):
            rows = results[results["scenario"] == scenario]
            for size, by_size in rows.groupby("wheel_size"):
                by_size = by_size.sort_values("tick_ms")
                ax.plot(by_size["tick_ms"], by_size[metric], marker="o", label=f"wheel {size}")
            ax.set_xscale("log")
            ax.set_title(scenario, fontsize="medium")
            ax.set_xlabel("tick (ms)")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].set_ylabel(title)
        axes[0][-1].legend(fontsize="x-small")
        paths[f"sweep_{metric}"] = _save(fig, directory / f"sweep_{metric}.png")
    return paths


def plot_bench_rates(rates: pd.DataFrame, path: Path) -> Path:
    """Achieved against target rate per implementation (does it keep up?)."""
    plt = _pyplot()
    panels = list(dict.fromkeys(rates["panel"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        rows = rates[rates["panel"] == panel]
        for impl, by_impl in rows.groupby("impl"):
            by_impl = by_impl.sort_values("target_rate")
            ax.plot(by_impl["target_rate"], by_impl["achieved_rate"], marker="o", label=str(impl))
        upper = max(float(rows["target_rate"].max()), 1.0)
        ax.plot([0, upper], [0, upper], color="grey", linestyle=":", linewidth=0.8)
        ax.set_title(panel, fontsize="medium")
        ax.set_xlabel("target rate (ops/s)")
        ax.set_ylabel("achieved rate (ops/s)")
        ax.legend(fontsize="small")
    return _save(fig, path)


def _bin_label(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:g} s"
    exponent = math.floor(math.log10(seconds))
    return f"{seconds * 1e3:g} ms" if exponent >= -3 else f"{seconds * 1e6:g} µs"
