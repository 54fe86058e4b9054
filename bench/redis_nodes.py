"""Real ``redis-server`` processes on loopback, for the benchmarks and the tests.

:class:`RedisServer`: one server without persistence on a free port.
:class:`RedisCluster`: a Redis Cluster of six (three primaries, a replica of each,
``redis-cli --cluster create``), ready when every node reports ``cluster_state:ok``
and agrees on the slot map; it can change its topology for real:
:meth:`RedisCluster.kill` (SIGKILL, the replica takes over after
``cluster-node-timeout``), :meth:`RedisCluster.restart`, :meth:`RedisCluster.migrate_slot`
(the steps ``redis-cli --cluster reshard`` takes, for one slot).

Nothing here needs an event loop or a Redis client library: the nodes are driven
(``CLIENT KILL``, ``CLIENT LIST``, ``CLUSTER ...``, SIGSTOP/SIGCONT, restart) through a
tiny blocking RESP client, one connection per command, so that the client library
under test or measured is never the one that observes the servers.
``tests/support/redis_server.py`` and ``tests/support/redis_cluster.py`` wrap them in pytest
fixtures;
``bench/redis_fanout.py`` runs its cluster variant on a :class:`RedisCluster`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import BinaryIO, Final

REDIS_SERVER: Final = shutil.which("redis-server")
SKIP_REASON: Final = (
    "redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)"
)

RespValue = bytes | int | list["RespValue"] | None


class RespError(Exception):
    """An error reply (``-ERR ...``) from the server."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process without persistence, on 127.0.0.1:``port``."""

    __slots__ = ("_dir", "_log", "port", "proc")

    def __init__(self, port: int | None = None) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError(SKIP_REASON)
        self.port = port if port is not None else free_port()
        self._dir = tempfile.mkdtemp(prefix="aiop-redis-")
        self._log = os.path.join(self._dir, "redis.log")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def extra_args(self) -> list[str]:
        """More ``redis-server`` options (a cluster node's, in ``redis_cluster``)."""
        return []

    def start(self, timeout: float = 10.0) -> None:
        assert REDIS_SERVER is not None
        assert self.proc is None, "already running"
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self._dir,
                "--logfile", self._log,
                "--daemonize", "no",
                # Enough clients for the connection-count test's thousands of waiters
                # (which must still use only a handful of connections).
                "--maxclients", "1000",
                *self.extra_args(),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.command("PING") == b"PONG":
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log_tail()
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{log}")
            time.sleep(0.02)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a frozen server cannot act on SIGTERM
            proc.terminate()
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5.0)

    def restart(self, down_for: float = 0.0) -> None:
        """Stop, stay down ``down_for`` seconds, start again on the same port."""
        self.stop()
        time.sleep(down_for)
        self.start()

    def freeze(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 20) -> str:
        try:
            with open(self._log, encoding="utf-8", errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- a blocking RESP2 client, one connection per command -------------------------

    def command(self, *args: str | bytes | int, timeout: float = 5.0) -> RespValue:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            parts = [b"*%d\r\n" % len(args)]
            for arg in args:
                data = arg if isinstance(arg, bytes) else str(arg).encode()
                parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
            sock.sendall(b"".join(parts))
            reader = sock.makefile("rb")
            return read_reply(reader)

    def clients(self) -> list[dict[str, str]]:
        """``CLIENT LIST`` as dicts (this helper's own connection left out)."""
        raw = self.command("CLIENT", "LIST")
        assert isinstance(raw, bytes)
        rows = []
        for line in raw.decode().splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if fields.get("cmd") != "client|list":
                rows.append(fields)
        return rows


def read_reply(reader: BinaryIO) -> RespValue:
    """One RESP reply from ``reader``: public, for the tests that pipeline commands by hand."""
    line = reader.readline()
    if not line:
        raise ConnectionError("connection closed by redis-server")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body
    if kind == b"-":
        raise RespError(body.decode())
    if kind == b":":
        return int(body)
    if kind == b"$":
        n = int(body)
        if n < 0:
            return None
        data = reader.read(n + 2)
        return data[:-2]
    if kind == b"*":
        n = int(body)
        return None if n < 0 else [read_reply(reader) for _ in range(n)]
    raise RespError(f"unexpected reply {line!r}")


REDIS_CLI: Final = shutil.which("redis-cli")
NODE_TIMEOUT_MS: Final = 1000
"""``cluster-node-timeout``: a replica is promoted about this long after its primary
stops answering (plus an election of a few hundred milliseconds). Short, for tests."""
SLOTS: Final = 16384


class ClusterNode(RedisServer):
    """One cluster-mode node: a RedisServer started with the cluster options."""

    __slots__ = ("bus_port", "node_timeout_ms")

    def __init__(self, node_timeout_ms: int = NODE_TIMEOUT_MS) -> None:
        super().__init__()
        # The cluster bus port defaults to the client port + 10000, which fails for
        # the free ports above 55535 the kernel hands out: pick one too.
        self.bus_port = free_port()
        self.node_timeout_ms = node_timeout_ms

    def extra_args(self) -> list[str]:
        return [
            "--cluster-enabled", "yes",
            "--cluster-port", str(self.bus_port),
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
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

    def __init__(
        self, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = NODE_TIMEOUT_MS
    ) -> None:
        if REDIS_SERVER is None or REDIS_CLI is None:
            raise RuntimeError(SKIP_REASON)
        count = primaries * (1 + replicas)
        self.nodes = [ClusterNode(node_timeout_ms) for _ in range(count)]

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
