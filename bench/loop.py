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
import gc
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from aiopurgatory import loop as apl

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


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench loop", description=__doc__)
    p.add_argument("--pending", default="10000,100000", help="comma-separated")
    p.add_argument("--gc", default="on,off", help="comma-separated: on, off")
    p.add_argument("--seconds", type=float, default=1.0, help="CPU seconds per case")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--lateness", type=int, default=20_000, help="timers (0: skip)")
    p.add_argument("--json", help="write the records here")
    args = p.parse_args(argv)
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
        f" (wheel and timer: {compiled}; loop.py: pure Python)"
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
    if args.lateness:
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
