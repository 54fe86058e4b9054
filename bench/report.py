"""Tables of benchmark records: medians over repeats, and the wheel's ratio to each impl;
and the ceiling's plot of expiry lateness against offered rate (:func:`ceiling_plot`).

matplotlib is imported only to draw (it is in the ``docs`` and ``analysis`` extras, not
in ``bench``): the tables need nothing beyond the standard library.
"""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from . import ceiling
from .common import LOOPS, Record, Value

__all__ = ["IMPL_STYLE", "TABLES", "Table", "ceiling_plot", "render"]

IMPL_STYLE: Final = {
    "wheel": ("#5e35b1", "o", "aiopurgatory, compiled"),
    "pure": ("#26a69a", "s", "aiopurgatory, pure Python"),
    "heap": ("#ef6c00", "^", "loop.call_later per operation"),
    "task": ("#c62828", "v", "a task per operation"),
    "floor": ("#78909c", "x", "floor: the loop and the objects only"),
    "hooks": ("#b0bec5", "+", "hooks floor: plus the operation's own calls"),
}
"""impl -> (colour, marker, legend label), for every plot of the records."""

JVM_STYLE: Final = ("#37474f", "D", "Kafka's JVM purgatory (median of its 3 runs)")
BAR_COLOUR: Final = "#c62828"

SUSTAINED_PCT: Final = 98.0
"""A target rate is sustained when at least this share of it is achieved."""


@dataclass(frozen=True)
class Table:
    """How one suite's records are shown."""

    keys: tuple[str, ...]
    """Parameters that, with loop and gc, identify a group of comparable rows."""
    metrics: tuple[str, ...]
    primary: str | None = None
    """Metric of the ``wheel x`` column: how many times better the wheel does."""
    higher_is_better: bool = True


TABLES: Final = {
    "timer": Table(
        ("pending",),
        ("ops_per_s", "cpu_ops_per_s", "bytes_per_op", "blocks_per_op", "gc_objects_per_op"),
        "ops_per_s",
    ),
    "churn": Table(
        ("pending",),
        (
            "ops_per_s",
            "cpu_ops_per_s",
            "turnovers",
            "gc0",
            "gc1",
            "gc2",
            "bytes_per_op",
            "blocks_per_op",
            "gc_objects_per_op",
        ),
        "cpu_ops_per_s",
    ),
    "expiry": Table(
        ("pattern", "n"),
        (
            "expire_per_s",
            "burst_ms",
            "cpu_us_per_expiry",
            "late_p50_ms",
            "late_p99_ms",
            "late_max_ms",
            "early",
            "early_max_ms",
            "stall_max_ms",
        ),
        "cpu_us_per_expiry",
        higher_is_better=False,
    ),
    "purgatory": Table(
        ("scenario", "keys", "rate"),
        (
            "achieved_per_s",
            "achieved_pct",
            "cpu_s_per_1m",
            "expired_pct",
            "late_p50_ms",
            "late_p99_ms",
            "late_p999_ms",
            "late_max_ms",
            "early",
            "early_max_ms",
            "gc0",
            "gc1",
            "gc2",
            "stall_max_ms",
            "doubles",
        ),
        "cpu_s_per_1m",
        higher_is_better=False,
    ),
    "idle": Table(("scenario", "seconds"), ("loop_wakeups", "timer_wakeups", "fired")),
    # What the library allocates per operation (bench.allocs): one row per path and
    # build, the library's call alone minus a baseline loop; no ratio column.
    "allocs": Table(
        ("path", "keys", "pending", "n"),
        ("allocs_per_op", "bytes_per_op", "young_per_op", "net_blocks_per_op"),
    ),
    "memory": Table(
        ("pending", "cycle"),
        (
            "rss_per_op",
            "bytes_per_op",
            "blocks_per_op",
            "gc_objects_per_op",
            "rss_filled_mb",
            "rss_half_mb",
            "rss_end_mb",
            "growth_pct",
            "growth_2nd_half_pct",
        ),
        "rss_per_op",
        higher_is_better=False,
    ),
    "timeouts": Table(
        ("api", "pending"), ("ops_per_s", "cpu_us_per_op", "fill_us_per_op"), "ops_per_s"
    ),
    # The Kafka-protocol broker (aiopurgatory.kafka) under aiokafka: one implementation,
    # so no ratio column. Idle: "polling" with max wait 500 ms, "parked" with 30 s.
    # Transactions of 10 records; start times to a broker answering Metadata, the
    # container's (cited_*) quoted from KIP-974, never run.
    "kafka": Table(
        ("records", "idle"),
        (
            "acks_1_produced_per_s",
            "acks_1_consumed_per_s",
            "acks_all_produced_per_s",
            "acks_all_consumed_per_s",
            "latency_p50_ms",
            "latency_p99_ms",
            "txn_aiokafka_commits_per_s",
            "txn_aiokafka_broker_cpu_us_per_commit",
            "txn_confluent_commits_per_s",
            "txn_confluent_broker_cpu_us_per_commit",
            "compaction_records_per_s",
            "compaction_longest_stall_ms",
            "start_in_process_ms",
            "start_fixture_thread_ms",
            "start_subprocess_listening_ms",
            "start_subprocess_answered_ms",
            "start_cited_jvm_broker_start_ms_low",
            "start_cited_native_broker_start_ms_low",
            "idle_nominal_answers_per_s",
            "idle_polling_answers_per_s",
            "idle_polling_round_trip_p50_ms",
            "idle_polling_round_trip_p99_ms",
            "idle_polling_broker_cpu_percent",
            "idle_polling_broker_cpu_us_per_answer",
            "idle_polling_clients_cpu_percent",
            "idle_polling_broker_run_queue_percent",
            "idle_rss_mib_before",
            "idle_polling_rss_mib",
            "idle_parked_broker_cpu_percent",
            "idle_parked_rss_mib",
        ),
    ),
}


