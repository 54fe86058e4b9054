"""Wheel-backed timeouts: purgatory.timeout / timeout_at / call_later / sleep.

Timing semantics run on a ManualClock (virtual time, exact instants); composition with
asyncio.timeout, TaskGroup and anyio's scopes runs on real loops (asyncio and uvloop,
through the anyio_backend fixture of conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aiopurgatory as ap
from aiopurgatory.timeouts import Timeout, TimerHandle

from ..support.interpreters import ids, interpreters

pytestmark = pytest.mark.anyio

TimeoutFactory = Callable[[float | None], AbstractAsyncContextManager[Any]]

TICK = 0.001


@asynccontextmanager
async def virtual(start: float = 0.0) -> AsyncIterator[tuple[ap.Purgatory, ap.ManualClock]]:
    clock = ap.ManualClock(start)
    async with ap.Purgatory("t", clock=clock) as purgatory:
        yield purgatory, clock


async def steps(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def outcome(
    body: Callable[[TimeoutFactory], Awaitable[None]], impl: str
) -> tuple[str, int, int]:
    """How ``body`` ends in a task of its own with our timeouts or asyncio's.

    The exception type, then the task's ``cancelling()`` count at the end of the body
    and after it: the scenarios compare ours with asyncio's rather than with fixed
    values, since asyncio's own bookkeeping differs between Python versions.
    """
    async with ap.Purgatory("diff") as p:
        factory: TimeoutFactory = p.timeout if impl == "wheel" else asyncio.timeout
        counts: list[int] = []

        async def run() -> None:
            task = asyncio.current_task()
            assert task is not None
            try:
                await body(factory)
            finally:
                counts.append(task.cancelling())

        task = asyncio.create_task(run())
        try:
            await task
            ending = "returned"
        except BaseException as exc:
            ending = type(exc).__name__
        return ending, counts[0], task.cancelling()


async def block_forever(timeout: Timeout) -> str:
    async with timeout:
        await asyncio.Event().wait()
    return "unreachable"


# -- timeout: timing on virtual time ------------------------------------------------------


async def test_timeout_raises_at_its_deadline_and_not_before() -> None:
    async with virtual(start=100.0) as (p, clock):
        timeout = p.timeout(1.0)
        assert timeout.when() == 101.0
        task = asyncio.create_task(block_forever(timeout))
        await clock.advance(0.999)
        assert not task.done()
        assert not timeout.expired()
        await clock.advance(0.001)
        await steps()
        assert task.done()
        with pytest.raises(TimeoutError):
            task.result()
        assert timeout.expired()
        assert task.cancelling() == 0  # our cancel request was taken back
        assert repr(timeout) == "<Timeout [expired]>"


async def test_block_that_finishes_in_time_leaves_nothing_on_the_wheel() -> None:
    async with virtual() as (p, clock):
        async with p.timeout(5.0) as timeout:
            assert p.stats.timed == 1
            await clock.advance(4.0)
        assert not timeout.expired()
        assert p.stats.timed == 0
        assert clock.pending_wakeups() == 0
        await clock.advance(10.0)  # nothing fires later either
        assert repr(timeout) == "<Timeout [finished]>"


async def test_an_entry_has_no_deadline_until_it_is_on_the_wheel() -> None:
    # Compiled, the entries skip TimerTask.__init__ and set the "not timed" NaN
    # themselves: a missed field would read 0.0 here instead of None.
    async with virtual(10.0) as (p, _):
        timeout = p.timeout(5.0)
        assert timeout.deadline is None
        async with timeout:
            assert timeout.deadline == pytest.approx(15.0, abs=1e-9)
        assert p.call_later(0, print).deadline is None  # due now: never on the wheel
        handle = p.call_later(1.0, print)
        assert handle.deadline == pytest.approx(11.0, abs=1e-9)
        handle.cancel()


async def test_none_means_no_deadline() -> None:
    async with virtual() as (p, clock):
        timeout = p.timeout(None)
        assert timeout.when() is None
        task = asyncio.create_task(block_forever(timeout))
        await clock.advance(1e9)
        assert not task.done()
        assert p.stats.timed == 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_timeout_at_uses_the_purgatory_clock() -> None:
    async with virtual(start=-50.0) as (p, clock):
        timeout = p.timeout_at(-49.5)
        task = asyncio.create_task(block_forever(timeout))
        await clock.advance(0.4999)
        assert not task.done()
        await clock.advance(0.0001 + TICK)
        await steps()
        with pytest.raises(TimeoutError):
            task.result()


async def test_past_deadline_expires_at_the_next_iteration_not_inside_the_block() -> None:
    async with virtual(start=10.0) as (p, _):
        # No await inside: asyncio's rule is that nothing is cancelled then.
        async with p.timeout_at(5.0) as timeout:
            pass
        assert not timeout.expired()
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
        await asyncio.sleep(0)  # no stray cancellation arrives later

        with pytest.raises(TimeoutError):
            async with p.timeout(0):
                await asyncio.sleep(0)


async def test_reschedule_moves_the_deadline_both_ways() -> None:
    async with virtual() as (p, clock):
        timeout = p.timeout(1.0)
        task = asyncio.create_task(block_forever(timeout))
        await steps()
        timeout.reschedule(3.0)
        assert timeout.when() == 3.0
        await clock.advance(2.0)
        assert not task.done()
        timeout.reschedule(None)
        await clock.advance(5.0)
        assert not task.done()
        assert p.stats.timed == 0
        timeout.reschedule(clock.time() + 0.5)
        await clock.advance(0.5)
        await steps()
        with pytest.raises(TimeoutError):
            task.result()
        with pytest.raises(RuntimeError, match="Cannot change state of expired Timeout"):
            timeout.reschedule(None)


async def test_reschedule_before_entering_or_after_exit_is_an_error() -> None:
    async with virtual() as (p, _):
        timeout = p.timeout(1.0)
        with pytest.raises(RuntimeError, match="has not been entered"):
            timeout.reschedule(2.0)
        async with timeout:
            with pytest.raises(ValueError, match="clock time"):
                timeout.reschedule(math.nan)
        with pytest.raises(RuntimeError, match="Cannot change state of finished Timeout"):
            timeout.reschedule(2.0)
        with pytest.raises(RuntimeError, match="already been entered"):
            async with timeout:
                pass


async def test_nested_timeouts_the_inner_one_expires() -> None:
    async with virtual() as (p, clock):

        async def body() -> str:
            async with p.timeout(10.0) as outer:
                try:
                    async with p.timeout(1.0):
                        await asyncio.Event().wait()
                except TimeoutError:
                    assert not outer.expired()
                    return "inner"
            return "none"

        task = asyncio.create_task(body())
        await clock.advance(1.0)
        await steps()
        assert task.result() == "inner"


async def test_nested_timeouts_the_outer_one_expires_through_the_inner() -> None:
    async with virtual() as (p, clock):
        inner: list[Timeout] = []

        async def body() -> None:
            async with p.timeout(1.0), p.timeout(10.0) as t:
                inner.append(t)
                await asyncio.Event().wait()

        task = asyncio.create_task(body())
        await clock.advance(1.0)
        await steps()
        with pytest.raises(TimeoutError):
            task.result()
        assert not inner[0].expired()  # the inner block let the CancelledError through
        assert p.stats.timed == 0


async def test_an_outside_cancel_wins_over_an_expiry() -> None:
    async with virtual() as (p, clock):
        timeout = p.timeout(1.0)
        task = asyncio.create_task(block_forever(timeout))
        await steps()
        # The deadline passes (it expires at the next iteration) and the caller cancels,
        # before the task runs again.
        timeout.reschedule(clock.time() - 1)
        task.cancel()
        await steps()
        assert timeout.expired()
        assert task.cancelled()  # CancelledError, not TimeoutError: not ours alone


async def test_cancel_requested_before_the_block_behaves_as_asyncio() -> None:
    async def body(timeout: TimeoutFactory) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # a pending request, delivered at the first await below
        async with timeout(0):
            await asyncio.sleep(1)

    assert await outcome(body, "wheel") == await outcome(body, "asyncio")


async def test_timeout_outside_a_task_is_an_error() -> None:
    async with virtual() as (p, _):
        timeout = p.timeout(1.0)
        loop = asyncio.get_running_loop()
        caught: asyncio.Future[BaseException] = loop.create_future()

        def enter_from_a_callback() -> None:  # a loop callback runs in no task
            coro = timeout.__aenter__()
            try:
                coro.send(None)
            except BaseException as exc:
                caught.set_result(exc)

        loop.call_soon(enter_from_a_callback)
        error = await caught
        assert isinstance(error, RuntimeError)
        assert "inside a task" in str(error)


async def test_a_nan_delay_is_rejected() -> None:
    # Negative delays are accepted, as asyncio accepts them (tests/core/test_timer_edges.py).
    async with virtual() as (p, _):
        with pytest.raises(ValueError, match="not NaN"):
            p.timeout(math.nan)
        with pytest.raises(ValueError, match="not NaN"):
            p.call_later(math.nan, print)
        with pytest.raises(ValueError, match="not NaN"):
            await p.sleep(math.nan)
        assert p.stats.timed == 0


@pytest.mark.parametrize("bad", ["1", True, b"1", [1]])
async def test_delays_that_are_not_numbers_are_rejected(bad: Any) -> None:
    async with virtual() as (p, _):
        with pytest.raises(TypeError, match="number of seconds"):
            p.timeout(bad)
        with pytest.raises(TypeError, match="clock time"):
            p.timeout_at(bad)
        with pytest.raises(TypeError, match="number of seconds"):
            p.call_later(bad, print)
        with pytest.raises(TypeError, match="callable"):
            p.call_later(1, "print")  # type: ignore[arg-type]


async def test_timeout_at_nan_is_rejected() -> None:
    async with virtual() as (p, _):
        with pytest.raises(ValueError, match="clock time"):
            p.timeout_at(math.nan)


@pytest.mark.parametrize("delay", [math.inf, 1e300, 2.0**60])
async def test_huge_delays_never_fire(delay: float) -> None:
    async with virtual() as (p, clock):
        timeout = p.timeout(delay)
        task = asyncio.create_task(block_forever(timeout))
        fired: list[int] = []
        handle = p.call_later(delay, fired.append, 1)
        await clock.advance(1e12)
        clock.jump(1e9)
        await clock.advance(1)
        assert not task.done()
        assert fired == []
        timeout.reschedule(clock.time() + 1)
        await clock.advance(1)
        await steps()
        with pytest.raises(TimeoutError):
            task.result()
        handle.cancel()
        assert p.stats.timed == 0


# -- call_later and sleep ------------------------------------------------------------------


async def test_call_later_runs_at_its_deadline_with_its_args() -> None:
    async with virtual(start=7.0) as (p, clock):
        calls: list[tuple[float, str]] = []
        handle = p.call_later(0.25, lambda tag: calls.append((clock.time(), tag)), "a")
        assert isinstance(handle, TimerHandle)
        assert handle.when() == 7.25
        await clock.advance(0.2499)
        assert calls == []
        await clock.advance(0.0001)
        assert calls == [(7.25, "a")]
        assert not handle.cancelled()
        assert p.stats.timed == 0


async def test_call_later_cancel() -> None:
    async with virtual() as (p, clock):
        calls: list[int] = []
        handle = p.call_later(1, calls.append, 1)
        handle.cancel()
        handle.cancel()  # idempotent
        assert handle.cancelled()
        assert "cancelled" in repr(handle)
        assert p.stats.timed == 0
        await clock.advance(5)
        assert calls == []


async def test_call_later_zero_runs_in_the_next_iteration_and_can_be_cancelled() -> None:
    async with virtual() as (p, _):
        calls: list[int] = []
        p.call_later(0, calls.append, 1)
        assert calls == []  # never inside call_later itself
        p.call_later(0, calls.append, 2).cancel()
        await steps(1)
        assert calls == [1]


async def test_call_later_runs_in_the_callers_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="outer")
    async with virtual() as (p, clock):
        seen: list[str] = []
        var.set("caller")
        p.call_later(1, lambda: seen.append(var.get()))
        ctx = contextvars.Context()
        p._wheel_timeouts().call_later(1, lambda: seen.append(var.get()), context=ctx)
        await clock.advance(1)
        assert seen == ["caller", "outer"]


async def test_call_later_callback_errors_go_to_the_loop_handler() -> None:
    async with virtual() as (p, clock):
        loop = asyncio.get_running_loop()
        reports: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, ctx: reports.append(ctx))
        calls: list[int] = []
        try:
            p.call_later(1, lambda: 1 / 0)
            p.call_later(1, calls.append, 2)
            await clock.advance(1)
        finally:
            loop.set_exception_handler(None)
        assert calls == [2]  # the next callback still ran
        assert len(reports) == 1
        assert isinstance(reports[0]["exception"], ZeroDivisionError)
        assert reports[0]["message"].startswith("Exception in callback")


async def test_sleep_returns_its_result_at_the_deadline() -> None:
    async with virtual() as (p, clock):
        task: asyncio.Task[str] = asyncio.create_task(p.sleep(2.0, "done"))
        await clock.advance(1.999)
        assert not task.done()
        await clock.advance(0.001)
        assert await task == "done"
        assert await p.sleep(0) is None
        assert p.stats.timed == 0


async def test_cancelled_sleep_leaves_the_wheel() -> None:
    async with virtual() as (p, clock):
        task: asyncio.Task[None] = asyncio.create_task(p.sleep(2.0))
        await steps()
        assert p.stats.timed == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert p.stats.timed == 0
        assert clock.pending_wakeups() == 0


async def test_close_finishes_what_waits_on_the_wheel() -> None:
    clock = ap.ManualClock()
    p = ap.Purgatory("t", clock=clock)
    calls: list[int] = []
    handle = p.call_later(1, calls.append, 1)
    sleeper: asyncio.Task[None] = asyncio.create_task(p.sleep(1))
    blocked = asyncio.create_task(block_forever(p.timeout(1)))
    await steps()
    await p.aclose()
    await steps()
    with pytest.raises(ap.PurgatoryClosed):
        sleeper.result()
    with pytest.raises(ap.PurgatoryClosed):
        blocked.result()
    assert handle.cancelled()
    await clock.advance(5)
    assert calls == []
    with pytest.raises(ap.PurgatoryClosed):
        p.timeout(1)


# -- the model: never early, never (more than a tick) late ---------------------------------


@settings(max_examples=60, deadline=None)
@given(
    start=st.floats(-1e6, 1e6, allow_nan=False),
    delays=st.lists(
        st.tuples(st.sampled_from(["timeout", "call_later", "sleep"]), st.floats(0, 5)),
        min_size=1,
        max_size=12,
    ),
    advances=st.lists(st.floats(0, 2), min_size=1, max_size=8),
    cancels=st.sets(st.integers(0, 11), max_size=4),
)
def test_model_fires_each_at_or_after_its_deadline(
    start: float,
    delays: list[tuple[str, float]],
    advances: list[float],
    cancels: set[int],
) -> None:
    async def scenario() -> None:
        async with virtual(start) as (p, clock):
            fired: dict[int, float] = {}
            deadlines: dict[int, float] = {}
            tasks: list[asyncio.Task[None]] = []
            handles: dict[int, TimerHandle] = {}
            for i, (kind, delay) in enumerate(delays):
                if kind == "call_later":
                    handles[i] = h = p.call_later(
                        delay, lambda i=i: fired.setdefault(i, clock.time())
                    )
                    deadlines[i] = h.when()
                    continue
                t = p.timeout(delay)
                deadlines[i] = clock.time() + delay if kind == "sleep" else t.when()  # type: ignore[assignment]

                async def run(
                    i: int = i, kind: str = kind, delay: float = delay, t: Timeout = t
                ) -> None:
                    if kind == "sleep":
                        await p.sleep(delay)
                        fired[i] = clock.time()
                        return
                    try:
                        await block_forever(t)
                    except TimeoutError:
                        fired[i] = clock.time()

                tasks.append(asyncio.create_task(run()))
            await steps()
            for i in cancels & set(handles):
                handles[i].cancel()
            for step in advances:
                await clock.advance(step)
                await steps()
                now = clock.time()
                for i, deadline in deadlines.items():
                    if i in fired:
                        assert fired[i] >= deadline, "early"
                    elif i not in (cancels & set(handles)):
                        # Due by a whole tick: must have fired (the tick grid of the
                        # timer has its origin at the clock's start).
                        assert deadline > now - 2 * TICK, (i, deadline, now)
            for task in tasks:
                task.cancel()
            for handle in handles.values():
                handle.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            assert p.stats.timed == 0

    asyncio.run(scenario())


# -- composition on real loops (asyncio and uvloop) ----------------------------------------


async def test_real_timeout_fires_never_early() -> None:
    async with ap.Purgatory("real") as p:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            async with p.timeout(0.02) as timeout:
                await asyncio.sleep(1)
        assert loop.time() >= timeout.when()  # type: ignore[operator]
        assert loop.time() - start < 0.5
        t0 = loop.time()
        assert await p.sleep(0.01, 5) == 5
        # Compared as the timer compares (clock >= start + delay), not by subtracting:
        # uvloop's clock counts whole milliseconds, and 16935.37 - 16935.36 is 0.01
        # less an ulp.
        assert loop.time() >= t0 + 0.01


async def test_composes_with_asyncio_timeout_both_ways() -> None:
    async with ap.Purgatory("real") as p:
        scopes: list[Any] = []

        async def asyncio_outside() -> None:
            async with asyncio.timeout(0.01) as outer, p.timeout(5) as ours:
                scopes[:] = [outer, ours]
                await asyncio.sleep(5)

        async def ours_outside() -> None:
            async with p.timeout(0.01) as ours, asyncio.timeout(5) as inner:
                scopes[:] = [ours, inner]
                await asyncio.sleep(5)

        for scenario in (asyncio_outside, ours_outside):
            with pytest.raises(TimeoutError):
                await scenario()
            outer, inner = scopes
            assert outer.expired()
            assert not inner.expired()  # it let the outer one's cancellation through
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def child(name: str, cancelled: list[str]) -> None:
    try:
        await asyncio.sleep(5)
    except asyncio.CancelledError:
        cancelled.append(name)
        raise


async def test_composes_with_a_task_group() -> None:
    async with ap.Purgatory("real") as p:
        cancelled: list[str] = []

        async def scenario() -> None:
            async with p.timeout(0.02), asyncio.TaskGroup() as group:
                group.create_task(child("a", cancelled))
                group.create_task(child("b", cancelled))

        with pytest.raises(TimeoutError):
            await scenario()
        assert sorted(cancelled) == ["a", "b"]


async def boom() -> None:
    raise ValueError("boom")


async def group_expires(timeout: TimeoutFactory) -> None:
    async with timeout(0.02), asyncio.TaskGroup() as group:
        group.create_task(child("a", []))


async def group_child_fails(timeout: TimeoutFactory) -> None:
    async with timeout(5), asyncio.TaskGroup() as group:
        group.create_task(boom())
        group.create_task(child("c", []))


async def group_inside_expires(timeout: TimeoutFactory) -> None:
    async with asyncio.TaskGroup() as group:
        group.create_task(child("d", []))
        async with timeout(0.02):
            await asyncio.sleep(5)


async def nested_outer_expires(timeout: TimeoutFactory) -> None:
    async with timeout(0.02), timeout(5):
        await asyncio.sleep(5)


async def nested_inner_caught(timeout: TimeoutFactory) -> None:
    async with timeout(5):
        with contextlib.suppress(TimeoutError):
            async with timeout(0.01):
                await asyncio.sleep(5)
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    "body",
    [
        group_expires,
        group_child_fails,
        group_inside_expires,
        nested_outer_expires,
        nested_inner_caught,
    ],
)
async def test_ends_as_asyncio_timeout_does(
    body: Callable[[TimeoutFactory], Awaitable[None]],
) -> None:
    assert await outcome(body, "wheel") == await outcome(body, "asyncio")


def chain(exc: BaseException | None) -> list[str]:
    """The types along ``exc``'s context chain, and where a cause differs from it."""
    names: list[str] = []
    while exc is not None:
        cause = exc.__cause__
        names.append(type(exc).__name__ + ("" if cause in (None, exc.__context__) else "!"))
        exc = exc.__context__
    return names


