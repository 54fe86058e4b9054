"""bench/redis_fanout.py at its smoke size: both designs run, side by side, and lose nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .redis_server import REDIS_SERVER, SKIP_REASON
from .servers import ROOT


@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
def test_smoke_run_compares_both_designs(tmp_path: Path) -> None:
    out = tmp_path / "fanout.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.redis_fanout", "--smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "redis conns" in done.stdout  # the table
    records = json.loads(out.read_text())
    assert all(r["suite"] == "redis-fanout" for r in records)
    results = {r["design"]: r for r in records}
    assert set(results) == {"fanout", "xread"}
    for result in results.values():
        assert result["skipped"] is None
        assert result["delivered"] == result["expected"] > 0
        assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
        assert result["worker_cpu_us"] > 0
    parked = results["xread"]["parked"]
    # One connection per waiter against one subscriber + a pool of 4 per worker.
    assert results["xread"]["connections"] >= parked
    assert results["fanout"]["connections"] <= results["fanout"]["workers"] * (1 + 4)
