"""Issue 25 item 15: what one more hostile read of the public entry points found, and
the traps that stay by design (each pinned here, so that changing one is a decision).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest

import aiopurgatory as ap
from aiopurgatory.asgi import PurgatoryLifespan

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("hook", ["try_complete", "on_complete", "on_expiration"])
def test_an_async_hook_is_refused_where_the_class_is_written(hook: str) -> None:
    # The purgatory calls hooks synchronously: an async try_complete returned a truthy
    # coroutine that completed nothing (the operation stayed pending, a "never
    # awaited" warning later), an async on_complete made a coroutine the result.
    namespace: dict[str, object] = {}
    exec(f"async def {hook}(self):\n    return True", namespace)
    body: dict[str, object] = {
        "try_complete": lambda self: False,
        "on_complete": lambda self: None,
        hook: namespace[hook],
    }
    with pytest.raises(TypeError, match=rf"Async\.{hook} must be a plain method, not async"):
        type("Async", (ap.DelayedOperation,), body)


def test_an_async_generator_hook_is_refused_and_subclasses_are_checked_too() -> None:
    class Plain(ap.DelayedOperation[int]):
        def try_complete(self) -> bool:
            return self.force_complete()

        def on_complete(self) -> int:
            return 1

    with pytest.raises(TypeError, match=r"Later\.on_expiration"):

        class Later(Plain):
            async def on_expiration(self) -> AsyncIterator[None]:  # type: ignore[override]
                yield

    class Fine(Plain):  # plain hooks and other async methods are welcome
        async def fetch(self) -> int:
            return 2

    assert Fine(None).timeout is None


async def test_a_tuple_of_keys_is_several_keys() -> None:
    # By design: keys is a collection, and a tuple is one. A key that is a tuple goes
    # in a list: [("topic", 0)]. A str or bytes alone is refused, being a common slip.
    async with ap.Purgatory("keys") as p:
        op = p.try_complete_else_watch(ap.PredicateOperation(lambda: False, None), ("t", 0))
        assert (p.watchers_of("t"), p.watchers_of(0), p.watchers_of(("t", 0))) == (1, 1, 0)
        one = p.try_complete_else_watch(ap.PredicateOperation(lambda: False, None), [("t", 0)])
        assert p.watchers_of(("t", 0)) == 1
        with pytest.raises(TypeError, match="not a single str"):
            p.try_complete_else_watch(ap.PredicateOperation(lambda: False, None), "topic")
        op.cancel()
        one.cancel()


async def test_a_huge_int_timeout_raises_overflow_error_as_asyncio() -> None:
    # By design: an int beyond the float range is not a number of seconds asyncio can
    # use either (asyncio.timeout(10**400) raises OverflowError); nothing is registered.
    with pytest.raises(OverflowError):
        asyncio.timeout(10**400)
    async with ap.Purgatory("huge") as p:
        with pytest.raises(OverflowError):
            ap.PredicateOperation(lambda: False, 10**400)
        with pytest.raises(OverflowError):
            await p.wait_for(["k"], lambda: False, 10**400)
        with pytest.raises(OverflowError):
            p.timeout(10**400)
        assert p.num_delayed() == 0
        assert p.stats.timed == 0


async def test_the_lifespans_purgatory_as_a_dependency() -> None:
    lifespan = PurgatoryLifespan("dep")
    with pytest.raises(RuntimeError, match="'dep' is not running"):
        lifespan.current()
    with pytest.raises(RuntimeError, match="not running"):
        await lifespan.dependency()
    async with lifespan(object()) as state:
        assert lifespan.current() is state["purgatory"]
        assert await lifespan.dependency() is state["purgatory"]
        assert asyncio.iscoroutinefunction(lifespan.dependency)  # FastAPI: on the loop
    with pytest.raises(RuntimeError, match="not running"):
        lifespan.current()


async def test_closing_ends_a_sleep_and_a_callback_at_inf() -> None:
    # A sleep at inf is not on the wheel (it never fires), and close() did not reach
    # it: the sleeping task hung until something else cancelled it.
    p = ap.Purgatory("inf")
    sleeping: asyncio.Future[None] = asyncio.ensure_future(p.sleep(math.inf))
    handle = p.call_later(math.inf, print)
    await asyncio.sleep(0)
    assert p.stats.timed == 0  # neither is on the wheel
    await p.aclose()
    with pytest.raises(ap.PurgatoryClosed):
        await asyncio.wait_for(sleeping, 5)
    assert handle.cancelled()


async def test_a_timeout_without_a_deadline_outlives_the_close_but_cannot_be_moved() -> None:
    p = ap.Purgatory("never")
    try:
        for never in (None, math.inf):
            async with p.timeout(never) as scope:
                p.close()  # nothing of this block waits on the wheel: it goes on
                await asyncio.sleep(0)
                with pytest.raises(ap.PurgatoryClosed):
                    scope.reschedule(asyncio.get_running_loop().time() - 1)
                with pytest.raises(ap.PurgatoryClosed):
                    scope.reschedule(asyncio.get_running_loop().time() + 1)
            p = ap.Purgatory("never")
    finally:
        await p.aclose()
