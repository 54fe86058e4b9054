"""aiopurgatory.loop: asyncio's timer semantics with the timers on the wheel."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import gc
import json
import os
import random
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiopurgatory import loop as apl

from ..support.interpreters import ids, interpreters

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = apl.new_event_loop()
    try:
        yield lp
    finally:
        lp.close()


@pytest.fixture(params=["asyncio", "uvloop"])
def any_loop(request: pytest.FixtureRequest) -> Iterator[asyncio.AbstractEventLoop]:
    """A wheel loop on each base: the probes that hold on both (uvloop's own ones are in
    tests/loop/test_loop_uvloop.py)."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        lp = apl.new_event_loop(uvloop.Loop)
    else:
        lp = apl.new_event_loop()
    try:
        yield lp
    finally:
        lp.close()


def base_timers(lp: asyncio.AbstractEventLoop) -> list[object]:
    """What the base loop's heap holds besides the wheel's one alarm."""
    return [h for h in lp._scheduled if not isinstance(h, apl._Alarm)]  # type: ignore[attr-defined]


def test_is_a_base_loop(loop: asyncio.AbstractEventLoop) -> None:
    assert isinstance(loop, asyncio.SelectorEventLoop)
    assert isinstance(loop, asyncio.BaseEventLoop)
    assert apl.is_wheel_loop(loop)
    stock = asyncio.SelectorEventLoop()
    assert not apl.is_wheel_loop(stock)
    stock.close()
    assert apl.wheel_loop_class() is type(loop)  # one class per base


def test_bad_bases_are_refused() -> None:
    with pytest.raises(TypeError, match="BaseEventLoop"):
        apl.new_event_loop(int)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"uvloop\.Loop"):
        apl.loop_factory(asyncio.AbstractEventLoop)
    with pytest.raises(TypeError, match="event loop class"):
        apl.loop_factory("uvloop.Loop")  # type: ignore[arg-type]
    # uvloop is a base (tests/loop/test_loop_uvloop.py), found without importing it here.
    uvloop = pytest.importorskip("uvloop")
    lp = apl.loop_factory(uvloop.Loop)()
    assert isinstance(lp, uvloop.Loop)
    lp.close()


def test_timer_handle_api(any_loop: asyncio.AbstractEventLoop) -> None:
    loop = any_loop
    ctx = contextvars.copy_context()
    h = loop.call_at(loop.time() + 10, print, "x", context=ctx)
    assert isinstance(h, asyncio.TimerHandle)
    assert h.when() == h._when  # type: ignore[attr-defined]
    # The repr is this Python's asyncio's: 3.13 leaves arguments out of debug mode.
    stock = asyncio.TimerHandle(h.when(), print, ("x",), loop, context=ctx)
    assert repr(h) == repr(stock)
    assert repr(h).startswith(f"<TimerHandle when={h.when()} print(")
    assert not h.cancelled()
    h.cancel()
    assert h.cancelled()
    assert repr(h).startswith("<TimerHandle cancelled when=")
    h2 = loop.call_later(5, print)
    assert h2.when() >= loop.time() + 4
    # Stock uvloop returns a plain Handle with no when() for delays under 1 ms.
    h3 = loop.call_later(0.0001, print)
    assert isinstance(h3, asyncio.TimerHandle)
    assert h3.when() == pytest.approx(loop.time() + 0.0001, abs=0.01)
    with pytest.raises(TypeError, match="when cannot be None"):
        loop.call_at(None, print)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delay must not be None"):
        loop.call_later(None, print)  # type: ignore[arg-type]


def test_fast_handles_set_every_field_as_asyncio_does(loop: asyncio.AbstractEventLoop) -> None:
    """call_later fills a handle's slots itself outside debug mode: every slot of
    asyncio's classes (this Python's) must be set, to what asyncio's __init__ sets."""
    slots = {
        name
        for cls in apl.TimerHandle.__mro__
        for name in getattr(cls, "__slots__", ())
        if name != "__weakref__"
    }
    assert slots == set(apl.HANDLE_FIELDS)
    ctx = contextvars.copy_context()
    fast = loop.call_later(10, print, 1, context=ctx)
    slow = asyncio.TimerHandle(fast.when(), print, (1,), loop, ctx)
    for name in sorted(slots - {"_entry", "_scheduled"}):
        assert getattr(fast, name) == getattr(slow, name), name
    assert fast._scheduled  # type: ignore[attr-defined]
    assert fast == slow
    no_ctx = loop.call_later(10, print)
    assert isinstance(no_ctx._context, contextvars.Context)  # type: ignore[attr-defined]


