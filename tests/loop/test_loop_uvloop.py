"""aiopurgatory.loop on uvloop: asyncio's timer semantics, the timers on the wheel.

The probes that hold on both bases (the handle's API, cancel, context=, exceptions to
the handler) run on both in tests/loop/test_loop.py (its ``any_loop`` fixture); these are
uvloop's own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from aiopurgatory import loop as apl

uvloop = pytest.importorskip("uvloop")


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = apl.new_event_loop(uvloop.Loop)
    try:
        yield lp
    finally:
        lp.close()


def spread(
    lp: asyncio.AbstractEventLoop, seed: int, batches: int = 20, per_batch: int = 100
) -> list[tuple[float, float, int]]:
    """``batches * per_batch`` timers 0.1-20 ms away, armed in batches with the loop
    running: (when, loop.time() at run, call order) of each, in the order they ran."""
    rng = random.Random(seed)
    fired: list[tuple[float, float, int]] = []

    def fire(w: float, n: int) -> None:
        fired.append((w, lp.time(), n))

    async def main() -> None:
        for batch in range(batches):
            for i in range(per_batch):
                w = lp.time() + rng.uniform(0.0001, 0.02)
                lp.call_at(w, fire, w, batch * per_batch + i)
            await asyncio.sleep(rng.uniform(0, 0.002))
        await asyncio.sleep(0.05)

    lp.run_until_complete(asyncio.wait_for(main(), 10))
    return fired


def test_is_a_uvloop_loop(loop: asyncio.AbstractEventLoop) -> None:
    assert isinstance(loop, uvloop.Loop)
    assert apl.is_wheel_loop(loop)
    assert not isinstance(loop, asyncio.BaseEventLoop)  # asyncio's code is not mixed in
    assert apl.wheel_loop_class(uvloop.Loop) is type(loop)  # one class per base
    assert apl.loop_factory(uvloop.Loop) is type(loop)
    stock = uvloop.new_event_loop()
    assert not apl.is_wheel_loop(stock)
    stock.close()


def test_a_subclass_of_uvloop_is_a_base_too() -> None:
    class MyLoop(uvloop.Loop):  # type: ignore[misc, name-defined]
        pass

    lp = apl.new_event_loop(MyLoop)
    try:
        assert isinstance(lp, MyLoop)
        h = lp.call_later(10, print)
        assert isinstance(h, apl.TimerHandle)
        assert lp.wheel_timers() == 1
    finally:
        lp.close()


def test_never_early_and_deadline_order(loop: asyncio.AbstractEventLoop) -> None:
    fired = spread(loop, seed=45)
    assert len(fired) == 2000
    assert [f for f in fired if f[1] < f[0]] == []  # 0 early by loop.time()
    runs = [(w, n) for w, _, n in fired]
    assert runs == sorted(runs)  # deadline order, ties in call order


def test_stock_uvloop_runs_timers_early() -> None:
    """The fact the wheel loop fixes: uvloop rounds a delay to whole milliseconds
    (round(), and from a cached clock), so some timers run before their when."""
    lp = uvloop.new_event_loop()
    try:
        fired = spread(lp, seed=45)
    finally:
        lp.close()
    assert len(fired) == 2000
    early = [f for f in fired if f[1] < f[0]]
    assert len(early) > 20, len(early)  # measured: about 40 % of them
    assert max(w - t for w, t, _ in early) <= 0.0011  # up to about 1 ms early


def test_due_in_one_pass_run_in_deadline_order(loop: asyncio.AbstractEventLoop) -> None:
    order: list[str] = []
    now = loop.time()
    for name, when in [("c", now - 1), ("a", now - 5), ("d1", now), ("b", now - 2), ("d2", now)]:
        loop.call_at(when, order.append, name)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert order == ["a", "b", "c", "d1", "d2"]


def test_sub_millisecond_deadlines_are_not_rounded(loop: asyncio.AbstractEventLoop) -> None:
    """A 0.1 ms timer runs at the clock's next millisecond, not a tick or more later."""
    lateness: list[float] = []

    def on_time(w: float, done: asyncio.Future[None]) -> None:
        lateness.append(loop.time() - w)
        done.set_result(None)

    async def main() -> None:
        for _ in range(50):
            w = loop.time() + 0.0001
            done = loop.create_future()
            loop.call_at(w, on_time, w, done)
            await done

    loop.run_until_complete(asyncio.wait_for(main(), 10))
    assert min(lateness) >= 0
    assert sorted(lateness)[25] < 0.01  # median: under a ms of uvloop's clock, idle


