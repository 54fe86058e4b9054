"""Run a fixed number of steps of a workload, untimed, for instruction counts.

``python -m bench.steps churn --impl wheel --pending 20000 --steps 40000`` fills the
churn suite's N pending operations and runs that many of its steps (complete-one or
cancel-one, then register-one, keys as one-key lists), and nothing else: no clock,
no GC watch, no tracemalloc. Under callgrind the difference between two runs that
differ only in ``--steps`` is the cost of those extra steps, start-up and filling
cancelled out::

    valgrind --tool=callgrind --callgrind-out-file=a.out python -m bench.steps churn --steps 40000
    valgrind --tool=callgrind --callgrind-out-file=b.out python -m bench.steps churn --steps 10000
    # (Ir of a - Ir of b) / 30000 = instructions per step

``python -m bench.steps pairs --loop wheel --pending 100000 --steps 200000`` runs
``python -m bench loop``'s call_later+cancel pairs (delays 10-300 s plus an hour,
the loop running) on a stock loop (``--loop asyncio`` or ``uvloop``) or a wheel loop
(``--loop wheel``, on asyncio, or ``wheel-uvloop``), for instructions per pair the
same way; ``--loop floor`` runs the same loop with no timer (the harness's share).

``python -m bench.steps close --pending 1000000`` fills a purgatory and prints the
CPU seconds its ``aclose()`` takes (every pending operation then ends with
``PurgatoryClosed``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

import aiopurgatory as ap

from .common import LOOPS, loop_factory
from .impls import FLOOR, HOOKS, IMPLS, make_purgatories
from .workloads import _steady_draws


class FrozenLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock stands still: no operation expires, on either side.

    Under callgrind the program runs some 50 times slower than it does timed, so with
    the real clock the 0.1-30 s timeouts expire by the thousand (timed at full speed,
    the pending set turns over long before); the counts would measure expiries, and
    vary with the machine's speed. ``time()`` is a Python method here: the heap pays
    it as asyncio's own does, the wheel's timer pays a Python call per clock read
    where it reads CLOCK_MONOTONIC in C on a real asyncio loop (its count is high by
    that much).
    """

    def time(self) -> float:
        return 1000.0


async def churn(impl: str, pending: int, steps: int) -> int:
    """The churn suite's fill and ``steps`` of its pairs; the pending count at the end."""
    mask, timeouts, slots = _steady_draws(pending)
    ops = make_purgatories(impl, asyncio.get_running_loop(), lambda token, expired: None)
    register = ops.register
    pool: list[Any] = [register(i, [i], timeouts[i & mask]) for i in range(pending)]
    tokens = list(range(pending))
    await asyncio.sleep(0)
    set_ready, check, cancel = ops.set_ready, ops.check_and_complete, ops.cancel
    token = pending
    for k in range(steps):
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
        if not k & 255:
            await asyncio.sleep(0)  # as the suite yields between its batches
    left = ops.pending()
    ops.close()
    return left


async def pairs(pending: int, steps: int, floor: bool = False) -> int:
    """``python -m bench loop``'s pairs, ``steps`` of them; the pending count at the end.

    ``floor``: the same loop, line for line, with no timer: each handle is one object
    whose ``cancel()`` is a C method that does nothing (a :class:`LoopEntry` that is on
    no wheel) and ``call_later`` is a C function of two arguments that returns its
    second (``{}.get``). What that costs is the harness's share of a pair, paid by
    every loop alike, so no stock / wheel ratio can exceed stock / floor.
    """
    import random

    loop = asyncio.get_running_loop()
    rng = random.Random(45)
    # bench loop's 10-300 s, an hour later: under callgrind, 50 times slower, none of
    # them may fall due (a firing is not a pair's cost).
    delays = [3600.0 + rng.uniform(10.0, 300.0) for _ in range(4096)]
    picks = [rng.randrange(pending) for _ in range(4096)]
    if floor:
        from aiopurgatory.looptimers import LoopEntry

        callback: Any = LoopEntry()
        call_later: Any = {}.get
        handles: list[Any] = [callback] * pending
    else:
        callback = int
        call_later = loop.call_later
        handles = [call_later(delays[i & 4095], callback) for i in range(pending)]
    await asyncio.sleep(0)
    j = 0
    for k in range(steps):
        j = (j + 1) & 4095
        i = picks[j]
        handles[i].cancel()
        handles[i] = call_later(delays[j], callback)
        if not k & 1023:
            await asyncio.sleep(0)  # as the bench yields between its chunks
    if floor:
        return 0
    left = sum(1 for h in handles if not h.cancelled())
    for h in handles:
        h.cancel()
    return left


async def close(pending: int) -> float:
    """CPU seconds of ``aclose()`` with ``pending`` operations pending, one key each."""
    purgatory = ap.Purgatory("close")
    never = ap.PredicateOperation
    ops = [
        purgatory.try_complete_else_watch(never(bool, 30.0 + i % 1000), [i]) for i in range(pending)
    ]
    await asyncio.sleep(0)
    cpu = time.process_time()
    await purgatory.aclose()
    cpu = time.process_time() - cpu
    assert all(op.done() for op in ops)
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.steps", description=__doc__)
    parser.add_argument("workload", choices=("churn", "pairs", "close"))
    parser.add_argument("--impl", choices=(*IMPLS, FLOOR, HOOKS), default="wheel")
    parser.add_argument(
        "--loop",
        choices=(*LOOPS, "wheel", "wheel-uvloop", "floor"),
        default="asyncio",
        help="pairs: floor is the harness alone, on asyncio's loop (see pairs())",
    )
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--gc", choices=("on", "off"), default="on")
    parser.add_argument(
        "--real-clock", action="store_true", help="churn: the loop's real clock (expiries)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="close: runs (median printed)")
    args = parser.parse_args()
    if args.gc == "off":
        gc.disable()
    if args.workload == "churn":
        frozen = args.loop == "asyncio" and not args.real_clock
        with asyncio.Runner(
            loop_factory=FrozenLoop if frozen else loop_factory(args.loop)
        ) as runner:
            left = runner.run(churn(args.impl, args.pending, args.steps))
        print(f"churn {args.impl}: {args.steps} steps, {left} pending")
    elif args.workload == "pairs":
        from aiopurgatory.loop import loop_factory as wheel_factory

        if args.loop == "wheel":
            factory = wheel_factory()
        elif args.loop == "wheel-uvloop":
            import uvloop

            factory = wheel_factory(uvloop.Loop)
        elif args.loop == "floor":
            factory = asyncio.SelectorEventLoop
        else:
            factory = loop_factory(args.loop)
        with asyncio.Runner(loop_factory=factory) as runner:
            left = runner.run(pairs(args.pending, args.steps, floor=args.loop == "floor"))
        print(f"pairs on {args.loop}: {args.steps} pairs, {left} pending")
    else:
        runs = []
        for _ in range(args.repeat):
            with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
                runs.append(runner.run(close(args.pending)))
        runs.sort()
        print(
            f"close: aclose() of {args.pending} pending, CPU s median {runs[len(runs) // 2]:.3f}"
            f" (runs {', '.join(f'{r:.3f}' for r in runs)})"
        )


if __name__ == "__main__":
    main()
