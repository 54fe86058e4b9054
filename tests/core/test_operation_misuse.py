"""Hardening, round two (issue 25, items 1-6): operations tracked by identity, outside
cancellation through asyncio's future helpers, watch_futures releasing its futures,
cross-thread calls refused, async predicates refused.

Every test here failed (or would hang, stopped by a timeout) on the code before the
change.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import gc
import inspect
import threading
import warnings
import weakref
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
import uvloop

import aiopurgatory as ap
from aiopurgatory.testing import ManualClock

from ..support.helpers import Flag

pytestmark = pytest.mark.anyio

HANG = 5.0
"""Seconds after which an await that should have finished counts as hung."""


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


class Equal(Flag):
    """A value object: every instance equals every other, with one hash."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Equal)

    def __hash__(self) -> int:
        return 42


@dataclass(eq=True)
class Unhashable(ap.DelayedOperation[str]):
    """A dataclass operation: ``eq=True`` makes it unhashable (``__hash__ = None``)."""

    name: str
    limit: float | None = None
    ready: bool = False
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.limit)

    def try_complete(self) -> bool:
        self.calls.append("try_complete")
        return self.ready and self.force_complete()

    def on_complete(self) -> str:
        return self.name


async def within(awaitable: Any, seconds: float = HANG) -> Any:
    """Await ``awaitable`` (a task), failing instead of hanging. Not asyncio.wait_for:
    that now cancels an operation it times out, which is what some tests look at."""
    async with asyncio.timeout(seconds):
        return await awaitable


async def _await(op: ap.DelayedOperation[Any]) -> Any:
    return await op


# -- 1. operations that compare equal are two operations -------------------------------