def test_a_callback_cancels_another_due_one(loop: asyncio.AbstractEventLoop) -> None:
    ran: list[int] = []
    now = loop.time()
    later: list[asyncio.TimerHandle] = []

    def first() -> None:
        ran.append(1)
        later[0].cancel()

    loop.call_at(now - 2, first)
    later.append(loop.call_at(now - 1, ran.append, 2))  # due in the same pass
    loop.call_at(now - 1, ran.append, 3)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert ran == [1, 3]


def test_a_callback_schedules_a_timer_already_due(loop: asyncio.AbstractEventLoop) -> None:
    """It runs, in a later pass, and a callback that re-arms itself in the past does
    not starve the rest of the loop."""
    ran: list[str] = []

    def again(n: int) -> None:
        ran.append(f"again{n}")
        if n < 5:
            loop.call_at(loop.time() - 1, again, n + 1)
            loop.call_soon(ran.append, f"soon{n}")

    loop.call_at(loop.time() - 1, again, 0)
    loop.run_until_complete(asyncio.sleep(0.02))
    assert [r for r in ran if r.startswith("again")] == [f"again{n}" for n in range(6)]
    assert set(ran) >= {f"soon{n}" for n in range(5)}
    assert ran.index("soon0") < ran.index("again5")  # call_soon ran between passes


def test_base_exception_in_a_callback_loses_no_timer(loop: asyncio.AbstractEventLoop) -> None:
    ran: list[str] = []

    def boom() -> None:
        ran.append("boom")
        raise KeyboardInterrupt

    now = loop.time()
    loop.call_at(now - 0.003, ran.append, "a")
    loop.call_at(now - 0.002, boom)
    loop.call_at(now - 0.001, ran.append, "b")  # due in the same pass as boom
    loop.call_at(now + 0.005, ran.append, "c")
    with pytest.raises(KeyboardInterrupt):
        loop.run_until_complete(asyncio.sleep(1))
    loop.run_until_complete(asyncio.sleep(0.02))
    assert ran == ["a", "boom", "b", "c"]
    assert loop.wheel_timers() == 1  # type: ignore[attr-defined]  # the first sleep's
    loop.run_until_complete(asyncio.sleep(0))


def test_close_drops_the_timers() -> None:
    lp = apl.new_event_loop(uvloop.Loop)
    lp.call_later(10, print)
    lp.call_at(lp.time() - 1, print)
    assert lp.wheel_timers() == 2
    lp.close()
    assert lp.wheel_timers() == 0
    with pytest.raises(RuntimeError, match="closed"):
        lp.call_later(1, print)
    with pytest.raises(RuntimeError, match="closed"):
        lp.call_at(1, print)


def test_timeout_wait_for_and_sleep_with_a_runner() -> None:
    async def main() -> tuple[bool, float, int]:
        lp = asyncio.get_running_loop()
        t0 = lp.time()
        async with asyncio.timeout(0.005):
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10), 0.005)
        await asyncio.wait_for(asyncio.sleep(0.001), 1)
        pending = lp.wheel_timers()  # type: ignore[attr-defined]
        return apl.is_wheel_loop(lp) and isinstance(lp, uvloop.Loop), lp.time() - t0, pending

    with asyncio.Runner(loop_factory=apl.loop_factory(uvloop.Loop)) as runner:
        ok, took, pending = runner.run(main())
    assert ok
    assert 0.011 - 1e-6 <= took < 5  # loop.time() is a float of milliseconds
    assert pending == 0  # every cancelled timer left the wheel


