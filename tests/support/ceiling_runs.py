"""Scripted runs of the purgatory suite for the ceiling search's tests."""

from __future__ import annotations

from collections.abc import Iterator

from bench.common import Record

PASS: Record = {
    "achieved_pct": 100.0,
    "late_p50_ms": 1.0,
    "late_p99_ms": 2.0,
    "late_p999_ms": 3.0,
    "cpu_s_per_1m": 2.5,
    "early": 0,
    "doubles": 0,
    "unfinished": 0,
}
"""A run that passes the bar."""


def scripted(script: dict[int, Iterator[bool]], tried: list[int]) -> object:
    """Per rate, the verdicts of its successive runs (True: the run passes)."""

    def run(impl: str, loop: str, gc: str, params: dict[str, int | float | str]) -> Record:
        rate = params["rate"]
        assert isinstance(rate, int)
        tried.append(rate)
        ok = next(script[rate])
        return {**PASS, "rate": rate, "late_p99_ms": 2.0 if ok else 9.0, "achieved_per_s": rate}

    return run
