"""A real Redis Cluster for tests: six ``redis-server`` processes on loopback.

Three primaries and three replicas (``redis-cli --cluster create --cluster-replicas
1``), each node a :class:`RedisServer` in cluster mode on a free port. Ready when every
node reports ``cluster_state:ok`` and agrees on the slot map. The tests change the
topology for real: :meth:`RedisCluster.kill` (SIGKILL, the replica takes over after
``cluster-node-timeout``), :meth:`RedisCluster.restart`,
:meth:`RedisCluster.migrate_slot` (the steps ``redis-cli --cluster reshard`` takes,
for one slot), all through the blocking RESP client, so that the client library under
test is never the one that observes the cluster. The cluster lives in
``bench/redis_nodes.py`` (``python -m bench redis-fanout`` starts one too); this module
re-exports it and adds the fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.redis_nodes import (
    NODE_TIMEOUT_MS,
    REDIS_CLI,
    REDIS_SERVER,
    SKIP_REASON,
    SLOTS,
    ClusterNode,
    RedisCluster,
)

__all__ = [
    "NODE_TIMEOUT_MS",
    "REDIS_CLI",
    "SLOTS",
    "ClusterNode",
    "RedisCluster",
    "redis_cluster",
    "whole",
]


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisCluster]:
    """A fresh cluster for the test module; skipped only when the binaries are missing."""
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip(SKIP_REASON)
    cluster = RedisCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def whole(cluster: RedisCluster) -> RedisCluster:
    """``cluster`` with every node running and the slot map agreed: what each test of
    a module starts from (an earlier test may have killed a node)."""
    for node in cluster.nodes:
        if node.proc is None:
            cluster.restart(node)
    cluster.wait_ok()
    return cluster
