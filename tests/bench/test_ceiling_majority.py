"""The ceiling search judges a rate whose first run fails by the majority of three runs,
as the JVM anchor's three runs per rate are judged by their medians (issue 28)."""

from __future__ import annotations

import pytest

from bench.ceiling import search

from ..support.ceiling_runs import scripted


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