async def crash_in_finally(timeout: TimeoutFactory) -> None:
    async with timeout(0.01):
        try:
            await asyncio.sleep(5)
        finally:
            1 / 0  # noqa: B018  # a cleanup that fails after the expiry


async def crash_in_a_child_of_a_group(timeout: TimeoutFactory) -> None:
    async def crash() -> None:
        try:
            await asyncio.sleep(5)
        finally:
            1 / 0  # noqa: B018

    async with timeout(0.01), asyncio.TaskGroup() as group:
        group.create_task(crash())
        await asyncio.sleep(5)


@pytest.mark.parametrize("body", [crash_in_finally, crash_in_a_child_of_a_group])
async def test_a_foreign_exception_chains_as_this_pythons_asyncio_does(
    body: Callable[[TimeoutFactory], Awaitable[None]],
) -> None:
    # 3.13 puts a TimeoutError (caused by the CancelledError) into the context chain of
    # an exception other than the CancelledError leaving an expired block, and into
    # each of a TaskGroup's; 3.11 and 3.12 do not. Ours does what the running one does.
    async with ap.Purgatory("chain") as p:
        chains = []
        for factory in (p.timeout, asyncio.timeout):
            with pytest.raises(BaseException) as caught:  # noqa: PT011  # compared below
                await body(factory)
            error = caught.value
            members = error.exceptions if isinstance(error, BaseExceptionGroup) else ()
            chains.append((chain(error), [chain(m) for m in members]))
        assert chains[0] == chains[1]
        if sys.version_info >= (3, 13):
            assert "TimeoutError" in str(chains[0])


