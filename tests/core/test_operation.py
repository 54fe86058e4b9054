"""DelayedOperation: exactly-once completion, awaiting, cancellation, hooks."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

import aiopurgatory as ap
from aiopurgatory.testing import ManualClock

from ..support.helpers import Flag

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("bad", [-1, -0.001, math.nan, -math.inf])
def test_bad_timeouts_raise_value_error_naming_the_value(bad: float) -> None:
    with pytest.raises(ValueError, match=str(bad).replace("(", r"\(")):
        Flag(bad)


@pytest.mark.parametrize("bad", ["1", b"1", [1], True])
def test_non_numeric_timeouts_raise_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="timeout"):
        Flag(bad)  # type: ignore[arg-type]


def test_none_and_infinity_mean_no_timeout() -> None:
    assert Flag(None).timeout is None
    assert Flag(math.inf).timeout is None
    assert Flag(0).timeout == 0.0


async def test_force_complete_wins_once_across_every_path() -> None:
    op = Flag(None)
    assert op.force_complete()
    assert not op.force_complete()
    assert not op.cancel()
    op._timer_fired()
    assert not op.expired
    assert op.completions == 1
    assert op.result() == "done"
    assert await op == "done"


async def test_result_before_completion_is_an_invalid_state() -> None:
    op = Flag(None)
    assert not op.done()
    with pytest.raises(asyncio.InvalidStateError):
        op.result()
    with pytest.raises(asyncio.InvalidStateError):
        op.exception()


async def test_several_awaiters_get_the_result() -> None:
    op = Flag(None)
    waiters = [asyncio.ensure_future(_await(op)) for _ in range(3)]
    await asyncio.sleep(0)
    op.force_complete()
    assert await asyncio.gather(*waiters) == ["done"] * 3


async def _await(op: ap.DelayedOperation[Any]) -> Any:
    return await op


async def test_on_complete_exception_completes_the_operation_with_it() -> None:
    class Failing(Flag):
        def on_complete(self) -> str:
            raise KeyError("boom")

    op = Failing(None)
    assert op.force_complete()
    assert isinstance(op.exception(), KeyError)
    with pytest.raises(KeyError):
        await op


async def test_try_complete_exception_completes_only_that_operation() -> None:
    class Raising(Flag):
        def try_complete(self) -> bool:
            raise ValueError("bad check")

    clock = ManualClock()
    async with ap.Purgatory("p", clock=clock) as purgatory:
        good = purgatory.try_complete_else_watch(Flag(1.0), ["k"])
        bad = purgatory.try_complete_else_watch(Raising(1.0), ["j"])
        assert bad.done()
        with pytest.raises(ValueError, match="bad check"):
            await bad
        assert bad.completions == 0, "on_complete must not run after try_complete raised"
        assert not good.done()
        assert purgatory.num_delayed() == 1


async def test_a_check_requested_during_a_check_runs_once_more() -> None:
    """Kafka's tryCompletePending: a nested request is deferred, not lost."""
    state = {"ready": False}

    class Nested(Flag):
        def try_complete(self) -> bool:
            self.checks += 1
            if self.checks == 1:
                state["ready"] = True
                assert not self._check(), "re-entered try_complete"
                return False
            return state["ready"] and self.force_complete()

    op = Nested(None)
    assert op._check()
    assert op.checks == 2
    assert op.result() == "done"


async def test_expiry_sets_expired_before_on_complete_then_runs_on_expiration() -> None:
    clock = ManualClock()
    async with ap.Purgatory("p", clock=clock) as purgatory:
        op = purgatory.try_complete_else_watch(Flag(0.5), ["k"])
        await clock.advance(0.5)
        assert op.expired
        assert (op.completions, op.expirations) == (1, 1)
        assert await op == "expired"
        assert op.outcome is ap.Outcome.EXPIRED


async def test_cancelling_the_awaiting_task_removes_the_operation_before_it_resumes() -> None:
    clock = ManualClock()
    async with ap.Purgatory("p", clock=clock) as purgatory:
        op = purgatory.try_complete_else_watch(Flag(10.0), ["a", "b"])
        seen: dict[str, int] = {}

        async def waiter() -> None:
            try:
                await op
            except asyncio.CancelledError:
                seen.update(pending=purgatory.num_delayed(), watched=purgatory.watched())
                raise

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == {"pending": 0, "watched": 0}
        assert op.cancelled()
        assert op.completions == 0
        assert purgatory.stats.cancelled == 1
        assert purgatory.stats.timed == 0


async def test_cancelling_one_of_two_awaiting_tasks_cancels_it_for_both() -> None:
    clock = ManualClock()
    async with ap.Purgatory("p", clock=clock) as purgatory:
        op = purgatory.try_complete_else_watch(Flag(10.0), ["a"])
        seen: list[tuple[str, int, bool]] = []

        async def waiter(name: str) -> None:
            try:
                await op
            except asyncio.CancelledError:
                seen.append((name, purgatory.num_delayed(), op.cancelled()))
                raise

        first = asyncio.ensure_future(waiter("first"))
        second = asyncio.ensure_future(waiter("second"))
        await asyncio.sleep(0)
        first.cancel()
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert [type(r) for r in results] == [asyncio.CancelledError] * 2
        # Whichever resumed first found the operation already cancelled and gone.
        assert sorted(seen) == [("first", 0, True), ("second", 0, True)]
        assert purgatory.stats.cancelled == 1
        assert op.completions == 0


async def test_shield_keeps_the_operation_alive() -> None:
    clock = ManualClock()
    async with ap.Purgatory("p", clock=clock) as purgatory:
        op = purgatory.try_complete_else_watch(Flag(10.0), ["a"])
        task = asyncio.ensure_future(asyncio.shield(op))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not op.done()
        assert purgatory.num_delayed() == 1
        op.force_complete()
        assert await op == "done"


async def test_cancel_directly_wakes_awaiters_with_cancelled_error() -> None:
    op = Flag(None)
    task = asyncio.ensure_future(_await(op))
    await asyncio.sleep(0)
    assert op.cancel("client went away")
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(asyncio.CancelledError, match="client went away"):
        op.result()


async def test_reset_timeout_moves_the_deadline() -> None:
    clock = ManualClock()
    async with ap.Purgatory("p", clock=clock) as purgatory:
        op = purgatory.try_complete_else_watch(Flag(1.0), ["k"])
        await clock.advance(0.9)
        op.reset_timeout(1.0)  # later: expires at 1.9
        await clock.advance(0.9)
        assert not op.done()
        op.reset_timeout(0.05)  # earlier: 1.85
        await clock.advance(0.05)
        assert op.expired
        forever = purgatory.try_complete_else_watch(Flag(1.0), ["k"])
        forever.reset_timeout(None)
        assert purgatory.stats.timed == 0
        await clock.advance(10)
        assert not forever.done()
        with pytest.raises(ValueError, match="timeout"):
            forever.reset_timeout(-1)
        forever.force_complete()
        with pytest.raises(asyncio.InvalidStateError):
            forever.reset_timeout(1)


def test_kind_defaults_to_the_class_name_and_follows_label() -> None:
    class Produce(Flag):
        label = "produce"

    assert Flag(None).kind == "Flag"
    assert Produce(None).kind == "produce"
