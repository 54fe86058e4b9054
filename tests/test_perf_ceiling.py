"""The ceiling search judges a rate whose first run fails by the majority of three runs,
as the JVM anchor's three runs per rate are judged by their medians (issue 28)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.ceiling import search
from bench.common import Record

PASS: Record = {
    "achieved_pct": 100.0,
    "achieved_per_s": 1,
    "late_p50_ms": 1.0,
    "late_p99_ms": 2.0,
    "late_p999_ms": 3.0,
    "cpu_s_per_1m": 2.5,
    "early": 0,
    "doubles": 0,
    "unfinished": 0,
}


def scripted(script: dict[int, Iterator[bool]], tried: list[int]) -> object:
    """Per rate, the verdicts of its successive runs (True: the run passes)."""

    def run(impl: str, loop: str, gc: str, params: dict[str, int | float | str]) -> Record:
        rate = params["rate"]
        assert isinstance(rate, int)
        tried.append(rate)
        ok = next(script[rate])
        return {**PASS, "rate": rate, "late_p99_ms": 2.0 if ok else 9.0, "achieved_per_s": rate}

    return run


def test_a_failing_run_is_judged_by_the_majority_of_three() -> None:
    tried: list[int] = []
    script = {
        100_000: iter([True]),
        200_000: iter([False, True, True]),  # one bad run: the rate passes
        400_000: iter([False, True, False]),  # most runs fail: the ceiling is below
    }
    record = search(
        scripted(script, tried),  # type: ignore[arg-type]
        "wheel", "uvloop", "on", "low", "shared",
        start=100_000, step=2.0, max_rate=800_000, seconds=1.0, confirm=3,
    )  # fmt: skip
    assert tried == [100_000, 200_000, 200_000, 200_000, 400_000, 400_000, 400_000]
    assert record["ceiling_per_s"] == 200_000
    assert record["failed_at_per_s"] == 400_000
    assert record["failed_late_p99_ms"] == 9.0
    assert record["failed_achieved_per_s"] == 400_000
    assert record["tried"] == 7


def test_two_failures_end_the_rate_at_once_and_one_run_is_the_default() -> None:
    tried: list[int] = []
    script = {100_000: iter([True]), 200_000: iter([False, False])}
    record = search(
        scripted(script, tried),  # type: ignore[arg-type]
        "heap", "asyncio", "off", "high", "unique",
        start=100_000, step=2.0, max_rate=800_000, seconds=1.0, confirm=3,
    )  # fmt: skip
    assert tried == [100_000, 200_000, 200_000]
    assert record["ceiling_per_s"] == 100_000
    tried.clear()
    script = {100_000: iter([True]), 200_000: iter([False, True, True])}
    record = search(
        scripted(script, tried),  # type: ignore[arg-type]
        "heap", "asyncio", "off", "high", "unique",
        start=100_000, step=2.0, max_rate=800_000, seconds=1.0,
    )  # fmt: skip
    assert tried == [100_000, 200_000]
    assert record["ceiling_per_s"] == 100_000


@pytest.mark.parametrize("confirm", [0, 2, 1.5])
def test_confirm_must_be_an_odd_count(confirm: float) -> None:
    with pytest.raises(ValueError, match="confirm must be an odd number"):
        search(
            scripted({}, []),  # type: ignore[arg-type]
            "wheel", "asyncio", "on", "low", "shared",
            start=100_000, step=2.0, max_rate=800_000, seconds=1.0, confirm=confirm,
        )  # fmt: skip
