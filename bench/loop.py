"""``python -m bench loop``: call_later+cancel pairs per CPU second, stock loop vs wheel loop.

Each case is a fresh loop holding ``pending`` timers 10-300 s away; with the loop
running, a pair schedules a new timer (``call_later``) and cancels a random pending
one in its place, so the pending count stays put. Pairs run in chunks of 1,000 with an
``await asyncio.sleep(0)`` between chunks, so the loop iterates (the stock loop purges
its cancelled handles there). The figure is pairs per CPU second of this process
(``time.process_time``), over at least ``--seconds`` of CPU per case. Implementations
(asyncio's selector loop and, when uvloop is importable, uvloop, each stock and as
the base of a wheel loop) and GC modes alternate within each repeat so that all share
the machine's noise; the table gives medians and each wheel loop's ratio to the stock
loop it is built on, of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import random
import statistics
import sys
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Final

from aiopurgatory import loop as apl

from .common import rss_bytes, run_child

CHUNK: Final = 1_000
DELAYS: Final = (10.0, 300.0)
LOOPS: Final[dict[str, Callable[[], asyncio.AbstractEventLoop]]] = {
    "stock asyncio": asyncio.SelectorEventLoop,
    "wheel/asyncio": apl.loop_factory(),
}
try:
    import uvloop
except ImportError:  # the bench extra brings it; without it, asyncio's loops only
    pass
else:
    LOOPS["stock uvloop"] = uvloop.Loop
    LOOPS["wheel/uvloop"] = apl.loop_factory(uvloop.Loop)
RATIOS: Final = [
    (f"wheel/{base} ÷ stock {base}", f"wheel/{base}", f"stock {base}")
    for base in ("asyncio", "uvloop")
    if f"wheel/{base}" in LOOPS
]
"""The table's ratio columns: each wheel loop against the stock loop it is built on."""


def _no_op() -> None:
    pass


async def _pairs(pending: int, seconds: float, seed: int) -> tuple[int, float]:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    delays = [rng.uniform(*DELAYS) for _ in range(4096)]
    picks = [rng.randrange(pending) for _ in range(4096)]
    handles = [loop.call_later(delays[i % 4096], _no_op) for i in range(pending)]
    await asyncio.sleep(0)
    call_later = loop.call_later
    pairs = 0
    j = 0
    start = time.process_time()
    elapsed = 0.0
    while elapsed < seconds:
        for _ in range(CHUNK):
            j = (j + 1) & 4095
            i = picks[j]
            handles[i].cancel()
            handles[i] = call_later(delays[j], _no_op)
        pairs += CHUNK
        await asyncio.sleep(0)
        elapsed = time.process_time() - start
    for h in handles:
        h.cancel()
    return pairs, elapsed


def run_case(impl: str, pending: int, gc_mode: str, seconds: float, seed: int) -> float:
    """Pairs per CPU second of one case on a fresh loop."""
    gc.collect()
    was = gc.isenabled()
    if gc_mode == "off":
        gc.disable()
    try:
        with asyncio.Runner(loop_factory=LOOPS[impl]) as runner:
            pairs, elapsed = runner.run(_pairs(pending, seconds, seed))
    finally:
        if was:
            gc.enable()
    return pairs / elapsed


async def _lateness(n: int, seed: int) -> list[float]:
    """``n`` timers 1-100 ms away, armed 100 at a time on a mostly idle loop: each
    callback's ``loop.time()`` minus its ``when`` (negative: ran early)."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    late: list[float] = []
    done = loop.create_future()
    left = n

    def fire(when: float) -> None:
        nonlocal left
        late.append(loop.time() - when)
        left -= 1
        if not left:
            done.set_result(None)

    for _ in range(n // 100):
        for _ in range(100):
            when = loop.time() + rng.uniform(0.001, 0.1)
            loop.call_at(when, fire, when)
        await asyncio.sleep(0.002)
    await done
    return late


def run_lateness(impl: str, n: int, seed: int) -> dict[str, float]:
    with asyncio.Runner(loop_factory=LOOPS[impl]) as runner:
        late = sorted(runner.run(_lateness(n, seed)))
    return {
        "early": sum(1 for x in late if x < 0),
        "p50_ms": late[len(late) // 2] * 1e3,
        "p99_ms": late[int(len(late) * 0.99)] * 1e3,
        "max_ms": late[-1] * 1e3,
    }


# -- the remaining probes: 1M pending, RSS, 10M lateness (--full) -----------

FULL: Final = {"pending": "10000,100000,1000000", "rss": 1_000_000, "lateness": 10_000_000}
"""What ``--full`` runs (each unless given explicitly): the issue's sizes."""

