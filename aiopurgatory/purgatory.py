"""The purgatory: delayed operations watched by key and timed by a wheel timer.

An operation is registered under one or more keys. An event on a key
(:meth:`Purgatory.check_and_complete`, or the coalesced :meth:`Purgatory.notify`)
re-checks every operation watching it; the timer expires the rest. A finished
operation leaves the timer and every watcher list at once, so the counts are exact and
completed operations are never kept alive by the purgatory.

Ground rules of the watcher table (``Purgatory._watchers``):

* A key watched by one operation maps to that operation: no other object, one hash
  lookup to add and one to remove (the common case: a key per request).
* A key watched by several maps to a :class:`_WatchList`, a doubly-linked list of
  :class:`_Link` entries, oldest first. Each entry is also chained to the operation's
  other entries (``op._links``), so a finishing operation leaves every list it is in
  by following its own chain: no lookup in the table nor in the list, whatever the
  list's length (a dict per key, keyed by ``id(op)``, cost a fresh int and a lookup
  in a dict of tens of thousands of entries per key on both paths).
* Operations are tracked by identity: their own ``__eq__`` / ``__hash__`` never come
  into it (two equal operations are two operations; an unhashable one is watched).
* A list that empties leaves the table; it is never reused, so whoever still holds it
  (a check in progress) sees it empty.
* An entry leaving a list drops its references (to the operation, the list and its
  neighbours): while linked, entries, lists and operations form reference cycles;
  unlinked, none is left.
* An entry is hidden from the cyclic GC when its operation is (compiled build): a
  timed operation waits untracked in the timer's wheel, for the reasons and within the
  limits of ``aiopurgatory.timer``'s ground rule on the GC, and its entries, made and
  freed with it, would otherwise put three times as many objects in the young
  generations (measured: GC on, a pass of Kafka's benchmark with three shared keys
  cost 10 % more CPU with tracked entries than with the dicts they replaced, and about
  20 % less untracked and from a free list). The entries of an operation without a
  timeout stay tracked, and those of one whose timeout is reset to None are tracked
  again as it leaves the timer, so a purgatory dropped without closing stays
  collectable through them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol, Self, TypeAlias, TypeVar

from .errors import PurgatoryClosed, PurgatoryFull
from .operation import DelayedOperation, OperationOwner, Outcome, describe_operation
from .ops import DelayedFuture, PredicateOperation
from .timeouts import Timeout, TimerHandle, WheelTimeouts
from .timer import DEFAULT_MAX_WORK_PER_PASS, Clock, Timer, collectable, is_timed

__all__ = ["OperationObserver", "Purgatory", "PurgatoryStats"]

T = TypeVar("T")
OpT = TypeVar("OpT", bound=DelayedOperation[Any])

try:
    import cython
except ImportError:  # Cython is needed to build, never to run
    from . import _nocython as cython

if not cython.compiled:
    _thread_ident = threading.get_ident  # compiled: PyThread_get_thread_ident, a C call
    _object_id = id  # compiled: PyLong_FromVoidPtr, a C call instead of calling id

    # Compiled: CPython's own functions (purgatory.pxd). Pure Python cannot untrack.
    def _gc_untrack(obj: object) -> None:
        """Stop the cyclic GC from tracking ``obj`` (a no-op in pure Python)."""

    def _gc_track(obj: object) -> None:
        """Let the cyclic GC track ``obj`` again (a no-op in pure Python)."""

    def _gc_is_tracked(obj: object) -> bool:
        return True

# Pending timed operations are hidden from the cyclic GC while they wait in the timer
# (compiled build): the timer untracks what enters its wheel and tracks it again on
# every exit it sees (see the ground rules of aiopurgatory.timer). The purgatory adds
# one exit the timer cannot see: an operation the timer has collected into a batch it
# has not fired yet may finish by another path, and must be collectable before its
# hooks run. Operations without a timeout are never untracked: only the purgatory
# holds them, and a purgatory dropped without closing must still be collectable.

_COMPLETED: Final = Outcome.COMPLETED
_EXPIRED: Final = Outcome.EXPIRED
_CANCELLED: Final = Outcome.CANCELLED


@cython.freelist(4096)
@cython.cclass  # the free list needs it said here; purgatory.pxd declares the rest
class _Link:
    """One operation's entry in the watcher list of one key.

    Invariants: ``owner`` is the list the entry is in, or None once it left it (then
    ``op``, ``prev`` and ``next`` are None too); ``sibling`` chains the operation's
    entries, starting at ``op._links``.

    Compiled, freed entries wait in a free list for reuse: made and freed at up to three
    per request, they would otherwise count as allocations towards the cyclic GC's
    young-generation threshold and trigger collections several times as often.
    """

    __slots__ = ("next", "op", "owner", "prev", "sibling")

    def __init__(self) -> None:
        self.op: DelayedOperation[Any] | None = None
        self.owner: _WatchList | None = None
        self.prev: _Link | None = None
        self.next: _Link | None = None
        self.sibling: _Link | None = None


class _WatchList:
    """The watchers of a key that more than one operation watches, oldest first.

    Invariants: ``size`` entries are linked from ``head`` to ``tail``; the table maps
    ``key`` to this list while ``size`` > 0, and never again once it drops to 0.
    """

    __slots__ = ("head", "key", "size", "tail")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.head: _Link | None = None
        self.tail: _Link | None = None
        self.size = 0

    def append(self, op: DelayedOperation[Any]) -> None:
        """Link ``op`` last, and chain the entry to ``op``'s other entries."""
        # __new__ skips __init__, a Python-level call (compiled: the type's allocator,
        # from its free list); every field is set here.
        link = _Link.__new__(_Link)
        link.op = op
        link.owner = self
        link.next = None
        link.prev = tail = self.tail
        if tail is None:
            self.head = link
        else:
            tail.next = link
        self.tail = link
        self.size += 1
        link.sibling = op._links
        op._links = link
        if not _gc_is_tracked(op):  # see the module's ground rule on the GC
            _gc_untrack(link)

    def unlink(self, link: _Link) -> None:
        """Take ``link`` out of this list (the caller unchains it from its operation)."""
        prev, nxt = link.prev, link.next
        if prev is None:
            self.head = nxt
        else:
            prev.next = nxt
        if nxt is None:
            self.tail = prev
        else:
            nxt.prev = prev
        link.owner = link.prev = link.next = None
        link.op = None
        self.size -= 1

    def ops(self, limit: int = -1) -> list[DelayedOperation[Any]]:
        """A snapshot of the first ``limit`` watchers (all when negative), oldest first."""
        out: list[DelayedOperation[Any]] = []
        link = self.head
        while link is not None and limit != 0:
            op = link.op
            assert op is not None
            out.append(op)
            link = link.next
            limit -= 1
        return out


