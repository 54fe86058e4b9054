"""A Prometheus collector for purgatories (needs the ``metrics`` extra).

    from prometheus_client import REGISTRY
    REGISTRY.register(PurgatoryCollector(purgatory))

Values are read when Prometheus scrapes, so the hot path pays nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .purgatory import Purgatory

__all__ = ["PurgatoryCollector"]


class PurgatoryCollector(Collector):
    """Exports the :class:`~aiopurgatory.PurgatoryStats` of one or more purgatories."""

    def __init__(self, *purgatories: Purgatory, prefix: str = "aiopurgatory") -> None:
        self._purgatories = purgatories
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        p = self._prefix
        gauges = {
            "pending": GaugeMetricFamily(
                f"{p}_pending", "Operations waiting", labels=["purgatory"]
            ),
            "watched": GaugeMetricFamily(
                f"{p}_watched", "Watcher-list entries", labels=["purgatory"]
            ),
            "timed": GaugeMetricFamily(
                f"{p}_timer_pending", "Operations in the timer", labels=["purgatory"]
            ),
            "heap_size": GaugeMetricFamily(
                f"{p}_timer_heap_size", "Bucket expirations in the timer heap", labels=["purgatory"]
            ),
            "timer_lag": GaugeMetricFamily(
                f"{p}_timer_lag_seconds",
                "How late the timer's latest wake-up was",
                labels=["purgatory"],
            ),
        }
        finished = CounterMetricFamily(
            f"{p}_operations_finished",
            "Operations finished, by outcome",
            labels=["purgatory", "outcome"],
        )
        wakeups = CounterMetricFamily(f"{p}_timer_wakeups", "Timer wake-ups", labels=["purgatory"])
        for purgatory in self._purgatories:
            stats = purgatory.stats
            name = [stats.name]
            gauges["pending"].add_metric(name, stats.pending)
            gauges["watched"].add_metric(name, stats.watched)
            gauges["timed"].add_metric(name, stats.timed)
            gauges["heap_size"].add_metric(name, stats.heap_size)
            gauges["timer_lag"].add_metric(name, stats.timer_lag)
            for outcome, count in (
                ("completed", stats.completed),
                ("expired", stats.expired),
                ("cancelled", stats.cancelled),
                ("closed", stats.closed),
            ):
                finished.add_metric([stats.name, outcome], count)
            wakeups.add_metric(name, stats.timer_wakeups)
        yield from gauges.values()
        yield finished
        yield wakeups