async def test_composes_with_anyio_scopes() -> None:
    async with ap.Purgatory("real") as p:

        async def ours_inside() -> None:
            async with p.timeout(5):
                await anyio.sleep(5)

        async def ours_expires() -> None:
            async with p.timeout(0.01):
                await anyio.sleep(5)

        with anyio.move_on_after(0.01) as scope:
            await ours_inside()
        assert scope.cancelled_caught

        with anyio.move_on_after(5) as scope:
            with pytest.raises(TimeoutError):
                await ours_expires()
        assert not scope.cancelled_caught

        with pytest.raises(TimeoutError), anyio.fail_after(0.01):
            await ours_inside()
        assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_call_later_on_a_real_loop() -> None:
    async with ap.Purgatory("real") as p:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[float] = loop.create_future()
        handle = p.call_later(0.01, lambda: done.set_result(loop.time()))
        assert await done >= handle.when()


def test_the_guides_example_runs_as_printed() -> None:
    # It was the README's; the docs' getting-started page has it now.
    readme = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.DOTALL)
    example = next(block for block in blocks if "purgatory.timeout(0.05)" in block)
    done = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done timed out\ncalled\nslept\n"


# -- CPython's own suites, on each supported interpreter installed -------------------------

ROOT = Path(__file__).resolve().parents[2]
INTERPRETERS = interpreters()