def _median(values: Iterable[Value]) -> float | None:
    numbers = [float(v) for v in values if isinstance(v, int | float) and not math.isnan(v)]
    return statistics.median(numbers) if numbers else None


def _fmt(value: Value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, str):
        return value
    if value == 0:
        return "0"  # also -0.0
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.2f}"


def _layout(header: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    )


def _versions(records: Sequence[Record]) -> bool:
    """Whether ``records`` come from more than one Python (``--python``): a column then."""
    return len({r.get("python") for r in records}) > 1


def _groups(records: Sequence[Record], table: Table) -> dict[tuple[Value, ...], list[Record]]:
    groups: dict[tuple[Value, ...], list[Record]] = {}
    python = _versions(records)
    for record in records:
        key = (*(record.get(k) for k in table.keys), record["loop"], record["gc"])
        if python:
            key = (record.get("python"), *key)
        groups.setdefault(key, []).append(record)
    return groups


def _by_impl(group: Sequence[Record]) -> dict[str, list[Record]]:
    impls: dict[str, list[Record]] = {}
    for record in group:
        impls.setdefault(str(record["impl"]), []).append(record)
    return impls


def _ratio(wheel: float | None, other: float | None, higher_is_better: bool) -> float | None:
    if wheel is None or other is None or not wheel or not other:
        return None
    return wheel / other if higher_is_better else other / wheel


