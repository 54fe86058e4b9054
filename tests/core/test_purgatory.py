"""Purgatory behaviour: registration, checks, notify, purge, limits, close, errors."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from functools import partial
from typing import Any

import pytest

import aiopurgatory as ap
from aiopurgatory.testing import ManualClock

from ..support.helpers import Flag

pytestmark = pytest.mark.anyio


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def test_completes_at_once_without_watching(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(1.0, lambda: True), ["k"])
        assert op.done()  # Kafka's boolean
        assert await op == "done"
        assert (p.num_delayed(), p.watched(), p.stats.timed) == (0, 0, 0)
        assert op.checks == 1


async def test_watch_then_complete_by_key(clock: ManualClock) -> None:
    ready = False
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(1.0, lambda: ready), ["a", "b", "a"])
        assert op.checks == 1  # one check at registration
        assert (p.num_delayed(), p.watched(), p.watchers_of("a")) == (1, 2, 1)
        assert p.check_and_complete("a") == 0
        ready = True
        assert p.check_and_complete("zzz") == 0
        assert p.check_and_complete("b") == 1
        assert await op == "done"
        assert (p.num_delayed(), p.watched(), p.stats.keys, p.stats.timed) == (0, 0, 0, 0)
        assert p.stats.purged == 2


async def test_an_on_complete_that_notifies_another_key(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        second = p.try_complete_else_watch(Flag(1.0, lambda: first.done()), ["b"])

        class Chained(Flag):
            def on_complete(self) -> str:
                assert p.check_and_complete("b") == 1  # re-entrant, synchronous
                return super().on_complete()

        ready = False
        first = p.try_complete_else_watch(Chained(1.0, lambda: ready), ["a"])
        ready = True
        assert p.check_and_complete("a") == 1
        assert second.done()
        assert p.num_delayed() == 0


async def test_a_try_complete_that_checks_its_own_key(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:

        class SelfChecking(Flag):
            def try_complete(self) -> bool:
                if self.checks == 1:  # the first check after registration
                    assert p.check_and_complete("k") == 0  # no re-entry, deferred
                return super().try_complete()

        ready = False
        op = p.try_complete_else_watch(SelfChecking(1.0, lambda: ready), ["k"])
        assert op.checks == 1
        assert p.check_and_complete("k") == 0
        assert op.checks == 3  # the deferred check ran right after
        ready = True
        assert p.check_and_complete("k") == 1


async def test_completions_may_add_watchers_to_the_key_being_checked(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        added: list[Flag] = []

        class Spawning(Flag):
            def on_complete(self) -> str:
                added.append(p.try_complete_else_watch(Flag(1.0), ["k"]))
                return super().on_complete()

        ready = False
        for _ in range(3):
            p.try_complete_else_watch(Spawning(1.0, lambda: ready), ["k"])
        ready = True
        assert p.check_and_complete("k") == 3
        assert p.watchers_of("k") == 3
        assert all(not op.done() for op in added)


async def test_finished_operations_are_not_kept_alive(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock, purge_interval=10) as p:
        refs = []
        for i in range(1000):
            op = p.try_complete_else_watch(Flag(5.0), ["shared", i])
            refs.append(weakref.ref(op))
            if i % 3 == 0:
                op.force_complete()
            elif i % 3 == 1:
                op.cancel()
        del op
        gc.collect()
        alive = sum(1 for ref in refs if ref() is not None)
        assert alive == p.num_delayed() == 333  # 0 finished ones referenced
        assert p.watched() == 2 * 333
        await clock.advance(5)
        gc.collect()
        assert all(ref() is None for ref in refs)


async def test_max_pending_refuses_before_touching_the_operation(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock, max_pending=2) as p:
        a = p.try_complete_else_watch(Flag(1.0), ["k"])
        p.try_complete_else_watch(Flag(1.0), ["k"])
        extra = Flag(1.0, lambda: True)
        with pytest.raises(ap.PurgatoryFull, match="max_pending=2"):
            p.try_complete_else_watch(extra, ["k"])
        assert extra.checks == 0
        assert not extra.done()
        assert p.num_delayed() == 2
        a.force_complete()
        assert p.try_complete_else_watch(extra, ["k"]).done()


async def test_notify_coalesces_checks_within_a_loop_pass(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(1.0), ["k"])
        before = op.checks
        for _ in range(100):
            p.notify("k")
        p.notify("other")
        await asyncio.sleep(0)
        assert op.checks == before + 1


async def test_notify_threadsafe_from_several_threads() -> None:
    async with ap.Purgatory("p") as p:
        flags = {f"key{i}": False for i in range(8)}
        ops = [
            p.try_complete_else_watch(Flag(30.0, partial(flags.__getitem__, key)), [key])
            for key in flags
        ]

        def worker(key: str) -> None:
            flags[key] = True
            for _ in range(50):
                p.notify_threadsafe(key)

        threads = [threading.Thread(target=worker, args=(key,)) for key in flags]
        for thread in threads:
            thread.start()
        results = await asyncio.wait_for(asyncio.gather(*ops), timeout=10)
        for thread in threads:
            thread.join()
        assert results == ["done"] * 8
        assert p.stats.completed == 8


async def test_use_from_another_thread_is_refused(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        errors: list[BaseException] = []

        def other_thread() -> None:
            try:
                p.try_complete_else_watch(Flag(1.0), ["k"])
            except RuntimeError as exc:
                errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert len(errors) == 1
        assert "notify_threadsafe" in str(errors[0])
        assert p.num_delayed() == 0


async def test_awaiting_from_another_loop_is_refused(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Flag(1.0), ["k"])
        errors: list[BaseException] = []

        async def wait() -> None:
            await op

        def other_thread() -> None:
            try:
                asyncio.run(asyncio.wait_for(wait(), 1.0))
            except BaseException as exc:  # what it raised is what is tested
                errors.append(exc)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        # Refused at once, not a wait on a future the purgatory's loop would complete
        # from the wrong thread.
        assert [type(exc) for exc in errors] == [RuntimeError]
        assert "from another event loop" in str(errors[0])
        assert not op.done()
        assert p.try_complete_else_watch(Flag(0.0), ["k"]).done()  # still usable here
        op.cancel()


def test_use_outside_a_running_loop_is_refused() -> None:
    p = ap.Purgatory("p")
    with pytest.raises(RuntimeError, match="running event loop"):
        p.check_and_complete("k")
    with pytest.raises(RuntimeError, match="not started"):
        p.notify_threadsafe("k")


async def test_bad_keys(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        op = Flag(1.0)
        with pytest.raises(ValueError, match="empty"):
            p.try_complete_else_watch(op, [])
        with pytest.raises(TypeError, match=r"\[1\] is not hashable"):
            p.try_complete_else_watch(op, ["ok", [1]])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="not a single str"):
            p.try_complete_else_watch(op, "topic")
        assert op.checks == 0
        assert p.num_delayed() == 0
        with pytest.raises(TypeError):
            p.notify([1])  # type: ignore[arg-type]


async def test_registering_twice_or_after_completion_raises_and_changes_nothing(
    clock: ManualClock,
) -> None:
    async with ap.Purgatory("p", clock=clock) as p, ap.Purgatory("q", clock=clock) as q:
        op = p.try_complete_else_watch(Flag(1.0), ["k"])
        with pytest.raises(RuntimeError, match="already registered"):
            p.try_complete_else_watch(op, ["j"])
        with pytest.raises(RuntimeError, match="already registered"):
            q.try_complete_else_watch(op, ["k"])
        assert (p.num_delayed(), p.watched(), q.num_delayed()) == (1, 1, 0)
        op.force_complete()
        with pytest.raises(RuntimeError, match="already completed"):
            p.try_complete_else_watch(op, ["k"])


async def test_bad_purgatory_settings_are_named() -> None:
    with pytest.raises(TypeError, match="name"):
        ap.Purgatory(1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tick"):
        ap.Purgatory("p", tick=-1)
    with pytest.raises(ValueError, match="wheel_size"):
        ap.Purgatory("p", wheel_size=0)
    with pytest.raises(ValueError, match="max_pending"):
        ap.Purgatory("p", max_pending=0)
    with pytest.raises(TypeError, match="purge_interval"):
        ap.Purgatory("p", purge_interval=1.5)  # type: ignore[arg-type]


async def test_close_finishes_every_pending_operation_once(clock: ManualClock) -> None:
    p = ap.Purgatory("p", clock=clock)
    async with p:
        timed = p.try_complete_else_watch(Flag(1.0), ["a", "b"])
        untimed = p.try_complete_else_watch(Flag(None), ["b"])
        waiter = asyncio.ensure_future(_await(timed))
        await asyncio.sleep(0)
    assert p.closed
    for op in (timed, untimed):
        assert op.outcome is ap.Outcome.CLOSED
        assert op.completions == 0
        with pytest.raises(ap.PurgatoryClosed):
            op.result()
    with pytest.raises(ap.PurgatoryClosed):
        await waiter
    assert p.stats.closed == 2
    assert (p.num_delayed(), p.watched(), p.stats.timed) == (0, 0, 0)
    assert clock.pending_wakeups() == 0, "a closed purgatory leaves no wake-up behind"
    p.close()  # idempotent
    with pytest.raises(ap.PurgatoryClosed, match="closed"):
        p.try_complete_else_watch(Flag(1.0), ["a"])
    with pytest.raises(ap.PurgatoryClosed):
        p.notify("a")


async def _await(op: ap.DelayedOperation[Any]) -> Any:
    return await op


async def test_close_can_expire_pending_operations(clock: ManualClock) -> None:
    p = ap.Purgatory("p", clock=clock)
    async with p:
        op = p.try_complete_else_watch(Flag(10.0), ["a"])
        p.close(expire_pending=True)
    assert op.expired
    assert (op.completions, op.expirations) == (1, 1)
    assert await op == "expired"
    assert p.stats.expired == 1


async def test_close_leaves_no_task_behind() -> None:
    before = asyncio.all_tasks()
    async with ap.Purgatory("p") as p:
        for i in range(100):
            p.try_complete_else_watch(Flag(0.5 + i / 100), [i % 7])
        p.notify(3)
    assert asyncio.all_tasks() == before


async def test_wait_for_predicate(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        messages: list[str] = []
        polling = asyncio.ensure_future(p.wait_for(["topic"], lambda: messages, timeout=30.0))
        await asyncio.sleep(0)
        messages.append("hello")
        p.notify("topic")
        assert await polling is True
        timing_out = asyncio.ensure_future(p.wait_for(["quiet"], lambda: False, timeout=1.0))
        await asyncio.sleep(0)
        await clock.advance(1.0)
        assert await timing_out is False
        with pytest.raises(TypeError, match="callable"):
            await p.wait_for(["x"], 3, timeout=1.0)  # type: ignore[arg-type]


async def test_watch_futures(clock: ManualClock) -> None:
    loop = asyncio.get_running_loop()
    async with ap.Purgatory("p", clock=clock) as p:
        futures: list[asyncio.Future[int]] = [loop.create_future() for _ in range(3)]
        op = p.watch_futures(futures, timeout=5.0)
        for i, future in enumerate(futures):
            assert not op.done()
            future.set_result(i)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        assert await op == [0, 1, 2]
        slow: list[asyncio.Future[int]] = [loop.create_future(), loop.create_future()]
        slow[0].set_result(7)
        late = p.watch_futures(slow, timeout=1.0)
        await clock.advance(1.0)
        with pytest.raises(TimeoutError, match="1 of 2"):
            await late
        assert slow[1].cancelled()
        assert p.num_delayed() == 0


async def test_cancel_for_key(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        a = p.try_complete_else_watch(Flag(1.0), ["x", "y"])
        b = p.try_complete_else_watch(Flag(None), ["x"])
        c = p.try_complete_else_watch(Flag(1.0), ["y"])
        assert set(p.cancel_for_key("x")) == {a, b}
        assert a.cancelled()
        assert b.cancelled()
        assert not c.done()
        assert p.cancel_for_key("nothing") == []
        assert (p.num_delayed(), p.watched(), p.stats.cancelled) == (1, 1, 2)


async def test_one_watcher_leaving_a_key_leaves_the_others_watching(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        ready = {"a": False, "b": False, "c": False}
        a, b, c = (
            p.try_complete_else_watch(Flag(1.0, lambda n=n: ready[n]), keys)  # type: ignore[misc]
            for n, keys in (("a", ["k", "a"]), ("b", ["k"]), ("c", ["k"]))
        )
        assert b.cancel()  # from the middle of the key's watchers
        assert (p.watchers_of("k"), p.watched(), p.stats.keys) == (2, 3, 2)
        assert a.cancel()  # the oldest
        assert (p.watchers_of("k"), p.watchers_of("a"), p.watched()) == (1, 0, 1)
        ready["c"] = True
        assert p.check_and_complete("k") == 1  # the last one is still found by its key
        assert await c == "done"
        assert (p.watchers_of("k"), p.watched(), p.stats.keys) == (0, 0, 0)
        again = p.try_complete_else_watch(Flag(1.0), ["k"])
        assert (p.watchers_of("k"), p.watched(), p.stats.keys) == (1, 1, 1)
        again.cancel()


async def test_completing_at_registration_leaves_the_keys_watchers_alone(
    clock: ManualClock,
) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        waiting = p.try_complete_else_watch(Flag(1.0), ["k"])
        shared = [p.try_complete_else_watch(Flag(1.0), ["s"]) for _ in range(2)]
        # Finishes inside its registration check, before watching "k" or "s".
        at_once = p.try_complete_else_watch(Flag(1.0, lambda: True), ["k", "s"])
        assert at_once.done()
        assert (p.watchers_of("k"), p.watchers_of("s"), p.watched()) == (1, 2, 3)
        assert p.cancel_for_key("k") == [waiting]
        assert p.cancel_for_key("s") == shared


async def test_watchers_are_checked_oldest_first(clock: ManualClock) -> None:
    async with ap.Purgatory("p", clock=clock) as p:
        served: list[tuple[int, int]] = []  # (which waiter, which value)
        queue: list[int] = []

        class Pop(Flag):
            def __init__(self, n: int) -> None:
                super().__init__(5.0)
                self.n = n

            def try_complete(self) -> bool:
                if queue and self.force_complete():
                    served.append((self.n, queue.pop(0)))
                    return True
                return False

        ops = [p.try_complete_else_watch(Pop(n), ["q"]) for n in range(3)]
        queue.extend([10, 20])
        assert p.check_and_complete("q") == 2
        # The two oldest waiters got the values, in arrival order; the newest waits.
        assert served == [(0, 10), (1, 20)]
        assert [op.done() for op in ops] == [True, True, False]


async def test_stats(clock: ManualClock) -> None:
    async with ap.Purgatory("produce", clock=clock) as p:
        p.try_complete_else_watch(Flag(0.2), ["a"])
        p.try_complete_else_watch(Flag(None), ["a", "b"])
        await clock.advance(0.2)
        stats = p.stats
        assert (stats.pending, stats.watched, stats.keys, stats.expired) == (1, 2, 2, 1)
        assert stats.timer_wakeups >= 1
