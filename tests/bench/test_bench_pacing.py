"""The purgatory benchmark's own pacing wakes the loop about once a millisecond.

Not a speed assertion about the library: a benchmark whose generator or completer
spins between requests pegs a core whatever it measures, so its CPU per request says
nothing. On uvloop a sub-millisecond sleep returns at the next loop pass (its timers
have millisecond resolution): with ``PACE`` at 0.4 ms the run below made 100 paced
sleeps per millisecond on uvloop and took 53% of a core; paced by the millisecond it
makes about 1.2 (two tasks, each sleeping at least ``PACE``).

The test counts the sleeps rather than timing the CPU: a CPU-time bound depends on how
busy the machine is (a loaded CI machine took 25% of a core for what takes 15% here),
the number of loop wake-ups does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import bench.workloads
from bench.__main__ import Case, run_case

# 2,000 requests at 2,000/s: about a second of mostly waiting (0.5 ms between
# requests on average, up to 200 ms until each one finishes).
REQUESTS = 2_000
RATE = 2_000
# The run lasts about a second and a quarter: the last requests wait up to their 200 ms
# timeout; a tenth of a second more for the loop's start and end.
SECONDS = REQUESTS / RATE + 0.2 + 0.1
SLOW: dict[str, int | float | str] = {
    "scenario": "low",
    "keys": "shared",
    "rate": RATE,
    "requests": REQUESTS,
    "max_seconds": 5.0,
    "batch": 64,
}


def _count_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count ``asyncio.sleep`` calls: ``[zero delay, positive delay]``."""
    counts = [0, 0]
    real: Callable[..., Awaitable[Any]] = asyncio.sleep

    async def counting(delay: float, result: Any = None) -> Any:
        counts[delay > 0] += 1
        return await real(delay, result)

    monkeypatch.setattr(asyncio, "sleep", counting)
    return counts


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_slow_purgatory_run_sleeps_about_once_a_millisecond(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = _count_sleeps(monkeypatch)
    record = run_case(Case("purgatory", "wheel", loop, "on", 0, dict(SLOW)))
    monkeypatch.undo()

    assert record["unfinished"] == 0
    assert record["doubles"] == 0
    zero, paced = counts
    # Each of the two tasks sleeps at least PACE at a time. uvloop's millisecond timers
    # may fire a little early, hence three per millisecond, not two.
    assert paced <= 3 * SECONDS / bench.workloads.PACE, paced
    # A yield follows each batch issued or served, never more than one per request.
    assert zero <= 2 * REQUESTS, zero


def test_the_count_sees_a_spinning_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    # The same run with sub-millisecond sleeps on uvloop: the count above catches it.
    monkeypatch.setattr(bench.workloads, "PACE", 0.0004)
    counts = _count_sleeps(monkeypatch)
    run_case(Case("purgatory", "wheel", "uvloop", "on", 0, dict(SLOW)))
    monkeypatch.undo()
    assert counts[1] > 3 * SECONDS / 0.001, counts