FULL_LATENESS_RATE: Final = 150_000.0
"""Timers armed per second by ``--full``'s lateness run: 10M in about 67 s per loop.
What a 2-core machine's loop sustains (the wheel loop keeps it, the stock loop nearly):
asked 250k/s, the loops armed 145k (stock) and 179k (wheel) per second, saturated."""

STEADY_INTERVAL: Final = 0.002
"""Seconds between the batches of the steady-rate lateness run (as the small run)."""

RSS_WARMUP: Final = 10_000


def _apply_full(args: argparse.Namespace) -> None:
    """``--full`` fills what was not given; the defaults stay quick without it."""
    full = args.full
    if args.pending is None:
        args.pending = FULL["pending"] if full else "10000,100000"
    if args.rss is None:
        args.rss = FULL["rss"] if full else 0
    if args.lateness is None:
        args.lateness = FULL["lateness"] if full else 20_000
    if args.lateness_rate is None and full:
        args.lateness_rate = FULL_LATENESS_RATE


def print_scaling(
    rates: dict[tuple[str, int, str], list[float]],
    pendings: Sequence[int],
    gcs: Sequence[str],
    records: list[dict[str, Any]],
) -> None:
    """Each loop's rate at the largest pending size over its rate at the smallest: the
    issue wants >= 0.8 at 1M / 10k for the wheel (a heap's rate falls with log n)."""
    low, high = min(pendings), max(pendings)
    if low == high:
        return
    impls = sorted({impl for impl, _, _ in rates}, key=list(LOOPS).index)
    print(f"\nrate at {high:,} pending / rate at {low:,} (medians; target for the wheel >= 0.8)")
    print(f"| GC | {' | '.join(impls)} |")
    print("|:--:|" + "---:|" * len(impls))
    for gc_mode in gcs:
        ratios = {
            impl: statistics.median(rates[(impl, high, gc_mode)])
            / statistics.median(rates[(impl, low, gc_mode)])
            for impl in impls
        }
        print(f"| {gc_mode} | {' | '.join(f'{ratios[i]:.2f}' for i in impls)} |")
        for impl in impls:
            records.append(
                {"impl": impl, "gc": gc_mode, "scaling": f"{high}/{low}", "ratio": ratios[impl]}
            )


def arming_seconds(impl: str, pending: int, seed: int = 0) -> dict[str, float]:
    """Wall and CPU seconds to arm ``pending`` timers as a pairs case does (before its
    timed window), then to cancel them all: what a case costs beyond its window."""
    rng = random.Random(seed)
    delays = [rng.uniform(*DELAYS) for _ in range(4096)]

    async def arm() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        wall, cpu = time.perf_counter(), time.process_time()
        handles = [loop.call_later(delays[i % 4096], _no_op) for i in range(pending)]
        await asyncio.sleep(0)
        armed_wall, armed_cpu = time.perf_counter() - wall, time.process_time() - cpu
        wall, cpu = time.perf_counter(), time.process_time()
        for h in handles:
            h.cancel()
        await asyncio.sleep(0)
        return {
            "arm_wall_s": armed_wall,
            "arm_cpu_s": armed_cpu,
            "cancel_wall_s": time.perf_counter() - wall,
            "cancel_cpu_s": time.process_time() - cpu,
        }

    gc.collect()
    with asyncio.Runner(loop_factory=LOOPS[impl]) as runner:
        return runner.run(arm())