@pytest.mark.parametrize("python", INTERPRETERS, ids=ids(INTERPRETERS))
def test_cpython_timeout_suites_pass_on_the_wheel_timeouts(tmp_path: Path, python: str) -> None:
    """CPython's own ``test_timeouts`` of ``python`` (this interpreter, and each other
    supported one installed: there the pure-Python build, as extensions are built for
    this one), with ``asyncio.timeout`` and ``timeout_at`` swapped for a purgatory's;
    from 3.12 on its ``test_waitfor`` too, as ``asyncio.wait_for`` is built on
    ``asyncio.timeout`` there (3.11's arms a loop handle of its own)."""
    version = subprocess.run(
        [python, "-c", "import sys; print(*sys.version_info[:2])"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    suites = ["test_timeouts"]
    if (int(version[0]), int(version[1])) >= (3, 12):
        suites.append("test_waitfor")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    if python != sys.executable:
        env["AIOPURGATORY_NO_EXTENSIONS"] = "1"

    def run(out: Path, names: list[str]) -> dict[str, Any]:
        done = subprocess.run(
            [python, "-m", "tests.support.asyncio_suites", "timeouts", str(out), *names],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert out.exists(), f"the run crashed:\n{done.stderr[-3000:]}"
        record: dict[str, Any] = json.loads(out.read_text())
        return record

    record = run(tmp_path / "timeouts", suites)
    outcomes: dict[str, str] = record["outcomes"]
    for suite in suites:  # every suite ran (a module that fails to import runs nothing)
        assert sum(f".{suite}." in t for t in outcomes) >= 15, (suite, outcomes)
    assert record["used"]["timeouts"] >= 30  # the swap took...
    assert record["used"]["expired"] >= 15  # ...and the wheel expired them
    # Both suites hold timing tests (a sleep against a deadline) that a loaded machine
    # can fail: a failed test runs again alone, twice at most; its last outcome counts.
    for attempt in range(2):
        again = [t for t, o in outcomes.items() if o in ("fail", "error")]
        if not again:
            break
        names = [t.removeprefix("test.test_asyncio.") for t in again]
        outcomes.update(run(tmp_path / f"again-{attempt}", names)["outcomes"])
    assert {t: o for t, o in outcomes.items() if o not in ("pass", "skip")} == {}
