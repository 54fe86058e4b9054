"""The ``timeouts`` suite: wheel-backed timeouts against asyncio's, at N concurrent.

Three apis, each against what Python code writes without a purgatory:

* ``timeout``: a task woken to leave its scope and enter a new one, under
  ``purgatory.timeout`` (``wheel``) or ``asyncio.timeout`` (``heap``, one handle in the
  loop's heap per deadline);
* ``call_later``: a handle cancelled and another added, ``purgatory.call_later``
  against ``loop.call_later``;
* ``wait_for``: a long-poll waiter, a task awaiting ``purgatory.wait_for`` on a key of
  its own, woken by setting its condition and checking its key, and waiting again.
  ``heap`` is the hand-written equivalent: the task awaits a future under
  ``asyncio.timeout``, and the waker sets the future's result.

Deadlines are 10 to 40 s away and a case lasts a few seconds, so none expires: what is
measured is the cost of arming and disarming deadlines (and for ``wait_for``, of
registering, watching and completing an operation) while N others are pending, which
is what a server pays per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Final

import aiopurgatory as ap

from .common import GcMode, Metrics, Params, uniform_table, warm_up

__all__ = ["DEFAULT_IMPLS", "IMPLS", "timeouts_suite"]

IMPLS: Final = ("wheel", "pure", "heap")
DEFAULT_IMPLS: Final = ("wheel", "heap")

_BATCH: Final = 256


def _delays() -> list[float]:
    return [10.0 + 30.0 * x for x in uniform_table()]


async def _measure(seconds: float, round_: Callable[[int], int]) -> tuple[int, float, float]:
    """Run ``round_`` (then one loop pass) for ``seconds`` after a short warm-up.

    ``round_(start)`` does a batch from index ``start`` and returns the operations done.
    """
    done = await warm_up(round_, _BATCH, seconds)
    count = 0
    rounds = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    end = wall0 + seconds
    while True:
        count += round_(done + rounds * _BATCH)
        rounds += 1
        await asyncio.sleep(0)
        if time.perf_counter() >= end:
            break
    return count, time.perf_counter() - wall0, time.process_time() - cpu0


async def _measure_tasks(
    tasks: list[asyncio.Task[None]], seconds: float, round_: Callable[[int], int], gc_mode: GcMode
) -> tuple[int, float, float]:
    """:func:`_measure` with ``tasks`` waiting (set up, GC mode applied), then end them."""
    gc_mode.after_setup()
    try:
        return await _measure(seconds, round_)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def timeouts_suite(impl: str, params: Params, gc_mode: GcMode) -> Metrics:
    """N deadlines pending; time one ending and one starting (api: timeout or call_later)."""
    loop = asyncio.get_running_loop()
    n = int(params["pending"])
    api = str(params["api"])
    seconds = float(params["seconds"])
    delays = _delays()
    mask = len(delays) - 1
    slots = [int(x * n) for x in uniform_table()[1:] + uniform_table()[:1]]
    purgatory = ap.Purgatory("bench")
    fired = 0

    def on_fire() -> None:
        nonlocal fired
        fired += 1

    wall0 = time.perf_counter()
    if api == "call_later":
        call_later: Callable[..., Any] = purgatory.call_later if impl != "heap" else loop.call_later
        handles = [call_later(delays[i & mask], on_fire) for i in range(n)]
        fill = time.perf_counter() - wall0

        def round_(start: int) -> int:
            for k in range(start, start + _BATCH):
                k &= mask
                slot = slots[k]
                handles[slot].cancel()
                handles[slot] = call_later(delays[k], on_fire)
            return _BATCH

        gc_mode.after_setup()
        count, wall, cpu = await _measure(seconds, round_)
        for handle in handles:
            handle.cancel()
    elif api == "wait_for" and impl != "heap":
        ready = [False] * n

        async def waiter(i: int) -> None:
            nonlocal fired
            keys = (i,)

            def predicate() -> bool:
                return ready[i]

            wait_for = purgatory.wait_for
            k = i
            while True:
                if not await wait_for(keys, predicate, delays[k & mask]):
                    fired += 1
                ready[i] = False
                k += n

        tasks = [loop.create_task(waiter(i)) for i in range(n)]
        await asyncio.sleep(0)  # every waiter registers its first operation
        fill = time.perf_counter() - wall0
        check_and_complete = purgatory.check_and_complete

        def round_(start: int) -> int:
            # Wake a batch of waiters: each one's operation completes here, and in the
            # next loop pass the waiter returns from wait_for and registers another.
            woken = 0
            for k in range(start, start + _BATCH):
                slot = slots[k & mask]
                if not ready[slot]:
                    ready[slot] = True
                    woken += check_and_complete(slot)
            return woken

        count, wall, cpu = await _measure_tasks(tasks, seconds, round_, gc_mode)
    elif api in ("timeout", "wait_for"):  # wait_for's heap: a future under asyncio.timeout
        timeout: Callable[[float], AbstractAsyncContextManager[Any]] = (
            purgatory.timeout if impl != "heap" else asyncio.timeout
        )
        futures: list[asyncio.Future[None]] = [loop.create_future() for _ in range(n)]

        async def worker(i: int) -> None:
            nonlocal fired
            k = i
            while True:
                try:
                    async with timeout(delays[k & mask]):
                        await futures[i]
                except TimeoutError:
                    fired += 1
                futures[i] = loop.create_future()
                k += n

        tasks = [loop.create_task(worker(i)) for i in range(n)]
        await asyncio.sleep(0)  # every worker enters its first scope
        fill = time.perf_counter() - wall0

        def round_(start: int) -> int:
            # Wake a batch of workers: in the next loop pass each one leaves its scope
            # (disarming its deadline) and enters a new one (arming another).
            woken = 0
            for k in range(start, start + _BATCH):
                future = futures[slots[k & mask]]
                if not future.done():
                    future.set_result(None)
                    woken += 1
            return woken

        count, wall, cpu = await _measure_tasks(tasks, seconds, round_, gc_mode)
    else:
        raise ValueError(f"unknown api {api!r}")
    await purgatory.aclose()
    return {
        "ops_per_s": round(count / wall),
        "cpu_us_per_op": round(cpu / count * 1e6, 3) if count else None,
        "fill_us_per_op": round(fill / n * 1e6, 3),
        "ops": count,
        "fired": fired,
    }