def test_install_with_asyncio_run() -> None:
    async def main() -> bool:
        await asyncio.sleep(0.001)
        lp = asyncio.get_running_loop()
        return apl.is_wheel_loop(lp) and isinstance(lp, uvloop.Loop)

    apl.install(uvloop.Loop)
    try:
        assert asyncio.run(main())
    finally:
        asyncio.set_event_loop_policy(None)


def test_tcp_echo_over_loopback(loop: asyncio.AbstractEventLoop) -> None:
    """uvloop's I/O is untouched: a server and a client on a free loopback port, with
    timeouts (on the wheel) around every read."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def main() -> bytes:
        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        got = b""
        for i in range(100):
            line = b"line %d\n" % i
            writer.write(line)
            async with asyncio.timeout(5):
                got += await reader.readline()
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return got

    got = loop.run_until_complete(asyncio.wait_for(main(), 20))
    assert got == b"".join(b"line %d\n" % i for i in range(100))


def test_debug_mode(loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture) -> None:
    """A slow timer callback is logged under its own name in debug mode (asyncio's
    checks and the source tracebacks are tests/loop/test_loop.py's, on both bases)."""
    loop.set_debug(True)

    def slow_timer_callback() -> None:
        time.sleep(0.03)

    loop.slow_callback_duration = 0.01
    fired: list[int] = []
    loop.call_later(0.001, slow_timer_callback)
    loop.call_later(0.002, fired.append, 1)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        loop.run_until_complete(asyncio.sleep(0.05))
    assert fired == [1]
    slow = [r.getMessage() for r in caplog.records if "slow_timer_callback" in r.getMessage()]
    assert len(slow) == 1, caplog.text
    assert slow[0].startswith("Executing <TimerHandle when=")


def test_debug_mode_refuses_another_thread(loop: asyncio.AbstractEventLoop) -> None:
    import threading

    loop.set_debug(True)
    errors: list[BaseException] = []

    async def main() -> None:
        def other() -> None:
            try:
                loop.call_later(1, print)
            except RuntimeError as exc:
                errors.append(exc)

        t = threading.Thread(target=other)
        t.start()
        await loop.run_in_executor(None, t.join)

    loop.run_until_complete(main())
    assert len(errors) == 1
    assert "Non-thread-safe" in str(errors[0])


class Pinger:
    def ping(self) -> None:
        pass


def test_timer_stats_by_owner(loop: asyncio.AbstractEventLoop) -> None:
    pinger = Pinger()
    now = loop.time()
    loop.call_at(now + 20, pinger.ping)
    loop.call_at(now + 10, pinger.ping)
    loop.call_at(now + 5, print).cancel()  # cancelled: not counted
    loop.call_at(now - 1, print)  # due: in the near heap until the loop runs
    stats = loop.timer_stats()  # type: ignore[attr-defined]
    assert stats.count == 3 == loop.wheel_timers()  # type: ignore[attr-defined]
    assert stats.owners == (
        apl.OwnerTimers(f"{__name__}.Pinger.ping", 2, now + 10, now + 20),
        apl.OwnerTimers("builtins.print", 1, now - 1, now - 1),
    )


def test_the_core_does_not_import_uvloop() -> None:
    code = (
        "import sys, asyncio\n"
        "from aiopurgatory import loop\n"
        "lp = loop.new_event_loop()\n"
        "lp.run_until_complete(asyncio.sleep(0.001))\n"
        "lp.close()\n"
        "assert 'uvloop' not in sys.modules, 'uvloop imported'\n"
        "assert 'aiopurgatory._loop_uv' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