def print_arming(pending: int, seconds: float, records: list[dict[str, Any]]) -> None:
    """The set-up of the largest case beside its timed window (the window alone is the
    figure: arming is never in it, but it is in the run's wall time)."""
    print(f"\narming and cancelling {pending:,} timers, once per loop (a case's window:"
          f" {seconds:g} CPU s)")  # fmt: skip
    print("| loop | arm wall s | arm CPU s | cancel all wall s |")
    print("|:--|---:|---:|---:|")
    for impl in LOOPS:
        r = arming_seconds(impl, pending)
        print(
            f"| {impl} | {r['arm_wall_s']:.2f} | {r['arm_cpu_s']:.2f} | {r['cancel_wall_s']:.2f} |"
        )
        records.append({"impl": impl, "arming": pending, **r})


async def _rss_phases(n: int, seed: int) -> list[dict[str, Any]]:
    """RSS through the life of ``n`` timers 10-300 s away on the running loop: before
    (after a warm-up), armed, half of them cancelled (the stock loop purges only once
    more than half of its heap is cancelled), all cancelled before the loop iterates,
    after it iterates, after ``gc.collect()`` (and after ``malloc_trim``). Beside the
    RSS, the heap's items and ``sys.getallocatedblocks()``: the objects still alive,
    whatever the allocator keeps."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)

    async def iterate() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    def phase(name: str) -> dict[str, Any]:
        heap = getattr(loop, "_scheduled", None)  # private; absent on uvloop
        return {
            "phase": name,
            "rss_mb": rss_bytes() / 2**20,
            "heap_items": len(heap) if heap is not None else None,
            "blocks": sys.getallocatedblocks(),
        }

    warm = [loop.call_later(rng.uniform(*DELAYS), _no_op) for _ in range(RSS_WARMUP)]
    for handle in warm:
        handle.cancel()
    del warm
    await iterate()
    gc.collect()
    phases = [phase("before")]
    handles: list[asyncio.TimerHandle | None] = [
        loop.call_later(rng.uniform(*DELAYS), _no_op) for _ in range(n)
    ]
    await iterate()
    phases.append(phase("armed"))
    half = n // 2
    for i in range(half):
        handles[i].cancel()  # type: ignore[union-attr]
        handles[i] = None
    await iterate()
    phases.append(phase("half cancelled, iterated"))
    for i in range(half, n):
        handles[i].cancel()  # type: ignore[union-attr]
        handles[i] = None
    del handles
    phases.append(phase("all cancelled"))
    await iterate()
    phases.append(phase("iterated"))
    gc.collect()
    phases.append(phase("gc.collect()"))
    if _malloc_trim():
        phases.append(phase("malloc_trim(0)"))
    return phases


def _malloc_trim() -> bool:
    """glibc's ``malloc_trim(0)``: hand the C heap's free pages back to the system, so
    that what stays is what the process still uses (or the allocator fragments)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    libc.malloc_trim(0)
    return True


def rss_child(argv: Sequence[str]) -> None:
    """The child side of :func:`run_rss`: one loop, one process; prints JSON."""
    impl, n = argv[0], int(argv[1])
    with asyncio.Runner(loop_factory=LOOPS[impl]) as runner:
        phases = runner.run(_rss_phases(n, seed=45))
    print(json.dumps(phases))


def run_rss(impl: str, n: int) -> list[dict[str, Any]]:
    """:func:`_rss_phases` in a fresh interpreter: a process's RSS does not reliably
    go down after free(), so each loop starts from a clean allocator."""
    code = "import sys, bench.loop as m; m.rss_child(sys.argv[1:])"
    child = run_child([sys.executable, "-c", code, impl, str(n)], timeout=600)
    if child.returncode:
        raise RuntimeError(f"rss child for {impl}: {child.stderr.strip()[-2000:]}")
    phases: list[dict[str, Any]] = json.loads(child.stdout.strip().splitlines()[-1])
    return phases