async def test_equal_operations_are_each_watched_and_checked(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        ops = [p.try_complete_else_watch(Equal(None), ["k", f"own-{i}"]) for i in range(3)]
        assert ops[0] == ops[1]  # the user's equality holds; the purgatory ignores it
        assert (p.num_delayed(), p.watched(), p.watchers_of("k")) == (3, 6, 3)
        for op in ops:
            op.ready = lambda: True
        assert p.check_and_complete("k") == 3  # no lost wake-up
        assert all(op.result() == "done" for op in ops)
        assert (p.num_delayed(), p.watched(), p.stats.keys) == (0, 0, 0)


async def test_equal_operations_with_a_limit_and_one_leaving(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        ops = [p.try_complete_else_watch(Equal(1.0), ["k"]) for _ in range(4)]
        assert ops[1].cancel()  # the one that leaves is this one, not an equal one
        assert [op.cancelled() for op in ops] == [False, True, False, False]
        assert (p.num_delayed(), p.watched(), p.watchers_of("k")) == (3, 3, 3)
        for op in ops:
            op.ready = lambda: True
        assert p.check_and_complete("k", limit=2) == 2
        assert [op.done() for op in ops] == [True, True, True, False]
        assert p.cancel_for_key("k") == [ops[3]]
        assert (p.num_delayed(), p.watched(), p.stats.keys) == (0, 0, 0)


async def test_close_finishes_every_equal_operation(clock: ManualClock) -> None:
    p = ap.Purgatory("p", clock=clock)
    ops = [p.try_complete_else_watch(Equal(None), ["k"]) for _ in range(3)]
    waiters = [asyncio.ensure_future(_await(op)) for op in ops]
    await asyncio.sleep(0)
    await p.aclose()
    for waiter in waiters:
        with pytest.raises(ap.PurgatoryClosed):
            await within(waiter)  # the second and third hung for ever
    assert p.stats.closed == 3
    assert p.num_delayed() == 0


# -- 2. an unhashable operation is watched correctly -----------------------------------


async def test_unhashable_operations_share_a_key(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        a = p.try_complete_else_watch(Unhashable("a", 1.0), ["k"])
        b = p.try_complete_else_watch(Unhashable("b", 1.0), ["k", "other"])
        c = p.try_complete_else_watch(Unhashable("c", None), ["k"])
        with pytest.raises(TypeError):
            hash(a)
        assert (p.num_delayed(), p.watched(), p.stats.timed) == (3, 4, 2)
        b.ready = True
        assert p.check_and_complete("k", limit=1) == 1
        assert b.result() == "b"
        assert (p.num_delayed(), p.watched(), p.stats.timed) == (2, 2, 1)
        await clock.advance(1.0)
        assert a.outcome is ap.Outcome.EXPIRED
        assert a.calls == ["try_complete", "try_complete"]  # registration, the check
        assert (p.num_delayed(), p.watched(), p.stats.timed) == (1, 1, 0)
        assert p.cancel_for_key("k") == [c]
        assert (p.num_delayed(), p.watched(), p.stats.keys) == (0, 0, 0)


async def test_an_unhashable_operation_expires_only_when_due(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        first = p.try_complete_else_watch(Unhashable("first", None), ["k"])
        late = p.try_complete_else_watch(Unhashable("late", 2.0), ["k"])
        await clock.advance(1.0)
        assert not late.done()
        assert p.stats.expired == 0
        await clock.advance(1.0)
        assert late.outcome is ap.Outcome.EXPIRED
        assert await late == "late"
        first.ready = True
        assert p.check_and_complete("k") == 1
        assert (p.num_delayed(), p.watched(), p.stats.expired) == (0, 0, 1)


# -- 3. cancellation from the outside, through asyncio's helpers -----------------------


async def test_wait_for_zero_cancels_the_operation(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(None), ["k"])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(op, 0)
        assert op.cancelled()
        assert (p.num_delayed(), p.watched(), p.stats.cancelled) == (0, 0, 1)
        done = p.try_complete_else_watch(Flag(None, lambda: True), ["k"])
        assert await asyncio.wait_for(done, 0) == "done"


async def test_wait_for_with_a_timeout_cancels_the_operation(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(None), ["k"])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(op, 0.01)
        assert op.cancelled()
        assert p.num_delayed() == 0


async def test_cancelling_a_gather_before_it_starts_cancels_the_operation(
    clock: ManualClock,
) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        ops = [p.try_complete_else_watch(Flag(None), ["k"]) for _ in range(2)]
        gathered = asyncio.gather(*ops)
        gathered.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(gathered)
        assert all(op.cancelled() for op in ops)
        assert (p.num_delayed(), p.watched()) == (0, 0)


async def test_gather_collects_operations_like_futures(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        done = p.try_complete_else_watch(Flag(None), ["k"])
        cancelled = p.try_complete_else_watch(Flag(None), ["k"])
        failed = p.try_complete_else_watch(Flag(None), ["k"])
        gathered = asyncio.gather(done, cancelled, failed, return_exceptions=True)
        await asyncio.sleep(0)
        cancelled.cancel("bye")
        failed.ready = lambda: 1 / 0  # type: ignore[assignment,return-value]
        done.ready = lambda: True
        p.check_and_complete("k")
        results = await within(gathered)
        assert results[0] == "done"
        assert isinstance(results[1], asyncio.CancelledError)
        assert results[1].args == ("bye",)
        assert isinstance(results[2], ZeroDivisionError)
        assert p.num_delayed() == 0


async def test_gather_raises_the_cancellation_of_an_operation(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(None), ["k"])
        gathered = asyncio.gather(op)
        op.cancel("gone")
        with pytest.raises(asyncio.CancelledError, match="gone"):
            await within(gathered)


async def test_an_operation_is_a_future_to_asyncio(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(None), ["k"])
        looks_like_a_future = asyncio.isfuture(op)  # (not an assert: mypy would narrow op)
        assert looks_like_a_future
        assert asyncio.ensure_future(op) is cast(object, op)  # not a task awaiting it
        assert op.get_loop() is asyncio.get_running_loop()
        finished, pending = await asyncio.wait([cast(Any, op)], timeout=0.01)
        assert (finished, pending) == (set(), {op})
        assert not op.done()  # asyncio.wait does not cancel
        shielded = asyncio.shield(op)
        shielded.cancel()
        await asyncio.sleep(0)
        assert not op.done()  # shield still opts out
        op.ready = lambda: True
        p.check_and_complete("k")
        assert await asyncio.wait_for(op, 1) == "done"


@pytest.mark.parametrize("path", ["complete", "expire", "cancel", "close", "registration"])
async def test_done_callbacks_run_once_on_every_path(clock: ManualClock, path: str) -> None:
    p = ap.Purgatory("p", clock=clock)
    await p.__aenter__()
    seen: list[tuple[Any, bool, str]] = []
    variable: contextvars.ContextVar[str] = contextvars.ContextVar("variable", default="")

    def record(op: ap.DelayedOperation[Any]) -> None:
        seen.append((op, op.done(), variable.get()))

    def removed(op: ap.DelayedOperation[Any]) -> None:
        raise AssertionError("a removed callback ran")

    op = Flag(1.0, lambda: path == "registration")
    op.add_done_callback(record)  # before registration, too
    p.try_complete_else_watch(op, ["k"])
    context = contextvars.copy_context()
    context.run(variable.set, "mine")
    if not op.done():
        op.add_done_callback(record, context=context)
        op.add_done_callback(removed)
        op.add_done_callback(removed)
        assert op.remove_done_callback(removed) == 2
        assert not seen  # not before it finishes
    if path == "complete":
        op.ready = lambda: True
        p.check_and_complete("k")
    elif path == "expire":
        await clock.advance(1.0)
    elif path == "cancel":
        op.cancel()
    await p.aclose()
    await asyncio.sleep(0)
    assert op.done()
    expected = [(op, True, "")] if path == "registration" else [(op, True, ""), (op, True, "mine")]
    assert seen == expected
    op.add_done_callback(record)  # once done: called soon, as by a future
    assert len(seen) == len(expected)
    await asyncio.sleep(0)
    assert len(seen) == len(expected) + 1
    assert op.remove_done_callback(record) == 0


# -- 4. watch_futures releases what it watched -----------------------------------------


def _live_delayed_futures() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is ap.DelayedFuture)


async def test_watch_futures_releases_cancelled_and_closed_operations(
    clock: ManualClock,
) -> None:
    # The two paths that finish one while its futures stay pending: a timeout cancels
    # the futures it waited for, which drops their callbacks anyway.
    loop = asyncio.get_running_loop()
    long_lived: asyncio.Future[int] = loop.create_future()
    before = _live_delayed_futures()
    async with ap.Purgatory("p", clock=clock) as p:
        for i in range(40):
            # No timeout: a timed operation is hidden from gc.get_objects() while it
            # waits in the wheel (compiled build), and this counts them.
            op = p.watch_futures([long_lived], timeout=None)
            if i % 2:
                op.cancel()
        del op
        assert p.num_delayed() == 20
        await asyncio.sleep(0)
        assert _live_delayed_futures() - before == 20  # the cancelled ones are gone
    # the other half finished by close
    await asyncio.sleep(0)
    assert _live_delayed_futures() == before
    assert not long_lived._callbacks
    long_lived.cancel()


async def test_a_watch_futures_operation_is_collected_once_finished(
    clock: ManualClock,
) -> None:
    loop = asyncio.get_running_loop()
    long_lived: asyncio.Future[int] = loop.create_future()
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.watch_futures([long_lived], timeout=None)
        ref = weakref.ref(op)
        op.cancel()
        del op
        await asyncio.sleep(0)
        gc.collect()
        assert ref() is None
    long_lived.cancel()


async def test_watch_futures_completes_through_a_key_of_its_own(
    clock: ManualClock,
) -> None:
    loop = asyncio.get_running_loop()
    shared: asyncio.Future[int] = loop.create_future()
    async with ap.Purgatory("p", clock=clock) as p:
        first = loop.create_future()
        op = p.watch_futures([first, shared], timeout=None)
        other = p.watch_futures([shared], timeout=None)
        first.set_result(1)
        shared.set_result(2)
        assert await within(op) == [1, 2]
        assert await within(other) == [2]
        assert p.num_delayed() == 0


async def test_watch_futures_does_not_use_the_operation_as_its_key(
    clock: ManualClock,
) -> None:
    loop = asyncio.get_running_loop()
    async with ap.Purgatory("p", clock=clock) as p:
        future: asyncio.Future[int] = loop.create_future()
        op = p.watch_futures([future], timeout=None)
        assert p.watchers_of(op) == 0  # its key is its own, not the operation itself
        future.set_result(3)
        assert await within(op) == [3]


# -- 5. operations are touched from one thread -----------------------------------------


async def test_cancel_from_another_thread_is_refused(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(5.0), ["k"])
        with pytest.raises(RuntimeError, match=r"call_soon_threadsafe\(op\.cancel\)"):
            await asyncio.to_thread(op.cancel)
        assert not op.done()
        assert (p.num_delayed(), p.watched(), p.stats.timed) == (1, 1, 1)
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(lambda: loop.call_soon_threadsafe(op.cancel))  # as offered
        with pytest.raises(asyncio.CancelledError):
            await within(_await(op))
        assert (p.num_delayed(), p.watched(), p.stats.timed) == (0, 0, 0)


async def test_reset_timeout_from_another_thread_changes_nothing(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(5.0), ["k"])
        deadline = op.deadline
        with pytest.raises(RuntimeError, match=r"call_soon_threadsafe\(op\.reset_timeout"):
            await asyncio.to_thread(op.reset_timeout, 60.0)
        assert (op.timeout, op.deadline) == (5.0, deadline)
        await clock.advance(5.0)
        assert op.outcome is ap.Outcome.EXPIRED


async def test_force_complete_from_another_thread_is_refused(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(None), ["k"])
        with pytest.raises(RuntimeError, match="another thread"):
            await asyncio.to_thread(op.force_complete)
        assert not op.done()
        assert op.force_complete()
        assert await op == "done"


@pytest.fixture(params=[asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def idle_loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    """A new loop (asyncio's, then uvloop's) that no thread runs yet; closed after."""
    loop: asyncio.AbstractEventLoop = request.param()
    try:
        yield loop
    finally:
        loop.close()


async def watch_flag(p: ap.Purgatory) -> Flag:
    """A Flag watched on "k", registered from the loop that runs this."""
    return p.try_complete_else_watch(Flag(None), ["k"])


def test_a_loop_that_moved_to_another_thread_may_still_cancel(
    idle_loop: asyncio.AbstractEventLoop,
) -> None:
    p = ap.Purgatory("p")
    box: list[Flag] = []
    thread = threading.Thread(
        target=lambda: box.append(idle_loop.run_until_complete(watch_flag(p)))
    )
    thread.start()
    thread.join()
    (op,) = box

    async def cancel() -> bool:
        return op.cancel()

    assert idle_loop.run_until_complete(cancel())  # this thread now runs the loop
    assert p.num_delayed() == 0
    assert op.cancel() is False  # done: nothing to refuse
    other = idle_loop.run_until_complete(watch_flag(p))
    with pytest.raises(RuntimeError, match="outside any event loop"):
        other.reset_timeout(60.0)  # the loop does not run: refused, and unchanged
    assert other.timeout is None
    p.close()


# -- 6. async predicates are refused ---------------------------------------------------


async def _never_ready() -> bool:
    return False


async def _async_gen() -> Any:
    yield True


class _AsyncCallable:
    async def __call__(self) -> bool:
        return True


@pytest.mark.parametrize(
    "predicate",
    [_never_ready, functools.partial(_never_ready), _async_gen],
    ids=["async-def", "partial", "async-generator"],
)
async def test_an_async_predicate_is_refused_before_registering(
    clock: ManualClock, predicate: Callable[[], object]
) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        with pytest.raises(TypeError, match="async"):
            await p.wait_for(["k"], predicate, timeout=1.0)
        with pytest.raises(TypeError, match="async"):
            ap.PredicateOperation(predicate, None)
        assert (p.num_delayed(), p.watched(), p.stats.completed) == (0, 0, 0)


async def test_a_predicate_returning_an_awaitable_fails_clearly(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(TypeError, match="not a truth value"):
                await within(p.wait_for(["k"], _AsyncCallable(), timeout=None))
            gc.collect()
        assert not [w for w in caught if "never awaited" in str(w.message)]
        assert (p.num_delayed(), p.watched()) == (0, 0)

        calls: list[Coroutine[Any, Any, bool]] = []

        def later() -> object:
            if p.watched() == 0:
                return False  # at registration
            calls.append(_never_ready())
            return calls[-1]

        waiting = asyncio.ensure_future(p.wait_for(["k"], later, timeout=None))
        await asyncio.sleep(0)
        p.check_and_complete("k")
        with pytest.raises(TypeError, match="not a truth value"):
            await within(waiting)
        # Closed, so never "never awaited".
        assert inspect.getcoroutinestate(calls[0]) == inspect.CORO_CLOSED
        assert (p.num_delayed(), p.watched()) == (0, 0)


async def test_truthy_predicate_values_still_complete(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        messages: list[str] = []
        polling = asyncio.ensure_future(p.wait_for(["t"], lambda: messages, timeout=None))
        await asyncio.sleep(0)
        messages.append("m")
        p.check_and_complete("t")
        assert await within(polling) is True


def test_run_until_complete_takes_an_operation(idle_loop: asyncio.AbstractEventLoop) -> None:
    p = ap.Purgatory("p")
    op = idle_loop.run_until_complete(watch_flag(p))

    def complete() -> None:
        op.ready = lambda: True
        p.check_and_complete("k")

    idle_loop.call_soon(complete)
    assert idle_loop.run_until_complete(op) == "done"  # a future to it, added to before it runs
    p.close()


async def test_keys_is_a_snapshot_of_the_watched_keys_each_once() -> None:
    async with ap.Purgatory("keys") as p:
        assert p.keys() == []
        a = p.try_complete_else_watch(ap.PredicateOperation(lambda: False, None), ["x", "y"])
        b = p.try_complete_else_watch(ap.PredicateOperation(lambda: False, None), ["y"])
        snapshot = p.keys()
        assert set(snapshot) == {"x", "y"}
        a.cancel()
        assert p.keys() == ["y"]
        assert set(snapshot) == {"x", "y"}  # a copy, not a view
        b.cancel()
        assert p.keys() == []