def render(records: Sequence[Record], *, markdown: bool = False) -> str:
    """One table per suite in ``records`` (medians over repeats), errors listed last."""
    out: list[str] = []
    for suite, table in TABLES.items():
        mine = [r for r in records if r.get("suite") == suite and "error" not in r]
        if not mine:
            continue
        # "wheel x": the build loaded (compiled when built) against each row; with the
        # pure-Python fallback in the run, "pure x" gives its figures the same way.
        leads = ["wheel", "pure"] if any(r["impl"] == "pure" for r in mine) else ["wheel"]
        ratio_cols = [f"{lead} x ({table.primary})" for lead in leads] if table.primary else []
        header = [*table.keys, "loop", "gc", "impl", *table.metrics, *ratio_cols, "runs"]
        if _versions(mine):
            header.insert(0, "python")
        rows: list[list[str]] = []
        for key, group in _groups(mine, table).items():
            impls = _by_impl(group)
            lead_values = {
                lead: _median(r.get(table.primary) for r in impls.get(lead, []))
                for lead in leads
                if table.primary
            }
            for impl, runs in impls.items():
                medians = [_median(r.get(m) for r in runs) for m in table.metrics]
                row = [_fmt(k) for k in key] + [impl] + [_fmt(v) for v in medians]
                if table.primary:
                    other = medians[table.metrics.index(table.primary)]
                    for lead in leads:
                        ratio = _ratio(lead_values[lead], other, table.higher_is_better)
                        row.append(_fmt(ratio))
                rows.append([*row, str(len(runs))])
        out += [f"## {suite}", "", _layout(header, rows, markdown), ""]
        if suite == "purgatory":
            out += [_sustained(mine, markdown), ""]
    # The ceiling's records are one per search, not one per run: its own table.
    ceilings = [r for r in records if r.get("suite") == "ceiling" and "error" not in r]
    if ceilings:
        out += [ceiling.render(ceilings, ceiling.load_jvm_anchor(), markdown=markdown), ""]
    errors = [r for r in records if "error" in r]
    out += [f"error: {r['suite']} {r['impl']} {r['loop']}: {r['error']}" for r in errors]
    return "\n".join(out)


def _sustains(runs: Sequence[Record]) -> bool:
    achieved = _median(r.get("achieved_pct") for r in runs)
    return (
        achieved is not None and achieved >= SUSTAINED_PCT and all(r["doubles"] == 0 for r in runs)
    )


def _sustained(records: Sequence[Record], markdown: bool) -> str:
    """Highest target rate each implementation sustains (median achieved >= 98%, 0 doubles)."""
    cases: dict[tuple[Value, ...], dict[str, dict[float, list[Record]]]] = {}
    for r in records:
        key: tuple[Value, ...] = (r["scenario"], r["keys"], r["loop"], r["gc"])
        if _versions(records):
            key = (r.get("python"), *key)
        by_rate = cases.setdefault(key, {}).setdefault(str(r["impl"]), {})
        by_rate.setdefault(float(r["rate"] or 0), []).append(r)
    header = ["scenario", "keys", "loop", "gc", "impl", "max sustained rate/s", "wheel x"]
    if _versions(records):
        header.insert(0, "python")
    rows: list[list[str]] = []
    for key, impls in cases.items():
        top = {
            impl: max((rate for rate, runs in by_rate.items() if _sustains(runs)), default=0.0)
            for impl, by_rate in impls.items()
        }
        for impl, rate in top.items():
            ratio = _ratio(top.get("wheel"), rate, True)
            rows.append([*(_fmt(k) for k in key), impl, _fmt(rate), _fmt(ratio)])
    return _layout(header, rows, markdown)


# -- the ceiling's plot -------------------------------------------------------------------

