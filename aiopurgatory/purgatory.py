"""The purgatory: delayed operations watched by key and timed by a wheel timer.

An operation is registered under one or more keys. An event on a key
(:meth:`Purgatory.check_and_complete`, or the coalesced :meth:`Purgatory.notify`)
re-checks every operation watching it; the timer expires the rest. A finished
operation leaves the timer and every watcher list at once (each list is an
insertion-ordered dict, so removal is O(1) and checks run oldest first), so the
counts are exact and completed operations are never kept alive by the purgatory.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol, TypeVar

from .errors import PurgatoryClosed, PurgatoryFull
from .operation import DelayedOperation, Outcome
from .ops import DelayedFuture, PredicateOperation
from .timer import DEFAULT_MAX_WORK_PER_PASS, Clock, Timer

__all__ = ["OperationObserver", "Purgatory", "PurgatoryStats"]

T = TypeVar("T")
OpT = TypeVar("OpT", bound=DelayedOperation[Any])

_ABSENT: Final = object()
_COMPLETED: Final = Outcome.COMPLETED
_EXPIRED: Final = Outcome.EXPIRED
_CANCELLED: Final = Outcome.CANCELLED


class OperationObserver(Protocol):
    """Told, synchronously on the loop, of every operation that finishes.

    It runs on the hot path: keep it to appending to a buffer.
    """

    def operation_finished(
        self, purgatory: str, op: DelayedOperation[Any], outcome: Outcome, finished: float
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class PurgatoryStats:
    """A snapshot of a purgatory's counters."""

    name: str
    pending: int
    """Registered operations not yet finished."""
    watched: int
    """Watcher-list entries (an operation watched under three keys counts three)."""
    keys: int
    """Keys with at least one watcher."""
    timed: int
    """Operations pending in the timer (those with a timeout)."""
    completed: int
    expired: int
    cancelled: int
    closed: int
    purged: int
    """Watcher-list entries removed because their operation finished."""
    timer_lag: float
    """Seconds the timer's latest wake-up came after the bucket it served."""
    timer_lag_max: float
    timer_wakeups: int
    heap_size: int
    """Bucket expirations in the timer's heap (bounded by buckets, not operations)."""


