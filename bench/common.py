"""What every suite needs: records, event loops, GC modes and process measurements."""

from __future__ import annotations

import asyncio
import gc
import math
import os
import random
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

__all__ = [
    "LOOPS",
    "SMOKE_TABLE_BITS",
    "TABLE_BITS",
    "GcMode",
    "GcWatch",
    "Metrics",
    "Params",
    "Record",
    "loop_factory",
    "percentile",
    "rss_bytes",
    "run_child",
    "uniform_table",
    "use_table_bits",
    "voluntary_switches",
    "warm_up",
]

Value = int | float | str | None
Params = dict[str, int | float | str]
Metrics = dict[str, Value]
Record = dict[str, Value]

LOOPS: Final = ("asyncio", "uvloop")
GC_MODES: Final = ("on", "off", "freeze")

CHECKOUT: Final = Path(__file__).resolve().parent.parent
"""Where ``python -m bench`` finds the package: the directory children run in."""

_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")
TABLE_BITS: Final = 20
"""The draw tables hold 2**TABLE_BITS values."""
SMOKE_TABLE_BITS: Final = 14
"""... and 2**14 at the smoke size: building 2**20 draws and the lists made from them
costs half a CPU second per case, more than a smoke case's timed window (the tests run
dozens of cases, each in a fresh interpreter; their figures are never asserted)."""


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """A new-loop factory for ``asyncio.Runner``."""
    if name == "asyncio":
        return asyncio.new_event_loop
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            raise SystemExit("--loop uvloop needs uvloop: pip install -e '.[bench]'") from None
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    raise ValueError(f"unknown loop {name!r}")


class GcMode:
    """The cyclic GC setting of one case: ``on``, ``off``, or ``freeze`` after set-up."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if name not in GC_MODES:
            raise ValueError(f"unknown gc mode {name!r}")
        self.name = name

    def enter(self) -> None:
        gc.collect()
        if self.name == "off":
            gc.disable()
        else:
            gc.enable()

    def after_setup(self) -> None:
        """Called by a workload once its long-lived objects exist."""
        if self.name == "freeze":
            gc.collect()
            gc.freeze()

    def exit(self) -> None:
        gc.unfreeze()
        gc.enable()
        gc.collect()


class GcWatch:
    """The cyclic collector's runs while a window is open: collections per generation,
    and the longest and total pause, from ``gc.callbacks`` (one Python call as a
    collection starts and one as it stops; nothing on any other path).

    ``gc.get_stats()`` deltas would give the counts too, but not the pauses, nor which
    collection a 6 ms stall was.
    """

    __slots__ = ("_started", "counting", "counts", "pause_max", "pause_total")

    def __init__(self) -> None:
        self.counting = False
        self.counts = [0, 0, 0]
        self.pause_max = 0.0
        self.pause_total = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self.counting:
            pause = time.perf_counter() - self._started
            self.counts[min(info["generation"], 2)] += 1
            self.pause_total += pause
            self.pause_max = max(self.pause_max, pause)

    def start(self) -> None:
        """Open the window: what ran before it does not count."""
        self.counts = [0, 0, 0]
        self.pause_max = self.pause_total = 0.0
        self.counting = True

    def stop(self) -> None:
        self.counting = False

    def close(self) -> None:
        self.counting = False
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def metrics(self) -> Metrics:
        """``gc0``, ``gc1``, ``gc2`` (collections of that generation in the window),
        ``gc_pause_max_ms`` and ``gc_pause_total_ms``."""
        return {
            "gc0": self.counts[0],
            "gc1": self.counts[1],
            "gc2": self.counts[2],
            "gc_pause_max_ms": round(self.pause_max * 1e3, 3),
            "gc_pause_total_ms": round(self.pause_total * 1e3, 3),
        }


async def warm_up(run: Callable[[int], object], batch: int, seconds: float) -> int:
    """Call ``run(start)`` (``batch`` operations from index ``start``), a loop pass
    after each, for a tenth of ``seconds``: the warm-up before a timed run. Returns the
    index the timed run starts from."""
    done = 0
    warm_until = time.perf_counter() + seconds * 0.1
    while time.perf_counter() < warm_until:
        run(done)
        done += batch
        await asyncio.sleep(0)
    return done


def run_child(
    argv: Sequence[str | Path], env: Mapping[str, str] | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` (a fresh interpreter) run from :data:`CHECKOUT`, its output captured as
    text; the caller reads its exit code."""
    return subprocess.run(
        argv, capture_output=True, text=True, check=False, cwd=CHECKOUT, env=env, timeout=timeout
    )


def rss_bytes() -> int:
    """Resident set size of this process, from ``/proc/self/statm``."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * _PAGE_SIZE


def voluntary_switches() -> int:
    """Times this thread blocked (for an event loop: its wake-ups from the poller)."""
    with open("/proc/thread-self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise RuntimeError("no voluntary_ctxt_switches in /proc/thread-self/status")


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of sorted values, nearest rank; NaN when empty."""
    if not ordered:
        return math.nan
    rank = math.ceil(q * len(ordered)) - 1
    return ordered[min(max(rank, 0), len(ordered) - 1)]


_uniform: dict[int, list[float]] = {}
_table_bits = TABLE_BITS


def use_table_bits(bits: int) -> None:
    """Size the draw tables of the cases that follow: 2**bits draws. A smaller table is
    the same draws' prefix (one seed), cycled sooner."""
    global _table_bits
    _table_bits = bits


def uniform_table() -> list[float]:
    """2**20 fixed uniform draws in [0, 1), shared so set-up costs every case alike."""
    table = _uniform.get(_table_bits)
    if table is None:
        rng = random.Random(20150101)
        table = _uniform[_table_bits] = [rng.random() for _ in range(1 << _table_bits)]
    return table
