"""How cost and precision depend on tick and wheel size: virtual-time simulations on Spark.

Each (scenario, tick, wheel size) is one Spark task. It drives a
:class:`~aiopurgatory.wheel.TimingWheel` the way the timer does, in virtual time, with
the benchmark's workload: Poisson arrivals, a timeout per operation, and a
log-normal time after which the operation completes (and leaves the wheel) if that is
before its timeout. It reports re-insertions per operation (cascades), the expiration
heap's size, wake-ups (bucket expirations served; ``wakeups_per_op`` per operation), and
lateness (never negative, under one tick).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Final

import numpy as np
import pandas as pd

from aiopurgatory.analysis.errors import AnalysisError, spark_errors
from aiopurgatory.analysis.job import one_line, to_pandas
from aiopurgatory.analysis.synthetic import lognormal_sigma
from aiopurgatory.timer import clock_tick, deadline_tick
from aiopurgatory.wheel import TimerEntry, TimingWheel

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_SCENARIOS",
    "SWEEP_METRICS",
    "Scenario",
    "run_sweep",
    "simulate",
]

_NEVER: Final = math.inf


@dataclass(frozen=True, slots=True)
class Scenario:
    """A generated workload: all times in seconds."""

    name: str
    rate: float
    """Arrivals per second."""
    timeout: float
    median: float
    """Median time until the operation's condition holds."""
    p75: float
    """75th percentile of that time."""


DEFAULT_SCENARIOS: Final = (
    Scenario("low timeout rate (200 ms)", 10_000.0, 0.2, median=0.02, p75=0.06),
    Scenario("high timeout rate (200 ms)", 10_000.0, 0.2, median=0.2, p75=0.4),
    Scenario("long polls (30 s)", 2_000.0, 30.0, median=5.0, p75=20.0),
)
DEFAULT_TICKS_MS: Final = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
DEFAULT_WHEEL_SIZES: Final = (8, 20, 64, 256)

SWEEP_METRICS: Final = (
    ("reinserts_per_op", "re-insertions per operation"),
    ("heap_max", "largest expiration heap"),
    ("wakeups_per_op", "wake-ups per operation"),
    ("lateness_max_ms", "largest lateness (ms)"),
)
"""The sweep's plotted metrics and their titles (figures and report)."""

RESULT_COLUMNS: Final = {
    "scenario": "string",
    "tick_ms": "double",
    "wheel_size": "int",
    "operations": "long",
    "expired": "long",
    "reinserts_per_op": "double",
    "heap_max": "long",
    "heap_mean": "double",
    "levels": "int",
    "wakeups": "long",
    "wakeups_per_op": "double",
    "lateness_max_ms": "double",
    "lateness_mean_ms": "double",
    "early": "long",
    "sim_seconds": "double",
}


class _Op(TimerEntry):
    __slots__ = ("deadline",)

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline


