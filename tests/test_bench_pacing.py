"""The purgatory benchmark's own pacing costs near nothing while it waits.

Not a speed assertion about the library: a benchmark whose generator or completer
spins between requests pegs a core whatever it measures, so its CPU per request says
nothing (on uvloop, a sub-millisecond sleep returns at the next loop pass).
"""

from __future__ import annotations

import gc
import time

import pytest

from bench.__main__ import Case, run_case

# 2,000 requests at 2,000/s: about a second of mostly waiting (0.5 ms between
# requests on average, up to 200 ms until each one finishes). With sub-millisecond
# sleeps the uvloop run took 35% of a core on the pure build (and its CPU per 1M
# requests was 213 s); paced by the millisecond it takes under 10% (48 s).
REQUESTS = 2_000
SLOW: dict[str, int | float | str] = {
    "scenario": "low",
    "keys": "shared",
    "rate": REQUESTS,
    "requests": REQUESTS,
    "max_seconds": 5.0,
    "batch": 64,
}


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_slow_purgatory_run_mostly_sleeps(loop: str) -> None:
    # The run has the GC on, and in a test session the heap already holds what earlier
    # tests left (the Spark tests' objects): the full collections the run triggers
    # would traverse all of it and charge that to the pacing (0.55 s of CPU in 1.6 s
    # after tests/test_analysis.py). Frozen, the session's objects are not traversed,
    # as in the benchmark's own fresh process.
    gc.collect()
    gc.freeze()
    try:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        record = run_case(Case("purgatory", "wheel", loop, "on", 0, dict(SLOW)))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    finally:
        gc.unfreeze()

    assert record["unfinished"] == 0
    assert record["doubles"] == 0
    assert wall > 0.9  # it did wait for its requests
    # Issuing and finishing 2,000 requests takes tens of milliseconds; a spinning
    # pace takes a good part of the second. A quarter leaves room for a slow machine.
    assert cpu < 0.25 * wall, (cpu, wall)
    per_1m = record["cpu_s_per_1m"]
    assert isinstance(per_1m, float)
    assert per_1m < 0.25 * wall / REQUESTS * 1e6
