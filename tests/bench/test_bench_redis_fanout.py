"""bench/redis_fanout.py at its smoke size: the three runs (one subscription per process
and one XREAD BLOCK per waiter on one Redis, the subscriptions on a Redis Cluster) side
by side, losing nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.redis_cluster import REDIS_CLI
from ..support.redis_server import REDIS_SERVER, SKIP_REASON
from ..support.servers import ROOT


@pytest.mark.skipif(REDIS_SERVER is None or REDIS_CLI is None, reason=SKIP_REASON)
def test_smoke_run_compares_the_designs(tmp_path: Path) -> None:
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
    assert set(results) == {"fanout", "xread", "cluster"}
    for result in results.values():
        assert result["skipped"] is None
        assert result["delivered"] == result["expected"] > 0
        assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
        assert result["worker_cpu_us"] > 0
    parked = results["xread"]["parked"]
    # One connection per waiter against one subscriber + a pool of 4 per worker.
    assert results["xread"]["connections"] >= parked
    workers = results["fanout"]["workers"]
    assert results["fanout"]["connections"] <= workers * (1 + 4)
    assert results["fanout"]["subscribers"] == workers
    assert results["fanout"]["nodes"] is None
    # The cluster: counted and measured on each of its 6 nodes; one subscriber per
    # worker on every primary, nothing on the replicas, a handful pooled per worker.
    cluster = results["cluster"]
    nodes = cluster["nodes"]
    assert sorted(n["role"] for n in nodes) == ["primary"] * 3 + ["replica"] * 3
    for node in nodes:
        if node["role"] == "primary":
            assert node["subscribers"] == workers
            assert node["connections"] <= workers * (1 + 4 + 4 + 1)
            assert node["cpu_us"] > 0
        else:
            assert node["connections"] == 0
    assert cluster["connections"] == sum(n["connections"] for n in nodes)
    assert cluster["subscribers"] == 3 * workers
    assert cluster["redis_cpu_us"] == pytest.approx(sum(n["cpu_us"] for n in nodes))
    assert "subscribers" in done.stdout  # the per-node table
