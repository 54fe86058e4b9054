"""Prometheus metrics for purgatories (needs the ``metrics`` extra, ``prometheus_client``).

::

    from prometheus_client import REGISTRY
    from aiopurgatory import Purgatory
    from aiopurgatory.metrics import PurgatoryCollector

    metrics = PurgatoryCollector()
    REGISTRY.register(metrics)
    produce = Purgatory("produce", observer=metrics)  # or metrics.purgatory("produce")

The collector is an :class:`~aiopurgatory.OperationObserver` (it sees every finished
operation, to count it and time its wait) and a ``prometheus_client`` collector.
Being a purgatory's observer is the one call that fills every series: the purgatory
announces itself to its observer when it is made (``purgatory_created``), so its
gauges are exported from then on, before any operation finishes. There is no way to
half-configure it: :meth:`PurgatoryCollector.track` of a purgatory that does not
report to the collector raises ``ValueError``.

Lifecycle. One collector may outlive the event loops it serves (registered once at
module level in ``prometheus_client.REGISTRY``, say, while tests or app reloads run
one loop after another). A closed purgatory, or one whose loop has closed, is
forgotten: its gauges stop being exported. The counters and histograms are kept by
purgatory name, so a new purgatory of the same name continues them (the timer's
wake-up counter too). Two purgatories in use at once under one name would mix their
series: making the second raises ``ValueError``. A collector serves the purgatories of
one running loop at a time; a scrape that finds them running on two loops at once
raises ``ValueError``.

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
* ``aiopurgatory_watcher_entries`` (one per pending operation and key it watches),
  ``aiopurgatory_watched_keys``, ``aiopurgatory_timer_operations`` (pending operations
  with a timeout), ``aiopurgatory_timer_heap_items`` (gauges) and
  ``aiopurgatory_timer_wakeups_total`` (counter): see
  :class:`~aiopurgatory.PurgatoryStats`. The heap items are wheel-bucket expirations,
  not operations: an emptied bucket's item stays until its time comes, so the gauge
  may read 1 or more with nothing pending.

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
import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Never

from ._extra import raise_missing_extra

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
    from prometheus_client.utils import floatToGoString
except ImportError as _exc:  # without the extra: say which to install
    raise_missing_extra(_exc, "metrics", "aiopurgatory.metrics")

from .loop import TimerStats, is_wheel_loop
from .operation import DelayedOperation, Outcome
from .purgatory import OperationObserver, Purgatory, PurgatoryStats

__all__ = [
    "DEFAULT_LAG_BUCKETS",
    "DEFAULT_TOP_OWNERS",
    "DEFAULT_WAIT_BUCKETS",
    "LoopTimerCollector",
    "PurgatoryCollector",
]

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

DEFAULT_TOP_OWNERS: Final = 10
"""Owners exported by name by :class:`LoopTimerCollector`; the rest add up as ``other``."""

OTHER_OWNER: Final = "other"

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
    past_wakeups: dict[str, int]  # timer wake-ups of forgotten purgatories, by name
    waits: dict[tuple[str, str], tuple[_Copied, ...]]  # (purgatory, kind) -> per outcome
    lags: dict[str, _Copied]


_EMPTY: Final = _Snapshot((), {}, {}, {})


class PurgatoryCollector(Collector):
    """Counts and times finished operations and exports them, with the purgatories' stats.

    Pass it as the ``observer`` of the purgatories it should report
    (``Purgatory("jobs", observer=collector)``, ``collector.purgatory("jobs")`` or
    ``PurgatoryLifespan("jobs", observer=collector)``): that one argument exports every
    series of the purgatory, its gauges from the moment it is made. One collector may
    serve purgatories of successive event loops, one loop at a time (see the module
    docstring).

    ``forward_to`` receives every finished operation after the collector (a
    :class:`~aiopurgatory.trace.TraceRecorder`, for instance), since a purgatory has
    one observer.

    Counting costs about a microsecond per finished operation, on the loop and without
    a lock; a scrape costs one copy of the counts, made on the loop.

    Args:
        prefix: the first word of every series name (``aiopurgatory_...``).
        wait_buckets: upper bounds, in seconds, of the histogram of waits from
            registration to finish (:data:`DEFAULT_WAIT_BUCKETS`).
        lag_buckets: upper bounds, in seconds, of the timer lag histogram
            (:data:`DEFAULT_LAG_BUCKETS`).
        scrape_timeout: how long a scrape from another thread waits for the loop to
            copy the counts before it reports the previous copy.
        forward_to: an observer that receives every finished operation after the
            collector (and every ``purgatory_created``).

    Raises:
        TypeError: purgatories were passed positionally (they must be made with the
            collector as their observer instead).
        ValueError: a bucket list is empty, unsorted or not finite, or
            ``scrape_timeout`` is not a finite number above zero.
    """

    def __init__(
        self,
        *purgatories: Never,
        prefix: str = "aiopurgatory",
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
        lag_buckets: Sequence[float] = DEFAULT_LAG_BUCKETS,
        scrape_timeout: float = 1.0,
        forward_to: OperationObserver | None = None,
    ) -> None:
        if purgatories:
            # Purgatories made before the collector cannot have it as their observer:
            # it would export their gauges and count none of their operations.
            given: tuple[object, ...] = purgatories
            names = ", ".join(repr(getattr(p, "name", p)) for p in given)
            raise TypeError(
                f"PurgatoryCollector() takes no purgatories (got {names}): make each"
                " purgatory with the collector as its observer,"
                " Purgatory(name, observer=collector) or collector.purgatory(name)"
            )
        self._prefix = prefix
        self._wait_bounds = _bounds("wait_buckets", wait_buckets)
        self._lag_bounds = _bounds("lag_buckets", lag_buckets)
        if not (scrape_timeout > 0 and math.isfinite(scrape_timeout)):
            raise ValueError(f"scrape_timeout must be a finite number > 0, got {scrape_timeout!r}")
        self._scrape_timeout = scrape_timeout
        self._forward = forward_to
        # The purgatories whose gauges are exported, and the timer wake-ups of forgotten
        # ones by name (so that the counter goes on with the next purgatory of the name).
        # Changed under the lock, by set-up on any thread and by scrapes (which forget
        # closed purgatories); the tuple is replaced, never mutated.
        self._lock = threading.Lock()
        self._purgatories: tuple[Purgatory, ...] = ()
        self._past_wakeups: dict[str, int] = {}
        # Mutated on the loop only; copied there by _take.
        self._waits: dict[tuple[str, str], tuple[_Series, ...]] = {}
        self._lags: dict[str, _Series] = {}
        self._last = _EMPTY

    # -- set-up -----------------------------------------------------------------------

    def purgatory_created(self, purgatory: Purgatory) -> None:
        """Export ``purgatory``'s gauges (called by a purgatory made with this observer).

        It replaces a tracked purgatory of the same name that is closed, whose loop has
        closed or that was never used. Raises ``ValueError`` if one of that name is in
        use (bound to a loop that has not closed, and not closed itself).
        """
        with self._lock:
            if any(tracked is purgatory for tracked in self._purgatories):
                return
            kept: list[Purgatory] = []
            for tracked in self._purgatories:
                if tracked.name == purgatory.name:
                    if _in_use(tracked):
                        raise ValueError(
                            f"a purgatory named {purgatory.name!r} reporting to this"
                            " collector is still in use (neither it nor its event loop"
                            " is closed): close it first, or give the new one another name"
                        )
                    self._forget(tracked)
                elif _gone(tracked):
                    self._forget(tracked)
                else:
                    kept.append(tracked)
            self._purgatories = (*kept, purgatory)
        created = getattr(self._forward, "purgatory_created", None)
        if created is not None:
            created(purgatory)

    def track(self, purgatory: Purgatory) -> None:
        """Check that ``purgatory`` reports to this collector; nothing else to do.

        A purgatory made with the collector as its observer is tracked already. One that
        is not (another observer, or none) raises ``ValueError``: the collector would
        export its gauges and count none of its operations.
        """
        with self._lock:
            if any(tracked is purgatory for tracked in self._purgatories) or purgatory.closed:
                return
        raise ValueError(
            f"purgatory {purgatory.name!r} does not report to this collector: make it with"
            f" the collector as its observer, Purgatory({purgatory.name!r},"
            f" observer=collector) or collector.purgatory({purgatory.name!r})"
            " (a collector that only tracked it would count none of its operations)"
        )

    def purgatory(self, name: str, **options: Any) -> Purgatory:
        """``Purgatory(name, observer=self, **options)``: a purgatory this collector reports.

        Raises:
            TypeError: ``observer`` was given (the collector is the observer: pass
                ``forward_to=`` to the collector for another one).
            ValueError: a purgatory of that name reporting here is still in use.
        """
        if "observer" in options:
            raise TypeError("the collector is the observer: pass forward_to= to the collector")
        purgatory = Purgatory(name, observer=self, **options)
        self.purgatory_created(purgatory)  # a no-op once the purgatory announced itself
        return purgatory

    # -- the observer (on the loop) ---------------------------------------------------

    def operation_finished(
        self, purgatory: str, op: DelayedOperation[Any], outcome: Outcome, finished: float
    ) -> None:
        """Count ``op`` and time its wait (called by the purgatory, on its loop).

        O(log b) for ``b`` histogram buckets, no lock; then forwards to ``forward_to``.
        """
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
        # Each HELP says what is counted; the ones that do not count operations say so.
        gauges = [
            ("pending", "operations_pending", "Operations registered and not finished"),
            (
                "watched",
                "watcher_entries",
                "Watcher-list entries, one per pending operation and key it watches"
                " (not a count of operations)",
            ),
            (
                "keys",
                "watched_keys",
                "Keys watched by at least one pending operation (not a count of operations)",
            ),
            (
                "timed",
                "timer_operations",
                "Pending operations in the timer (those with a timeout)",
            ),
            (
                "heap_size",
                "timer_heap_items",
                "Items in the timer's heap of wheel-bucket expirations (not a count of"
                " operations): at most one live item per bucket, and an emptied bucket's"
                " item stays until its time comes, so it may be above 0 with nothing pending",
            ),
            (
                "timer_lag",
                "timer_lag_last_seconds",
                "Seconds the timer's latest expiring pass ran after the earliest deadline"
                " it served (not a count of operations)",
            ),
            (
                "timer_lag_max",
                "timer_lag_max_seconds",
                "The largest timer_lag_last_seconds of this purgatory, in seconds"
                " (not a count of operations)",
            ),
        ]
        for field, name, documentation in gauges:
            gauge = GaugeMetricFamily(f"{p}_{name}", documentation, labels=["purgatory"])
            for stats in snapshot.stats:
                gauge.add_metric([stats.name], getattr(stats, field))
            yield gauge
        wakeups = CounterMetricFamily(
            f"{p}_timer_wakeups",
            "Passes of the timer task (not a count of operations)",
            labels=["purgatory"],
        )
        passes = dict(snapshot.past_wakeups)
        for stats in snapshot.stats:
            passes[stats.name] = passes.get(stats.name, 0) + stats.timer_wakeups
        for purgatory, count in sorted(passes.items()):
            wakeups.add_metric([purgatory], count)
        yield wakeups

        labels = ["purgatory", "kind", "outcome"]
        total = CounterMetricFamily(
            f"{p}_operations", "Operations finished, by kind and outcome", labels=labels
        )
        waits = HistogramMetricFamily(
            f"{p}_operation_wait_seconds",
            "Seconds from an operation's registration to its finish",
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
        """The running loop of the tracked purgatories, if one runs them now."""
        running: dict[asyncio.AbstractEventLoop, Purgatory] = {}
        for purgatory in self._purgatories:
            loop = purgatory.loop
            if loop is not None and not purgatory.closed and loop.is_running():
                running.setdefault(loop, purgatory)
        if len(running) > 1:
            first, second = list(running.values())[:2]
            raise ValueError(
                f"purgatories {first.name!r} and {second.name!r} of one collector run on two"
                " event loops at once: use one collector per loop"
            )
        return next(iter(running), None)

    def _snapshot(self) -> _Snapshot:
        """A copy taken on the loop's thread, or while nothing can change the counts."""
        loop = self._bound_loop()
        if loop is None or _running_loop() is loop:
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
        with self._lock:
            gone = [purgatory for purgatory in self._purgatories if _gone(purgatory)]
            if gone:
                for purgatory in gone:
                    self._forget(purgatory)
                self._purgatories = tuple(p for p in self._purgatories if not _gone(p))
            purgatories = self._purgatories
            past_wakeups = dict(self._past_wakeups)
        snapshot = _Snapshot(
            stats=tuple(purgatory.stats for purgatory in purgatories),
            past_wakeups=past_wakeups,
            waits={key: tuple(s.copy() for s in row) for key, row in self._waits.items()},
            lags={name: series.copy() for name, series in self._lags.items()},
        )
        self._last = snapshot
        return snapshot

    def _forget(self, purgatory: Purgatory) -> None:
        """Keep what ``purgatory``'s wake-up counter reached (called under the lock)."""
        wakeups = purgatory.stats.timer_wakeups
        if wakeups:
            name = purgatory.name
            self._past_wakeups[name] = self._past_wakeups.get(name, 0) + wakeups


