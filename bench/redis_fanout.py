"""Parked long polls over 4 worker processes, woken through Redis: three runs side by side.

    python -m bench.redis_fanout [--smoke | --quick] [--design ...] [--json out.json]

``fanout``: each worker holds its waiters in a purgatory joined by one
:class:`aiopurgatory.redis.RedisFanout` (one subscriber connection and a pool of 4); a
wake-up makes the worker fetch the topic's new entries once (one pipeline per batch of
woken topics) and every waiter of that topic there takes them from that copy.
``xread``: the usual design, one ``XREAD BLOCK`` per waiting request, hence one Redis
connection per waiter.
``cluster``: ``fanout`` against a Redis Cluster of 3 primaries and 3 replicas (the
workers and the publisher given one node's URL, as a user would): one SSUBSCRIBE
subscriber per primary per worker, the wake-ups sent with SPUBLISH from the same Lua
script as the XADD (the topic's stream named with the fanout's ``hash_tag``, so both
are on one slot), the workers' fetches through ``fanout.cluster_client``.

Per size (parked waiters N over 4 workers, N/10 topics, so each message wakes 10
waiters spread over the workers): each design parks N waiters, then a publisher in
this process XADDs (and, for ``fanout`` and ``cluster``, PUBLISHes or SPUBLISHes the
wake-up in the same Lua script) messages carrying their publish time at a steady
rate; each waiter takes every message of its topic and parks again. Reported: Redis
connections while parked and publishing (``CLIENT LIST``; ``subscribers`` those
holding channels), publish-to-delivery latency p50/p99/max (CLOCK_MONOTONIC is
system-wide on Linux, so the publisher's stamp and the waiter's clock compare), CPU
per delivered message in the workers (getrusage) and in redis-server (``INFO cpu``),
and the deliveries expected vs made. For ``cluster``, connections and CPU are counted
on every node (clients only: the replication links are left out): the row has their
sums, its ``nodes`` each node's figures, the CPU per delivered message as for one Redis.

One redis-server (or one cluster, :class:`bench.redis_nodes.RedisCluster`, which starts
in about 2 s) per run, on free loopback ports; the single server with
``--maxclients`` sized for the run, after raising the soft ``RLIMIT_NOFILE`` to the
hard limit. When the hard limit cannot hold one connection per waiter, ``xread`` is
skipped at that size and the table says why. Linux only (the monotonic clock).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any, Final

from .common import percentile

WORKERS: Final = 4
WAITERS_PER_TOPIC: Final = 10
POOL_SIZE: Final = 4
SIZES: Final = {
    # parked waiters per run, messages per second, seconds of publishing
    "smoke": ([200], 100, 1.0),
    "quick": ([1000, 5000], 200, 3.0),
    "full": ([1000, 10_000, 50_000], 200, 5.0),
}
DESIGNS: Final = ("fanout", "xread", "cluster")
CLUSTER_NODE_TIMEOUT_MS: Final = 5000
"""The bench cluster's ``cluster-node-timeout``: Redis's default is 15 s, the tests'
1 s; long enough that a busy machine never makes the cluster fail a node over."""
PREFIX: Final = "bench-fanout"
FD_MARGIN: Final = 256

PUBLISH_LUA: Final = """
redis.call('XADD', KEYS[1], 'MAXLEN', '~', 1000, '*', 'ts', ARGV[1])
if ARGV[2] ~= '' then redis.call(ARGV[4], ARGV[2], ARGV[3]) end
return 0
"""


@dataclass
class Result:
    design: str
    parked: int
    connections: int | None = None
    messages: int = 0
    expected: int = 0
    delivered: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    worker_cpu_us: float | None = None
    """Workers' CPU (user + system) per delivered message, microseconds."""
    redis_cpu_us: float | None = None
    park_seconds: float | None = None
    skipped: str | None = None
    subscribers: int | None = None
    """Of ``connections``, those subscribed to channels (SUBSCRIBE or SSUBSCRIBE)."""
    nodes: list[dict[str, Any]] | None = None
    """``cluster`` only: per node, ``port``, ``role`` (primary or replica),
    ``connections`` and ``subscribers`` (peaks while parked and publishing) and
    ``cpu_us`` (per delivered message); ``connections``, ``subscribers`` and
    ``redis_cpu_us`` above are their sums."""