Point = tuple[float, float | None, float | None, bool]
"""(offered rate, p50 ms, p99 ms, whether the rate passed the bar)."""


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def ceiling_points(records: Sequence[Mapping[str, object]]) -> list[Point]:
    """Per offered rate (ascending), from the ceiling records of one search or more:
    the medians of its runs' p50 and p99 lateness, and whether most of its runs passed.

    Records written before the steps were kept have only the ceiling and the first
    failing rate: those two points (the failure's p50 unknown).
    """
    by_rate: dict[float, list[Mapping[str, object]]] = {}
    for record in records:
        steps = record.get("steps")
        if isinstance(steps, list):
            for step in steps:
                rate = _number(step.get("rate")) if isinstance(step, dict) else None
                if rate is not None:
                    by_rate.setdefault(rate, []).append(step)
            continue
        rate = _number(record.get("ceiling_per_s"))
        if rate:
            by_rate.setdefault(rate, []).append(
                {
                    "late_p50_ms": record.get("late_p50_ms"),
                    "late_p99_ms": record.get("late_p99_ms"),
                    "passed": True,
                }
            )
        rate = _number(record.get("failed_at_per_s"))
        if rate:
            by_rate.setdefault(rate, []).append(
                {"late_p99_ms": record.get("failed_late_p99_ms"), "passed": False}
            )
    points: list[Point] = []
    for rate, steps in sorted(by_rate.items()):
        p50 = _median(_number(s.get("late_p50_ms")) for s in steps)
        p99 = _median(_number(s.get("late_p99_ms")) for s in steps)
        passed = 2 * sum(1 for s in steps if s.get("passed") is True) > len(steps)
        points.append((rate, p50, p99, passed))
    return points


def _series(ax: Any, points: Sequence[Point], style: tuple[str, str, str]) -> None:
    """p99 as a line with markers (filled: the rate passed; hollow: it failed), p50 as
    a fainter dotted line."""
    colour, marker, _ = style
    rates = [p[0] for p in points]
    p50 = [math.nan if p[1] is None else p[1] for p in points]
    p99 = [math.nan if p[2] is None else p[2] for p in points]
    ax.plot(rates, p50, ":", color=colour, alpha=0.45, lw=1.0, marker=marker, ms=3)
    ax.plot(rates, p99, "-", color=colour, lw=1.6)
    for passed in (True, False):
        xs = [r for r, y, p in zip(rates, p99, points, strict=True) if p[3] is passed]
        ys = [y for y, p in zip(p99, points, strict=True) if p[3] is passed]
        ax.plot(
            xs,
            ys,
            linestyle="none",
            marker=marker,
            ms=6,
            mec=colour,
            mfc=colour if passed else "white",
            zorder=3,
        )


def _ordered(values: Iterable[object], preferred: Sequence[str]) -> list[str]:
    present = {str(v) for v in values}
    return [v for v in preferred if v in present] + sorted(present - set(preferred))


def _rate_label(rate: float, _: object = None) -> str:
    return f"{rate / 1000:g}k" if rate >= 1000 else f"{rate:g}"