if TYPE_CHECKING:
    _Watching: TypeAlias = DelayedOperation[Any] | _WatchList
    """What a key maps to in the watcher table: its one watcher, or a list of them."""


class OperationObserver(Protocol):
    """Told, synchronously on the loop, of every operation that finishes.

    It runs on the hot path: keep it to appending to a buffer.

    An observer may also have ``purgatory_created(purgatory)``: a purgatory made with
    it as its ``observer`` calls it once, at the end of ``__init__``, so that an
    observer exporting the purgatory's own figures (the Prometheus collector's gauges)
    learns of it from that one argument. What it raises propagates out of ``__init__``.
    """

    def operation_finished(
        self, purgatory: str, op: DelayedOperation[Any], outcome: Outcome, finished: float
    ) -> None:
        """``op`` of the purgatory named ``purgatory`` finished by ``outcome``.

        Args:
            purgatory: the purgatory's name.
            op: the operation, its hooks run (its ``result()`` is ready).
            outcome: how it finished.
            finished: the purgatory's clock reading when it finished, in seconds.

        What it raises goes to the loop's exception handler; the completion stands.
        """


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
    """How late the timer's latest expiring pass was: seconds from the earliest deadline
    it expired to the clock reading it expired at."""
    timer_lag_max: float
    """The largest ``timer_lag`` so far."""
    timer_wakeups: int
    heap_size: int
    """Bucket expirations in the timer's heap (bounded by buckets, not operations)."""