# -- redis-server ------------------------------------------------------------------------


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (inherited by children); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Server:
    """A redis-server without persistence on a free loopback port."""

    def __init__(self, maxclients: int) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (Debian: apt-get install redis-server)")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port: int = sock.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="bench-redis-")
        command = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", self.dir, "--maxclients", str(maxclients)]
        command += ["--tcp-backlog", "4096"]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class Cluster:
    """3 primaries + 3 replicas (:class:`bench.redis_nodes.RedisCluster`), seen as one."""

    def __init__(self) -> None:
        from .redis_nodes import REDIS_CLI, REDIS_SERVER, SKIP_REASON, RedisCluster

        if REDIS_SERVER is None or REDIS_CLI is None:
            raise SystemExit(SKIP_REASON)
        self.cluster = RedisCluster(node_timeout_ms=CLUSTER_NODE_TIMEOUT_MS)
        try:
            self.cluster.start()
            self.roles = {
                n.port: "primary" if n.role() == "master" else "replica" for n in self.nodes
            }
        except BaseException:
            self.cluster.close()
            raise
        self.url = self.cluster.primaries()[0].url  # one node's URL, as a user gives it

    @property
    def nodes(self) -> list[Any]:
        return list(self.cluster.nodes)

    def cpu_seconds(self) -> list[float]:
        return [_cpu_seconds(node.port) for node in self.nodes]

    def connections(self) -> list[tuple[int, int]]:
        return [_connections(node.port) for node in self.nodes]

    def failovers(self) -> list[int]:
        """Ports whose role changed since the start (a failover during the run)."""
        return [
            n.port
            for n in self.nodes
            if self.roles[n.port] != ("primary" if n.role() == "master" else "replica")
        ]

    def close(self) -> None:
        self.cluster.close()


class Single:
    """One :class:`Server`, with :class:`Cluster`'s interface (one node)."""

    def __init__(self, maxclients: int) -> None:
        self.server = Server(maxclients)
        self.url = self.server.url

    def cpu_seconds(self) -> list[float]:
        return [_cpu_seconds(self.server.port)]

    def connections(self) -> list[tuple[int, int]]:
        return [_connections(self.server.port)]

    def close(self) -> None:
        self.server.close()


# -- the workers -------------------------------------------------------------------------


