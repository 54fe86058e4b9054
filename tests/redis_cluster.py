"""A real Redis Cluster for tests: six ``redis-server`` processes on loopback.

Three primaries and three replicas (``redis-cli --cluster create --cluster-replicas
1``), each node a :class:`~tests.redis_server.RedisServer` in cluster mode on a free
port. Ready when every node reports ``cluster_state:ok`` and agrees on the slot map.
The tests change the topology for real: :meth:`RedisCluster.kill` (SIGKILL, the
replica takes over after ``cluster-node-timeout``), :meth:`RedisCluster.restart`,
:meth:`RedisCluster.migrate_slot` (the steps ``redis-cli --cluster reshard`` takes,
for one slot), all through the blocking RESP client of ``redis_server``, so that the
client library under test is never the one that observes the cluster.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Final

import pytest

from .redis_server import REDIS_SERVER, SKIP_REASON, RedisServer, RespError, free_port

REDIS_CLI: Final = shutil.which("redis-cli")
NODE_TIMEOUT_MS: Final = 1000
"""``cluster-node-timeout``: a replica is promoted about this long after its primary
stops answering (plus an election of a few hundred milliseconds). Short, for tests."""
SLOTS: Final = 16384


class ClusterNode(RedisServer):
    """One cluster-mode node: a RedisServer started with the cluster options."""

    __slots__ = ("bus_port",)

    def __init__(self) -> None:
        super().__init__()
        # The cluster bus port defaults to the client port + 10000, which fails for
        # the free ports above 55535 the kernel hands out: pick one too.
        self.bus_port = free_port()

    def extra_args(self) -> list[str]:
        return [
            "--cluster-enabled", "yes",
            "--cluster-port", str(self.bus_port),
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A primary whose replica took over comes back as its replica; a restarted
            # node keeps its identity through nodes.conf in its own directory.
            "--cluster-require-full-coverage", "no",
            # A replica syncs at once (the default waits 5 s for more replicas to share
            # the transfer) and may take over however long its link was down: a test
            # kills a primary when it likes.
            "--repl-diskless-sync-delay", "0",
            "--cluster-replica-validity-factor", "0",
            "--cluster-allow-reads-when-down", "no",
        ]  # fmt: skip

    @property
    def node_id(self) -> str:
        raw = self.command("CLUSTER", "MYID")
        assert isinstance(raw, bytes)
        return raw.decode()

    def info(self) -> dict[str, str]:
        raw = self.command("CLUSTER", "INFO")
        assert isinstance(raw, bytes)
        return dict(line.split(":", 1) for line in raw.decode().splitlines() if ":" in line)

    def link_up(self) -> bool:
        """A primary, or a replica whose link to its primary is up (synced)."""
        raw = self.command("INFO", "replication")
        assert isinstance(raw, bytes)
        text = raw.decode()
        return "role:master" in text or "master_link_status:up" in text

    def role(self) -> str:
        raw = self.command("ROLE")
        assert isinstance(raw, list)
        assert isinstance(raw[0], bytes)
        return raw[0].decode()  # "master" or "slave"


class RedisCluster:
    """Six nodes: three primaries (slots split evenly) and a replica of each."""

    __slots__ = ("nodes",)

    def __init__(self, primaries: int = 3, replicas: int = 1) -> None:
        if REDIS_SERVER is None or REDIS_CLI is None:
            raise RuntimeError(SKIP_REASON)
        self.nodes = [ClusterNode() for _ in range(primaries * (1 + replicas))]

    # -- life ------------------------------------------------------------------------

    def start(self, timeout: float = 15.0) -> None:
        assert REDIS_CLI is not None
        for node in self.nodes:
            node.start()
        replicas = len(self.nodes) // 3 - 1
        subprocess.run(
            [
                REDIS_CLI, "--cluster", "create",
                *(f"127.0.0.1:{node.port}" for node in self.nodes),
                "--cluster-replicas", str(replicas), "--cluster-yes",
            ],
            check=True, capture_output=True, timeout=timeout,
        )  # fmt: skip
        self.wait_ok(timeout)

    def wait_ok(self, timeout: float = 15.0) -> None:
        """Until every running node says ``cluster_state:ok`` and all agree on the map."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                running = [n for n in self.nodes if n.proc is not None]
                if (
                    all(n.info().get("cluster_state") == "ok" for n in running)
                    and len({self._slot_map(n) for n in running}) == 1
                    and all(n.link_up() for n in running)
                ):
                    return
            except (OSError, RespError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not become ok:\n" + self.describe())
            time.sleep(0.05)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    # -- what it looks like ----------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def primaries(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.proc is not None and n.role() == "master"]

    def replicas(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.proc is not None and n.role() == "slave"]

    def owner(self, slot: int) -> ClusterNode:
        """The primary serving ``slot``, as a running node sees the map."""
        port = dict(self._slot_owners(self._any_running()))[slot]
        return next(n for n in self.nodes if n.port == port)

    def keyslot(self, key: str | bytes) -> int:
        raw = self._any_running().command("CLUSTER", "KEYSLOT", key)
        assert isinstance(raw, int)
        return raw

    def describe(self) -> str:
        lines = []
        for node in self.nodes:
            if node.proc is None:
                lines.append(f"{node.port}: stopped")
                continue
            try:
                raw = node.command("CLUSTER", "NODES")
                assert isinstance(raw, bytes)
                lines.append(f"{node.port}:\n{raw.decode()}")
            except (OSError, RespError) as exc:
                lines.append(f"{node.port}: {exc!r}")
        return "\n".join(lines)

    # -- faults ----------------------------------------------------------------------

    def kill(self, node: ClusterNode) -> None:
        """SIGKILL: no goodbye; its replica is promoted after the node timeout."""
        assert node.proc is not None
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(5.0)
        node.proc = None

    def wait_failover(self, dead: ClusterNode, timeout: float = 15.0) -> ClusterNode:
        """Until a replica of ``dead`` serves its slots; that replica, now a primary."""
        deadline = time.monotonic() + timeout
        port = dead.port
        while time.monotonic() < deadline:
            try:
                owners = self._slot_owners(self._any_running())
                if owners and all(p != port for _, p in owners):
                    self.wait_ok(max(deadline - time.monotonic(), 0.1))
                    return self.owner(next(s for s, p in owners if p not in {port}))
            except (OSError, RespError):
                pass
            time.sleep(0.05)
        raise RuntimeError("no failover:\n" + self.describe())

    def restart(self, node: ClusterNode) -> None:
        """Start a killed node again (same port, same nodes.conf: same identity)."""
        node.start()
        self.wait_ok()

    def migrate_slot(self, slot: int, target: ClusterNode) -> None:
        """Move ``slot`` and its keys to ``target``, as ``redis-cli --cluster reshard``."""
        source = self.owner(slot)
        if source is target:
            return
        source_id, target_id = source.node_id, target.node_id
        target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        while True:
            keys = source.command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            assert isinstance(keys, list)
            if not keys:
                break
            source.command(
                "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS",
                *(k for k in keys if isinstance(k, bytes)),
            )  # fmt: skip
        for node in self.primaries():
            node.command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self.wait_ok()

    # -- internals -------------------------------------------------------------------

    def _any_running(self) -> ClusterNode:
        return next(n for n in self.nodes if n.proc is not None)

    @staticmethod
    def _slot_owners(node: ClusterNode) -> list[tuple[int, int]]:
        """(slot, port of its primary) for every slot in ``CLUSTER SLOTS``."""
        raw = node.command("CLUSTER", "SLOTS")
        assert isinstance(raw, list)
        owners: list[tuple[int, int]] = []
        for entry in raw:
            assert isinstance(entry, list)
            start, end, primary = entry[0], entry[1], entry[2]
            assert isinstance(start, int)
            assert isinstance(end, int)
            assert isinstance(primary, list)
            assert isinstance(primary[1], int)
            owners.extend((slot, primary[1]) for slot in range(start, end + 1))
        return owners

    @classmethod
    def _slot_map(cls, node: ClusterNode) -> tuple[tuple[int, int, int], ...]:
        """The map as ranges (start, end, port), to compare nodes cheaply."""
        raw = node.command("CLUSTER", "SLOTS")
        assert isinstance(raw, list)
        ranges = []
        for entry in raw:
            assert isinstance(entry, list)
            primary = entry[2]
            assert isinstance(primary, list)
            ranges.append((entry[0], entry[1], primary[1]))
        return tuple(sorted(ranges))  # type: ignore[arg-type]


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