class Purgatory(OperationOwner):
    """Holds delayed operations until their condition holds or their timeout passes.

    Use it on one event loop (``async with Purgatory("name") as p:``); from other
    threads only :meth:`notify_threadsafe` is allowed. It binds to the loop it is first
    used on; its timer task starts then, and sleeps while nothing is timed.

    Args:
        name: names the timer task (``aiopurgatory-timer:<name>``), metrics and traces.
        tick: seconds per bucket of the wheel's finest level (at least 1 µs).
        wheel_size: buckets per level (at least 2); level *k* spans
            ``tick * wheel_size**(k + 1)`` seconds.
        purge_interval: Kafka's bound on finished operations still referenced; finished
            operations leave at once here, so it always holds.
        max_pending: at most this many pending operations; registering one more raises
            :class:`~aiopurgatory.PurgatoryFull` before touching it. None: no limit.
        clock: where time comes from (``time()``, ``call_at()``); the loop's by default,
            a :class:`~aiopurgatory.ManualClock` in tests.
        observer: told of every finished operation (a trace recorder, the Prometheus
            collector).
        max_work_per_pass: entries the timer handles in one wake-up before it yields
            to the loop.

    Raises:
        TypeError: ``name`` is not a str, or an option is not a number of its kind.
        ValueError: an option out of its range (a tick below 1 µs, NaN or infinite;
            ``wheel_size`` below 2; a count below 1), naming it and the value.

    Registering, cancelling and expiring an operation cost O(1) each (plus O(keys)
    for its watcher lists); the timer's heap holds buckets, never operations.
    """

    __slots__ = (
        "_clock",
        "_closed",
        "_loop",
        "_loop_running",
        "_max_pending",
        "_max_work",
        "_n_cancelled",
        "_n_closed",
        "_n_completed",
        "_n_expired",
        "_notified",
        "_notify_handle",
        "_observer",
        "_pending",
        "_purge_interval",
        "_purged",
        "_registering",
        "_registering_start",
        "_stock_loop",
        "_tick",
        "_timeouts",
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
        self._loop_running: Callable[[], bool] = _never
        self._stock_loop = False  # the loop's is_running is asyncio's own
        self._thread = 0  # what threading.get_ident() said where the loop last ran
        self._timer: Timer | None = None
        self._timeouts: WheelTimeouts | None = None  # made by the first timeout()
        # Key -> the one operation watching it, or an insertion-ordered dict of them
        # (oldest first) once a second one watches it: a key watched by one operation,
        # the common case, costs no dict of its own.
        self._watchers: dict[Hashable, _Watching] = {}
        self._notified: dict[Hashable, None] = {}
        self._notify_handle: asyncio.Handle | None = None
        self._closed = False
        # The operation inside try_complete_else_watch's check, and when its timeout
        # counts from (reset_timeout from try_complete moves it).
        self._registering: DelayedOperation[Any] | None = None
        self._registering_start = 0.0
        self._pending = 0
        self._watched = 0
        self._purged = 0
        self._n_completed = 0
        self._n_expired = 0
        self._n_cancelled = 0
        self._n_closed = 0
        # An observer that exports this purgatory's stats (PurgatoryCollector) learns of
        # it here, made whole: observer= is then the one argument that sets up all of its
        # metrics, gauges included, before any operation finishes.
        created = getattr(observer, "purgatory_created", None)
        if created is not None:
            created(self)

    # -- lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the purgatory is bound to (None until its first use)."""
        return self._loop

    def bind_loop(self) -> asyncio.AbstractEventLoop:
        """Bind the purgatory to the running loop now, as its first use would.

        For code that hands the purgatory to another component which will call it from
        this loop (:meth:`aiopurgatory.redis.RedisFanout.attach` does): a later use on
        another loop then fails at that use. A no-op when already bound to this loop.

        Returns:
            The loop it is bound to.

        Raises:
            RuntimeError: no event loop runs in this thread, or the purgatory is bound
                to another loop.
            PurgatoryClosed: the purgatory is closed.
        """
        return self._bound_loop()

    def close(self, *, expire_pending: bool = False) -> None:
        """Finish every pending operation exactly once, then stop. Idempotent.

        Pending operations complete with :class:`PurgatoryClosed` (neither
        ``on_complete`` nor ``on_expiration`` runs), or, with ``expire_pending``,
        expire as if their timeout had passed. Everything is released: no operation
        stays watched or linked in the timer, and the timer task ends (see
        :meth:`aclose` to wait for it).

        Call it on the purgatory's loop, from inside a hook too, or after that loop
        has stopped or closed (operations then finish without waking anyone). From
        another thread while the loop runs it raises ``RuntimeError``: use
        ``loop.call_soon_threadsafe(purgatory.close)``.
        """
        if self._closed:
            return
        loop = self._loop
        if loop is not None and asyncio._get_running_loop() is not loop and loop.is_running():
            raise RuntimeError(
                f"purgatory {self.name!r} is in use by an event loop running elsewhere;"
                " close it from that loop (loop.call_soon_threadsafe(purgatory.close))"
            )
        self._shut_down(expire_pending, None)

    async def aclose(self) -> None:
        """:meth:`close`, then wait until the timer task has ended."""
        self.close()
        timer = self._timer
        if timer is not None:
            await timer.wait_closed()

    # -- registering and completing -----------------------------------------------

    def try_complete_else_watch(self, op: OpT, keys: Iterable[Hashable]) -> OpT:
        """Complete ``op`` now if it can, else watch it under ``keys`` and time it.

        Registration is synchronous: one ``try_complete`` call, then (if the operation
        is still pending) the timer and the watcher lists. Nothing on this loop can run
        in between, and a check asked for during that call runs again right after it.
        The returned operation is awaitable; ``op.done()`` right after the call is
        Kafka's "completed at once" boolean.

        O(1) to time it, O(len(keys)) to watch it.

        Args:
            op: a new operation (never registered, not finished).
            keys: the keys whose events re-check it: a collection of hashables (a
                tuple is several keys; a lone ``str`` or ``bytes`` is refused).

        Returns:
            ``op`` itself.

        Raises:
            RuntimeError: ``op`` is already registered or finished (nothing changes),
                or the purgatory is used from another loop or thread.
            TypeError: ``keys`` is a lone ``str``/``bytes``, or a key is unhashable.
            ValueError: ``keys`` is empty.
            PurgatoryFull: ``max_pending`` operations are pending (``op`` untouched).
            PurgatoryClosed: the purgatory is closed.
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
        outer, outer_start = self._registering, self._registering_start
        self._registering, self._registering_start = op, created
        try:
            op._check()
            start = self._registering_start  # moved if try_complete reset the timeout
        finally:
            self._registering, self._registering_start = outer, outer_start
        # try_complete may have completed, cancelled or failed the operation without
        # saying so in its return value, or closed the purgatory.
        if op.done():
            return op
        if self._closed:
            op._abandon(_Closing(self.name, None))
            return op
        timeout = op.timeout
        if timeout is not None:
            try:
                # The timeout counts from registration (or from a reset inside
                # try_complete): ``start`` is the latest clock reading, no second one.
                timer._place(op, start + timeout, start)
            except BaseException:
                if not op.done():  # nothing registered it: undo
                    op._owner = None
                    op._keys = ()
                    self._pending -= 1
                raise
            if op.done():  # a timeout of 0 expires at once
                return op
        watchers = self._watchers
        for key in watch_keys:
            watching = watchers.setdefault(key, op)  # one hash lookup for a new key
            if watching is op:
                continue
            if isinstance(watching, _WatchList):
                shared = watching
            else:  # the key's one watcher, so far: both go in a list, it first
                shared = _WatchList(key)
                shared.append(watching)
                watchers[key] = shared
            shared.append(op)
        self._watched += len(watch_keys)
        return op

    def check_and_complete(self, key: Hashable, *, limit: int | None = None) -> int:
        """Re-check the operations watching ``key``, oldest first; returns completions.

        With ``limit``, stop after that many completions: ``limit=1`` wakes one waiter
        (a queue's pop), and costs one successful check when the oldest can complete.
        Operations added under ``key`` by the completions are not checked in this call.

        Args:
            key: the key whose watchers to check.
            limit: stop after this many completions (an int >= 1); None: check all.

        Returns:
            How many operations this call completed.

        Raises:
            TypeError: ``key`` is unhashable, or ``limit`` is not an int.
            ValueError: ``limit`` is below 1.
            RuntimeError: called from another event loop or thread than the
                purgatory's (or outside a running loop before its first use).
            PurgatoryClosed: the purgatory is closed.
        """
        self._enter()
        if limit is not None:
            _check_count("limit", limit)
        watching = self._watchers.get(key)
        if watching is None:
            return 0
        if not isinstance(watching, _WatchList):
            op = watching  # typed: compiled, a C call rather than a method lookup
            return 1 if op._check() else 0  # any limit is >= 1
        shared = watching
        if limit is None:
            completed = 0
            for op in shared.ops():  # completions may add or remove watchers
                if op._check():
                    completed += 1
            return completed
        return self._check_some(shared, limit)

    def notify(self, key: Hashable) -> None:
        """Check ``key`` in a later loop pass; notifies in one pass share one check.

        Args:
            key: the key whose watchers to check.

        Raises:
            TypeError: ``key`` is unhashable.
            RuntimeError: called from another event loop or thread than the
                purgatory's (or outside a running loop before its first use).
            PurgatoryClosed: the purgatory is closed.
        """
        loop = self._bound_loop()
        hash(key)
        if not self._notified:
            self._notify_handle = loop.call_soon(self._run_notified)
        self._notified[key] = None

    def notify_threadsafe(self, key: Hashable) -> None:
        """Like :meth:`notify`, callable from any thread.

        Args:
            key: the key whose watchers to check, on the purgatory's loop.

        Raises:
            TypeError: ``key`` is unhashable.
            RuntimeError: the purgatory has not been used on a loop yet.
            PurgatoryClosed: the purgatory or its event loop is closed (a notify that
                can no longer be delivered is not silently lost).
        """
        hash(key)
        loop = self._loop
        if loop is None:
            raise RuntimeError(f"purgatory {self.name!r} has not started on an event loop yet")
        if self._closed:
            raise PurgatoryClosed(f"purgatory {self.name!r} is closed")
        try:
            loop.call_soon_threadsafe(self._notify_if_open, key)
        except RuntimeError:
            if not loop.is_closed():
                raise
            raise PurgatoryClosed(
                f"purgatory {self.name!r} can no longer be notified: its event loop is closed"
            ) from None

    def cancel_for_key(self, key: Hashable) -> list[DelayedOperation[Any]]:
        """Cancel every operation watching ``key``; returns those it cancelled.

        Cancelled operations run neither ``on_complete`` nor ``on_expiration``; their
        awaiters get ``CancelledError``.

        Raises:
            TypeError: ``key`` is unhashable.
            RuntimeError: called from another event loop or thread than the
                purgatory's (or outside a running loop before its first use).
            PurgatoryClosed: the purgatory is closed.
        """
        self._enter()
        return [op for op in self._watching(key) if op.cancel()]

    async def wait_for(
        self, keys: Iterable[Hashable], predicate: Callable[[], object], timeout: float | None
    ) -> bool:
        """Wait until ``predicate()`` holds, re-checked on events of ``keys``.

        A :class:`~aiopurgatory.PredicateOperation` registered with
        :meth:`try_complete_else_watch`: the predicate is called at once, then on every
        event of one of ``keys`` (:meth:`notify`, :meth:`check_and_complete`).

        Args:
            keys: the keys whose events re-check the predicate.
            predicate: a plain function (an ``async def`` one is refused); truthy
                means done.
            timeout: seconds, or None for no timeout.

        Returns:
            True when the predicate held, False when ``timeout`` passed first.

        Raises:
            TypeError: an ``async def`` predicate, a bad timeout or bad keys (nothing
                is registered), or a predicate that returned an awaitable.
            ValueError: a negative or NaN timeout, or no keys.
            PurgatoryClosed: the purgatory is closed, before or while waiting.
            Exception: what the predicate raised.
        """
        return await self.try_complete_else_watch(PredicateOperation(predicate, timeout), keys)

    def watch_futures(
        self, futures: Iterable[asyncio.Future[T]], timeout: float | None
    ) -> DelayedFuture[T]:
        """A :class:`DelayedFuture` over ``futures``, checked as each one finishes.

        The callbacks it adds to the futures are removed once the operation finishes,
        by any path, and never refer to it: a long-lived future keeps nothing alive.

        Args:
            futures: the futures to wait for (all of them).
            timeout: seconds, or None for no timeout.

        Returns:
            The registered operation: awaiting it gives the futures' results in order,
            or raises ``TimeoutError`` (after cancelling those not done), the first
            failed future's exception, or ``CancelledError``.
        """
        op: DelayedFuture[T] = DelayedFuture(futures, timeout)
        # A key of its own: the operation itself would be hashed with its class's
        # __hash__ (a subclass may be unhashable), and the callbacks below would keep it
        # reachable from the futures.
        key = object()
        self.try_complete_else_watch(op, (key,))
        if not op.done():
            pending = op.futures

            def wake(_: object) -> None:
                self._notify_if_open(key)

            def release(_: object) -> None:
                # The operation finished, by any path: a long-lived future must not
                # collect one callback per operation that ever watched it.
                for future in pending:
                    future.remove_done_callback(wake)

            for future in pending:
                future.add_done_callback(wake)
            op.add_done_callback(release)
        return op

    # -- counts ---------------------------------------------------------------------

    def num_delayed(self) -> int:
        """Operations registered and not yet finished."""
        return self._pending

    def watched(self) -> int:
        """Watcher-list entries across all keys."""
        return self._watched

    def watchers_of(self, key: Hashable) -> int:
        """Operations watching ``key`` (0 for a key nobody watches).

        Raises:
            TypeError: ``key`` is unhashable.
        """
        watching = self._watchers.get(key)
        if watching is None:
            return 0
        return watching.size if isinstance(watching, _WatchList) else 1

    def keys(self) -> list[Hashable]:
        """A snapshot of the keys watched now, each once (e.g. to re-check them all)."""
        return list(self._watchers)

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
        return PurgatoryStats(
            name=self.name,
            pending=self._pending,
            watched=self._watched,
            keys=len(self._watchers),
            timed=len(timer) if timer is not None else 0,
            completed=self._n_completed,
            expired=self._n_expired,
            cancelled=self._n_cancelled,
            closed=self._n_closed,
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

    def _operation_detached(self, op: DelayedOperation[Any]) -> None:
        """``op`` finished: it leaves the timer and every watcher list, before any hook."""
        self._pending -= 1
        if is_timed(op):  # not when the timer fired it: the deadline stays for traces
            timer = self._timer
            assert timer is not None
            timer.cancel(op)  # which makes it collectable
        else:  # fired, never timed, or in a batch the timer has not fired yet
            collectable(op)
        self._unwatch(op)

    def _unwatch(self, op: DelayedOperation[Any]) -> None:
        watchers = self._watchers
        removed = 0
        # The shared keys: follow the operation's own chain of entries.
        link = op._links
        op._links = None
        while link is not None:
            shared = link.owner
            if shared is not None:
                shared.unlink(link)
                removed += 1
                if shared.size == 0:  # the list leaves the table, never to return
                    key = shared.key
                    if watchers.get(key) is shared:
                        del watchers[key]
            nxt = link.sibling
            link.sibling = None
            link = nxt
        # The keys it alone watched, if any. One hash lookup for such a key, the common
        # case. What else a key held goes back in (last in the table's order, which
        # nothing relies on): a shared key's list (left above), or another operation
        # of a key ``op`` never watched, having finished during its registration check.
        if removed < len(op._keys):
            for key in op._keys:
                watching = watchers.pop(key, None)
                if watching is op:
                    removed += 1
                elif watching is not None:
                    watchers[key] = watching
        self._watched -= removed
        self._purged += removed

    def _operation_recorded(self, op: DelayedOperation[Any], outcome: Outcome) -> None:
        """``op``'s hooks have run: count its final outcome and tell the observer."""
        if outcome is _COMPLETED:
            self._n_completed += 1
        elif outcome is _EXPIRED:
            self._n_expired += 1
        elif outcome is _CANCELLED:
            self._n_cancelled += 1
        else:
            self._n_closed += 1
        observer = self._observer
        if observer is not None:
            timer = self._timer
            assert timer is not None
            try:
                observer.operation_finished(self.name, op, outcome, timer.now())
            except (Exception, asyncio.CancelledError) as exc:
                self._report(exc, f"observer of purgatory {self.name!r} raised", op)

    def _reset_timeout(self, op: DelayedOperation[Any], timeout: float | None) -> None:
        if self._closed:
            op.timeout = timeout
            return  # a hook run by close: the close in progress finishes ``op`` too
        timer = self._enter()  # refuses a wrong loop before ``op`` changes
        op.timeout = timeout
        if op is self._registering:
            # Inside registration's try_complete: not timed yet. Registration times it
            # with the new timeout, counted from now.
            self._registering_start = timer.now()
        elif timeout is None:
            timer.cancel(op)  # which makes it collectable: only the purgatory holds it now
            op.deadline = None
            _track_links(op)  # and its entries with it (the module's rule on the GC)
        else:
            timer.reset(op, timeout)

    # -- internals --------------------------------------------------------------------

    def _enter(self) -> Timer:
        """Check the purgatory may be used here and now; binds it on first use."""
        timer = self._timer
        if (
            timer is not None
            and not self._closed
            and _thread_ident() == self._thread
            and (
                self._loop._thread_id is not None  # type: ignore[union-attr]
                if self._stock_loop
                else self._loop_running()
            )
        ):
            # The common case. Our loop running, in this thread, is the running loop
            # here (a thread runs one loop at a time), and these two checks cost a
            # third of asyncio._get_running_loop(), which makes a getpid() system call.
            return timer
        if self._closed:
            loop = self._loop
            if loop is not None and asyncio._get_running_loop() is not loop:
                # Typically a purgatory made at module level and used by a second test:
                # the first test's loop ended and took the purgatory with it.
                raise PurgatoryClosed(self._wrong_loop_message(closed=True))
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

    def _event_loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def _check_thread(self, op: DelayedOperation[Any], method: str) -> None:
        """The slow path of an operation's thread check: one loop, one thread."""
        loop = self._loop
        if loop is None or not loop.is_running():
            return  # stopped or closed: nothing runs concurrently (as for close())
        if asyncio._get_running_loop() is loop:
            self._thread = _thread_ident()  # the loop now runs in this thread
            return
        args = ", seconds" if method == "reset_timeout" else ""
        raise RuntimeError(
            f"{op!r}.{method}() called from thread {threading.current_thread().name!r},"
            f" but it belongs to purgatory {self.name!r}, whose event loop runs in another"
            " thread. Operations are not thread-safe: hand the call to the loop,"
            f" purgatory.loop.call_soon_threadsafe(op.{method}{args})"
        )

    def _bind(self) -> None:
        loop = asyncio._get_running_loop()
        if loop is None:
            raise RuntimeError(
                f"purgatory {self.name!r} must be used from a running event loop"
                " (from other threads, only notify_threadsafe())"
            )
        self._loop = loop
        self._loop_running = loop.is_running
        # asyncio's is_running() is a Python method reading _thread_id: read it
        # directly in _enter, sparing a Python frame on every call into the purgatory.
        self._stock_loop = getattr(
            type(loop), "is_running", None
        ) is asyncio.BaseEventLoop.is_running and hasattr(loop, "_thread_id")
        self._thread = _thread_ident()
        self._timer = Timer(
            self._clock if self._clock is not None else loop,
            tick=self._tick,
            wheel_size=self._wheel_size,
            max_work_per_pass=self._max_work,
            name=self.name,
            on_failure=self._timer_failed,
        )

    def _check_loop(self) -> None:
        if asyncio._get_running_loop() is not self._loop:
            raise RuntimeError(self._wrong_loop_message())
        self._thread = _thread_ident()  # the loop may now run in another thread

    def _wrong_loop_message(self, *, closed: bool = False) -> str:
        running = asyncio._get_running_loop()
        where = "outside any event loop" if running is None else "from another event loop"
        first = self._loop
        gone = " (now closed)" if first is not None and first.is_closed() else ""
        state = "bound to" if not closed else "closed, and bound to"
        return (
            f"purgatory {self.name!r} is used {where}, but it is {state} the event loop it"
            f" was first used on{gone}. A purgatory belongs to one loop: create it"
            " inside that loop (e.g. in an async main(), or per test with the"
            " `purgatory` fixture of aiopurgatory's pytest plugin), not at module"
            " level. From other threads, use notify_threadsafe()."
        )

    def _shut_down(self, expire_pending: bool, cause: BaseException | None) -> None:
        """Close: finish every pending operation once, release everything.

        A hook that raises KeyboardInterrupt / SystemExit does not stop the rest from
        finishing; the first such exception propagates once everything is released.
        """
        self._closed = True
        if self._notify_handle is not None:
            self._notify_handle.cancel()
            self._notify_handle = None
        self._notified.clear()
        interrupted: BaseException | None = None
        closing = _Closing(self.name, cause)  # one for all: errors are made when read
        # Every pending operation is watched (registration watches before it returns,
        # and a closed purgatory registers nothing), so finishing the watched ones
        # finishes all. Snapshots, not "take the first key again": a dict whose first
        # entries were deleted is walked from its start on every next(iter(...)), which
        # made closing N keys O(N**2) (3 s for 100k keys). Hooks may finish other
        # operations meanwhile: those are skipped as done.
        while self._watchers:
            for watching in list(self._watchers.values()):
                ops = watching.ops() if isinstance(watching, _WatchList) else [watching]
                for op in ops:
                    if not op.done():
                        try:
                            if expire_pending:
                                op._timer_fired()
                            else:
                                op._abandon(closing)
                        except BaseException as exc:  # only KeyboardInterrupt / SystemExit
                            interrupted = interrupted or exc
                    self._unwatch(op)  # a no-op unless it failed to leave: never loop forever
        if self._timer is not None:
            self._timer.close()
        if self._timeouts is not None:  # what waits on the wheel must not hang
            self._timeouts.close()
        if interrupted is not None:
            raise interrupted

    def _timer_failed(self, exc: BaseException) -> None:
        """The timer task ended other than by close: nothing would ever expire again."""
        if self._closed:
            return
        self._shut_down(False, exc)
        if not isinstance(exc, asyncio.CancelledError):
            self._report(exc, f"the timer task of purgatory {self.name!r} failed", None)

    def _report(self, exc: BaseException, message: str, op: DelayedOperation[Any] | None) -> None:
        context: dict[str, Any] = {"message": message, "exception": exc, "purgatory": self}
        if op is not None:
            context["operation"] = op
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_exception_handler(context)

    def _check_some(self, shared: _WatchList, limit: int) -> int:
        """check_and_complete with a limit: look at no more watchers than needed."""
        completed = 0
        # By id, holding each operation tried: an id is unique only while its operation
        # lives, and one that left the key must not lend its id to a newcomer here.
        tried: dict[int, DelayedOperation[Any]] = {}
        # Usually the oldest few complete: copy only those, and the rest if needed.
        batch = shared.ops(2 * limit + 8)
        while batch:
            for op in batch:
                tried[_object_id(op)] = op
                if op._check():
                    completed += 1
                    if completed >= limit:
                        return completed
            batch = [op for op in shared.ops() if _object_id(op) not in tried]
        return completed

    def _watching(self, key: Hashable) -> list[DelayedOperation[Any]]:
        """A snapshot of the operations watching ``key``, oldest first."""
        watching = self._watchers.get(key)
        if watching is None:
            return []
        return watching.ops() if isinstance(watching, _WatchList) else [watching]

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

    # -- wheel-backed timeouts (aiopurgatory.timeouts) ----------------------------------

    def timeout(self, delay: float | None) -> Timeout:
        """``asyncio.timeout(delay)`` on this purgatory's wheel and clock.

        ``async with purgatory.timeout(5):`` cancels the block after 5 seconds and
        raises ``TimeoutError``; None means no deadline. See :class:`Timeout` for the
        semantics (those of ``asyncio.timeout``) and what differs.
        """
        return self._wheel_timeouts().timeout(delay)

    def timeout_at(self, when: float | None) -> Timeout:
        """``asyncio.timeout_at(when)``: ``when`` is a time on this purgatory's clock.

        See :meth:`WheelTimeouts.timeout_at <aiopurgatory.timeouts.WheelTimeouts.timeout_at>`
        for what it raises.
        """
        return self._wheel_timeouts().timeout_at(when)

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> TimerHandle:
        """``loop.call_later`` on the wheel: a :class:`TimerHandle` (``cancel()``).

        O(1) to arm and to cancel. See :meth:`WheelTimeouts.call_later
        <aiopurgatory.timeouts.WheelTimeouts.call_later>` for its arguments and errors.
        """
        return self._wheel_timeouts().call_later(delay, callback, *args)

    async def sleep(self, delay: float, result: T = None) -> T:  # type: ignore[assignment]
        """``asyncio.sleep(delay, result)`` on the wheel.

        See :meth:`WheelTimeouts.sleep <aiopurgatory.timeouts.WheelTimeouts.sleep>` for
        its arguments and errors.
        """
        return await self._wheel_timeouts().sleep(delay, result)

    def _wheel_timeouts(self) -> WheelTimeouts:
        timer = self._enter()
        timeouts = self._timeouts
        if timeouts is None:
            assert self._loop is not None
            timeouts = self._timeouts = WheelTimeouts(timer, self._loop, self.name)
        return timeouts


def _track_links(op: DelayedOperation[Any]) -> None:
    """Let the cyclic GC see ``op``'s entries again: ``op`` is no longer timed."""
    link = op._links
    while link is not None:
        if not _gc_is_tracked(link):
            _gc_track(link)
        link = link.sibling


_OPERATION_REPR: Final = DelayedOperation.__repr__


class _Closing:
    """What the operations pending at a close end with: their ``PurgatoryClosed``,
    each made when first read (``exception()``, ``result()``, ``await``).

    One per close, shared; it holds no operation (the operation holds it, until its
    error is made). The message reads as when it was formatted at close: the
    operation ``pending``, unless its class has a repr of its own, read then.
    """

    __slots__ = ("cause", "name")

    def __init__(self, name: str, cause: BaseException | None) -> None:
        self.name = name
        self.cause = cause

    def __call__(self, op: DelayedOperation[Any]) -> PurgatoryClosed:
        kind = type(op)
        if kind.__repr__ is _OPERATION_REPR:
            described = describe_operation(kind, "pending", op.timeout)
        else:
            described = repr(op)
        error = PurgatoryClosed(f"purgatory {self.name!r} closed before {described} completed")
        error.__cause__ = self.cause
        return error


def _never() -> bool:
    return False


_SMALL_KEYS: Final = 8
"""Key tuples up to this long are checked for duplicates pairwise, without a dict."""


def _unique_keys(keys: Iterable[Hashable]) -> tuple[Hashable, ...]:
    if type(keys) is list:
        # The documented idiom (``[key]``): copied, as the caller may change its list
        # later, and then on the tuple's short paths. Through dict.fromkeys, one key
        # cost 13 % of a whole register-and-finish step.
        keys = tuple(keys)
    if type(keys) is tuple:
        n = len(keys)
        if n == 1:
            # The common case (one key per operation) without building a dict: hashing
            # now still refuses an unhashable key before anything is registered.
            key = keys[0]
            try:
                hash(key)
            except TypeError:
                raise TypeError(f"key {key!r} is not hashable") from None
            return keys
        # A small tuple of distinct keys is kept as it is: a copy would be one more
        # object for the cyclic GC per operation (and a dict built and thrown away).
        if 1 < n <= _SMALL_KEYS and _distinct(keys, n):
            return keys
    if isinstance(keys, str | bytes):
        raise TypeError(f"keys must be a collection of keys, not a single {type(keys).__name__}")
    if iter(keys) is keys:  # an iterator is read once: keep its keys to name a bad one
        keys = tuple(keys)
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


def _distinct(keys: tuple[Hashable, ...], n: int) -> bool:
    """Whether no two of ``keys`` are the same dict key (False too if one is unhashable:
    the caller's general path then raises its error)."""
    try:
        for i in range(1, n):
            key = keys[i]
            h = hash(key)
            for j in range(i):
                other = keys[j]
                if other is key or (hash(other) == h and other == key):
                    return False
        return True  # every key was hashed (keys[0] in the first inner loop)
    except TypeError:
        return False


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
