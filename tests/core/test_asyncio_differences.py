"""What the README says differs from asyncio on purpose, and how cancellation scopes
(asyncio.timeout, TaskGroup, anyio's move_on_after / fail_after) reach an operation."""

from __future__ import annotations

import asyncio

import anyio
import pytest

import aiopurgatory as ap

from ..support.helpers import Flag

pytestmark = pytest.mark.anyio


def assert_gone(p: ap.Purgatory, op: Flag) -> None:
    """``op`` was cancelled and left the timer and every watcher list."""
    assert op.cancelled()
    assert op.outcome is ap.Outcome.CANCELLED
    assert (p.num_delayed(), p.watched(), p.stats.timed) == (0, 0, 0)
    assert op.completions == 0  # on_complete never ran


async def test_wait_for_returns_false_at_its_timeout_instead_of_raising() -> None:
    async with ap.Purgatory("p") as p:
        assert await p.wait_for(["k"], lambda: False, timeout=0.01) is False
        assert await p.wait_for(["k"], lambda: True, timeout=0.01) is True
        assert p.num_delayed() == 0


async def test_awaiting_an_operation_cancelled_by_others_raises_cancelled_error() -> None:
    async with ap.Purgatory("p") as p:
        op = p.try_complete_else_watch(Flag(None), ["k"])
        waiter = asyncio.ensure_future(asyncio.shield(op))  # not cancelled itself
        await asyncio.sleep(0)
        assert p.cancel_for_key("k") == [op]
        with pytest.raises(asyncio.CancelledError):
            await waiter
        current = asyncio.current_task()
        assert current is not None
        assert current.cancelling() == 0  # nobody cancelled the awaiting task
        with pytest.raises(asyncio.CancelledError):
            await op  # the awaiter tells it apart with op.cancelled()
        assert_gone(p, op)


async def test_asyncio_timeout_cancels_the_operation_it_interrupts() -> None:
    async with ap.Purgatory("p") as p:
        op = p.try_complete_else_watch(Flag(30.0), ["k"])
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await op
        assert_gone(p, op)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await p.wait_for(["k"], lambda: False, timeout=None)
        assert p.num_delayed() == 0


async def test_a_task_group_cancels_the_operations_of_its_other_tasks() -> None:
    async with ap.Purgatory("p") as p:
        ops = [p.try_complete_else_watch(Flag(30.0), ["k", i]) for i in range(3)]

        async def fail() -> None:
            await asyncio.sleep(0.01)
            raise RuntimeError("boom")

        async def run_group() -> None:
            async with asyncio.TaskGroup() as group:
                for op in ops:
                    group.create_task(_await(op))
                group.create_task(fail())

        with pytest.raises(ExceptionGroup) as caught:
            await run_group()
        assert caught.group_contains(RuntimeError, match="boom")
        for op in ops:
            assert op.cancelled()
        assert (p.num_delayed(), p.watched(), p.stats.timed) == (0, 0, 0)


async def test_anyio_move_on_after_cancels_the_operation() -> None:
    async with ap.Purgatory("p") as p:
        op = p.try_complete_else_watch(Flag(30.0), ["k"])
        with anyio.move_on_after(0.01) as scope:
            await op
        assert scope.cancelled_caught
        assert_gone(p, op)


async def test_anyio_fail_after_cancels_the_operation_and_raises_timeout_error() -> None:
    async with ap.Purgatory("p") as p:
        op = p.try_complete_else_watch(Flag(None), ["k"])
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.01):
                await op
        assert_gone(p, op)


async def test_anyio_task_group_cancel_scope_reaches_operations() -> None:
    async with ap.Purgatory("p") as p:
        ops = [p.try_complete_else_watch(Flag(None), ["k"]) for _ in range(2)]
        async with anyio.create_task_group() as tg:
            for op in ops:
                tg.start_soon(_await, op)
            await asyncio.sleep(0.01)
            tg.cancel_scope.cancel()
        for op in ops:
            assert op.cancelled()
        assert p.num_delayed() == 0


async def _await(op: Flag) -> str:
    return await op