def _worker(conn: Connection, design: str, url: str, topics: list[str]) -> None:
    """One worker process: park a waiter per entry of ``topics``, then follow orders."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    try:
        asyncio.run(_work(conn, design, url, topics))
    except BaseException as exc:  # report, never hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


async def _work(conn: Connection, design: str, url: str, topics: list[str]) -> None:
    import redis.asyncio as aioredis

    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    tasks: list[asyncio.Task[None]] = []
    cleanup: list[Any] = []

    if design in ("fanout", "cluster"):
        import aiopurgatory as ap
        from aiopurgatory.redis import RedisFanout

        purgatory = ap.Purgatory("bench")
        latest: dict[str, tuple[int, int]] = dict.fromkeys(topics, (0, 0))
        recent: dict[str, deque[tuple[tuple[int, int], float]]] = {
            t: deque(maxlen=1000) for t in topics
        }

        streams: dict[str, str] = {}

        async def refresh(keys: list[Any]) -> None:
            names = [k for k in keys if isinstance(k, str) and k in latest]
            client: Any = fanout.cluster_client if fanout.cluster else fanout.client
            async with client.pipeline(transaction=False) as pipe:
                for name in names:
                    last = latest[name]
                    pipe.xrange(streams[name], min=f"({last[0]}-{last[1]}", count=1000)
                replies = await pipe.execute()
            for name, entries in zip(names, replies, strict=True):
                for entry_id, fields in entries:
                    ident = _ident(entry_id)
                    recent[name].append((ident, float(fields[b"ts"])))
                    latest[name] = ident

        fanout = RedisFanout(
            url, prefix=f"{PREFIX}:wake", pool_size=POOL_SIZE, refresh=refresh, name="bench"
        )
        fanout.attach(purgatory)
        fanout.start()
        cleanup.append(fanout.aclose)
        if not await fanout.wait_connected(10):
            raise RuntimeError(f"the fanout did not connect: {fanout.stats}")
        if fanout.cluster != (design == "cluster"):
            raise RuntimeError(f"{design}: the fanout found cluster={fanout.cluster}")
        streams.update((t, stream_key(fanout, t, design == "cluster")) for t in topics)
        if fanout.cluster:  # read the slot map now, not in the first wake-up's fetch
            await fanout.cluster_client.initialize()  # type: ignore[union-attr]

        async def waiter(topic: str) -> None:
            seen = (0, 0)

            def news() -> bool:
                return latest[topic] > seen

            while True:
                await purgatory.wait_for([topic], news, None)
                now = time.monotonic()
                for ident, stamp in reversed(recent[topic]):
                    if ident <= seen:
                        break
                    latencies.append(now - stamp)
                seen = latest[topic]

        for topic in topics:
            tasks.append(loop.create_task(waiter(topic)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        ready = purgatory.num_delayed() == len(topics)
    else:
        # One connection per waiter, opened a few dozen at a time (thousands of
        # connects at once overflow the listen backlog and time out).
        opening = asyncio.Semaphore(32)
        clients: list[aioredis.Redis] = []

        async def close_all() -> None:
            for one in clients:
                await one.aclose()

        cleanup.append(close_all)

        async def waiter(topic: str) -> None:
            last = "0-0"
            key = f"{PREFIX}:{topic}"
            # No socket timeout: redis-py 8's default (5 s) would end XREAD BLOCK 0.
            client = aioredis.Redis.from_url(
                url, single_connection_client=True, socket_timeout=None
            )
            clients.append(client)
            async with opening:
                await client.ping()
            while True:
                reply: Any = await client.xread({key: last}, block=0, count=1000)
                now = time.monotonic()
                streams = reply.items() if isinstance(reply, dict) else reply
                for _, entries in streams:
                    for entry_id, fields in entries:
                        latencies.append(now - float(fields[b"ts"]))
                        last = entry_id.decode() if isinstance(entry_id, bytes) else entry_id

        for topic in topics:
            tasks.append(loop.create_task(waiter(topic)))
        ready = True
    failed: list[BaseException] = []

    def report(task: asyncio.Task[None]) -> None:
        # A waiter that dies (a refused connection...) must fail the run, not shrink it.
        if not task.cancelled() and task.exception() is not None and not failed:
            failed.append(task.exception() or RuntimeError())
            conn.send(("error", f"a waiter failed: {task.exception()!r}"))

    for task in tasks:
        task.add_done_callback(report)
    conn.send(("parked", ready))
    start_cpu = 0.0
    while True:
        order = await loop.run_in_executor(None, conn.recv)
        if order == "go":
            latencies.clear()
            start_cpu = _cpu()
            conn.send(("going", None))
        elif order == "count":
            conn.send(("count", len(latencies)))
        elif order == "stop":
            cpu = _cpu() - start_cpu
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for close in cleanup:
                await close()
            conn.send(("result", (cpu, latencies)))
            return


def stream_key(fanout: Any, topic: str, cluster: bool) -> str:
    """The topic's stream: on a cluster, in the slot of its wake-up channel."""
    return f"{PREFIX}:{fanout.hash_tag(topic)}:{topic}" if cluster else f"{PREFIX}:{topic}"