def test_never_early_and_deadline_order(loop: asyncio.AbstractEventLoop) -> None:
    rng = random.Random(45)
    fired: list[tuple[float, float, int]] = []  # (when, time at run, call order)

    def fire(w: float, n: int) -> None:
        fired.append((w, loop.time(), n))

    async def main() -> None:
        for batch in range(20):
            for i in range(100):
                w = loop.time() + rng.uniform(0.0001, 0.03)  # after every fired one
                loop.call_at(w, fire, w, batch * 100 + i)
            await asyncio.sleep(rng.uniform(0, 0.002))
        await asyncio.sleep(0.05)

    loop.run_until_complete(main())
    assert len(fired) == 2000
    assert [f for f in fired if f[1] < f[0]] == []  # 0 early by loop.time()
    runs = [(w, n) for w, _, n in fired]
    assert runs == sorted(runs)  # deadline order, ties in call order


def test_due_in_one_iteration_run_in_deadline_order(loop: asyncio.AbstractEventLoop) -> None:
    order: list[str] = []
    now = loop.time()
    # Scheduled out of order, some far in the past, two equal deadlines: all due at once.
    for name, when in [("c", now - 1), ("a", now - 5), ("d1", now), ("b", now - 2), ("d2", now)]:
        loop.call_at(when, order.append, name)
    loop.call_soon(order.append, "soon")  # the ready queue's own order is untouched
    loop.run_until_complete(asyncio.sleep(0.01))
    assert order == ["soon", "a", "b", "c", "d1", "d2"]


def test_wake_never_later_than_earliest_deadline(loop: asyncio.AbstractEventLoop) -> None:
    """Sub-tick deadlines are not rounded up: the base loop's only timer (the alarm)
    asks for a wake-up at or before every pending deadline."""
    rng = random.Random(7)

    async def main() -> None:
        for _ in range(300):
            w = loop.time() + rng.choice([0.0001, 0.0004, 0.0009, 0.003, 0.2, 70.0, 5000.0])
            loop.call_at(w, lambda: None)
            heap = loop._scheduled  # type: ignore[attr-defined]
            assert len(heap) == 1
            assert isinstance(heap[0], apl._Alarm)
            assert heap[0]._when <= w
            await asyncio.sleep(rng.uniform(0, 0.001))

    loop.run_until_complete(main())


def test_cancel_frees_the_entry_at_once(any_loop: asyncio.AbstractEventLoop) -> None:
    loop = any_loop

    class Owner:
        def cb(self) -> None:
            raise AssertionError("a cancelled timer ran")

    owners = [Owner() for _ in range(1000)]
    refs = [weakref.ref(o) for o in owners]
    handles = [loop.call_later(1 + i / 1000, o.cb) for i, o in enumerate(owners)]
    assert loop.wheel_timers() == 1000  # type: ignore[attr-defined]
    on_asyncio = isinstance(loop, asyncio.BaseEventLoop)
    if on_asyncio:
        assert base_timers(loop) == []  # the base heap holds no wheel timer
    del owners
    for h in handles:
        h.cancel()
    assert loop.wheel_timers() == 0  # type: ignore[attr-defined]
    assert len(loop._wheel_timers) == 0  # type: ignore[attr-defined]
    if on_asyncio:
        assert loop._timer_cancelled_count == 0  # type: ignore[attr-defined]  # no tombstones
    gc.disable()
    try:
        assert all(r() is None for r in refs)  # freed by refcount at cancel()
    finally:
        gc.enable()
    loop.run_until_complete(asyncio.sleep(0.05))


def test_cancel_in_the_near_heap_never_runs(loop: asyncio.AbstractEventLoop) -> None:
    ran: list[int] = []
    now = loop.time()
    h1 = loop.call_at(now - 1, ran.append, 1)  # due: straight to the near heap
    loop.call_at(now - 1, ran.append, 2)
    h1.cancel()
    loop.run_until_complete(asyncio.sleep(0))
    loop.run_until_complete(asyncio.sleep(0.005))
    assert ran == [2]


