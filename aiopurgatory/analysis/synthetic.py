"""Generated traces, statistically like a broker's: ``aiopurgatory trace synth --rows N``.

For trying and timing the report at any size (the 10M-row benchmark uses it) and for
the tests.

Arrivals are Poisson; each operation's condition would hold after a log-normal time
(the workload of ``python -m bench purgatory``). It completes then if that is before its
timeout, else it expires a little after its deadline (within a tick plus a small
exponential delay, like a loop that is not blocked). A few are cancelled, and those
still pending at the end are closed.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Final

import numpy as np
import pyarrow as pa

from aiopurgatory.trace import trace_schema, write_trace_table

__all__ = ["DEFAULT_KINDS", "Z75", "KindSpec", "generate_trace", "lognormal_sigma"]


@dataclass(frozen=True, slots=True)
class KindSpec:
    """One kind of operation in a generated trace."""

    purgatory: str
    kind: str
    share: float
    """Fraction of arrivals of this kind."""
    timeout: float | None
    """Seconds; None = no timeout."""
    median: float
    """Median seconds until the condition holds."""
    p75: float
    """75th percentile of that time (sets the log-normal's spread)."""
    keys: int = 1
    cancel_rate: float = 0.0


DEFAULT_KINDS: Final = (
    KindSpec("produce", "Produce", 0.5, 0.2, median=0.02, p75=0.06, keys=3),
    KindSpec("fetch", "Fetch", 0.35, 0.5, median=0.2, p75=0.4, keys=2, cancel_rate=0.01),
    KindSpec("fetch", "Follower", 0.1, 0.5, median=0.005, p75=0.01, keys=1),
    KindSpec("rebalance", "Join", 0.05, None, median=1.0, p75=2.0, keys=1, cancel_rate=0.02),
)

Z75: Final = NormalDist().inv_cdf(0.75)
"""The standard normal's 75th percentile (about 0.6745)."""


def lognormal_sigma(median: float, p75: float) -> float:
    """The log-normal's sigma given its median and 75th percentile."""
    return math.log(p75 / median) / Z75


def generate_trace(
    directory: str | Path,
    rows: int,
    *,
    rate: float = 50_000.0,
    kinds: tuple[KindSpec, ...] = DEFAULT_KINDS,
    tick: float = 0.001,
    rows_per_file: int = 1_000_000,
    seed: int = 0,
    base_wall_ns: int | None = None,
) -> Path:
    """Write ``rows`` operations arriving at ``rate`` per second as trace files."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows!r}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    wall = time.time_ns() if base_wall_ns is None else base_wall_ns
    token = secrets.token_hex(4)
    shares = np.array([k.share for k in kinds])
    start = 0.0
    for seq, first in enumerate(range(0, rows, rows_per_file)):
        n = min(rows_per_file, rows - first)
        created = start + np.cumsum(rng.exponential(1.0 / rate, n))
        start = float(created[-1])
        which = rng.choice(len(kinds), size=n, p=shares / shares.sum())
        table = _operations(rng, kinds, which, created, tick, end=rows / rate)
        write_trace_table(out, table, base_wall_ns=wall, base_clock_ns=0, token=token, seq=seq)
    return out


def _operations(
    rng: np.random.Generator,
    kinds: tuple[KindSpec, ...],
    which: np.ndarray,
    created: np.ndarray,
    tick: float,
    end: float,
) -> pa.Table:
    n = len(created)

    def per_row(values: list[object], dtype: type | str = object) -> np.ndarray:
        return np.array(values, dtype=dtype).take(which)

    median = per_row([k.median for k in kinds], "f8")
    sigma = per_row([lognormal_sigma(k.median, k.p75) for k in kinds], "f8")
    ready = created + median * np.exp(sigma * rng.standard_normal(n))
    deadline = created + per_row([np.nan if k.timeout is None else k.timeout for k in kinds], "f8")
    expires = ready >= deadline  # False where there is no deadline (NaN)
    lateness = rng.uniform(0.0, tick, n) + rng.exponential(tick / 10, n)
    finished = np.where(expires, deadline + lateness, ready)
    outcome = np.where(expires, "expired", "completed").astype(object)
    cancel = rng.random(n) < per_row([k.cancel_rate for k in kinds], "f8")
    finished = np.where(cancel, created + (finished - created) * rng.random(n), finished)
    outcome[cancel] = "cancelled"
    closed = finished > end
    finished[closed] = np.maximum(end, created[closed])
    outcome[closed] = "closed"

    def ns(seconds: np.ndarray) -> pa.Array:
        return pa.array(np.rint(seconds * 1e9), pa.float64(), from_pandas=True).cast(pa.int64())

    return pa.table(
        {
            "purgatory": per_row([k.purgatory for k in kinds]),
            "kind": per_row([k.kind for k in kinds]),
            "num_keys": per_row([k.keys for k in kinds], "i4"),
            "created_ns": ns(created),
            "deadline_ns": ns(deadline),
            "finished_ns": ns(finished),
            "outcome": outcome,
        },
        schema=trace_schema(),
    )
