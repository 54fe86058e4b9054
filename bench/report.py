"""Tables of benchmark records: medians over repeats, and the wheel's ratio to each impl."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from .common import Record, Value

__all__ = ["TABLES", "Table", "render"]

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
        ("ops_per_s", "cpu_ops_per_s", "bytes_per_op", "blocks_per_op", "gc_objects_per_op"),
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
            "doubles",
        ),
        "cpu_s_per_1m",
        higher_is_better=False,
    ),
    "idle": Table(("scenario", "seconds"), ("loop_wakeups", "timer_wakeups", "fired")),
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
    # The Kafka-protocol broker (examples/kafka_broker) under aiokafka: one implementation,
    # so no ratio column. Idle: "polling" with max wait 500 ms, "parked" with 30 s.
    "kafka": Table(
        ("records", "idle"),
        (
            "acks_1_produced_per_s",
            "acks_1_consumed_per_s",
            "acks_all_produced_per_s",
            "acks_all_consumed_per_s",
            "latency_p50_ms",
            "latency_p99_ms",
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


def _groups(records: Sequence[Record], table: Table) -> dict[tuple[Value, ...], list[Record]]:
    groups: dict[tuple[Value, ...], list[Record]] = {}
    for record in records:
        key = (*(record.get(k) for k in table.keys), record["loop"], record["gc"])
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
        by_rate = cases.setdefault(key, {}).setdefault(str(r["impl"]), {})
        by_rate.setdefault(float(r["rate"] or 0), []).append(r)
    header = ["scenario", "keys", "loop", "gc", "impl", "max sustained rate/s", "wheel x"]
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