def test_context(any_loop: asyncio.AbstractEventLoop) -> None:
    loop = any_loop
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="none")
    ctx = contextvars.copy_context()
    ctx.run(var.set, "inside")
    seen: list[str] = []
    loop.call_later(0.001, lambda: seen.append(var.get()), context=ctx)
    loop.call_later(0.001, lambda: seen.append(var.get()))
    loop.run_until_complete(asyncio.sleep(0.01))
    assert seen == ["inside", "none"]


def test_coroutine_function_refused_in_debug_mode(any_loop: asyncio.AbstractEventLoop) -> None:
    loop = any_loop

    async def coro() -> None:
        pass

    loop.set_debug(True)
    with pytest.raises(TypeError, match="coroutines cannot be used with call_at"):
        loop.call_at(loop.time() + 1, coro)
    # asyncio's call_later goes through call_at and names it, on the base loop too.
    with pytest.raises(TypeError, match="coroutines cannot be used with call_at"):
        loop.call_later(1, coro)


def test_debug_source_traceback_ends_at_the_callers_line(
    any_loop: asyncio.AbstractEventLoop,
) -> None:
    loop = any_loop
    loop.set_debug(True)
    line = sys._getframe().f_lineno + 1
    h = loop.call_later(1, print)
    tb = h._source_traceback  # type: ignore[attr-defined]
    assert tb[-1][:3] == (__file__, line, sys._getframe().f_code.co_name)
    line = sys._getframe().f_lineno + 1
    h2 = loop.call_at(loop.time() + 1, print)
    assert h2._source_traceback[-1][1] == line  # type: ignore[attr-defined]


def test_exception_in_callback_goes_to_the_handler(any_loop: asyncio.AbstractEventLoop) -> None:
    loop = any_loop
    caught: list[dict[str, object]] = []
    loop.set_exception_handler(lambda lp, c: caught.append(c))
    h = loop.call_later(0.001, lambda: 1 / 0)
    ran: list[int] = []
    loop.call_later(0.001, ran.append, 1)  # the timers due with it still run
    loop.run_until_complete(asyncio.sleep(0.01))
    assert len(caught) == 1
    assert isinstance(caught[0]["exception"], ZeroDivisionError)
    assert caught[0]["handle"] is h
    assert ran == [1]


def test_close_drops_the_timers() -> None:
    lp = apl.new_event_loop()
    lp.call_later(10, print)
    lp.call_at(lp.time() - 1, print)
    lp.close()
    assert lp.wheel_timers() == 0
    with pytest.raises(RuntimeError, match="closed"):
        lp.call_later(1, print)


def test_loop_factory_with_runner() -> None:
    async def main() -> tuple[bool, float]:
        lp = asyncio.get_running_loop()
        t0 = lp.time()
        async with asyncio.timeout(0.005):
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(10)
        await asyncio.wait_for(asyncio.sleep(0.001), 1)
        return apl.is_wheel_loop(lp), lp.time() - t0

    with asyncio.Runner(loop_factory=apl.loop_factory()) as runner:
        on_wheel, took = runner.run(main())
    assert on_wheel
    assert 0.005 <= took < 5


def test_install_with_asyncio_run() -> None:
    async def main() -> bool:
        await asyncio.sleep(0.001)
        return apl.is_wheel_loop(asyncio.get_running_loop())

    policy = apl.install()
    try:
        assert asyncio.get_event_loop_policy() is policy
        assert asyncio.run(main())
        lp = asyncio.new_event_loop()
        assert apl.is_wheel_loop(lp)
        lp.close()
    finally:
        asyncio.set_event_loop_policy(None)
    assert not asyncio.run(main())


# -- CPython's own suites --------------------------------------------------------------

CI_SUITES = ["test_timeouts", "test_waitfor", "test_tasks", "test_events", "test_taskgroups"]
"""Run on every CI job: the timer-heavy suites (about 35 s per loop, both loops at once)."""