class Purgatory:
    """Holds delayed operations until their condition holds or their timeout passes.

    Use it on one event loop (``async with Purgatory("name") as p:``); from other
    threads only :meth:`notify_threadsafe` is allowed.
    """

    __slots__ = (
        "_clock",
        "_closed",
        "_counts",
        "_loop",
        "_max_pending",
        "_max_work",
        "_notified",
        "_notify_handle",
        "_observer",
        "_pending",
        "_purge_interval",
        "_purged",
        "_tick",
        "_timer",
        "_watched",
        "_watchers",
        "_wheel_size",
        "name",
    )

    def __init__(
        self,
        name: str,
        *,
        tick: float = 0.001,
        wheel_size: int = 20,
        purge_interval: int = 1000,
        max_pending: int | None = None,
        clock: Clock | None = None,
        observer: OperationObserver | None = None,
        max_work_per_pass: int = DEFAULT_MAX_WORK_PER_PASS,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        _check_count("purge_interval", purge_interval)
        if max_pending is not None:
            _check_count("max_pending", max_pending)
        Timer.check_config(tick, wheel_size, max_work_per_pass)
        self.name = name
        self._tick = tick
        self._wheel_size = wheel_size
        self._max_work = max_work_per_pass
        self._purge_interval = purge_interval
        self._max_pending = max_pending
        self._clock = clock
        self._observer = observer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: Timer | None = None
        self._watchers: dict[Hashable, dict[DelayedOperation[Any], None]] = {}
        self._notified: dict[Hashable, None] = {}
        self._notify_handle: asyncio.Handle | None = None
        self._closed = False
        self._pending = 0
        self._watched = 0
        self._purged = 0
        # Completed, expired, cancelled, closed: a list, since an Enum key hashes in Python.
        self._counts = [0, 0, 0, 0]

    # -- lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> Purgatory:
        self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, *, expire_pending: bool = False) -> None:
        """Finish every pending operation exactly once, then stop. Idempotent.

        Pending operations complete with :class:`PurgatoryClosed` (neither
        ``on_complete`` nor ``on_expiration`` runs), or, with ``expire_pending``,
        expire as if their timeout had passed.
        """
        if self._closed:
            return
        if self._loop is not None:
            self._check_loop()
        self._closed = True
        if self._notify_handle is not None:
            self._notify_handle.cancel()
            self._notify_handle = None
        self._notified.clear()
        pending = {op: None for ops in self._watchers.values() for op in ops}
        for op in pending:
            if expire_pending:
                op._timer_fired()
            else:
                op._abandon(self._closed_error(op))
        if self._timer is not None:
            self._timer.close()

    # -- registering and completing -----------------------------------------------

    def try_complete_else_watch(self, op: OpT, keys: Iterable[Hashable]) -> OpT:
        """Complete ``op`` now if it can, else watch it under ``keys`` and time it.

        Registration is synchronous; the returned operation is awaitable, and
        ``op.done()`` right after the call is Kafka's "completed at once" boolean.
        """
        timer = self._enter()
        if op._owner is not None:
            raise RuntimeError(f"{op!r} is already registered with a purgatory")
        if op.done():
            raise RuntimeError(f"{op!r} has already completed")
        watch_keys = _unique_keys(keys)
        if self._max_pending is not None and self._pending >= self._max_pending:
            raise PurgatoryFull(
                f"purgatory {self.name!r} holds {self._pending} operations"
                f" (max_pending={self._max_pending})"
            )
        op._owner = self
        op._keys = watch_keys
        op.created = created = timer.now()
        self._pending += 1
        if op._check():
            return op
        if self._closed:  # try_complete closed the purgatory
            op._abandon(self._closed_error(op))
            return op
        watchers = self._watchers
        for key in watch_keys:
            ops = watchers.get(key)
            if ops is None:
                ops = watchers[key] = {}
            ops[op] = None
        self._watched += len(watch_keys)
        # Nothing else can run between the first check and the watch on this
        # thread, but try_complete itself may have changed what it depends on.
        if op._check():
            return op
        if op.timeout is not None:
            timer.add(op, op.timeout, start=created)  # the timeout counts from registration
        return op

    def check_and_complete(self, key: Hashable) -> int:
        """Re-check every operation watching ``key``; returns how many it completed."""
        self._enter()
        ops = self._watchers.get(key)
        if not ops:
            return 0
        completed = 0
        for op in list(ops):  # completions may add or remove watchers of this key
            if op._check():
                completed += 1
        return completed

    def notify(self, key: Hashable) -> None:
        """Check ``key`` in a later loop pass; notifies in one pass share one check."""
        loop = self._bound_loop()
        hash(key)
        if not self._notified:
            self._notify_handle = loop.call_soon(self._run_notified)
        self._notified[key] = None

    def notify_threadsafe(self, key: Hashable) -> None:
        """Like :meth:`notify`, callable from any thread."""
        hash(key)
        loop = self._loop
        if loop is None:
            raise RuntimeError(f"purgatory {self.name!r} has not started on an event loop yet")
        if self._closed:
            raise PurgatoryClosed(f"purgatory {self.name!r} is closed")
        loop.call_soon_threadsafe(self._notify_if_open, key)

    def cancel_for_key(self, key: Hashable) -> list[DelayedOperation[Any]]:
        """Cancel every operation watching ``key``; returns those it cancelled."""
        self._enter()
        ops = self._watchers.get(key)
        if not ops:
            return []
        return [op for op in list(ops) if op.cancel()]

    async def wait_for(
        self, keys: Iterable[Hashable], predicate: Callable[[], object], timeout: float | None
    ) -> bool:
        """Wait until ``predicate()`` holds, re-checked on events of ``keys``.

        Returns True when it held, False when ``timeout`` passed first.
        """
        return await self.try_complete_else_watch(PredicateOperation(predicate, timeout), keys)

    def watch_futures(
        self, futures: Iterable[asyncio.Future[T]], timeout: float | None
    ) -> DelayedFuture[T]:
        """A :class:`DelayedFuture` over ``futures``, checked as each one finishes."""
        op: DelayedFuture[T] = DelayedFuture(futures, timeout)
        self.try_complete_else_watch(op, (op,))
        if not op.done():
            for future in op.futures:
                future.add_done_callback(lambda _: self._notify_if_open(op))
        return op

    # -- counts ---------------------------------------------------------------------

    def num_delayed(self) -> int:
        """Operations registered and not yet finished."""
        return self._pending

    def watched(self) -> int:
        """Watcher-list entries across all keys."""
        return self._watched

    def watchers_of(self, key: Hashable) -> int:
        """Operations watching ``key``."""
        ops = self._watchers.get(key)
        return len(ops) if ops else 0

    @property
    def purge_interval(self) -> int:
        """Bound on finished operations still referenced from watcher lists.

        Finished operations leave their lists at once, so the number referenced is
        always 0 and the bound always holds; it is kept for Kafka parity.
        """
        return self._purge_interval

    @property
    def stats(self) -> PurgatoryStats:
        timer = self._timer
        counts = self._counts
        return PurgatoryStats(
            name=self.name,
            pending=self._pending,
            watched=self._watched,
            keys=len(self._watchers),
            timed=len(timer) if timer is not None else 0,
            completed=counts[0],
            expired=counts[1],
            cancelled=counts[2],
            closed=counts[3],
            purged=self._purged,
            timer_lag=timer.lag_last if timer is not None else 0.0,
            timer_lag_max=timer.lag_max if timer is not None else 0.0,
            timer_wakeups=timer.wakeups if timer is not None else 0,
            heap_size=timer.wheel.heap_size if timer is not None else 0,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Purgatory {self.name!r} {state} pending={self._pending}>"

    # -- called by operations -------------------------------------------------------

    def _operation_finished(self, op: DelayedOperation[Any], outcome: Outcome) -> None:
        self._pending -= 1
        timer = self._timer
        assert timer is not None
        if outcome is not _EXPIRED and op.deadline is not None:  # expired: already out
            timer.cancel(op)
        watchers = self._watchers
        removed = 0
        for key in op._keys:
            ops = watchers.get(key)
            if ops is not None and ops.pop(op, _ABSENT) is not _ABSENT:
                removed += 1
                if not ops:
                    del watchers[key]
        self._watched -= removed
        self._purged += removed
        if outcome is _COMPLETED:
            self._counts[0] += 1
        elif outcome is _EXPIRED:
            self._counts[1] += 1
        elif outcome is _CANCELLED:
            self._counts[2] += 1
        else:
            self._counts[3] += 1
        if self._observer is not None:
            self._observer.operation_finished(self.name, op, outcome, timer.now())

    def _reset_timeout(self, op: DelayedOperation[Any], timeout: float | None) -> None:
        timer = self._enter()
        if timeout is None:
            timer.cancel(op)
            op.deadline = None
        else:
            timer.reset(op, timeout)

    # -- internals --------------------------------------------------------------------

    def _enter(self) -> Timer:
        """Check the purgatory may be used here and now; binds it on first use."""
        timer = self._timer
        if timer is not None and not self._closed and asyncio._get_running_loop() is self._loop:
            return timer  # the common case, kept to one call
        if self._closed:
            raise PurgatoryClosed(f"purgatory {self.name!r} is closed")
        if self._timer is None:
            self._bind()
        else:
            self._check_loop()
        assert self._timer is not None
        return self._timer

    def _bound_loop(self) -> asyncio.AbstractEventLoop:
        self._enter()
        assert self._loop is not None
        return self._loop

    def _bind(self) -> None:
        loop = asyncio._get_running_loop()
        if loop is None:
            raise RuntimeError(
                f"purgatory {self.name!r} must be used from a running event loop"
                " (from other threads, only notify_threadsafe())"
            )
        self._loop = loop
        self._timer = Timer(
            self._clock if self._clock is not None else loop,
            tick=self._tick,
            wheel_size=self._wheel_size,
            max_work_per_pass=self._max_work,
        )

    def _check_loop(self) -> None:
        if asyncio._get_running_loop() is not self._loop:
            raise RuntimeError(
                f"purgatory {self.name!r} belongs to another event loop or thread;"
                " use notify_threadsafe() from other threads"
            )

    def _closed_error(self, op: DelayedOperation[Any]) -> PurgatoryClosed:
        return PurgatoryClosed(f"purgatory {self.name!r} closed before {op!r} completed")

    def _run_notified(self) -> None:
        self._notify_handle = None
        keys = self._notified
        self._notified = {}
        for key in keys:
            if self._closed:
                return
            self.check_and_complete(key)

    def _notify_if_open(self, key: Hashable) -> None:
        if not self._closed:
            self.notify(key)


def _unique_keys(keys: Iterable[Hashable]) -> tuple[Hashable, ...]:
    if isinstance(keys, str | bytes):
        raise TypeError(f"keys must be a collection of keys, not a single {type(keys).__name__}")
    try:
        unique = tuple(dict.fromkeys(keys))
    except TypeError:
        for key in keys:
            try:
                hash(key)
            except TypeError:
                raise TypeError(f"key {key!r} is not hashable") from None
        raise
    if not unique:
        raise ValueError("keys must not be empty: an operation needs at least one key")
    return unique


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
