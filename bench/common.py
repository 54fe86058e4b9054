"""What every suite needs: records, event loops, GC modes and process measurements."""

from __future__ import annotations

import asyncio
import gc
import math
import os
import random
from collections.abc import Callable, Sequence
from typing import Final

__all__ = [
    "LOOPS",
    "GcMode",
    "Metrics",
    "Params",
    "Record",
    "loop_factory",
    "percentile",
    "rss_bytes",
    "uniform_table",
    "voluntary_switches",
]

Value = int | float | str | None
Params = dict[str, int | float | str]
Metrics = dict[str, Value]
Record = dict[str, Value]

LOOPS: Final = ("asyncio", "uvloop")
GC_MODES: Final = ("on", "off", "freeze")

_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")
_TABLE_BITS: Final = 20


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


_uniform: list[float] = []


def uniform_table() -> list[float]:
    """2**20 fixed uniform draws in [0, 1), shared so set-up costs every case alike."""
    if not _uniform:
        rng = random.Random(20150101)
        _uniform.extend(rng.random() for _ in range(1 << _TABLE_BITS))
    return _uniform