def print_rss(n: int, records: list[dict[str, Any]]) -> None:
    results = {impl: run_rss(impl, n) for impl in LOOPS}
    names = [p["phase"] for p in next(iter(results.values()))]
    print(f"\nRSS MB of a fresh process per loop, {n:,} timers 10-300 s away"
          " (heap items: the base loop's _scheduled)")  # fmt: skip
    print(f"| phase | {' | '.join(f'{i} MB | heap items | blocks' for i in LOOPS)} |")
    print("|:--|" + "---:|---:|---:|" * len(LOOPS))
    for k, name in enumerate(names):
        cells = []
        for impl in LOOPS:
            p = results[impl][k]
            items = "-" if p["heap_items"] is None else f"{p['heap_items']:,}"
            cells.append(f"{p['rss_mb']:,.1f} | {items} | {p['blocks']:,}")
        print(f"| {name} | {' | '.join(cells)} |")
    for impl in LOOPS:
        before, end = results[impl][0]["rss_mb"], results[impl][-1]["rss_mb"]
        print(f"{impl}: RSS at the end / before = {end / before:.3f}")
        records.append(
            {
                "impl": impl,
                "rss_timers": n,
                "phases": results[impl],
                "after_over_before": end / before,
            }
        )


async def _lateness_steady(n: int, rate: float, seed: int, late: array[float]) -> float:
    """``n`` timers 1-100 ms away, armed at ``rate`` per second in batches every
    :data:`STEADY_INTERVAL`; each callback's lateness goes to ``late``. Returns the
    seconds the arming took (behind schedule when the loop cannot keep up)."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    uniform, now, call_at = rng.uniform, loop.time, loop.call_at
    done = loop.create_future()
    left = n
    append = late.append

    def fire(when: float) -> None:
        nonlocal left
        append(now() - when)
        left -= 1
        if not left:
            done.set_result(None)

    batch = max(1, round(rate * STEADY_INTERVAL))
    start = now()
    armed = 0
    steps = 0
    while armed < n:
        size = min(batch, n - armed)
        for _ in range(size):
            when = now() + uniform(0.001, 0.1)
            call_at(when, fire, when)
        armed += size
        steps += 1
        await asyncio.sleep(max(0.0, start + steps * STEADY_INTERVAL - now()))
    arming = now() - start
    await done
    return arming


def run_lateness_steady(impl: str, n: int, rate: float, seed: int) -> dict[str, float]:
    late = array("d")
    gc.collect()
    with asyncio.Runner(loop_factory=LOOPS[impl]) as runner:
        wall = time.perf_counter()
        arming = runner.run(_lateness_steady(n, rate, seed, late))
        wall = time.perf_counter() - wall
    early = sum(1 for x in late if x < 0)
    ordered = array("d", sorted(late))
    del late
    return {
        "early": early,
        "p50_ms": ordered[len(ordered) // 2] * 1e3,
        "p99_ms": ordered[int(len(ordered) * 0.99)] * 1e3,
        "max_ms": ordered[-1] * 1e3,
        "rate": rate,
        "armed_per_s": n / arming,
        "wall_s": wall,
    }


def print_lateness_steady(n: int, rate: float, records: list[dict[str, Any]]) -> None:
    batch = max(1, round(rate * STEADY_INTERVAL))
    print(f"\nlateness of {n:,} timers 1-100 ms away, armed {batch:,} every"
          f" {STEADY_INTERVAL * 1e3:g} ms (asked: {rate:,.0f}/s), one run each")  # fmt: skip
    print("| loop | early | p50 ms | p99 ms | max ms | armed/s | wall s |")
    print("|:--|---:|---:|---:|---:|---:|---:|")
    for impl in LOOPS:
        r = run_lateness_steady(impl, n, rate, seed=45)
        print(f"| {impl} | {r['early']:.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} |"
              f" {r['max_ms']:.3f} | {r['armed_per_s']:,.0f} | {r['wall_s']:.1f} |")  # fmt: skip
        records.append({"impl": impl, "lateness": n, **r})


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench loop", description=__doc__)
    p.add_argument("--pending", help="comma-separated (default 10000,100000)")
    p.add_argument("--gc", default="on,off", help="comma-separated: on, off")
    p.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per case")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--lateness", type=int, help="timers (default 20000; 0: skip)")
    p.add_argument(
        "--lateness-rate",
        type=float,
        help="arm the lateness timers at this many per second, in batches (default: 100"
        " every 2 ms, sleeping 2 ms between batches)",
    )
    p.add_argument("--rss", type=int, help="timers armed and cancelled for RSS (0: skip)")
    p.add_argument(
        "--full",
        action="store_true",
        help=f"the issue's sizes: pending {FULL['pending']}, RSS at {FULL['rss']:,},"
        f" lateness of {FULL['lateness']:,} at {FULL_LATENESS_RATE:,.0f}/s",
    )
    p.add_argument("--json", help="write the records here")
    args = p.parse_args(argv)
    _apply_full(args)
    pendings = [int(x) for x in args.pending.split(",")]
    gcs = args.gc.split(",")
    rates: dict[tuple[str, int, str], list[float]] = {}
    for rep in range(args.repeats):
        for pending in pendings:
            for gc_mode in gcs:
                for impl in LOOPS:
                    rate = run_case(impl, pending, gc_mode, args.seconds, seed=rep)
                    rates.setdefault((impl, pending, gc_mode), []).append(rate)
                    print(f"  {impl:14} pending={pending:>7} gc={gc_mode:3} {rate:>12,.0f}",
                          file=sys.stderr)  # fmt: skip
    compiled = "compiled" if _compiled() else "pure Python"
    print(
        f"call_later+cancel pairs per CPU second, median of {args.repeats}"
        f" (wheel, timer and looptimers: {compiled})"
    )
    print(f"| pending | GC | {' | '.join(LOOPS)} | {' | '.join(r[0] for r in RATIOS)} |")
    print("|---:|:--:|" + "---:|" * (len(LOOPS) + len(RATIOS)))
    records: list[dict[str, Any]] = []
    for pending in pendings:
        for gc_mode in gcs:
            med = {impl: statistics.median(rates[(impl, pending, gc_mode)]) for impl in LOOPS}
            cells = " | ".join(f"{med[i]:,.0f}" for i in LOOPS)
            ratios = " | ".join(f"{med[wheel] / med[stock]:.2f}x" for _, wheel, stock in RATIOS)
            print(f"| {pending:,} | {gc_mode} | {cells} | {ratios} |")
            for impl in LOOPS:
                records.append(
                    {"pending": pending, "gc": gc_mode, "impl": impl, "median": med[impl],
                     "runs": rates[(impl, pending, gc_mode)], "wheel": compiled}
                )  # fmt: skip
    print_scaling(rates, pendings, gcs, records)
    if max(pendings) >= 1_000_000:
        print_arming(max(pendings), args.seconds, records)
    if args.rss:
        print_rss(args.rss, records)
    if args.lateness and args.lateness_rate:
        print_lateness_steady(args.lateness, args.lateness_rate, records)
    elif args.lateness:
        print(f"\nlateness of {args.lateness:,} timers 1-100 ms away, idle loop, one run each")
        print("| loop | early | p50 ms | p99 ms | max ms |")
        print("|:--|---:|---:|---:|---:|")
        for impl in LOOPS:
            r = run_lateness(impl, args.lateness, seed=45)
            print(f"| {impl} | {r['early']:.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} |"
                  f" {r['max_ms']:.3f} |")  # fmt: skip
            records.append({"impl": impl, "lateness": args.lateness, **r})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)
    return 0


def _compiled() -> bool:
    from aiopurgatory import wheel

    return not wheel.__file__.endswith(".py") if wheel.__file__ else False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