def ceiling_plot(
    records: Sequence[Mapping[str, object]],
    jvm: Mapping[str, Sequence[tuple[float, float, float, bool]]] | None = None,
    *,
    gc: str = "on",
    source: str | None = None,
) -> bytes | None:
    """Expiry lateness against offered rate, from ceiling records, as SVG bytes.

    One panel per scenario and key layout (rows) and loop (columns), with the GC mode
    ``gc``: per implementation, p99 (filled marker: the rate passed the bar, hollow:
    it failed) and p50 (fainter), the 5 ms bar, and Kafka's JVM purgatory per offered
    rate (``jvm``: :func:`bench.ceiling.load_jvm_lateness`; its layout is 3 shared keys,
    drawn on every panel of the scenario). None when no ceiling record has that GC mode.
    Old records without ``steps`` give two points each: the ceiling and the failure.
    """
    mine = [
        r for r in records if r.get("suite") == "ceiling" and "error" not in r and r.get("gc") == gc
    ]
    if not mine:
        return None
    try:
        import matplotlib
    except ImportError as exc:  # the bench extra has no matplotlib: say which has
        raise RuntimeError(
            "the ceiling plot needs matplotlib: pip install -e '.[docs]' (or '.[analysis]')"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    scenarios = _ordered((r.get("scenario") for r in mine), ("low", "high"))
    layouts = _ordered((r.get("keys") for r in mine), ("shared", "unique"))
    loops = _ordered((r.get("loop") for r in mine), LOOPS)
    impls = _ordered((r.get("impl") for r in mine), tuple(IMPL_STYLE))
    panels = [(scenario, keys) for scenario in scenarios for keys in layouts]
    figure, axes = plt.subplots(
        len(panels),
        len(loops),
        figsize=(5.0 * len(loops), 2.9 * len(panels) + 1.2),
        squeeze=False,
        sharex=True,
        sharey=True,
    )
    shown: dict[str, tuple[str, str, str]] = {}
    rates: list[float] = []
    for row, (scenario, keys) in enumerate(panels):
        for col, loop in enumerate(loops):
            ax = axes[row][col]
            ax.axhline(ceiling.P99_MS, color=BAR_COLOUR, ls="--", lw=1.0)
            for impl in impls:
                runs = [
                    r
                    for r in mine
                    if (r.get("scenario"), r.get("keys"), r.get("loop"), r.get("impl"))
                    == (scenario, keys, loop, impl)
                ]
                points = ceiling_points(runs)
                if points:
                    style = IMPL_STYLE.get(impl, ("#757575", "o", impl))
                    _series(ax, points, style)
                    shown[impl] = style
                    rates += [p[0] for p in points]
            anchor = (jvm or {}).get(scenario)
            if anchor:
                _series(ax, [(rate, p50, p99, ok) for rate, p50, p99, ok in anchor], JVM_STYLE)
                shown["jvm"] = JVM_STYLE
                rates += [rate for rate, *_ in anchor]
            ax.set_title(f"{scenario}, {keys} keys, {loop}, GC {gc}", fontsize=10)
            ax.grid(True, alpha=0.3)
            if col == 0:
                ax.set_ylabel("expiry lateness, ms")
            if row == len(panels) - 1:
                ax.set_xlabel("offered rate, requests/s")
    low, high = (min(rates), max(rates)) if rates else (1e4, 1e6)
    ticks = [t for t in (1e4, 2.5e4, 5e4, 1e5, 2e5, 4e5, 8e5) if low / 1.3 <= t <= high * 1.3]
    for ax in axes.flat:
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(FixedLocator(ticks or [low, high]))
        ax.xaxis.set_major_formatter(FuncFormatter(_rate_label))
        ax.xaxis.set_minor_formatter(NullFormatter())
    handles: list[Any] = []
    for colour, marker, label in shown.values():
        handles.append(Line2D([], [], color=colour, marker=marker, lw=1.6, label=f"{label}: p99"))
        handles.append(
            Line2D(
                [], [], color=colour, marker=marker, ms=3, ls=":", alpha=0.45, label=f"{label}: p50"
            )
        )
    handles.append(
        Line2D(
            [], [], color=BAR_COLOUR, ls="--", lw=1.0, label=f"the bar: p99 {ceiling.P99_MS:g} ms"
        )
    )
    handles.append(
        Line2D(
            [],
            [],
            color="#616161",
            marker="o",
            mfc="white",
            ls="none",
            label=f"hollow: the rate failed (< {ceiling.ACHIEVED_PCT:g}% achieved,"
            f" p99 > {ceiling.P99_MS:g} ms, or early)",
        )
    )
    figure.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)
    title = "Expiry lateness against offered rate, Kafka's purgatory workload"
    figure.suptitle(f"{title} ({source})" if source else title, fontsize=11)
    # Room below for the legend: its rows (two entries each) take about 0.17 inch.
    legend_inches = 0.17 * ((len(handles) + 1) // 2) + 0.15
    figure.tight_layout(rect=(0, legend_inches / figure.get_figheight(), 1, 1))
    data = svg_bytes(figure)
    plt.close(figure)
    return data


def svg_bytes(figure: Any) -> bytes:
    """The figure as SVG that does not change when nothing drawn did (no date, fixed ids)."""
    import matplotlib

    buffer = io.BytesIO()
    # Text stays text (the page's fonts draw it): a third of the size of glyph paths.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "aiopurgatory"}):
        figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    return buffer.getvalue()
