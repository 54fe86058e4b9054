"""Hostile input for the core: huge timeouts, raising hooks, re-entrant calls, shutdown.

Every test here failed (or hung) on the code before the hardening change.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop

import aiopurgatory as ap
from aiopurgatory.testing import ManualClock
from aiopurgatory.timer import MAX_TICK, Timer, TimerTask, clock_tick, deadline_tick

from ..support.helpers import Flag, watchdog

pytestmark = pytest.mark.anyio

HUGE = [1e30, 1.8e305, 1.7976931348623157e308]


@contextlib.contextmanager
def loop_errors() -> Iterator[list[dict[str, Any]]]:
    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        yield seen
    finally:
        loop.set_exception_handler(None)


class Hook(Flag):
    """A Flag whose hooks run ``actions[name]()`` first (to raise, or to re-enter)."""

    def __init__(
        self,
        timeout: float | None,
        ready: Callable[[], bool] = lambda: False,
        **actions: Callable[[], object],
    ) -> None:
        super().__init__(timeout, ready)
        self.actions = actions

    def try_complete(self) -> bool:
        if (action := self.actions.get("try_complete")) is not None:
            action()
        return super().try_complete()

    def on_complete(self) -> str:
        result = super().on_complete()
        if (action := self.actions.get("on_complete")) is not None:
            action()
        return result

    def on_expiration(self) -> None:
        super().on_expiration()
        if (action := self.actions.get("on_expiration")) is not None:
            action()


def raiser(exc: BaseException) -> Callable[[], None]:
    def run() -> None:
        raise exc

    return run


class Log:
    def __init__(self, fail: BaseException | None = None) -> None:
        self.finished: list[tuple[ap.DelayedOperation[Any], ap.Outcome]] = []
        self.fail = fail

    def operation_finished(
        self, purgatory: str, op: ap.DelayedOperation[Any], outcome: ap.Outcome, finished: float
    ) -> None:
        self.finished.append((op, outcome))
        if self.fail is not None:
            raise self.fail


# -- timeouts no clock can reach --------------------------------------------------------


def test_tick_conversions_are_bounded_and_never_early() -> None:
    for value in [*HUGE, float("inf"), float("nan")]:
        with watchdog(2.0):
            assert deadline_tick(value, 0.001) == MAX_TICK
            assert clock_tick(value, 0.001) <= MAX_TICK - 1
    assert clock_tick(-5.0, 0.001) == 0
    assert deadline_tick(-5.0, 0.001) == 0
    for deadline in [0.6, 0.3, 1e-9, 123.456, 2.0**40 * 0.001]:
        k = deadline_tick(deadline, 0.001)
        assert k * 0.001 >= deadline
        assert (k - 1) * 0.001 < deadline
        assert clock_tick(k * 0.001, 0.001) >= k  # reaching the tick's time reaches it


@pytest.mark.parametrize("timeout", HUGE)
async def test_a_huge_timeout_waits_and_stays_cancellable_resettable_completable(
    timeout: float,
) -> None:
    with watchdog():
        ready = False
        async with ap.Purgatory("huge") as p:
            waits = p.try_complete_else_watch(ap.PredicateOperation(lambda: ready, timeout), ["k"])
            cancelled = p.try_complete_else_watch(Flag(timeout), ["k"])
            reset = p.try_complete_else_watch(Flag(timeout), ["r"])
            assert (p.num_delayed(), p.watched(), p.stats.timed) == (3, 3, 3)
            await asyncio.sleep(0.005)
            assert not waits.done()
            assert cancelled.cancel()
            reset.reset_timeout(0.002)
            assert await reset == "expired"
            ready = True
            assert p.check_and_complete("k") == 1
            assert await waits is True
            assert (p.num_delayed(), p.watched(), p.stats.timed) == (0, 0, 0)


@pytest.mark.parametrize("timeout", HUGE)
async def test_reset_timeout_to_a_huge_value_and_back(timeout: float) -> None:
    clock = ManualClock()
    with watchdog():
        async with ap.Purgatory("huge", clock=clock) as p:
            op = p.try_complete_else_watch(Flag(1.0), ["k"])
            op.reset_timeout(timeout)
            await clock.advance(10_000.0)
            assert not op.done()
            assert p.stats.timed == 1
            op.reset_timeout(0.5)
            await clock.advance(0.5)
            assert await op == "expired"
            assert p.stats.timed == 0


async def test_far_future_deadlines_never_fire_even_when_the_clock_jumps() -> None:
    clock = ManualClock()
    with watchdog():
        async with ap.Purgatory("huge", clock=clock) as p:
            ops = [p.try_complete_else_watch(Flag(t), ["k"]) for t in HUGE]
            await clock.advance(1e15)
            clock.jump(1e300)
            await clock.advance(1.0)
            assert not any(op.done() for op in ops)
            assert p.cancel_for_key("k") == ops


def test_a_timer_refuses_nothing_finite() -> None:
    async def main() -> None:
        clock = ManualClock()
        timer = Timer(clock)
        tasks = [TimerTask() for _ in HUGE]
        for task, timeout in zip(tasks, HUGE, strict=True):
            timer.add(task, timeout)
        assert len(timer) == len(HUGE)
        assert all(timer.cancel(task) for task in tasks)
        assert clock.pending_wakeups() == 0
        timer.close()

    with watchdog():
        asyncio.run(main())


# -- hook code that raises --------------------------------------------------------------


async def test_on_complete_raising_cancelled_error_finishes_it_and_the_batch_goes_on() -> None:
    clock = ManualClock()
    async with ap.Purgatory("p", clock=clock) as p:
        ops = [p.try_complete_else_watch(Flag(1.0), ["k"]) for _ in range(3)]
        rude = p.try_complete_else_watch(
            Hook(1.0, on_complete=raiser(asyncio.CancelledError())), ["k"]
        )
        ops += [p.try_complete_else_watch(Flag(1.0), ["k"]) for _ in range(3)]
        later = p.try_complete_else_watch(Flag(2.0), ["k"])  # the driver must be re-armed
        await clock.advance(1.0)
        assert rude.done()
        assert rude.cancelled()
        with pytest.raises(asyncio.CancelledError):
            rude.result()
        awaited = asyncio.ensure_future(asyncio.shield(rude))  # an awaiter is not left hanging
        with pytest.raises(asyncio.CancelledError):
            await awaited
        assert [op.outcome for op in ops] == [ap.Outcome.EXPIRED] * 6
        await clock.advance(1.0)
        assert later.outcome is ap.Outcome.EXPIRED
        assert (p.stats.expired, p.stats.cancelled, p.num_delayed()) == (7, 1, 0)


@pytest.mark.parametrize("exc_type", [RuntimeError, asyncio.CancelledError])
async def test_on_expiration_raising_finishes_it_with_that_exception(
    exc_type: type[BaseException],
) -> None:
    clock = ManualClock()
    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Hook(0.5, on_expiration=raiser(exc_type("x"))), ["k"])
        other = p.try_complete_else_watch(Flag(0.5), ["k"])
        await clock.advance(0.5)
        with pytest.raises(exc_type):
            op.result()
        assert op.cancelled() is (exc_type is asyncio.CancelledError)
        assert await other == "expired"


async def test_a_delayed_future_over_a_cancelled_future_finishes() -> None:
    clock = ManualClock()
    loop = asyncio.get_running_loop()
    async with ap.Purgatory("p", clock=clock) as p:
        by_condition: asyncio.Future[int] = loop.create_future()
        op = p.watch_futures([by_condition], timeout=1.0)
        by_condition.cancel()
        await clock.advance(0)
        assert op.cancelled()
        # On the timeout path the pending future is cancelled by on_complete itself.
        ok, hung = loop.create_future(), loop.create_future()
        ok.set_result(1)
        timed = p.watch_futures([ok, hung], timeout=0.5)
        await clock.advance(0.5)
        assert timed.done()
        with pytest.raises(TimeoutError):
            await timed
        assert p.num_delayed() == 0


@pytest.mark.parametrize("exc_type", [RuntimeError, asyncio.CancelledError])
async def test_try_complete_raising_in_a_pass_finishes_only_that_operation(
    exc_type: type[BaseException],
) -> None:
    clock = ManualClock()
    ready = False
    async with ap.Purgatory("p", clock=clock) as p:
        before = p.try_complete_else_watch(Flag(1.0, lambda: ready), ["k"])
        rude = p.try_complete_else_watch(
            Hook(1.0, try_complete=lambda: ready and raiser(exc_type("x"))()), ["k"]
        )
        after = p.try_complete_else_watch(Flag(1.0, lambda: ready), ["k"])
        ready = True
        p.notify("k")
        await clock.advance(0)
        assert before.done()
        assert after.done()
        assert rude.cancelled() is (exc_type is asyncio.CancelledError)
        with pytest.raises(exc_type):
            rude.result()
        assert p.num_delayed() == 0
        assert p.watched() == 0


@pytest.mark.parametrize("exc", [RuntimeError("observer"), asyncio.CancelledError()])
async def test_a_raising_observer_is_reported_and_the_completion_stands(exc: BaseException) -> None:
    clock = ManualClock()
    log = Log(fail=exc)
    with loop_errors() as seen:
        p = ap.Purgatory("p", clock=clock, observer=log)
        done = p.try_complete_else_watch(Flag(1.0, lambda: True), ["k"])
        expired = p.try_complete_else_watch(Flag(0.5), ["k"])
        pending = [p.try_complete_else_watch(Flag(5.0), ["k", i]) for i in range(5)]
        await clock.advance(0.5)
        assert await done == "done"
        assert await expired == "expired"
        await p.aclose()  # does not stop half way
        for op in pending:
            with pytest.raises(ap.PurgatoryClosed):
                await op
    assert len(log.finished) == 7
    assert len(seen) == 7
    assert all(context["exception"] is exc for context in seen)
    assert p.num_delayed() == 0
    assert p.watched() == 0


def test_keyboard_interrupt_from_a_hook_propagates_with_the_timer_whole() -> None:
    for new_loop in (asyncio.new_event_loop, uvloop.new_event_loop):
        loop = new_loop()
        clock = ManualClock()
        p = ap.Purgatory("p", clock=clock)

        async def register(p: ap.Purgatory = p) -> list[Flag]:
            first = [p.try_complete_else_watch(Flag(1.0), ["k"]) for _ in range(3)]
            rude = p.try_complete_else_watch(
                Hook(1.0, on_complete=raiser(KeyboardInterrupt())), ["k"]
            )
            last = [p.try_complete_else_watch(Flag(1.0), ["k"]) for _ in range(3)]
            return [*first, *last, rude]

        ops = loop.run_until_complete(register())
        later = loop.run_until_complete(_register(p, Flag(2.0)))
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(clock.advance(1.0))
        # The rude one finished with it; the rest are consistent and resume.
        assert ops[-1].done()
        loop.run_until_complete(clock.advance(0))
        assert all(op.outcome is ap.Outcome.EXPIRED for op in ops[:-1])
        loop.run_until_complete(clock.advance(1.0))
        assert later.outcome is ap.Outcome.EXPIRED
        assert p.num_delayed() == 0
        loop.run_until_complete(p.aclose())
        loop.close()


async def _register(p: ap.Purgatory, op: Flag) -> Flag:
    return p.try_complete_else_watch(op, ["k"])


# -- re-entrant calls -------------------------------------------------------------------


@pytest.mark.parametrize("action", ["cancel", "force", "force_then_false"])
async def test_finishing_itself_inside_registration_leaves_nothing_watched(action: str) -> None:
    class Finisher(Flag):
        def try_complete(self) -> bool:
            self.checks += 1
            if action == "cancel":
                self.cancel()
                return False
            completed = self.force_complete()
            return completed and action == "force"

    async with ap.Purgatory("p", clock=ManualClock()) as p:
        op = p.try_complete_else_watch(Finisher(1.0), ["k", "j"])
        assert op.done()
        assert (p.num_delayed(), p.watched(), p.stats.timed, p.stats.keys) == (0, 0, 0, 0)


async def test_reset_timeout_inside_registration_times_from_then() -> None:
    clock = ManualClock()

    class Resetting(Flag):
        def __init__(self, timeout: float, new: float | None) -> None:
            super().__init__(timeout)
            self.new = new

        def try_complete(self) -> bool:
            self.reset_timeout(self.new)
            return super().try_complete()

    async with ap.Purgatory("p", clock=clock) as p:
        await clock.advance(1.0)
        op = p.try_complete_else_watch(Resetting(5.0, 0.25), ["k"])
        assert p.stats.timed == 1
        await clock.advance(0.249)
        assert not op.done()
        await clock.advance(0.001)
        assert op.outcome is ap.Outcome.EXPIRED
        gone = p.try_complete_else_watch(Resetting(0.1, None), ["k"])
        await clock.advance(1.0)
        assert not gone.done()
        assert p.stats.timed == 0
        now = p.try_complete_else_watch(Resetting(5.0, 0.0), ["k"])
        assert now.outcome is ap.Outcome.EXPIRED
        assert p.num_delayed() == 1


async def test_reset_timeout_of_operations_in_the_batch_being_drained() -> None:
    clock = ManualClock()
    async with ap.Purgatory("p", clock=clock, max_work_per_pass=16) as p:
        others: list[Flag] = []

        def postpone() -> None:
            for op in others:
                if not op.done():
                    op.reset_timeout(5.0)

        first = p.try_complete_else_watch(Hook(1.0, on_complete=postpone), ["k"])
        others += [p.try_complete_else_watch(Flag(1.0), ["k"]) for _ in range(100)]
        await clock.advance(1.0)
        assert first.done()
        assert sum(op.done() for op in others) == 0
        await clock.advance(4.999)
        assert sum(op.done() for op in others) == 0
        await clock.advance(0.001)
        assert all(op.outcome is ap.Outcome.EXPIRED for op in others)


@pytest.mark.parametrize("where", ["try_complete", "on_complete", "on_expiration", "observer"])
@pytest.mark.parametrize("expire", [False, True])
async def test_close_from_inside_a_hook_finishes_everything_once(where: str, expire: bool) -> None:
    clock = ManualClock()
    log = Log()
    p = ap.Purgatory("p", clock=clock, observer=log)

    def close() -> None:
        p.close(expire_pending=expire)

    ready = False
    ops = [p.try_complete_else_watch(Flag(1.0), ["k", i]) for i in range(20)]
    if where == "observer":
        log.fail = None

        class Closing(Log):
            def operation_finished(self, *args: Any) -> None:
                close()
                super().operation_finished(*args)

        log.__class__ = Closing
        trigger: Flag = p.try_complete_else_watch(Flag(0.5, lambda: ready), ["t"])
    else:

        def action() -> None:
            if ready or where != "try_complete":
                close()

        trigger = p.try_complete_else_watch(Hook(0.5, lambda: ready, **{where: action}), ["t"])
    ops += [p.try_complete_else_watch(Flag(1.0), ["k", i]) for i in range(20)]
    if where == "try_complete":
        ready = True
        p.check_and_complete("t")
    else:
        await clock.advance(0.5)
    await clock.advance(2.0)
    assert p.closed
    finished = [op for op, _ in log.finished]
    assert len(finished) == len(set(finished)) == 41
    assert all(op.done() and op.completions <= 1 for op in [*ops, trigger])
    expected = ap.Outcome.EXPIRED if expire else ap.Outcome.CLOSED
    assert all(op.outcome is expected for op in ops)
    stats = p.stats
    assert (stats.pending, stats.watched, stats.keys, stats.timed) == (0, 0, 0, 0)
    assert stats.completed + stats.expired + stats.cancelled + stats.closed == 41


# -- shutdown and results ---------------------------------------------------------------


async def test_close_expiring_pending_operations_releases_them_all() -> None:
    clock = ManualClock()
    p = ap.Purgatory("p", clock=clock)
    refs = [weakref.ref(p.try_complete_else_watch(Flag(5.0), ["k", i % 7])) for i in range(2000)]
    await clock.advance(1.0)
    p.close(expire_pending=True)
    gc.collect()
    assert sum(ref() is not None for ref in refs) == 0
    assert p.stats.expired == 2000


def _close_seconds(n: int) -> float:
    async def run() -> float:
        p = ap.Purgatory("p", clock=ManualClock())
        for i in range(n):
            p.try_complete_else_watch(Flag(30.0), [i])  # one key each
        start = time.process_time()
        p.close()
        seconds = time.process_time() - start
        assert p.stats.closed == n
        return seconds

    return asyncio.run(run())


def test_closing_many_keys_takes_linear_time() -> None:
    # Not a benchmark: a shape check. Closing took O(keys**2) (each op taken as the
    # first entry of a dict whose front had been deleted): 3 s for 100k keys. Linear,
    # ten times the keys costs about ten times as much; quadratic, a hundred.
    small = _close_seconds(10_000)
    large = _close_seconds(100_000)
    assert large < 30 * small + 0.3, (small, large)


async def test_result_reraises_without_growing_the_traceback() -> None:
    async with ap.Purgatory("p", clock=ManualClock()) as p:
        op = p.try_complete_else_watch(
            Hook(1.0, lambda: True, on_complete=raiser(ValueError())), ["k"]
        )
        depths = []
        for _ in range(300):
            try:
                op.result()
            except ValueError as exc:
                depths.append(len(traceback.extract_tb(exc.__traceback__)))
        assert depths[0] == depths[-1]


def test_close_after_the_loop_ended_finishes_everything_quietly() -> None:
    for new_loop in (asyncio.new_event_loop, uvloop.new_event_loop):
        p = ap.Purgatory("p")
        loop = new_loop()
        ops = loop.run_until_complete(_register_many(p))
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        p.close()
        assert all(isinstance(op.exception(), ap.PurgatoryClosed) for op in ops)
        assert p.num_delayed() == 0
        with pytest.raises(ap.PurgatoryClosed):
            p.notify_threadsafe("k")


async def _register_many(p: ap.Purgatory) -> list[Flag]:
    return [p.try_complete_else_watch(Flag(t), ["k"]) for t in (None, 1.0, 10.0)]


def test_notify_threadsafe_after_the_loop_closed_raises_purgatory_closed() -> None:
    p = ap.Purgatory("p")
    loop = asyncio.new_event_loop()
    loop.run_until_complete(_register_many(p))
    loop.close()
    errors: list[BaseException] = []

    def notify() -> None:
        try:
            p.notify_threadsafe("k")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=notify)
    thread.start()
    thread.join()
    assert [type(e) for e in errors] == [ap.PurgatoryClosed]
    p.close()


async def test_close_from_another_thread_while_the_loop_runs_is_refused() -> None:
    async with ap.Purgatory("p") as p:
        p.try_complete_else_watch(Flag(1.0), ["k"])
        errors: list[BaseException] = []

        def close() -> None:
            try:
                p.close()
            except RuntimeError as exc:
                errors.append(exc)

        await asyncio.to_thread(close)
        assert len(errors) == 1
        assert "call_soon_threadsafe" in str(errors[0])
        assert not p.closed


async def test_a_clock_that_goes_back_fires_nothing_early() -> None:
    clock = ManualClock(start=-5.0)  # any start, negative too
    finished: dict[str, float] = {}

    class Noted(Flag):
        def on_complete(self) -> str:
            finished[self.name] = clock.time()
            return super().on_complete()

        name = ""

    def op(name: str, timeout: float) -> Noted:
        made = Noted(timeout)
        made.name = name
        return p.try_complete_else_watch(made, ["k"])

    async with ap.Purgatory("p", clock=clock) as p:
        op("first", 1.0)  # deadline -4.0
        await clock.advance(0.9)
        clock.rewind(10.0)  # -14.1
        op("second", 0.5)  # deadline -13.6
        for _ in range(200):
            await clock.advance(0.05)
            clock.rewind(0.01)
        await clock.advance(10.0)
    # Never early against the clock; what was timed while it was behind may wait
    # until it is back where the timer had got to.
    assert finished["first"] >= -4.0
    assert finished["second"] >= -13.6
    assert finished["first"] <= -4.0 + 0.05


@pytest.mark.parametrize("tick", [1e-4, 0.001])
async def test_an_early_wake_up_does_not_spin(tick: float) -> None:
    """uvloop may fire an alarm up to half a millisecond early (it rounds to ms).

    Before the fix a burst like this one took uvloop ~8,000 wake-ups at a 0.1 ms tick.
    """
    rng = random.Random(1)
    # A level-0 bucket per distinct deadline tick (no cascade): at most one due bucket
    # per operation.
    async with ap.Purgatory("p", tick=tick, wheel_size=1000) as p:
        ops = [p.try_complete_else_watch(Flag(rng.uniform(0, 0.05)), [i]) for i in range(300)]
        await asyncio.gather(*ops)
        assert p.stats.timer_wakeups <= 2 * len(ops)


# -- the timer task ---------------------------------------------------------------------


async def test_the_timer_is_one_named_task_gone_after_aclose() -> None:
    p = ap.Purgatory("orders")
    p.try_complete_else_watch(Flag(None), ["k"])  # nothing timed: no task yet
    timed = p.try_complete_else_watch(Flag(0.001), ["k"])
    await asyncio.sleep(0)
    names = [t.get_name() for t in asyncio.all_tasks()]
    assert names.count("aiopurgatory-timer:orders") == 1
    assert await timed == "expired"
    p.try_complete_else_watch(Flag(60.0), ["k"])
    await p.aclose()
    assert "aiopurgatory-timer:orders" not in [t.get_name() for t in asyncio.all_tasks()]


async def test_aclose_works_with_contextlib_aclosing() -> None:
    async with contextlib.aclosing(ap.Purgatory("p")) as p:
        op = p.try_complete_else_watch(Flag(10.0), ["k"])
    assert p.closed
    assert isinstance(op.exception(), ap.PurgatoryClosed)
    assert p.stats.closed == 1


async def test_async_with_returns_the_subclass() -> None:
    class Named(ap.Purgatory):
        __slots__ = ()

    async with Named("p") as p:
        assert type(p) is Named


async def test_a_failing_timer_task_is_never_silent() -> None:
    bug = RuntimeError("the clock broke")

    class BreakingClock(ManualClock):
        __slots__ = ("broken",)

        def __init__(self) -> None:
            super().__init__()
            self.broken = False

        def time(self) -> float:
            if self.broken:
                raise bug
            return super().time()

    clock = BreakingClock()
    with loop_errors() as seen:
        p = ap.Purgatory("p", clock=clock)
        op = p.try_complete_else_watch(Flag(1.0), ["k"])
        untimed = p.try_complete_else_watch(Flag(None), ["j"])
        clock.broken = True
        await clock.advance(1.0)
        for failed in (op, untimed):
            error = failed.exception()
            assert isinstance(error, ap.PurgatoryClosed)
            assert error.__cause__ is bug
        assert p.closed
    assert [context["exception"] for context in seen] == [bug]


async def test_cancelling_the_timer_task_closes_the_purgatory() -> None:
    p = ap.Purgatory("p")
    op = p.try_complete_else_watch(Flag(10.0), ["k"])
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == "aiopurgatory-timer:p"]
    task.cancel()
    with pytest.raises(ap.PurgatoryClosed):
        await op
    assert p.closed
    assert p.num_delayed() == 0


# -- wake-one -----------------------------------------------------------------------------


async def test_check_and_complete_with_a_limit_wakes_the_oldest_first() -> None:
    queue: list[int] = []

    class Pop(ap.DelayedOperation[int]):
        checks = 0

        def try_complete(self) -> bool:
            Pop.checks += 1
            return bool(queue) and self.force_complete()

        def on_complete(self) -> int:
            return queue.pop(0)

    async with ap.Purgatory("q", clock=ManualClock()) as p:
        waiters = [p.try_complete_else_watch(Pop(None), ["q"]) for _ in range(10_000)]
        Pop.checks = 0
        for value in range(1000):
            queue.append(value)
            assert p.check_and_complete("q", limit=1) == 1
        assert Pop.checks == 1000
        assert [w.result() for w in waiters[:1000]] == list(range(1000))
        assert not any(w.done() for w in waiters[1000:])
        with pytest.raises(ValueError, match="limit"):
            p.check_and_complete("q", limit=0)
        with pytest.raises(TypeError, match="limit"):
            p.check_and_complete("q", limit=1.5)  # type: ignore[arg-type]
        p.cancel_for_key("q")


async def test_a_limit_looks_past_watchers_that_cannot_complete() -> None:
    async with ap.Purgatory("q", clock=ManualClock()) as p:
        blocked = [p.try_complete_else_watch(Flag(None), ["q"]) for _ in range(50)]
        ready = [p.try_complete_else_watch(Flag(None, lambda: False), ["q"]) for _ in range(3)]
        for op in ready:
            op.ready = lambda: True
        assert p.check_and_complete("q", limit=2) == 2
        assert [op.done() for op in ready] == [True, True, False]
        assert not any(op.done() for op in blocked)
        p.cancel_for_key("q")