def simulate(
    scenario: Scenario, tick_ms: float, wheel_size: int, operations: int, seed: int = 0
) -> dict[str, float | int | str]:
    """Run one configuration in virtual time; returns one row of :data:`RESULT_COLUMNS`."""
    began = time.perf_counter()
    rng = np.random.default_rng(seed)
    tick = tick_ms / 1e3
    arrivals = np.cumsum(rng.exponential(1.0 / scenario.rate, operations))
    sigma = lognormal_sigma(scenario.median, scenario.p75)
    ready = scenario.median * np.exp(sigma * rng.standard_normal(operations))
    leaves = np.where(ready < scenario.timeout, arrivals + ready, _NEVER)
    # Events in time order: (time, 0 = arrival / 1 = completion, index).
    events: Iterator[tuple[float, int, int]] = heapq.merge(
        ((float(t), 0, i) for i, t in enumerate(arrivals)),
        sorted((float(t), 1, i) for i, t in enumerate(leaves) if t != _NEVER),
    )
    wheel = TimingWheel(wheel_size)
    ops: list[_Op | None] = [None] * operations
    due: list[TimerEntry] = []
    wakeups = expired = early = heap_max = levels = 0
    heap_total = 0.0
    samples = 0
    lateness_max = lateness_sum = 0.0
    for when, kind, index in itertools.chain(events, [(_NEVER, 2, -1)]):
        while (next_tick := wheel.next_expiration()) is not None and next_tick * tick <= when:
            wheel.collect_due(next_tick, due, operations + 1)
            wakeups += 1
            now = next_tick * tick
            for entry in due:
                assert isinstance(entry, _Op)
                late = now - entry.deadline
                expired += 1
                early += late < 0
                lateness_max = max(lateness_max, late)
                lateness_sum += late
            due.clear()
        if kind == 0:
            deadline = when + scenario.timeout
            op = ops[index] = _Op(deadline)
            if not len(wheel):
                wheel.restart(clock_tick(when, tick))
            wheel.schedule(op, deadline_tick(deadline, tick))
        elif kind == 1:
            pending = ops[index]
            assert pending is not None
            wheel.remove(pending)
        heap_size = wheel.heap_size
        heap_max = max(heap_max, heap_size)
        heap_total += heap_size
        samples += 1
        levels = max(levels, wheel.num_levels)
    return {
        "scenario": scenario.name,
        "tick_ms": tick_ms,
        "wheel_size": wheel_size,
        "operations": operations,
        "expired": expired,
        "reinserts_per_op": wheel.cascaded / operations,
        "heap_max": heap_max,
        "heap_mean": heap_total / samples,
        "levels": levels,
        "wakeups": wakeups,
        "wakeups_per_op": wakeups / operations,
        "lateness_max_ms": lateness_max * 1e3,
        "lateness_mean_ms": lateness_sum / max(expired, 1) * 1e3,
        "early": early,
        "sim_seconds": time.perf_counter() - began,
    }


def _simulate_batches(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """``mapInPandas`` body: one simulation per configuration row."""
    for batch in batches:
        rows = [
            simulate(
                Scenario(r.scenario, r.rate, r.timeout, r.median, r.p75),
                float(r.tick_ms),
                int(r.wheel_size),
                int(r.operations),
                int(r.seed),
            )
            for r in batch.itertuples(index=False)
        ]
        yield pd.DataFrame(rows, columns=list(RESULT_COLUMNS))


def run_sweep(
    spark: SparkSession,
    *,
    scenarios: Sequence[Scenario] = DEFAULT_SCENARIOS,
    ticks_ms: Sequence[float] = DEFAULT_TICKS_MS,
    wheel_sizes: Sequence[int] = DEFAULT_WHEEL_SIZES,
    operations: int = 20_000,
    seed: int = 0,
) -> pd.DataFrame:
    """Every (scenario, tick, wheel size) simulated as its own Spark task."""
    configs = pd.DataFrame(
        [
            {**asdict(s), "scenario": s.name, "tick_ms": float(t), "wheel_size": int(w)}
            | {"operations": operations, "seed": seed}
            for s, t, w in itertools.product(scenarios, ticks_ms, wheel_sizes)
        ]
    ).drop(columns=["name"])
    if configs.empty:
        raise AnalysisError("the sweep needs at least one scenario, tick and wheel size")
    schema = ", ".join(f"`{name}` {kind}" for name, kind in RESULT_COLUMNS.items())
    tasks = spark.createDataFrame(configs).repartition(len(configs))
    try:
        frame = to_pandas(tasks.mapInPandas(_simulate_batches, schema))
    except spark_errors() as exc:
        raise AnalysisError(
            f"the sweep failed (is aiopurgatory[analysis] installed where Spark runs Python?):"
            f" {one_line(exc)}"
        ) from exc
    order = {s.name: i for i, s in enumerate(scenarios)}
    frame = frame.sort_values(
        ["scenario", "wheel_size", "tick_ms"],
        key=lambda c: c.map(order) if c.name == "scenario" else c,
    )
    return frame.reset_index(drop=True)
