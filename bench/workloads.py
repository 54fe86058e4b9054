"""The workloads of the five suites, written once against :mod:`bench.impls`.

Each suite is an async function ``(impl, params, gc_mode) -> metrics`` run on a fresh
event loop by :mod:`bench.__main__`. Random draws are made before timing starts, from
fixed seeds, so every implementation sees the same operations.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import math
import random
import time
import tracemalloc
from array import array
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Sequence
from typing import Any, Final

from .common import (
    GcMode,
    GcWatch,
    Metrics,
    Params,
    percentile,
    rss_bytes,
    uniform_table,
    warm_up,
)
from .common import voluntary_switches as switches
from .impls import Purgatories, Timers, make_purgatories, make_timers
from .timeouts import timeouts_suite

__all__ = ["SUITES", "SuiteFn"]

SuiteFn = Callable[[str, Params, GcMode], Coroutine[Any, Any, Metrics]]

EARLY_EPSILON: Final = 1e-9
"""Seconds of float rounding tolerated before a fire counts as early."""

_STALL_BAR: Final = 0.005
"""A loop stall longer than this (the ceiling's p99 bar, 5 ms) is counted."""

_TRACED_SAMPLE: Final = 20_000
"""Operations allocated under tracemalloc to count bytes and blocks per operation."""


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _lateness(unsorted: Sequence[float]) -> Metrics:
    """Percentiles of fire time minus deadline, and the fires that came early."""
    if not unsorted:
        names = ("late_p50_ms", "late_p99_ms", "late_p999_ms", "late_max_ms", "early_max_ms")
        return {**dict.fromkeys(names), "early": 0}
    late = sorted(unsorted)
    return {
        "late_p50_ms": _ms(percentile(late, 0.50)),
        "late_p99_ms": _ms(percentile(late, 0.99)),
        "late_p999_ms": _ms(percentile(late, 0.999)),
        "late_max_ms": _ms(late[-1]),
        "early": sum(1 for x in late if x < -EARLY_EPSILON),
        "early_max_ms": _ms(max(-late[0], 0.0)),
    }


async def _traced(fill: Callable[[], Awaitable[None]], count: int) -> Metrics:
    """Bytes, memory blocks and GC-tracked objects per operation that ``fill`` adds."""
    gc.collect()
    objects = len(gc.get_objects())
    tracemalloc.start()
    try:
        await fill()
        snapshot = tracemalloc.take_snapshot()
        traced, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    blocks = sum(stat.count for stat in snapshot.statistics("filename"))
    del snapshot
    gc_objects = len(gc.get_objects()) - objects
    return {
        "bytes_per_op": round(traced / count),
        "blocks_per_op": round(blocks / count, 2),
        "gc_objects_per_op": round(gc_objects / count, 2),
    }


def _steady_draws(n: int) -> tuple[int, list[float], list[int]]:
    """A steady workload at ``n`` pending: the index mask of the draw tables, timeouts
    (uniform 0.1-30 s) and the slot each add/remove pair replaces."""
    uniform = uniform_table()
    timeouts = [0.1 + 29.9 * x for x in uniform]
    slots = [int(x * n) for x in uniform[1:] + uniform[:1]]
    return len(uniform) - 1, timeouts, slots


async def _time_batches(
    run: Callable[[int], None],
    batch: int,
    seconds: float,
    measuring: Callable[[], None],
    *,
    min_count: int = 0,
    max_seconds: float = math.inf,
) -> tuple[int, float, float]:
    """``run(start)`` does ``batch`` operations; warm up for a tenth of ``seconds``,
    call ``measuring()``, then run for ``seconds`` and on until ``min_count``
    operations are done, but never past ``max_seconds``: (operations, wall s, CPU s)."""
    done = await warm_up(run, batch, seconds)
    measuring()
    count = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    end = wall0 + seconds
    hard_end = wall0 + max(seconds, max_seconds)
    while True:
        run(done + count)
        count += batch
        await asyncio.sleep(0)
        t = time.perf_counter()
        if t >= end and (count >= min_count or t >= hard_end):
            break
    return count, time.perf_counter() - wall0, time.process_time() - cpu0


# -- timer: steady add-one / cancel-one at N pending ----------------------------------


async def timer_suite(impl: str, params: Params, gc_mode: GcMode) -> Metrics:
    """N timers pending (timeouts uniform 0.1-30 s); time add-one/cancel-one pairs."""
    loop = asyncio.get_running_loop()
    n = int(params["pending"])
    seconds = float(params["seconds"])
    batch = 256
    mask, timeouts, slots = _steady_draws(n)
    pool: list[Any] = [None] * n
    fired = 0

    def refill(token: int) -> None:  # an expired timer is replaced, keeping N pending
        nonlocal fired
        fired += 1
        pool[token] = timers.add(token, timeouts[token & mask])

    timers: Timers[Any] = make_timers(impl, loop, refill)
    add = timers.add

    async def fill(start: int, stop: int) -> None:
        for i in range(start, stop):
            pool[i] = add(i, timeouts[i & mask])
            if not i % 10_000:
                await asyncio.sleep(0)
        await asyncio.sleep(0)  # tasks take their first step
        await asyncio.sleep(0)

    sample = min(n, _TRACED_SAMPLE)
    memory = await _traced(lambda: fill(0, sample), sample)
    await fill(sample, n)
    gc_mode.after_setup()

    def pairs(start: int) -> None:
        cancel = timers.cancel
        for k in range(start, start + batch):
            k &= mask
            slot = slots[k]
            cancel(pool[slot])
            pool[slot] = add(slot, timeouts[k])

    def measuring() -> None:
        nonlocal fired
        fired = 0

    count, wall, cpu = await _time_batches(pairs, batch, seconds, measuring)
    metrics: Metrics = {
        "ops_per_s": round(count / wall),
        "cpu_ops_per_s": round(count / cpu) if cpu > 0 else None,
        "pairs": count,
        "fired": fired,
        "pending_end": timers.pending(),
        **memory,
    }
    timers.close()
    return metrics


# -- churn: the purgatory at N pending, one key per operation -----------------------


async def churn_suite(impl: str, params: Params, gc_mode: GcMode) -> Metrics:
    """N operations pending, each watching its own key; time register/finish pairs.

    The key is passed as a one-key list, as the documented examples do.

    Each pair finishes one pending operation (alternately completed through its key
    with ``check_and_complete`` and cancelled) and registers a new one in its place
    (timeouts uniform 0.1-30 s), so N stay pending.

    The timed window lasts ``seconds`` and goes on until the pending set has turned
    over ``min_turnovers`` times (pairs >= that many times N: the heap's cancelled
    handles, the wheel's buckets and the collector's older generations then hold what
    a long-running server's do), never past ``max_seconds``. The record gives the
    ``turnovers`` reached (pairs / N) and the collections per generation in the window.
    """
    n = int(params["pending"])
    seconds = float(params["seconds"])
    min_turnovers = float(params.get("min_turnovers", 0.0))
    max_seconds = float(params.get("max_seconds", math.inf))
    batch = 256
    mask, timeouts, slots = _steady_draws(n)
    pool: list[Any] = [None] * n
    tokens = list(range(n))
    ops: Purgatories[Any] = make_purgatories(
        impl, asyncio.get_running_loop(), lambda token, expired: None
    )
    register = ops.register

    async def fill(start: int, stop: int) -> None:
        for i in range(start, stop):
            pool[i] = register(i, [i], timeouts[i & mask])
            if not i % 10_000:
                await asyncio.sleep(0)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    sample = min(n, _TRACED_SAMPLE)
    memory = await _traced(lambda: fill(0, sample), sample)
    await fill(sample, n)
    gc_mode.after_setup()
    next_token = n

    def pairs(start: int) -> None:
        nonlocal next_token
        set_ready, check, cancel = ops.set_ready, ops.check_and_complete, ops.cancel
        token = next_token
        for k in range(start, start + batch):
            k &= mask
            slot = slots[k]
            old = pool[slot]
            if k & 1:
                cancel(old)
            else:
                set_ready(old)
                check(tokens[slot])
            tokens[slot] = token
            pool[slot] = register(token, [token], timeouts[k])
            token += 1
        next_token = token

    watch = GcWatch()
    try:
        count, wall, cpu = await _time_batches(
            pairs,
            batch,
            seconds,
            watch.start,
            min_count=math.ceil(min_turnovers * n),
            max_seconds=max_seconds,
        )
        watch.stop()
    finally:
        watch.close()
    metrics: Metrics = {
        "ops_per_s": round(count / wall),
        "cpu_ops_per_s": round(count / cpu) if cpu > 0 else None,
        "pairs": count,
        "turnovers": round(count / n, 2),
        "window_s": round(wall, 3),
        **watch.metrics(),
        "pending_end": ops.pending(),
        **memory,
    }
    ops.close()
    return metrics


# -- expiry: many deadlines spread over an interval, or one deadline shared ---------


class _Probe:
    """A 1 ms periodic callback; its worst lateness is how long the loop stalled.

    It measures what an expiring operation sees: the time from when a callback was due
    to when the loop ran it, whatever held the loop (a collection inside any callback,
    a long batch of expirations, the completer, another process taking the CPU). The
    loop's own slow-callback report needs asyncio's debug mode, which slows every
    callback and which uvloop does not implement alike. On uvloop, whose timers have
    millisecond resolution, up to about 1 ms of any reading is that rounding.
    """

    __slots__ = ("_due", "_handle", "_loop", "over", "worst")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due = loop.time() + 0.001
        self._handle = loop.call_at(self._due, self._tick)
        self.worst = 0.0
        self.over = 0
        """Stalls longer than :data:`_STALL_BAR` s."""

    def _tick(self) -> None:
        now = self._loop.time()
        late = now - self._due
        if late > self.worst:
            self.worst = late
        if late > _STALL_BAR:
            self.over += 1
        self._due = now + 0.001
        self._handle = self._loop.call_at(self._due, self._tick)

    def reset(self) -> None:
        """Forget what it saw so far (the warm-up)."""
        self.worst = 0.0
        self.over = 0

    def stop(self) -> None:
        self._handle.cancel()


async def expiry_suite(impl: str, params: Params, gc_mode: GcMode) -> Metrics:
    """N timers expiring over ``spread`` seconds, or (``shared``) at one instant."""
    loop = asyncio.get_running_loop()
    now = loop.time
    n = int(params["n"])
    lead = float(params["lead"])
    fired_at = array("d", bytes(8 * n))
    fired = 0
    all_fired = loop.create_future()

    def on_fire(token: int) -> None:
        nonlocal fired
        fired_at[token] = now()
        fired += 1
        if fired == n:
            all_fired.set_result(None)

    timers: Timers[Any] = make_timers(impl, loop, on_fire)
    draws = uniform_table()[:n] if params["pattern"] == "spread" else [0.0] * n
    spread = float(params["spread"])
    base = now() + lead
    targets = [base + spread * x for x in draws]
    late_adds = 0
    for token, target in enumerate(targets):
        timeout = target - now()
        if timeout <= 0:
            late_adds += 1
        timers.add(token, max(timeout, 0.0))
    gc_mode.after_setup()
    cpu0 = time.process_time()
    probe = _Probe(loop)
    await asyncio.wait_for(all_fired, lead + 60.0)
    cpu = time.process_time() - cpu0
    probe.stop()
    timers.close()
    first, last = min(fired_at), max(fired_at)
    return {
        "expire_per_s": round(n / max(last - first, 1e-6)),
        "burst_ms": _ms(last - first),
        "cpu_us_per_expiry": round(cpu / n * 1e6, 2),
        **_lateness([fired_at[i] - targets[i] for i in range(n)]),
        "stall_max_ms": _ms(probe.worst),
        "late_adds": late_adds,
    }


# -- purgatory: Kafka's TestPurgatoryPerformance --------------------------------------

SCENARIOS: Final = {"low": (20.0, 60.0), "high": (200.0, 400.0)}
"""Completion latency (p50, p75) in ms of each scenario."""

_Z75: Final = 0.674490
_TIMEOUT: Final = 0.2
PACE: Final = 0.001
"""The shortest sleep of the purgatory suite's generator and completer, in seconds.

Both batch by elapsed time: a caught-up task sleeps at least this long, then serves
everything that fell due meanwhile. A shorter sleep spins on uvloop, whose timers have
millisecond resolution (``sleep(0.0004)`` returns at the next loop pass): the process
then burns a core whatever it runs, and CPU per request measures the pacing, not the
purgatory. Requests issued up to a millisecond late count their timeout from when they
were issued, so expiry lateness is unaffected.
"""
_SLOTS_PER_S: Final = 1000
"""The completer's queue: requests due within one millisecond share a slot (see
:func:`purgatory_suite`)."""
_SEEDS: Final = {"gaps": 1, "low": 2, "high": 3}
_draws: dict[str, array[float]] = {}


def _draw(kind: str, count: int) -> array[float]:
    """At least ``count`` exponential gaps (mean 1) or a scenario's latencies (s).

    Cached per kind, so every implementation and repeat gets the same requests.
    """
    cached = _draws.get(kind)
    if cached is not None and len(cached) >= count:
        return cached
    rng = random.Random(_SEEDS[kind])
    if kind == "gaps":
        values = (rng.expovariate(1.0) for _ in range(count))
    else:
        p50, p75 = SCENARIOS[kind]
        mu = math.log(p50)
        sigma = (math.log(p75) - mu) / _Z75
        values = (rng.lognormvariate(mu, sigma) / 1e3 for _ in range(count))
    drawn = _draws[kind] = array("d", values)
    return drawn


class _Outcomes:
    """Counts how each request finished, and how late the expired ones were."""

    __slots__ = (
        "all_done",
        "completed",
        "deadline",
        "doubles",
        "early_warmup",
        "expired",
        "first_counted",
        "late",
        "now",
        "state",
    )

    def __init__(self, count: int, loop: asyncio.AbstractEventLoop, first_counted: int = 0) -> None:
        self.now = loop_clock(loop)
        self.first_counted = first_counted
        """Tokens below it are the warm-up's: checked, but not in ``late``."""
        self.all_done: asyncio.Future[None] = loop.create_future()
        self.deadline = array("d", bytes(8 * count))
        self.state = bytearray(count)
        # An array, not a list: the collector walks every slot of a list in each full
        # collection, and at the ceiling this one grows to hundreds of thousands of
        # floats (a stall the bench made, not the purgatory it measures).
        self.late = array("d")
        self.completed = 0
        self.expired = 0
        self.doubles = 0
        self.early_warmup = 0

    def done(self, token: int, expired: bool) -> None:
        if self.state[token]:
            self.doubles += 1
        self.state[token] = 1
        if expired:
            self.expired += 1
            late = self.now() - self.deadline[token]
            if token >= self.first_counted:
                self.late.append(late)
            elif late < -EARLY_EPSILON:  # the warm-up's are not timed, but checked
                self.early_warmup += 1
        else:
            self.completed += 1
        if self.completed + self.expired == len(self.state):
            self.all_done.set_result(None)


def loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """``loop.time`` itself, or on asyncio the function it calls (one Python frame less
    per reading, the same clock)."""
    if isinstance(loop, asyncio.BaseEventLoop) and type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


async def purgatory_suite(impl: str, params: Params, gc_mode: GcMode) -> Metrics:
    """Requests at a target rate, completed after a lognormal latency or timed out.

    ``warmup`` seconds of requests go first and are not counted; then the counted
    window: ``max_seconds`` of requests, or ``requests`` of them if fewer. Lateness,
    the achieved rate, the collections per generation (``gc0``-``gc2``, with their
    pauses) and the longest loop stall (``stall_max_ms``, a 1 ms probe's lateness) are
    the window's: from the issue of its first request to that of its last. CPU per
    request is the window's too after a warm-up (the steady state's cost per request);
    without one (``warmup`` 0, the short step as it was published) it runs to the last
    finish, as it always did.

    The completer is Kafka's completion thread as a task. Its queue is not a heap:
    requests due in the same millisecond share a slot (a list, in the order they were
    issued), and a heap holds only the slots' numbers, so a request costs an append and
    its completion a list read. A heap of (due, token, op) tuples spent more per
    request than the purgatory did on some paths (a pop compares tuples down ~15 levels
    at 20k due). A slot is served once it is wholly past, so a completion comes up to a
    millisecond after its due time, as it did with the heap: the completer never sleeps
    less than :data:`PACE`.
    """
    loop = asyncio.get_running_loop()
    now = loop_clock(loop)
    rate = float(params["rate"])
    counted = int(min(int(params["requests"]), rate * float(params["max_seconds"])))
    warm = round(rate * float(params.get("warmup", 0.0)))
    total = warm + counted
    batch = int(params["batch"])
    unique = params["keys"] == "unique"
    gaps = _draw("gaps", total)
    latency = _draw(str(params["scenario"]), total)
    picked = random.Random(3).sample(range(100), 3)
    shared_keys: tuple[Hashable, ...] = tuple(f"fakeKey{i}" for i in picked)
    outcomes = _Outcomes(total, loop, warm)
    ops: Purgatories[Any] = make_purgatories(impl, loop, outcomes.done)
    # By token, the operations the completer will finish: a dict of those in flight
    # (tens of thousands), not a list of every token (a million slots, which each full
    # collection walked: the bench's own 5-10 ms stall on top of the purgatory's).
    held: dict[int, Any] = {}
    slots: dict[int, list[int]] = {}  # millisecond -> tokens due in it, in issue order
    slot_heap: list[int] = []  # the slots' milliseconds
    issuing = True

    async def completer() -> None:  # Kafka's completion thread, as a task
        head = 0  # how far the first slot has been served
        while issuing or slot_heap:
            t = now()
            past = int(t * _SLOTS_PER_S)  # slots before this one are wholly due
            served = 0
            while slot_heap and slot_heap[0] < past and served < batch:
                tokens = slots[slot_heap[0]]
                while head < len(tokens) and served < batch:
                    token = tokens[head]
                    head += 1
                    op = held.pop(token)
                    if unique:
                        ops.set_ready(op)
                        ops.check_and_complete(token)
                    else:
                        ops.force_complete(op)
                    served += 1
                if head == len(tokens):
                    del slots[heapq.heappop(slot_heap)]
                    head = 0
            if served == batch:
                await asyncio.sleep(0)
            else:  # nothing more due now: sleep until the next slot is, never below a pace
                wake = (slot_heap[0] + 1) / _SLOTS_PER_S - t if slot_heap else PACE
                await asyncio.sleep(max(wake, PACE))

    gc_mode.after_setup()
    watch = GcWatch()
    probe = _Probe(loop)
    completing = asyncio.ensure_future(completer())
    register = ops.register
    deadline = outcomes.deadline
    wall0 = cpu0 = -1.0  # the window's start: set as its first request goes out
    next_at = now()
    token = 0
    try:
        while token < total:
            if token == warm and wall0 < 0:  # the warm-up is over: the window opens
                wall0 = now()
                cpu0 = time.process_time()
                watch.start()
                probe.reset()
            t = now()
            if next_at > t:  # caught up: the requests due meanwhile go out as one batch
                await asyncio.sleep(max(next_at - t, PACE))
                continue
            stop = min(warm if token < warm else total, token + batch)
            while token < stop and next_at <= t:
                created = now()
                deadline[token] = created + _TIMEOUT
                op = register(token, (token,) if unique else shared_keys, _TIMEOUT)
                if latency[token] < _TIMEOUT:
                    held[token] = op
                    slot = int((created + latency[token]) * _SLOTS_PER_S)
                    tokens = slots.get(slot)
                    if tokens is None:
                        slots[slot] = [token]
                        heapq.heappush(slot_heap, slot)
                    else:
                        tokens.append(token)
                next_at += gaps[token] / rate
                token += 1
            await asyncio.sleep(0)
        last_issue = now()
        cpu_issued = time.process_time()
        watch.stop()
        stall, stalls = probe.worst, probe.over
        issuing = False
        await completing
        await outcomes.all_done
    finally:
        probe.stop()
        watch.close()
    cpu = (cpu_issued if warm else time.process_time()) - cpu0
    ops.close()
    scheduled = sum(gaps[warm : total - 1]) / rate
    elapsed = last_issue - wall0
    finished = outcomes.completed + outcomes.expired
    lateness = _lateness(outcomes.late)
    lateness["early"] = int(lateness["early"] or 0) + outcomes.early_warmup
    return {
        "requests": counted,
        "warmup_requests": warm,
        "window_s": round(elapsed, 3),
        "achieved_per_s": round(counted / elapsed),
        "achieved_pct": round(100 * min(scheduled / elapsed, 1.0), 1),
        "cpu_s_per_1m": round(cpu / counted * 1e6, 2),
        "expired_pct": round(100 * len(outcomes.late) / max(counted, 1), 2),
        **lateness,
        **watch.metrics(),
        "stall_max_ms": _ms(stall),
        "stalls_over_5ms": stalls,
        "doubles": outcomes.doubles,
        "unfinished": total - finished,
    }


# -- idle: wake-ups with nothing (or one far operation) pending -----------------------


async def idle_suite(impl: str, params: Params, gc_mode: GcMode) -> Metrics:
    """Loop wake-ups over ``seconds`` while idle: ``empty``, ``one_far``, ``after_burst``."""
    loop = asyncio.get_running_loop()
    fired = 0

    def on_fire(token: int) -> None:
        nonlocal fired
        fired += 1

    timers: Timers[Any] = make_timers(impl, loop, on_fire)
    scenario = params["scenario"]
    if scenario == "one_far":
        timers.add(0, 3600.0)
    elif scenario == "after_burst":
        handles = [timers.add(i, 0.05 + i * 1e-4) for i in range(1000)]
        await asyncio.sleep(0)
        for handle in handles:
            timers.cancel(handle)
        del handles
    for _ in range(3):  # let finished tasks end before counting
        await asyncio.sleep(0)
    gc_mode.after_setup()
    gc.collect()
    timer_wakeups = timers.wakeups()
    before = switches()
    await asyncio.sleep(float(params["seconds"]))
    woke = switches() - before - 1  # one wake-up is this sleep ending
    after = timers.wakeups()
    timers.close()
    return {
        "loop_wakeups": max(woke, 0),
        "timer_wakeups": None if after is None or timer_wakeups is None else after - timer_wakeups,
        "fired": fired,
    }


# -- memory: RSS per pending operation, and after cycling many through ----------------


async def memory_suite(impl: str, params: Params, gc_mode: GcMode) -> Metrics:
    """RSS per pending operation watched under 3 keys; RSS while cycling ``cycle`` more."""
    loop = asyncio.get_running_loop()
    n = int(params["pending"])
    cycle = int(params["cycle"])
    keys: tuple[Hashable, ...] = ("fakeKey7", "fakeKey42", "fakeKey93")
    ops: Purgatories[Any] = make_purgatories(impl, loop, lambda token, expired: None)
    register = ops.register
    ring: list[Any] = [None] * n

    async def fill(start: int, stop: int) -> None:
        for i in range(start, stop):
            ring[i] = register(i, keys, 3600.0)
            if not i % 10_000:
                await asyncio.sleep(0)
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    gc.collect()
    rss0 = rss_bytes()
    await fill(0, n)
    gc_mode.after_setup()
    gc.collect()
    rss_filled = rss_bytes()
    metrics: Metrics = {"rss_per_op": round((rss_filled - rss0) / n)}
    extra: list[Any] = []
    sample = min(n, _TRACED_SAMPLE)

    async def fill_extra() -> None:
        for i in range(sample):
            extra.append(register(n + i, keys, 3600.0))
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    metrics.update(await _traced(fill_extra, sample))
    for op in extra:
        ops.force_complete(op)
    extra.clear()
    if cycle:
        force_complete = ops.force_complete
        batch = 1000
        half = cycle // 2 // batch * batch
        rss_half = rss_filled
        for start in range(0, cycle, batch):
            for token in range(start, start + batch):
                slot = token % n
                force_complete(ring[slot])
                ring[slot] = register(n + token, keys, 3600.0)
            await asyncio.sleep(0)
            if start + batch == half:
                gc.collect()
                rss_half = rss_bytes()
        gc.collect()
        rss_end = rss_bytes()
        metrics.update(
            {
                "rss_filled_mb": round(rss_filled / 2**20, 1),
                "rss_half_mb": round(rss_half / 2**20, 1),
                "rss_end_mb": round(rss_end / 2**20, 1),
                "growth_pct": round(100 * (rss_end - rss_filled) / rss_filled, 2),
                "growth_2nd_half_pct": round(100 * (rss_end - rss_half) / rss_half, 2),
            }
        )
    ops.close()
    return metrics


SUITES: Final[dict[str, SuiteFn]] = {
    "timer": timer_suite,
    "churn": churn_suite,
    "expiry": expiry_suite,
    "purgatory": purgatory_suite,
    "idle": idle_suite,
    "memory": memory_suite,
    "timeouts": timeouts_suite,
}
