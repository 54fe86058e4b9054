"""The registration fast path (issue 28): one clock read, asyncio's clock in C, and the
loop-running check without a Python call, each as correct as what it replaced."""

from __future__ import annotations

import asyncio
import time

import pytest
import uvloop

import aiopurgatory as ap
from aiopurgatory.testing import ManualClock
from aiopurgatory.timer import Timer

from ..support.helpers import Flag, watchdog

pytestmark = pytest.mark.anyio


async def test_timer_now_reads_the_loops_clock() -> None:
    """Compiled on asyncio, now() reads CLOCK_MONOTONIC in C: the same clock as the loop."""
    loop = asyncio.get_running_loop()
    timer = Timer(loop)
    try:
        for _ in range(1000):
            before = loop.time()
            now = timer.now()
            after = loop.time()
            assert before <= now <= after
        if type(loop).time is asyncio.BaseEventLoop.time:
            before = time.monotonic()
            now = timer.now()
            assert before <= now <= time.monotonic()
    finally:
        timer.close()


async def test_registration_times_from_its_start_and_never_fires_early() -> None:
    loop = asyncio.get_running_loop()
    async with ap.Purgatory("p") as p:
        ops = [p.try_complete_else_watch(Flag(0.02), ["k"]) for _ in range(50)]
        for op in ops:
            assert op.created is not None
            assert op.deadline == pytest.approx(op.created + 0.02, abs=1e-9)
            assert op.created <= loop.time()
        with watchdog(5.0):
            await asyncio.gather(*ops)
        now = loop.time()
        for op in ops:
            assert op.outcome is ap.Outcome.EXPIRED
            assert op.deadline is not None
            assert op.deadline <= now


async def test_a_timeout_that_passes_inside_try_complete_expires_next_pass() -> None:
    """Registration reads the clock once, before try_complete: a timeout that runs out
    while try_complete runs expires by the timer's next tick (late, never early); a
    timeout of 0 still expires inside the call."""
    clock = ManualClock()

    class Slow(Flag):
        def try_complete(self) -> bool:
            clock.jump(2.0)  # the check takes two seconds of the clock's time
            return super().try_complete()

    async with ap.Purgatory("p", clock=clock) as p:
        op = p.try_complete_else_watch(Slow(1.0), ["k"])
        assert op.created is not None
        assert op.deadline == op.created + 1.0
        assert not op.done() or op.outcome is ap.Outcome.EXPIRED
        await clock.advance(0.001)  # the wheel's next tick after the clock's now
        assert op.outcome is ap.Outcome.EXPIRED
        assert op.expirations == 1
        assert op.completions == 1
        assert p.num_delayed() == 0
        assert p.watched() == 0
        at_once = p.try_complete_else_watch(Slow(0.0), ["k"])
        assert at_once.outcome is ap.Outcome.EXPIRED


def _use_after_the_loop_stopped(loop: asyncio.AbstractEventLoop) -> None:
    p = ap.Purgatory("p")

    async def register() -> Flag:
        return p.try_complete_else_watch(Flag(None), ["k"])

    try:
        op = loop.run_until_complete(register())
        assert not op.done()
        # The loop has stopped (not closed): the purgatory must refuse, as before.
        with pytest.raises(RuntimeError, match="outside any event loop"):
            p.check_and_complete("k")
        with pytest.raises(RuntimeError, match="outside any event loop"):
            p.try_complete_else_watch(Flag(None), ["k"])

        async def again() -> int:
            return p.check_and_complete("k")

        assert loop.run_until_complete(again()) == 0  # running again: usable again
        p.close()
    finally:
        loop.close()


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_a_stopped_loop_is_refused_as_before(kind: str) -> None:
    loop = asyncio.new_event_loop() if kind == "asyncio" else uvloop.new_event_loop()
    _use_after_the_loop_stopped(loop)