class LoopTimerCollector(Collector):
    """Exports a wheel loop's pending timers, in total and by owner.

    ::

        REGISTRY.register(LoopTimerCollector(asyncio.get_running_loop()))

    A purgatory's collector follows purgatories; this one follows a loop (made by
    :func:`aiopurgatory.loop.new_event_loop` and friends), which may hold no purgatory
    at all. Each scrape counts the timers then (:meth:`timer_stats`, O(timers)) on the
    loop's thread, as :class:`PurgatoryCollector` copies its counts; nothing is counted
    between scrapes, so the loop pays nothing until a scrape, then about 1 µs per
    pending timer (0.1 s at 100k). Once the loop has closed it exports zero timers.

    Exported (gauges):

    * ``aiopurgatory_loop_timers``: timers pending on the wheel loop.
    * ``aiopurgatory_loop_timers_by_owner{owner}``: per owner (see
      :func:`~aiopurgatory.loop.timer_owner`), the ``top`` owners with the most timers
      by name and the rest summed as ``owner="other"``, so the label's cardinality is
      bounded whatever the application schedules.
    * ``aiopurgatory_loop_timer_next_due_seconds{owner}``: seconds until the owner's
      next timer falls due (for the named owners; ``other`` gets the earliest of the
      rest). Negative means overdue: a loop too busy to run it.

    Args:
        loop: a wheel loop.
        top: owners exported by name (:data:`DEFAULT_TOP_OWNERS`).
        prefix: the first word of every series name.
        scrape_timeout: how long a scrape from another thread waits for the loop.

    Raises:
        TypeError: ``loop`` is not a wheel loop.
        ValueError: ``top`` is below 0 or ``scrape_timeout`` not a finite number > 0.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        top: int = DEFAULT_TOP_OWNERS,
        prefix: str = "aiopurgatory",
        scrape_timeout: float = 1.0,
    ) -> None:
        if not is_wheel_loop(loop):
            raise TypeError(
                f"{type(loop).__qualname__} is not a wheel loop: make it with"
                " aiopurgatory.loop.new_event_loop() (or loop_factory(), install())"
            )
        if top < 0:
            raise ValueError(f"top must be >= 0, got {top!r}")
        if not (scrape_timeout > 0 and math.isfinite(scrape_timeout)):
            raise ValueError(f"scrape_timeout must be a finite number > 0, got {scrape_timeout!r}")
        self._loop = loop
        self._top = top
        self._prefix = prefix
        self._scrape_timeout = scrape_timeout
        self._last: TimerStats | None = None

    def collect(self) -> Iterator[Metric]:
        """The three gauges, from one count of the loop's timers."""
        stats = self._stats()
        p = self._prefix
        total = GaugeMetricFamily(f"{p}_loop_timers", "Timers pending on the wheel loop")
        total.add_metric([], stats.count if stats is not None else 0)
        yield total
        by_owner = GaugeMetricFamily(
            f"{p}_loop_timers_by_owner",
            f"Timers pending on the wheel loop by callback owner (the top {self._top},"
            f" the rest as {OTHER_OWNER!r})",
            labels=["owner"],
        )
        due = GaugeMetricFamily(
            f"{p}_loop_timer_next_due_seconds",
            "Seconds until the owner's next timer falls due (negative: overdue)",
            labels=["owner"],
        )
        if stats is not None:
            named, rest = stats.owners[: self._top], stats.owners[self._top :]
            for row in named:
                by_owner.add_metric([row.owner], row.count)
                due.add_metric([row.owner], row.next_when - stats.time)
            if rest:
                by_owner.add_metric([OTHER_OWNER], sum(row.count for row in rest))
                due.add_metric([OTHER_OWNER], min(row.next_when for row in rest) - stats.time)
        yield by_owner
        yield due

    def _stats(self) -> TimerStats | None:
        """Counted on the loop's thread (or directly while nothing runs the loop)."""
        loop = self._loop
        if loop.is_closed():
            return None
        if not loop.is_running() or _running_loop() is loop:
            return self._count()
        result: concurrent.futures.Future[TimerStats] = concurrent.futures.Future()

        def count() -> None:
            if result.set_running_or_notify_cancel():
                try:
                    result.set_result(self._count())
                except Exception as exc:
                    result.set_exception(exc)

        try:
            loop.call_soon_threadsafe(count)
        except RuntimeError:  # closed meanwhile
            return None
        try:
            return result.result(self._scrape_timeout)
        except TimeoutError:
            result.cancel()
            return self._last

    def _count(self) -> TimerStats:
        stats: TimerStats = self._loop.timer_stats()  # type: ignore[attr-defined]
        self._last = stats
        return stats


def _gone(purgatory: Purgatory) -> bool:
    """Nothing will change ``purgatory`` again: closed, or its loop is."""
    loop = purgatory.loop
    return purgatory.closed or (loop is not None and loop.is_closed())


def _in_use(purgatory: Purgatory) -> bool:
    """``purgatory`` has been used and may be again: not gone, and bound to a loop."""
    return purgatory.loop is not None and not _gone(purgatory)


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
