"""Prometheus metrics for purgatories (needs the ``metrics`` extra, ``prometheus_client``).

::

    from prometheus_client import REGISTRY
    from aiopurgatory.metrics import PurgatoryCollector

    metrics = PurgatoryCollector()
    produce = metrics.purgatory("produce")  # Purgatory("produce", observer=metrics), tracked
    REGISTRY.register(metrics)

The collector is an :class:`~aiopurgatory.OperationObserver` (it sees every finished
operation, to count it and time its wait) and a ``prometheus_client`` collector.
Exported, with the ``purgatory`` label and, per finished operation, ``kind``
(:attr:`DelayedOperation.kind <aiopurgatory.DelayedOperation.kind>`) and ``outcome``
(``completed``, ``expired``, ``cancelled``, ``closed``):

* ``aiopurgatory_operations_pending`` (gauge): registered, not finished.
* ``aiopurgatory_operations_total{purgatory, kind, outcome}`` (counter): finished.
* ``aiopurgatory_operation_wait_seconds{purgatory, kind, outcome}`` (histogram): from
  registration to finish.
* ``aiopurgatory_timer_lag_seconds`` (histogram): how late each expiration finished
  after its deadline; ``aiopurgatory_timer_lag_last_seconds`` and
  ``aiopurgatory_timer_lag_max_seconds`` (gauges): how late the timer's latest pass
  that expired something was after the earliest deadline it served, and the worst.
* ``aiopurgatory_watcher_entries``, ``aiopurgatory_watched_keys``,
  ``aiopurgatory_timer_operations``, ``aiopurgatory_timer_heap_items`` (gauges) and
  ``aiopurgatory_timer_wakeups_total`` (counter): see
  :class:`~aiopurgatory.PurgatoryStats`.

Threads. Prometheus scrapes on another thread (``start_http_server``) or on the loop
(an HTTP handler calling ``generate_latest``). Only the loop's thread touches the
counts: the observer adds to plain lists there, without a lock, and a scrape from
another thread asks the loop for a copy of everything (one ``call_soon_threadsafe``)
and waits for it, so every figure of a scrape comes from one instant. If the loop does
not answer within ``scrape_timeout`` (blocked by a long callback), the scrape reports
the previous copy. A scrape on the loop's thread, or while the loop is not running,
copies directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from .operation import DelayedOperation, Outcome
from .purgatory import OperationObserver, Purgatory, PurgatoryStats

__all__ = ["DEFAULT_LAG_BUCKETS", "DEFAULT_WAIT_BUCKETS", "PurgatoryCollector"]

DEFAULT_WAIT_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
"""Upper bounds (seconds) of ``operation_wait_seconds``: long polls wait up to minutes."""

DEFAULT_LAG_BUCKETS: Final = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
"""Upper bounds (seconds) of ``timer_lag_seconds``: within a tick or two when healthy."""

_OUTCOMES: Final = (Outcome.COMPLETED, Outcome.EXPIRED, Outcome.CANCELLED, Outcome.CLOSED)
_COMPLETED: Final = Outcome.COMPLETED
_EXPIRED: Final = Outcome.EXPIRED
_CANCELLED: Final = Outcome.CANCELLED


class _Series:
    """Histogram counts kept on the loop: one count per bucket (not cumulative), a sum."""

    __slots__ = ("counts", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * (buckets + 1)  # the last one is +Inf
        self.total = 0.0

    def copy(self) -> tuple[tuple[int, ...], float]:
        return tuple(self.counts), self.total


_Copied = tuple[tuple[int, ...], float]


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """Everything one scrape reports, copied on the loop at one instant."""

    stats: tuple[PurgatoryStats, ...]
    waits: dict[tuple[str, str], tuple[_Copied, ...]]  # (purgatory, kind) -> per outcome
    lags: dict[str, _Copied]


_EMPTY: Final = _Snapshot((), {}, {})


class PurgatoryCollector(Collector):
    """Counts and times finished operations and exports them, with the purgatories' stats.

    Pass it as the ``observer`` of the purgatories it should count and :meth:`track`
    them (or let :meth:`purgatory` do both). ``PurgatoryCollector(p1, p2)`` tracks
    purgatories created already; those not observed export their gauges only. One
    collector serves the purgatories of one event loop.

    ``forward_to`` receives every finished operation after the collector (a
    :class:`~aiopurgatory.trace.TraceRecorder`, for instance), since a purgatory has
    one observer.
    """

    def __init__(
        self,
        *purgatories: Purgatory,
        prefix: str = "aiopurgatory",
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
        lag_buckets: Sequence[float] = DEFAULT_LAG_BUCKETS,
        scrape_timeout: float = 1.0,
        forward_to: OperationObserver | None = None,
    ) -> None:
        self._prefix = prefix
        self._wait_bounds = _bounds("wait_buckets", wait_buckets)
        self._lag_bounds = _bounds("lag_buckets", lag_buckets)
        if not (scrape_timeout > 0 and math.isfinite(scrape_timeout)):
            raise ValueError(f"scrape_timeout must be a finite number > 0, got {scrape_timeout!r}")
        self._scrape_timeout = scrape_timeout
        self._forward = forward_to
        # Replaced, never mutated, so that a scrape thread may read it at any time.
        self._purgatories: tuple[Purgatory, ...] = ()
        self._loop: asyncio.AbstractEventLoop | None = None
        # Mutated on the loop only; copied there by _take.
        self._waits: dict[tuple[str, str], tuple[_Series, ...]] = {}
        self._lags: dict[str, _Series] = {}
        self._last = _EMPTY
        for purgatory in purgatories:
            self.track(purgatory)

    # -- set-up -----------------------------------------------------------------------

    def track(self, purgatory: Purgatory) -> None:
        """Export ``purgatory``'s gauges (pending, watchers, timer) from now on."""
        if purgatory in self._purgatories:
            return
        mine = self._bound_loop()
        theirs = purgatory.loop
        if mine is not None and theirs is not None and theirs is not mine:
            raise ValueError(
                f"purgatory {purgatory.name!r} runs on another event loop than the"
                " purgatories this collector tracks: use one collector per loop"
            )
        self._purgatories = (*self._purgatories, purgatory)

    def purgatory(self, name: str, **options: Any) -> Purgatory:
        """``Purgatory(name, observer=self, **options)``, tracked."""
        if "observer" in options:
            raise TypeError("the collector is the observer: pass forward_to= to the collector")
        purgatory = Purgatory(name, observer=self, **options)
        self.track(purgatory)
        return purgatory

    # -- the observer (on the loop) ---------------------------------------------------

    def operation_finished(
        self, purgatory: str, op: DelayedOperation[Any], outcome: Outcome, finished: float
    ) -> None:
        """Count ``op`` and time its wait (called by the purgatory, on its loop)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        key = (purgatory, op.kind)
        row = self._waits.get(key)
        if row is None:
            n = len(self._wait_bounds)
            row = self._waits[key] = (_Series(n), _Series(n), _Series(n), _Series(n))
        if outcome is _COMPLETED:
            series = row[0]
        elif outcome is _EXPIRED:
            series = row[1]
            deadline = op.deadline
            if deadline is not None and finished >= deadline:  # not expired early by close
                lags = self._lags.get(purgatory)
                if lags is None:
                    lags = self._lags[purgatory] = _Series(len(self._lag_bounds))
                lag = finished - deadline
                lags.counts[bisect_left(self._lag_bounds, lag)] += 1
                lags.total += lag
        elif outcome is _CANCELLED:
            series = row[2]
        else:
            series = row[3]
        created = op.created
        wait = finished - created if created is not None else 0.0
        series.counts[bisect_left(self._wait_bounds, wait)] += 1
        series.total += wait
        forward = self._forward
        if forward is not None:
            forward.operation_finished(purgatory, op, outcome, finished)

    # -- the collector (any thread) ---------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The metrics of one consistent snapshot (see the module docstring)."""
        snapshot = self._snapshot()
        p = self._prefix
        gauges = [
            ("pending", "operations_pending", "Operations registered and not finished"),
            ("watched", "watcher_entries", "Watcher-list entries (one per operation and key)"),
            ("keys", "watched_keys", "Keys with at least one watcher"),
            ("timed", "timer_operations", "Operations in the timer"),
            ("heap_size", "timer_heap_items", "Bucket expirations in the timer's heap"),
            (
                "timer_lag",
                "timer_lag_last_seconds",
                "How late the timer's latest expiring pass was after its earliest deadline",
            ),
            ("timer_lag_max", "timer_lag_max_seconds", "The largest timer_lag_last_seconds"),
        ]
        for field, name, documentation in gauges:
            gauge = GaugeMetricFamily(f"{p}_{name}", documentation, labels=["purgatory"])
            for stats in snapshot.stats:
                gauge.add_metric([stats.name], getattr(stats, field))
            yield gauge
        wakeups = CounterMetricFamily(
            f"{p}_timer_wakeups", "Passes of the timer task", labels=["purgatory"]
        )
        for stats in snapshot.stats:
            wakeups.add_metric([stats.name], stats.timer_wakeups)
        yield wakeups

        labels = ["purgatory", "kind", "outcome"]
        total = CounterMetricFamily(f"{p}_operations", "Operations finished", labels=labels)
        waits = HistogramMetricFamily(
            f"{p}_operation_wait_seconds",
            "Seconds from registration to finish",
            labels=labels,
        )
        for (purgatory, kind), row in sorted(snapshot.waits.items()):
            for outcome, (counts, wait_sum) in zip(_OUTCOMES, row, strict=True):
                names = [purgatory, kind, outcome.value]
                total.add_metric(names, sum(counts))
                waits.add_metric(names, _buckets(self._wait_bounds, counts), wait_sum)
        yield total
        yield waits

        lag = HistogramMetricFamily(
            f"{p}_timer_lag_seconds",
            "Seconds each expiration finished after its deadline",
            labels=["purgatory"],
        )
        for purgatory, (counts, lag_sum) in sorted(snapshot.lags.items()):
            lag.add_metric([purgatory], _buckets(self._lag_bounds, counts), lag_sum)
        yield lag

    def _bound_loop(self) -> asyncio.AbstractEventLoop | None:
        loop = self._loop
        if loop is None:
            for purgatory in self._purgatories:
                if purgatory.loop is not None:
                    loop = self._loop = purgatory.loop
                    break
        return loop

    def _snapshot(self) -> _Snapshot:
        """A copy taken on the loop's thread, or while nothing can change the counts."""
        loop = self._bound_loop()
        if loop is None or loop.is_closed() or not loop.is_running() or _running_loop() is loop:
            return self._take()
        result: concurrent.futures.Future[_Snapshot] = concurrent.futures.Future()

        def take() -> None:
            if result.set_running_or_notify_cancel():
                try:
                    result.set_result(self._take())
                except Exception as exc:
                    result.set_exception(exc)

        try:
            loop.call_soon_threadsafe(take)
        except RuntimeError:  # the loop closed meanwhile: nothing changes the counts
            return self._take()
        try:
            return result.result(self._scrape_timeout)
        except TimeoutError:
            result.cancel()
            return self._last

    def _take(self) -> _Snapshot:
        snapshot = _Snapshot(
            stats=tuple(purgatory.stats for purgatory in self._purgatories),
            waits={key: tuple(s.copy() for s in row) for key, row in self._waits.items()},
            lags={name: series.copy() for name, series in self._lags.items()},
        )
        self._last = snapshot
        return snapshot


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _bounds(name: str, buckets: Iterable[float]) -> tuple[float, ...]:
    bounds = tuple(float(b) for b in buckets)
    if not bounds or any(not math.isfinite(b) for b in bounds):
        raise ValueError(f"{name} must be finite upper bounds (+Inf is added), got {bounds!r}")
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"{name} must increase, got {bounds!r}")
    return bounds


def _buckets(bounds: tuple[float, ...], counts: tuple[int, ...]) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs, +Inf last, as HistogramMetricFamily takes them."""
    pairs: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*bounds, math.inf), counts, strict=True):
        running += count
        pairs.append((floatToGoString(bound), running))  # type: ignore[no-untyped-call]
    return pairs
