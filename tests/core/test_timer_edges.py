"""Hardening, round two (issue 25 items 7-10, issue 30 item 3): virtual time that
skips nothing, the timer's horizon, far deadlines in traces, negative timeouts as
asyncio has them, and waiting for code under test to park.

Every test named ``test_*_issue*`` failed (or hung) on the code before the change,
but for the ``plain`` case of the ASGI one: a bare app parks in the request task's
first step, which the old ``advance`` did run; it stays as the control of the
``cancel-on-disconnect`` case, whose handler runs in a task of its own and hung.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pyarrow.dataset as ds
import pytest

import aiopurgatory as ap
from aiopurgatory.asgi import CancelOnDisconnect, Receive, Scope, Send
from aiopurgatory.testing import ManualClock, parked, settle
from aiopurgatory.timer import MAX_TICK, Timer, TimerTask
from aiopurgatory.trace import TraceRecorder

from ..support.helpers import watchdog

pytestmark = pytest.mark.anyio

MIN_TICK = 1e-6  # the documented smallest tick (aiopurgatory.timer.MIN_TICK)


@asynccontextmanager
async def virtual(start: float = 0.0) -> AsyncIterator[tuple[ap.Purgatory, ManualClock]]:
    clock = ManualClock(start)
    async with ap.Purgatory("t", clock=clock) as purgatory:
        yield purgatory, clock


class Recorder(TimerTask):
    __slots__ = ("clock", "fired_at")

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.fired_at: list[float] = []

    def _timer_fired(self) -> None:
        self.fired_at.append(self.clock.time())


# -- item 7: advance runs every timer due, also those armed after more awaits ---------


async def more_awaits(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.mark.parametrize("extra", [1, 2, 10])
@pytest.mark.parametrize("wait", ["timeout", "sleep", "operation"])
async def test_advance_sees_every_successive_wait_issue25_7(wait: str, extra: int) -> None:
    with watchdog():
        async with virtual() as (p, clock):
            seen: list[float] = []

            async def worker() -> None:
                while True:
                    if wait == "timeout":
                        with contextlib.suppress(TimeoutError):
                            async with p.timeout(1.0):
                                await asyncio.Event().wait()
                    elif wait == "sleep":
                        await p.sleep(1.0)
                    else:
                        assert not await p.wait_for(["k"], lambda: False, 1.0)
                    seen.append(clock.time())
                    await more_awaits(extra)  # once more (or more) before it waits again

            task = asyncio.create_task(worker())
            await clock.advance(3.5)
            assert seen == [1.0, 2.0, 3.0]
            assert clock.time() == 3.5
            await clock.advance(0.5)
            assert seen == [1.0, 2.0, 3.0, 4.0]
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_advance_follows_a_chain_through_tasks_and_callbacks_issue25_7() -> None:
    """A fire that wakes a task, which starts another task, which a plain callback
    wakes, which then waits again: every hop is followed."""
    with watchdog():
        async with virtual() as (p, clock):
            seen: list[float] = []
            loop = asyncio.get_running_loop()

            async def hop() -> None:
                ready = loop.create_future()
                loop.call_soon(ready.set_result, None)
                await ready
                await p.sleep(1.0)
                seen.append(clock.time())

            async def worker() -> None:
                for _ in range(3):
                    await asyncio.create_task(hop())

            task = asyncio.create_task(worker())
            await clock.advance(10.0)
            assert seen == [1.0, 2.0, 3.0]
            assert task.done()


async def test_advance_runs_timers_at_their_instants_on_a_bare_timer_issue25_7() -> None:
    clock = ManualClock()
    timer = Timer(clock)
    fired: list[float] = []

    class Again(Recorder):
        __slots__ = ()

        def _timer_fired(self) -> None:
            fired.append(self.clock.time())
            # Re-armed by a task two loop passes later, as a handler would.
            asyncio.get_running_loop().call_soon(asyncio.ensure_future, rearm(self))

    async def rearm(task: Again) -> None:
        await asyncio.sleep(0)
        timer.add(task, 0.25)

    timer.add(Again(clock), 0.25)
    with watchdog():
        await clock.advance(1.1)
    assert fired == [0.25, 0.5, 0.75, 1.0]
    timer.close()
    await timer.wait_closed()


async def test_a_loop_that_never_goes_idle_does_not_hang_advance() -> None:
    clock = ManualClock(max_passes=50)
    stop = False

    async def spin() -> None:
        while not stop:  # noqa: ASYNC110 - busy on purpose: the loop is never idle
            await asyncio.sleep(0)

    spinner = asyncio.create_task(spin())
    timer = Timer(clock)
    task = Recorder(clock)
    timer.add(task, 1.0)
    with watchdog():
        assert await clock.settle() is False
        assert await settle(max_passes=50) is False
        await clock.advance(2.0)
    assert task.fired_at == [1.0]
    stop = True
    await spinner
    assert await clock.settle() is True
    assert await settle() is True
    timer.close()
    await timer.wait_closed()


async def test_settle_does_not_wait_for_real_time() -> None:
    sleeper = asyncio.create_task(asyncio.sleep(60))
    with watchdog(5.0):
        assert await settle() is True
    assert not sleeper.done()
    sleeper.cancel()


def test_manual_clock_checks_max_passes() -> None:
    with pytest.raises(ValueError, match="max_passes"):
        ManualClock(max_passes=0)
    with pytest.raises(TypeError, match="max_passes"):
        ManualClock(max_passes=1.5)  # type: ignore[arg-type]


# -- item 8: no tick whose horizon is short ---------------------------------------------


@pytest.mark.parametrize("tick", [1e-9, 5e-7, math.nextafter(MIN_TICK, 0.0)])
def test_a_tick_with_a_short_horizon_is_refused_issue25_8(tick: float) -> None:
    with pytest.raises(ValueError, match=r"tick must be at least 1e-06 s .*stop firing after"):
        Timer(ManualClock(), tick=tick)
    with pytest.raises(ValueError, match=repr(tick)):
        ap.Purgatory("p", tick=tick)


async def test_the_smallest_tick_fires_on_time_up_to_its_horizon() -> None:
    clock = ManualClock()
    timer = Timer(clock, tick=MIN_TICK)
    assert timer.horizon == MAX_TICK * MIN_TICK
    assert timer.horizon > 142 * 365 * 86400  # documented: 142 years of uptime
    with watchdog():
        # At 52 days (where a 1 ns tick ran out) and just inside the horizon.
        for uptime in [53 * 86400.0, timer.horizon - 10.0]:
            clock.jump(uptime - clock.time())
            task = Recorder(clock)
            timer.add(task, 1.0)
            deadline = clock.time() + 1.0
            await clock.advance(1.0 - 2 * MIN_TICK)
            assert task.fired_at == []
            await clock.advance(3 * MIN_TICK)
            assert task.fired_at
            assert deadline <= task.fired_at[0] <= deadline + 3 * MIN_TICK
        # Beyond the horizon a deadline is far future: pending, cancellable, never fired.
        far = Recorder(clock)
        timer.add(far, 20.0)
        await clock.advance(30.0)
        assert far.fired_at == []
        assert len(timer) == 1
        assert timer.cancel(far)
    timer.close()
    await timer.wait_closed()


# -- item 9: a far deadline costs one row, not a batch --------------------------------


class FakeOp:
    __slots__ = ("created", "deadline", "kind", "num_keys")

    def __init__(self, created: float | None, deadline: float | None) -> None:
        self.kind = "Fake"
        self.num_keys = 1
        self.created = created
        self.deadline = deadline


def read_rows(directory: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = ds.dataset(directory, format="parquet").to_table().to_pylist()
    return sorted(rows, key=lambda row: row["finished_ns"])


@pytest.mark.parametrize("far", [1e12, math.inf, 1e300])
def test_a_far_deadline_costs_nothing_but_its_value_issue25_9(tmp_path: Path, far: float) -> None:
    recorder = TraceRecorder(tmp_path, rows_per_file=1000, clock=lambda: 0.0)
    for i in range(1000):
        t = i * 1e-3
        deadline = t + far if i == 500 else t + 0.5
        op: Any = FakeOp(t, deadline)
        recorder.operation_finished("p", op, ap.Outcome.COMPLETED, t + 0.1)
    recorder.close()  # raised "trace writer failed" before
    assert (recorder.rows_written, recorder.dropped_rows, recorder.files_written) == (1000, 0, 1)
    rows = read_rows(tmp_path)
    assert len(rows) == 1000
    assert rows[500]["deadline_ns"] is None  # too far to record: null, as "none"
    assert rows[500]["created_ns"] == 500_000_000
    assert rows[499]["deadline_ns"] == 999_000_000
    assert rows[501]["deadline_ns"] == 1_001_000_000


def test_a_row_whose_times_cannot_be_recorded_is_dropped_alone(tmp_path: Path) -> None:
    recorder = TraceRecorder(tmp_path, rows_per_file=10, clock=lambda: 0.0)
    for i in range(10):
        t = i * 1.0
        created = 1e12 if i == 3 else t  # a clock other than the recorder's, say
        finished = math.nan if i == 7 else t + 0.5
        op: Any = FakeOp(created, t + 1.0)
        recorder.operation_finished("p", op, ap.Outcome.EXPIRED, finished)
    recorder.close()
    assert (recorder.rows_written, recorder.dropped_rows) == (8, 2)
    created_ns = [row["created_ns"] for row in read_rows(tmp_path)]
    assert created_ns == [i * 1_000_000_000 for i in range(10) if i not in (3, 7)]


def test_a_recorder_clock_too_far_from_zero_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="clock must read"):
        TraceRecorder(tmp_path, clock=lambda: 1e12)
    with pytest.raises(ValueError, match="clock must read"):
        TraceRecorder(tmp_path, clock=lambda: math.nan)


async def test_a_far_deadline_from_a_real_purgatory_is_recorded_issue25_9(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    with TraceRecorder(tmp_path, clock=clock.time) as recorder:
        async with ap.Purgatory("far", clock=clock, observer=recorder) as p:
            far = p.try_complete_else_watch(ap.PredicateOperation(lambda: False, 1e12), ["k"])
            near = p.try_complete_else_watch(ap.PredicateOperation(lambda: False, 1.0), ["k"])
            await clock.advance(1.0)
            assert await near is False
            far.cancel()
    rows = read_rows(tmp_path)
    assert [(row["outcome"], row["deadline_ns"]) for row in rows] == [
        ("expired", 1_000_000_000),
        ("cancelled", None),
    ]


# -- item 10: negative timeouts as asyncio has them --------------------------------------


async def ending(body: Callable[[], Coroutine[Any, Any, None]]) -> str:
    task = asyncio.create_task(body())
    await asyncio.wait([task])
    if task.cancelled():
        return "cancelled"
    error = task.exception()
    if error is None:
        return "ok"
    assert isinstance(error, TimeoutError)
    assert isinstance(error.__cause__, asyncio.CancelledError)
    return "TimeoutError"


PAST = [-0.5, -1e-9, 0, -math.inf]


@pytest.mark.parametrize("delay", PAST)
@pytest.mark.parametrize("awaits", [0, 1])
async def test_a_delay_not_after_now_expires_at_the_next_await_issue25_10(
    delay: float, awaits: int
) -> None:
    async with ap.Purgatory("neg") as p:
        results = {}
        for impl, make in [("asyncio", asyncio.timeout), ("wheel", p.timeout)]:

            async def body(make: Any = make) -> None:
                async with make(delay) as cm:
                    for _ in range(awaits):
                        await asyncio.sleep(0)
                assert cm.expired() is bool(awaits)

            results[impl] = await ending(body)
        assert results["wheel"] == results["asyncio"] == ("TimeoutError" if awaits else "ok")
        assert p.stats.timed == 0


@pytest.mark.parametrize("when", ["past", "-inf"])
async def test_timeout_at_and_reschedule_into_the_past_issue25_10(when: str) -> None:
    async with virtual(start=100.0) as (p, clock):
        deadline = clock.time() - 1.0 if when == "past" else -math.inf

        async def at() -> None:
            async with p.timeout_at(deadline) as cm:
                assert cm.when() == deadline
                await asyncio.sleep(0)

        async def moved() -> None:
            async with p.timeout(10.0) as cm:
                cm.reschedule(deadline)
                assert cm.when() == deadline
                await asyncio.sleep(0)

        async def long_block() -> None:
            async with p.timeout(-5):  # expires at the next await, not later
                await asyncio.Event().wait()

        with watchdog(5.0):
            assert await ending(at) == "TimeoutError"
            assert await ending(moved) == "TimeoutError"
            assert await ending(long_block) == "TimeoutError"
        assert clock.time() == 100.0  # no virtual time needed
        assert p.stats.timed == 0


async def test_cpython_timeout_in_the_past_sleep_zero_issue25_10() -> None:
    # CPython's test_timeouts.test_timeout_in_the_past_sleep_zero, on the wheel.
    async with ap.Purgatory("cpython") as p:
        with pytest.raises(TimeoutError):
            async with p.timeout(-11) as cm:
                await asyncio.sleep(0)
        assert cm.expired()
        with pytest.raises(TimeoutError):
            async with p.timeout(0) as cm:
                await asyncio.sleep(10)
        assert cm.expired()


@pytest.mark.parametrize("delay", [-1, -0.5, -math.inf, 0])
async def test_call_later_and_sleep_with_a_negative_delay_as_asyncio_issue25_10(
    delay: float,
) -> None:
    async with virtual(start=5.0) as (p, clock):
        ran: list[str] = []
        handle = p.call_later(delay, ran.append, "wheel")
        assert ran == []  # never inside call_later, as loop.call_later
        assert handle.when() == clock.time() + delay
        asyncio.get_running_loop().call_later(delay, ran.append, "loop")
        cancelled = p.call_later(delay, ran.append, "cancelled")
        cancelled.cancel()
        for _ in range(3):
            await asyncio.sleep(0)
        assert sorted(ran) == ["loop", "wheel"]
        assert await p.sleep(delay, "slept") == "slept"
        assert p.stats.timed == 0


async def test_nan_stays_an_error() -> None:
    async with virtual() as (p, _):
        with pytest.raises(ValueError, match="nan"):
            p.timeout(math.nan)
        with pytest.raises(ValueError, match="nan"):
            p.timeout_at(math.nan)
        with pytest.raises(ValueError, match="nan"):
            p.call_later(math.nan, print)
        with pytest.raises(ValueError, match="nan"):
            await p.sleep(math.nan)
        async with p.timeout(1.0) as cm:
            with pytest.raises(ValueError, match="nan"):
                cm.reschedule(math.nan)
        assert p.stats.timed == 0


async def test_huge_int_delays_raise_overflow_error_as_asyncio() -> None:
    async with virtual() as (p, _):
        for huge in (10**400, -(10**400)):
            with pytest.raises(OverflowError):
                asyncio.timeout(huge)
            with pytest.raises(OverflowError):
                p.timeout(huge)
            with pytest.raises(OverflowError):
                p.timeout_at(huge)
            with pytest.raises(OverflowError):
                p.call_later(huge, print)
        assert p.stats.timed == 0


# -- issue 30 item 3: virtual time through HTTP -----------------------------------------


def long_poll_app(purgatory: ap.Purgatory) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A bare ASGI app: GET /poll waits 30 s for an event that never comes."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        await receive()
        ready = await purgatory.wait_for(["topic"], lambda: False, 30)
        body = b"ready" if ready else b"timeout"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return app


@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "cancel-on-disconnect"])
async def test_readme_pattern_through_an_asgi_transport_issue30_3(middleware: bool) -> None:
    """ensure_future(request), then advance(30): the handler parks before time moves."""
    async with virtual() as (p, clock):
        app: Any = long_poll_app(p)
        if middleware:  # the handler runs in a task of its own
            app = CancelOnDisconnect(app)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            with watchdog(10.0):
                request = asyncio.ensure_future(client.get("/poll"))
                await clock.advance(30)
                assert request.done()  # hung before: the wait was registered at t = 30
                response = await request
        assert response.text == "timeout"
        assert p.num_delayed() == 0


async def test_parked_then_advance_through_an_asgi_transport() -> None:
    async with virtual() as (p, clock):
        transport = httpx.ASGITransport(app=long_poll_app(p))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            with watchdog(10.0):
                requests = [asyncio.ensure_future(client.get("/poll")) for _ in range(3)]
                await parked(p, 3)
                assert p.num_delayed() == 3
                await clock.advance(29.999)
                assert not any(request.done() for request in requests)
                await clock.advance(0.001)
                assert all(request.done() for request in requests)
                assert [(await r).text for r in requests] == ["timeout"] * 3


async def test_parked_waits_for_a_request_over_a_real_socket() -> None:
    """Over TCP the handler parks after real I/O, which only parked() waits for."""
    async with virtual() as (p, clock):

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readline()
            ready = await p.wait_for(["topic"], lambda: False, 30)
            writer.write(b"ready\n" if ready else b"timeout\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with watchdog(10.0):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"poll\n")
                await writer.drain()
                await parked(p, 1, timeout=5.0)
                await clock.advance(30)
                assert await reader.readline() == b"timeout\n"
                writer.close()
                await writer.wait_closed()
        finally:
            server.close()
            await server.wait_closed()


async def test_parked_gives_up_with_a_clear_error() -> None:
    async with virtual() as (p, _):
        p.try_complete_else_watch(ap.PredicateOperation(lambda: False, 10.0), ["k"])
        message = r"'t' has 1 operation\(s\) parked after 0.05 s, waiting for 2"
        with pytest.raises(TimeoutError, match=message):
            await parked(p, 2, timeout=0.05)
        await parked(p, 1, timeout=0.0)  # already there: no wait at all
    with pytest.raises(RuntimeError, match="closed"):
        await parked(p, 1)
    with pytest.raises(ValueError, match="n must be at least 1"):
        await parked(p, 0)
    with pytest.raises(TypeError, match="n must be an int"):
        await parked(p, 1.5)  # type: ignore[arg-type]
