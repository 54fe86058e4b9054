"""Timer semantics in virtual time: never early, at most one tick late, one wake-up."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiopurgatory.testing import ManualClock
from aiopurgatory.timer import Timer, TimerTask, is_timed

pytestmark = pytest.mark.anyio

TICK = 0.001


class Recorder(TimerTask):
    """Notes the clock time at which it fired."""

    __slots__ = ("clock", "fired_at", "timeout")

    def __init__(self, clock: ManualClock, timeout: float) -> None:
        super().__init__()
        self.clock = clock
        self.timeout = timeout
        self.fired_at: list[float] = []

    def _timer_fired(self) -> None:
        self.fired_at.append(self.clock.time())


def make_timer(clock: ManualClock, **kwargs: Any) -> Timer:
    return Timer(clock, tick=TICK, wheel_size=kwargs.pop("wheel_size", 20), **kwargs)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    start=st.floats(0, 1e6, allow_nan=False),
    timeouts=st.lists(
        st.one_of(st.floats(0, 0.05), st.floats(0, 30), st.floats(0, 3 * 24 * 3600)),
        min_size=1,
        max_size=40,
    ),
    steps=st.lists(st.floats(0.0001, 5000), min_size=1, max_size=30),
    wheel_size=st.sampled_from([2, 3, 20]),
    max_work=st.sampled_from([1, 7, 2048]),
)
async def test_never_early_and_at_most_one_tick_late(
    start: float,
    timeouts: list[float],
    steps: list[float],
    wheel_size: int,
    max_work: int,
) -> None:
    clock = ManualClock(start)
    timer = make_timer(clock, wheel_size=wheel_size, max_work_per_pass=max_work)
    tasks = [Recorder(clock, t) for t in timeouts]
    for task in tasks:
        timer.add(task, task.timeout)
    for step in [*steps, 4 * 24 * 3600]:
        await clock.advance(step)
        for task in tasks:
            assert task.deadline is not None
            if task.fired_at:
                # The clock stops at each armed wake-up, so lateness is the rounding.
                assert task.fired_at[0] >= task.deadline, "fired early"
                assert task.fired_at[0] - task.deadline <= TICK + 1e-9 * max(1.0, task.deadline)
            else:
                assert clock.time() < task.deadline + TICK
    assert all(len(task.fired_at) == 1 for task in tasks)
    assert len(timer) == 0
    timer.wheel.check_invariants()


async def test_overflow_levels_cascade_to_the_exact_tick() -> None:
    clock = ManualClock()
    timer = make_timer(clock)
    task = Recorder(clock, 3600.0)
    timer.add(task, 3600.0)
    assert timer.wheel.num_levels >= 5
    await clock.advance(3599.999)
    assert task.fired_at == []
    await clock.advance(0.002)
    assert task.fired_at == [3600.0]
    # A handful of cascade wake-ups, not one per tick.
    assert timer.wakeups <= 2 * timer.wheel.num_levels


async def test_an_earlier_bucket_rearms_the_single_wakeup() -> None:
    clock = ManualClock()
    timer = make_timer(clock)
    late, early = Recorder(clock, 10.0), Recorder(clock, 0.005)
    timer.add(late, 10.0)
    assert clock.pending_wakeups() == 1
    timer.add(early, 0.005)
    assert clock.pending_wakeups() == 1  # re-armed, not doubled
    await clock.advance(0.005)
    assert early.fired_at == [0.005]
    assert late.fired_at == []
    assert clock.pending_wakeups() == 1


async def test_no_wakeups_while_nothing_is_pending() -> None:
    clock = ManualClock()
    timer = make_timer(clock)
    await clock.advance(3600)
    assert timer.wakeups == 0
    assert clock.pending_wakeups() == 0
    task = Recorder(clock, 5.0)
    timer.add(task, 5.0)
    assert timer.cancel(task)
    assert clock.pending_wakeups() == 0, "cancelling the last task must disarm"
    await clock.advance(3600)
    assert timer.wakeups == 0


async def test_one_task_an_hour_away_costs_a_few_wakeups() -> None:
    clock = ManualClock()
    timer = make_timer(clock)
    timer.add(Recorder(clock, 3600.0), 3600.0)
    await clock.advance(3000)
    assert timer.wakeups <= 3


async def test_buckets_due_together_are_drained_in_one_pass() -> None:
    clock = ManualClock()
    timer = make_timer(clock)
    tasks = [Recorder(clock, 0.001 * i) for i in range(1, 200)]
    for task in tasks:
        timer.add(task, task.timeout)
    clock.jump(1.0)  # a blocked loop: every bucket is overdue at the next wake-up
    await clock.advance(0)
    assert all(task.fired_at == [1.0] for task in tasks)
    assert timer.wakeups == 1


async def test_a_100k_bucket_expires_in_chunks_while_the_loop_keeps_running() -> None:
    clock = ManualClock()
    timer = make_timer(clock, max_work_per_pass=1000)
    tasks = [Recorder(clock, 7.0) for _ in range(100_000)]  # one level-3 bucket
    for task in tasks:
        timer.add(task, 7.0)
    progress: list[int] = []

    def ticker() -> None:
        progress.append(sum(1 for t in tasks[::1000] if t.fired_at))
        if len(timer):
            asyncio.get_running_loop().call_soon(ticker)

    asyncio.get_running_loop().call_soon(ticker)
    await clock.advance(6.999)
    assert not any(t.fired_at for t in tasks)
    progress.clear()
    await clock.advance(0.001)
    assert all(t.fired_at == [7.0] for t in tasks)
    # The other callback ran between chunks, watching expiries progress.
    assert len(progress) >= 100
    assert len(set(progress)) > 10
    assert timer.wakeups >= 100


async def test_timeout_zero_fires_synchronously() -> None:
    clock = ManualClock(5.0)
    timer = make_timer(clock)
    task = Recorder(clock, 0.0)
    timer.add(task, 0.0)
    assert task.fired_at == [5.0]
    assert len(timer) == 0


async def test_reset_later_and_earlier() -> None:
    clock = ManualClock()
    timer = make_timer(clock)
    task = Recorder(clock, 1.0)
    timer.add(task, 1.0)
    await clock.advance(0.5)
    timer.reset(task, 1.0)  # later: now 1.5
    await clock.advance(0.9)
    assert task.fired_at == []
    timer.reset(task, 0.01)  # earlier: now 1.41
    await clock.advance(0.02)
    assert task.fired_at == [pytest.approx(1.41)]
    assert task.fired_at[0] >= 1.41 - 1e-12
    assert len(timer) == 0


async def test_a_raising_task_goes_to_the_loop_handler_and_the_driver_survives() -> None:
    class Boom(TimerTask):
        __slots__ = ()

        def _timer_fired(self) -> None:
            raise RuntimeError("boom")

    loop = asyncio.get_running_loop()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        clock = ManualClock()
        timer = make_timer(clock)
        after = Recorder(clock, 0.002)
        timer.add(Boom(), 0.001)
        timer.add(after, 0.002)
        await clock.advance(1)
    finally:
        loop.set_exception_handler(None)
    assert [str(c["exception"]) for c in seen] == ["boom"]
    assert after.fired_at == [0.002]


async def test_never_early_on_the_real_loop_clock() -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    fired: list[tuple[float, float]] = []

    class Real(TimerTask):
        __slots__ = ()

        def _timer_fired(self) -> None:
            assert self.deadline is not None
            fired.append((loop.time(), self.deadline))
            if len(fired) == 20:
                done.set()

    timer = Timer(loop, tick=TICK)
    for i in range(20):
        timer.add(Real(), 0.001 * i)
    await done.wait()
    assert all(now >= deadline for now, deadline in fired)


def test_bad_timer_settings_are_named() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError, match="tick"):
        Timer(clock, tick=0)
    with pytest.raises(ValueError, match="tick"):
        Timer(clock, tick=math.nan)
    with pytest.raises(TypeError, match="tick"):
        Timer(clock, tick="1ms")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wheel_size"):
        Timer(clock, wheel_size=1)
    with pytest.raises(TypeError, match="wheel_size"):
        Timer(clock, wheel_size=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_work_per_pass"):
        Timer(clock, max_work_per_pass=0)


async def test_a_task_added_after_the_timer_went_idle_is_armed() -> None:
    """Regression: the emptied bucket kept its expiration, so re-adding to it armed nothing."""
    clock = ManualClock()
    timer = make_timer(clock)
    first, second = Recorder(clock, 0.5), Recorder(clock, 0.5)
    timer.add(first, 0.5)
    timer.cancel(first)
    timer.add(second, 0.5)  # same bucket as the cancelled task
    assert clock.pending_wakeups() == 1
    await clock.advance(0.5)
    assert second.fired_at == [0.5]


async def test_a_start_in_the_past_counts_the_timeout_from_it() -> None:
    clock = ManualClock()
    timer = make_timer(clock)
    ticking = Recorder(clock, 1.0)
    timer.add(ticking, 1.0)
    await clock.advance(0.5)
    late, passed = Recorder(clock, 0.3), Recorder(clock, 0.2)
    timer.add(late, 0.3, start=0.3)  # deadline 0.6: still ahead
    timer.add(passed, 0.2, start=0.1)  # deadline 0.3: already passed
    await clock.advance(0)  # it fires at the next wake-up, without time passing
    assert passed.fired_at == [0.5]
    assert late.fired_at == []
    await clock.advance(0.1)
    assert late.fired_at == [pytest.approx(0.6)]
    assert late.fired_at[0] >= 0.6


@pytest.mark.parametrize(
    ("timeout", "tick"),
    [
        (0.010, TICK),  # a level-0 bucket: the alarm is armed at the deadline's tick
        (0.5, TICK),  # a coarse bucket, split a quarter span ahead of its start
        (30.0, TICK),  # two levels up
        (0.0105, 0.01),  # a deadline between ticks: rounded up to 0.02
    ],
)
async def test_lag_is_how_late_a_wakeup_came_after_the_real_deadline(
    timeout: float, tick: float
) -> None:
    clock = ManualClock(start=100.0)
    timer = Timer(clock, tick=tick)
    task = Recorder(clock, timeout)
    timer.add(task, timeout)
    # The loop is blocked from now until 2 ms after the tick the deadline rounds up
    # to (past every split on the way), then the wake-up comes.
    late_by = math.ceil(round(timeout / tick, 9)) * tick - timeout + 0.002
    clock.jump(timeout + late_by)
    await clock.advance(0)
    assert task.fired_at == [pytest.approx(100.0 + timeout + late_by)]
    assert timer.lag_last == pytest.approx(late_by, abs=1e-9)
    assert timer.lag_max == timer.lag_last
    timer.close()


async def test_lag_is_zero_for_punctual_wakeups_and_keeps_its_maximum() -> None:
    clock = ManualClock()
    timer = make_timer(clock)
    assert (timer.lag_last, timer.lag_max) == (0.0, 0.0)
    first, second = Recorder(clock, 0.5), Recorder(clock, 2.0)
    timer.add(first, 0.5)
    timer.add(second, 2.0)
    await clock.advance(0.25)  # wake-ups that expire nothing (splits) set no lag
    clock.jump(0.3)  # 50 ms late for the first deadline
    await clock.advance(0)
    assert first.fired_at == [pytest.approx(0.55)]
    assert timer.lag_last == pytest.approx(0.05)
    await clock.advance(2.0)  # punctual: every alarm fires at the instant it asked for
    assert second.fired_at == [pytest.approx(2.0)]
    assert timer.lag_last == pytest.approx(0.0, abs=1e-9)
    assert timer.lag_max == pytest.approx(0.05)
    timer.close()


async def test_is_timed_says_whether_a_task_waits_in_a_timer() -> None:
    clock = ManualClock()
    timer = make_timer(clock)
    fired, cancelled = Recorder(clock, 1.0), Recorder(clock, 1.0)
    assert not is_timed(fired)
    for task in (fired, cancelled):
        timer.add(task, 1.0)
        assert is_timed(task)
        assert is_timed(task) is task.scheduled
    assert timer.cancel(cancelled)
    assert not is_timed(cancelled)
    await clock.advance(1.0)
    assert fired.fired_at == [1.0]
    assert not is_timed(fired)
    assert not cancelled.fired_at
    timer.close()
    await timer.wait_closed()


async def test_deadline_is_none_until_timed_a_float_while_timed_and_kept_after_firing() -> None:
    # Stored as a number (NaN while not timed); the property keeps the None API, for
    # bare tasks and for operations (whose compiled __init__ skips the task's).
    from aiopurgatory import DelayedOperation

    class Op(DelayedOperation[None]):
        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> None:
            pass

    clock = ManualClock(start=10.0)
    timer = make_timer(clock)
    task, op = Recorder(clock, 0.5), Op(0.5)
    assert (task.deadline, op.deadline) == (None, None)
    timer.add(task, 0.5)
    timer.add(op, 0.25)
    assert (task.deadline, op.deadline) == (10.5, 10.25)
    timer.cancel(op)
    assert op.deadline == 10.25  # a cancel outside a batch keeps it, for traces
    await clock.advance(0.5)
    assert task.fired_at == [10.5]
    assert task.deadline == 10.5
    task.deadline = None
    assert [task.deadline] == [None]
    task.deadline = 3.0
    assert [task.deadline] == [3.0]
    assert isinstance(task.deadline, float)