ALL_SUITES = [
    *CI_SUITES,
    "test_base_events", "test_runners", "test_locks", "test_queues", "test_futures",
    "test_futures2", "test_streams", "test_server", "test_pep492", "test_context",
    "test_threads", "test_sock_lowlevel", "test_sendfile", "test_unix_events",
    "test_selector_events", "test_buffered_proto", "test_protocols", "test_transports",
]  # fmt: skip
"""AIOPURGATORY_ASYNCIO_SUITES=all runs these (about 70 s per loop)."""

EXCUSED: dict[str, str] = {}
"""Test ids allowed to differ on the wheel loop, with the reason: only tests reading the
base loop's private timer state (_scheduled, _timer_cancelled_count, _run_once). Empty
on 3.11.7, 3.12.1 and 3.13.0: the tests reading them build base_events.BaseEventLoop
directly, which stays the base loop in both runs (the selector loop and the
virtual-time TestLoop are swapped)."""


INTERPRETERS = interpreters()


@pytest.mark.parametrize("python", INTERPRETERS, ids=ids(INTERPRETERS))
def test_cpython_asyncio_suites_on_the_wheel_loop(tmp_path: Path, python: str) -> None:
    """CPython's own suites of ``python`` (this interpreter, and each other supported one
    installed: there the pure-Python build, as extensions are built for this one)."""
    suites = ALL_SUITES if os.environ.get("AIOPURGATORY_ASYNCIO_SUITES") == "all" else CI_SUITES
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    if python != sys.executable:
        env["AIOPURGATORY_NO_EXTENSIONS"] = "1"
    procs = {
        mode: subprocess.Popen(
            [python, "-m", "tests.support.asyncio_suites", mode, str(tmp_path / mode), *suites],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        for mode in ("stock", "wheel")
    }  # fmt: skip
    for mode, proc in procs.items():
        _, err = proc.communicate(timeout=600)
        assert (tmp_path / mode).exists(), f"{mode} run crashed:\n{err[-3000:]}"
    stock = json.loads((tmp_path / "stock").read_text())
    wheel = json.loads((tmp_path / "wheel").read_text())
    assert wheel["used"]["loops"] > 100  # the swap took
    assert wheel["used"]["wakeups"] > 10
    assert wheel["used"]["test_loops"] > 100  # the suites' virtual-time TestLoop too
    s, w = stock["outcomes"], wheel["outcomes"]
    assert len(s) > 900
    assert s.keys() == w.keys()
    # The suites hold timing tests (a sleep against a deadline) that a loaded CI machine
    # can fail on either loop: a test that differs, or fails on the stock loop, runs
    # again alone on both, twice at most, one loop at a time; its last outcomes count.
    for attempt in range(2):
        again = [t for t in s if (s[t] != w[t] and t not in EXCUSED) or s[t] in ("fail", "error")]
        if not again:
            break
        names = [t.removeprefix("test.test_asyncio.") for t in again]
        for mode, outcomes in (("stock", s), ("wheel", w)):
            out = tmp_path / f"{mode}-again-{attempt}"
            subprocess.run(
                [python, "-m", "tests.support.asyncio_suites", mode, str(out), *names],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                timeout=600, check=False,
            )  # fmt: skip
            if out.exists():
                outcomes.update(json.loads(out.read_text())["outcomes"])
    differ = {t: (s[t], w[t]) for t in s if s[t] != w[t] and t not in EXCUSED}
    assert differ == {}
    assert [t for t, o in s.items() if o in ("fail", "error")] == []  # the judge is sound


class Pinger:
    def ping(self) -> None:
        pass


def plain() -> None:
    pass


async def sleeper() -> None:
    await asyncio.sleep(100)


async def under_timeout() -> None:
    async with asyncio.timeout(50):
        await asyncio.Event().wait()


async def under_wait_for() -> None:
    await asyncio.wait_for(asyncio.Event().wait(), 70)


def test_timer_stats_by_owner(loop: asyncio.AbstractEventLoop) -> None:
    pinger = Pinger()
    now = loop.time()
    loop.call_at(now + 20, pinger.ping)
    loop.call_at(now + 10, pinger.ping)
    loop.call_at(now + 5, functools.partial(functools.partial(plain)))
    loop.call_at(now + 6, plain).cancel()  # cancelled: not counted
    tasks = [loop.create_task(f()) for f in (sleeper, under_timeout, under_wait_for)]
    loop.run_until_complete(asyncio.sleep(0.01))  # each task reaches its timer
    loop.call_at(now - 1, plain)  # overdue: in the near heap, not on the wheel
    timers = loop._wheel_timers  # type: ignore[attr-defined]
    assert len(timers) - len(timers._wheel) == 1
    stats = loop.timer_stats()  # type: ignore[attr-defined]
    assert isinstance(stats, apl.TimerStats)
    assert stats.count == 7 == loop.wheel_timers()  # type: ignore[attr-defined]
    rows = {row.owner: row for row in stats.owners}
    here = __name__
    assert rows[f"{here}.Pinger.ping"] == apl.OwnerTimers(
        f"{here}.Pinger.ping", 2, now + 10, now + 20
    )
    assert rows[f"{here}.plain"].count == 2
    assert rows[f"{here}.plain"].next_when == now - 1
    # asyncio's own callbacks resolve to the task's coroutine that asked for them.
    for name in ("sleeper", "under_timeout", "under_wait_for"):
        assert rows[f"{here}.{name}"].count == 1, stats
    assert sorted(rows) == sorted(
        f"{here}.{n}"
        for n in ("Pinger.ping", "plain", "sleeper", "under_timeout", "under_wait_for")
    )
    assert stats.owners[0].count == 2  # most timers first
    assert stats.time >= now
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    assert loop.timer_stats().owners[0].owner == f"{here}.Pinger.ping"  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.count = 0  # type: ignore[misc]


class MyTask(asyncio.Task):  # type: ignore[type-arg]
    """A Task subclass outside asyncio: its owner is still per task (its coroutine)."""

    def ping(self) -> None:
        pass


def test_timer_stats_resolves_each_task_of_a_task_subclass(
    loop: asyncio.AbstractEventLoop,
) -> None:
    async def first() -> None:
        await asyncio.sleep(0)

    async def second() -> None:
        await asyncio.sleep(0)

    tasks = [MyTask(first(), loop=loop), MyTask(second(), loop=loop)]
    now = loop.time()
    for task in tasks:
        loop.call_at(now + 10, task.ping)  # a method of each task: per task, not per class
    stats = loop.timer_stats()  # type: ignore[attr-defined]
    assert sorted(row.owner for row in stats.owners) == [
        f"{__name__}.test_timer_stats_resolves_each_task_of_a_task_subclass.<locals>.first",
        f"{__name__}.test_timer_stats_resolves_each_task_of_a_task_subclass.<locals>.second",
    ]
    loop.run_until_complete(asyncio.gather(*tasks))


def test_timer_owner_fallbacks() -> None:
    assert apl.timer_owner(print) == "builtins.print"
    assert apl.timer_owner([].append).endswith("builtins.list.append")
    # An asyncio function whose future nobody awaits: the function itself.
    fut: asyncio.Future[None] = asyncio.Future(loop=asyncio.new_event_loop())
    assert apl.timer_owner(asyncio.futures._set_result_unless_cancelled, (fut,)) == (  # type: ignore[attr-defined]
        "asyncio.futures._set_result_unless_cancelled"
    )
    fut.get_loop().close()


def test_the_compiled_build_fills_handles_at_their_slots() -> None:
    """The compiled hot path writes a handle's slots at their offsets; it must find every
    one (else it silently falls back to setattr, a third slower)."""
    import aiopurgatory
    from aiopurgatory import looptimers

    if not aiopurgatory.COMPILED:
        pytest.skip("pure-Python build: attributes are assigned")
    assert looptimers._OFFSETS is not None
    assert len(set(looptimers._OFFSETS)) == len(apl.HANDLE_FIELDS)


def test_call_later_reads_the_loops_clock(any_loop: asyncio.AbstractEventLoop) -> None:
    """On asyncio's loop the compiled build reads CLOCK_MONOTONIC itself for a float
    delay (no time.monotonic call): ``when`` is still ``any_loop.time() + delay``, between
    two reads of it, for a float delay and for the generic path (an int)."""
    for delay in (12.5, 7, 0.0, 1e-9):
        before = any_loop.time()
        when = any_loop.call_later(delay, print).when()
        after = any_loop.time()
        assert before + delay <= when <= after + delay, delay
    with pytest.raises(TypeError):
        any_loop.call_later("1", print)  # type: ignore[arg-type]  # as asyncio: float + str


def test_the_timers_store_is_in_a_slot_of_the_loop_class(
    any_loop: asyncio.AbstractEventLoop,
) -> None:
    """call_later reads ``_wheel_timers`` per timer: the wheel-loop class keeps it in a
    slot (no instance dict search); a base that cannot take one still works."""
    from aiopurgatory._loop_wheel import _wheel_class

    assert "_wheel_timers" not in getattr(any_loop, "__dict__", {})
    assert "_wheel_timers" in type(any_loop).__dict__["__slots__"]
    plain = _wheel_class("NoSlots", (int,), {})  # variable-size base: no slot possible
    assert "__slots__" not in plain.__dict__
    assert plain(3) == 3


def test_a_cancelled_entry_is_reused_only_when_no_one_holds_it(
    any_loop: asyncio.AbstractEventLoop,
) -> None:
    """The compiled cancel keeps an unlinked entry for the store's next timer, but only
    when its frame holds the last reference: an entry someone kept stays as cancel left
    it, whatever is scheduled after, and every timer still runs once, in order."""
    ran: list[int] = []
    first = any_loop.call_later(100.0, ran.append, -1)
    held = first._entry  # type: ignore[attr-defined]
    assert held is not None
    first.cancel()
    later = [any_loop.call_later(0.001 * (n % 7), ran.append, n) for n in range(50)]
    for handle in later[::3]:
        handle.cancel()
    again = [any_loop.call_later(0.001 * (n % 5), ran.append, 100 + n) for n in range(20)]
    assert held.handle is None
    assert held._bucket is None
    assert all(h._entry is not held for h in later + again)  # type: ignore[attr-defined]
    any_loop.run_until_complete(asyncio.sleep(0.05))
    expected = [h for h in later + again if not h.cancelled()]
    assert sorted(ran) == sorted(h._args[0] for h in expected)
    whens = {h._args[0]: h.when() for h in expected}
    assert [whens[n] for n in ran] == sorted(whens[n] for n in ran)
    assert any_loop.wheel_timers() == 0  # type: ignore[attr-defined]


def test_handles_hold_and_release_exactly_their_references(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Whatever writes the slots (the compiled build writes them at their offsets), a
    timer that is cancelled, or that runs, gives back every reference it took."""

    class Callback:
        def __call__(self, *args: object) -> None:
            pass

    callback, arg = Callback(), object()
    ctx = contextvars.copy_context()
    before = [sys.getrefcount(x) for x in (callback, arg, ctx, loop)]
    for _ in range(1000):
        loop.call_later(100, callback, arg, context=ctx).cancel()
        loop.call_at(loop.time() + 100, callback, arg, context=ctx).cancel()
    handles = [loop.call_later(0, callback, arg, context=ctx) for _ in range(1000)]
    loop.run_until_complete(asyncio.sleep(0.01))
    assert all(not h.cancelled() for h in handles)
    del handles
    assert [sys.getrefcount(x) for x in (callback, arg, ctx, loop)] == before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
# 3.12+ warns when forking a process with threads (a test runner may have some); the
# child here only runs its own loop and exits.
@pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")
def test_fork_with_timers_pending(loop: asyncio.AbstractEventLoop) -> None:
    """A child forked while the parent's wheel loop holds timers makes its own wheel loop
    and runs its timers; closing the inherited loop there leaves the parent's alone."""
    fired: list[str] = []
    loop.call_later(0.05, fired.append, "parent")
    far = loop.call_later(300, fired.append, "never")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            loop.close()  # the inherited copy: its timers go with it

            async def child() -> str:
                await asyncio.sleep(0.02)
                async with asyncio.timeout(5):
                    await asyncio.sleep(0.01)
                return "wheel" if apl.is_wheel_loop(asyncio.get_running_loop()) else "stock"

            with asyncio.Runner(loop_factory=apl.loop_factory()) as runner:
                os.write(write, runner.run(child()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        assert f.read() == "wheel"
    assert os.waitstatus_to_exitcode(status) == 0
    loop.run_until_complete(asyncio.sleep(0.1))
    assert fired == ["parent"]
    assert not far.cancelled()
    assert loop.wheel_timers() == 1  # type: ignore[attr-defined]