def _ident(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, seq = text.split("-")
    return int(ms), int(seq)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- one run -------------------------------------------------------------------------------


def _connections(port: int) -> tuple[int, int]:
    """(subscribers, others) among the clients of the redis-server on ``port``, but this
    process's own (publisher, CLIENT LIST) and a cluster's replication links (flags S
    on a primary, M on a replica). A subscriber holds channels (``sub``/``ssub``)."""
    subscribers = others = 0
    for line in _clients(port):
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("name") == "bench-publisher" or set(fields.get("flags", "")) & {"S", "M"}:
            continue
        if any(int(fields.get(k) or 0) > 0 for k in ("sub", "psub", "ssub")):
            subscribers += 1
        else:
            others += 1
    return subscribers, others


def _clients(port: int) -> list[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"CLIENT LIST\r\n")
        reader = sock.makefile("rb")
        header = reader.readline()
        body = reader.read(int(header[1:-2]) + 2).decode()
    return [line for line in body.splitlines() if line and "cmd=client|list" not in line]


async def _publish(url: str, design: str, topics: int, rate: float, seconds: float) -> int:
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

    from aiopurgatory.redis import RedisFanout

    cluster = design == "cluster"
    client: Any = (RedisCluster if cluster else aioredis.Redis).from_url(
        url, client_name="bench-publisher"
    )
    wake = RedisFanout(url, prefix=f"{PREFIX}:wake")  # only to encode wake-ups: never started
    script = client.register_script(PUBLISH_LUA)
    command = "SPUBLISH" if cluster else "PUBLISH"
    count = int(rate * seconds)
    try:
        # Before the clock starts: the script cached on every node (on a cluster, the
        # slot map read too), so that the first messages do not carry that setup.
        await client.script_load(PUBLISH_LUA)
        start = time.monotonic()
        for n in range(count):
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            topic = f"t{n % topics}"
            channel, payload = wake.message_for(topic) if design != "xread" else ("", b"")
            key = stream_key(wake, topic, cluster)
            stamp = repr(time.monotonic())
            await script(keys=[key], args=[stamp, channel, payload, command])
    finally:
        await client.aclose()
        await wake.aclose()
    return count


def run_one(design: str, parked: int, rate: float, seconds: float, fd_limit: int) -> Result:
    result = Result(design, parked)
    need = parked + FD_MARGIN if design == "xread" else FD_MARGIN
    if need > fd_limit:
        result.skipped = (
            f"needs {need} open files in redis-server, the limit here is {fd_limit}"
            " (hard RLIMIT_NOFILE; raise it to run)"
        )
        return result
    topics = max(1, parked // WAITERS_PER_TOPIC)
    target: Cluster | Single = (
        Cluster()
        if design == "cluster"
        else Single(maxclients=max(1000, min(fd_limit - 64, parked + FD_MARGIN)))
    )
    url = target.url
    context = multiprocessing.get_context("fork")
    pipes: list[Connection] = []
    procs: list[Any] = []
    try:
        for w in range(WORKERS):
            mine = [f"t{i % topics}" for i in range(parked) if (i // topics) % WORKERS == w]
            parent, child = context.Pipe()
            proc = context.Process(target=_worker, args=(child, design, url, mine))
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        started = time.monotonic()
        for pipe in pipes:
            kind, value = _recv(pipe, 120)
            if kind != "parked":
                raise RuntimeError(f"a worker failed: {value}")
        if isinstance(target, Single) and design == "xread":  # all blocked before we start
            while _blocked(target.server.port) < parked:
                for pipe in pipes:
                    if pipe.poll(0):
                        raise RuntimeError(f"a worker failed: {pipe.recv()[1]}")
                if time.monotonic() - started > 120:
                    raise RuntimeError("the XREADs did not all block within 120 s")
                time.sleep(0.05)
        result.park_seconds = time.monotonic() - started
        connections = target.connections()
        for pipe in pipes:
            pipe.send("go")
        for pipe in pipes:
            _recv(pipe, 30)
        cpu_before = target.cpu_seconds()
        result.messages = asyncio.run(_publish(url, design, topics, rate, seconds))
        per_topic = [0] * topics
        for i in range(parked):
            per_topic[i % topics] += 1
        result.expected = sum(per_topic[n % topics] for n in range(result.messages))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            total = 0
            for pipe in pipes:
                pipe.send("count")
                total += _recv(pipe, 30)[1]
            if total >= result.expected:
                break
            time.sleep(0.05)
        redis_cpu = [b - a for a, b in zip(cpu_before, target.cpu_seconds(), strict=True)]
        # Pools open their connections as they are used: count again, still parked.
        connections = [
            (max(a[0], b[0]), max(a[1], b[1]))
            for a, b in zip(connections, target.connections(), strict=True)
        ]
        result.connections = sum(sum(c) for c in connections)
        result.subscribers = sum(c[0] for c in connections)
        if isinstance(target, Cluster):
            changed = target.failovers()
            if changed:
                raise RuntimeError(f"the cluster failed nodes over during the run: {changed}")
        worker_cpu = 0.0
        latencies: list[float] = []
        for pipe in pipes:
            pipe.send("stop")
            kind, value = _recv(pipe, 60)
            if kind != "result":
                raise RuntimeError(f"a worker failed: {value}")
            worker_cpu += value[0]
            latencies.extend(value[1])
        latencies.sort()
        result.delivered = len(latencies)
        if latencies:
            result.p50_ms = percentile(latencies, 0.50) * 1000
            result.p99_ms = percentile(latencies, 0.99) * 1000
            result.max_ms = latencies[-1] * 1000
            result.worker_cpu_us = worker_cpu / len(latencies) * 1e6
            result.redis_cpu_us = sum(redis_cpu) / len(latencies) * 1e6
        if isinstance(target, Cluster):
            result.nodes = [
                {
                    "port": node.port,
                    "role": target.roles[node.port],
                    "connections": sum(count),
                    "subscribers": count[0],
                    "cpu_us": cpu / max(1, len(latencies)) * 1e6,
                }
                for node, count, cpu in zip(target.nodes, connections, redis_cpu, strict=True)
            ]
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        target.close()
    return result


def _recv(pipe: Connection, timeout: float) -> Any:
    if not pipe.poll(timeout):
        raise RuntimeError(f"a worker did not answer within {timeout} s")
    return pipe.recv()


def _info(port: int, section: str) -> dict[str, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"INFO %s\r\n" % section.encode())
        reader = sock.makefile("rb")
        header = reader.readline()
        body = reader.read(int(header[1:-2]) + 2).decode()
    return dict(line.split(":", 1) for line in body.splitlines() if ":" in line)


def _blocked(port: int) -> int:
    return int(_info(port, "clients").get("blocked_clients", 0))


def _cpu_seconds(port: int) -> float:
    """redis-server's CPU time so far, user + system (``INFO cpu``: its getrusage, to the
    microsecond, where ``/proc/<pid>/stat`` counts in clock ticks of 10 ms)."""
    info = _info(port, "cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


# -- the table ---------------------------------------------------------------------------


def table(results: Sequence[Result]) -> str:
    header = ["parked", "design", "redis conns", "p50 ms", "p99 ms", "max ms"]
    header += ["worker CPU us/msg", "redis CPU us/msg", "delivered/expected", "park s"]
    rows = [header]
    for r in results:
        if r.skipped:
            rows.append([str(r.parked), r.design, f"skipped: {r.skipped}"])
            continue
        rows.append(
            [
                str(r.parked),
                r.design,
                str(r.connections),
                _fmt(r.p50_ms),
                _fmt(r.p99_ms),
                _fmt(r.max_ms),
                _fmt(r.worker_cpu_us),
                _fmt(r.redis_cpu_us),
                f"{r.delivered}/{r.expected}",
                _fmt(r.park_seconds),
            ]
        )
    full = [row for row in rows if len(row) == len(header)]
    widths = [max(len(row[i]) for row in full) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [
            c.ljust(w) if i == 1 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=False))
        ]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def nodes_table(results: Sequence[Result]) -> str:
    """Each cluster node's connections and CPU per message, beside one Redis's."""
    rows = [["parked", "node", "role", "redis conns", "subscribers", "redis CPU us/msg"]]
    for r in results:
        if r.skipped or r.design == "xread":
            continue
        if r.nodes is None:
            rows.append(
                [
                    str(r.parked),
                    "one Redis",
                    "",
                    str(r.connections),
                    str(r.subscribers),
                    _fmt(r.redis_cpu_us),
                ]
            )
            continue
        for node in r.nodes:
            rows.append(
                [
                    str(r.parked),
                    f"cluster :{node['port']}",
                    node["role"],
                    str(node["connections"]),
                    str(node["subscribers"]),
                    _fmt(node["cpu_us"]),
                ]
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i in (1, 2) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.redis_fanout",
        description="Parked polls over 4 workers woken through Redis: one subscription"
        " per process (aiopurgatory.redis) vs one XREAD BLOCK per waiter, and the"
        " subscriptions on a 3-primary Redis Cluster.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="1k and 5k parked (about a minute)")
    size.add_argument("--smoke", action="store_true", help="200 parked, for the test suite")
    parser.add_argument("--parked", type=int, nargs="+", help="parked waiters per run")
    parser.add_argument(
        "--design", choices=DESIGNS, nargs="+", default=list(DESIGNS), help="all by default"
    )
    parser.add_argument("--json", metavar="PATH", help="write the results there")
    args = parser.parse_args(argv)
    name = "smoke" if args.smoke else "quick" if args.quick else "full"
    sizes, rate, seconds = SIZES[name]
    if args.parked:
        sizes = args.parked
    fd_limit = raise_fd_limit()
    print(
        f"{WORKERS} workers, {WAITERS_PER_TOPIC} waiters per topic, {rate:g} messages/s for"
        f" {seconds:g} s; open files limit {fd_limit}",
        flush=True,
    )
    results = []
    for parked in sizes:
        for design in args.design:
            result = run_one(design, parked, rate, seconds, fd_limit)
            results.append(result)
            print(table([result]).splitlines()[-1], flush=True)
    print()
    print(table(results))
    if any(r.nodes for r in results):
        print()
        print(nodes_table(results))
    if args.json:
        with open(args.json, "w") as f:
            # A list of flat records, as every suite of ``python -m bench`` writes (the
            # docs' performance page tables each bench/*.json).
            common = {"suite": "redis-fanout", "size": name, "rate": rate}
            common |= {"seconds": seconds, "workers": WORKERS, "fd_limit": fd_limit}
            json.dump([{**common, **asdict(r)} for r in results], f, indent=1)
    failed = [r for r in results if not r.skipped and r.delivered < r.expected]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
