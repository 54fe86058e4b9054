"""Parked long polls over 4 worker processes, woken through Redis: two designs side by side.

    python -m bench.redis_fanout [--smoke | --quick] [--json out.json]

``fanout``: each worker holds its waiters in a purgatory joined by one
:class:`aiopurgatory.redis.RedisFanout` (one subscriber connection and a pool of 4); a
wake-up makes the worker fetch the topic's new entries once (one pipeline per batch of
woken topics) and every waiter of that topic there takes them from that copy.
``xread``: the usual design, one ``XREAD BLOCK`` per waiting request, hence one Redis
connection per waiter.

Per size (parked waiters N over 4 workers, N/10 topics, so each message wakes 10
waiters spread over the workers): both designs park N waiters, then a publisher in
this process XADDs (and, for ``fanout``, PUBLISHes the wake-up in the same Lua script)
messages carrying their publish time at a steady rate; each waiter takes every message
of its topic and parks again. Reported: Redis connections while parked (``CLIENT
LIST``), publish-to-delivery latency p50/p99/max (CLOCK_MONOTONIC is system-wide on
Linux, so the publisher's stamp and the waiter's clock compare), CPU per delivered
message in the workers and in redis-server (getrusage / ``/proc/<pid>/stat``), and
the deliveries expected vs made.

One redis-server per size, started here on a free loopback port with ``--maxclients``
sized for the run, after raising the soft ``RLIMIT_NOFILE`` to the hard limit. When
the hard limit cannot hold one connection per waiter, ``xread`` is skipped at that
size and the table says why. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
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
DESIGNS: Final = ("fanout", "xread")
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

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


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

    if design == "fanout":
        import aiopurgatory as ap
        from aiopurgatory.redis import RedisFanout

        purgatory = ap.Purgatory("bench")
        latest: dict[str, tuple[int, int]] = dict.fromkeys(topics, (0, 0))
        recent: dict[str, deque[tuple[tuple[int, int], float]]] = {
            t: deque(maxlen=1000) for t in topics
        }

        async def refresh(keys: list[Any]) -> None:
            names = [k for k in keys if isinstance(k, str) and k in latest]
            async with fanout.client.pipeline(transaction=False) as pipe:
                for name in names:
                    last = latest[name]
                    pipe.xrange(f"{PREFIX}:{name}", min=f"({last[0]}-{last[1]}", count=1000)
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


def _ident(entry_id: bytes | str) -> tuple[int, int]:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, seq = text.split("-")
    return int(ms), int(seq)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- one run -------------------------------------------------------------------------------


def _connections(port: int) -> int:
    """Connections to redis-server but this process's own (publisher, CLIENT LIST)."""
    return len([c for c in _clients(port) if "name=bench-publisher" not in c])


def _clients(port: int) -> list[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"CLIENT LIST\r\n")
        reader = sock.makefile("rb")
        header = reader.readline()
        body = reader.read(int(header[1:-2]) + 2).decode()
    return [line for line in body.splitlines() if line and "cmd=client|list" not in line]


async def _publish(url: str, design: str, topics: int, rate: float, seconds: float) -> int:
    import redis.asyncio as aioredis

    from aiopurgatory.redis import RedisFanout

    client = aioredis.Redis.from_url(url, client_name="bench-publisher")
    wake = RedisFanout(url, prefix=f"{PREFIX}:wake")  # only to encode wake-ups: never started
    script = client.register_script(PUBLISH_LUA)
    count = int(rate * seconds)
    start = time.monotonic()
    try:
        for n in range(count):
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            topic = f"t{n % topics}"
            channel, payload = wake.message_for(topic) if design == "fanout" else ("", b"")
            stamp = repr(time.monotonic())
            await script(keys=[f"{PREFIX}:{topic}"], args=[stamp, channel, payload, "PUBLISH"])
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
    server = Server(maxclients=max(1000, min(fd_limit - 64, parked + FD_MARGIN)))
    context = multiprocessing.get_context("fork")
    pipes: list[Connection] = []
    procs: list[Any] = []
    try:
        for w in range(WORKERS):
            mine = [f"t{i % topics}" for i in range(parked) if (i // topics) % WORKERS == w]
            parent, child = context.Pipe()
            proc = context.Process(target=_worker, args=(child, design, server.url, mine))
            proc.start()
            pipes.append(parent)
            procs.append(proc)
        started = time.monotonic()
        for pipe in pipes:
            kind, value = _recv(pipe, 120)
            if kind != "parked":
                raise RuntimeError(f"a worker failed: {value}")
        if design == "xread":  # every XREAD must be blocked in Redis before we start
            while _blocked(server.port) < parked:
                for pipe in pipes:
                    if pipe.poll(0):
                        raise RuntimeError(f"a worker failed: {pipe.recv()[1]}")
                if time.monotonic() - started > 120:
                    raise RuntimeError("the XREADs did not all block within 120 s")
                time.sleep(0.05)
        result.park_seconds = time.monotonic() - started
        result.connections = _connections(server.port)
        for pipe in pipes:
            pipe.send("go")
        for pipe in pipes:
            _recv(pipe, 30)
        cpu_before = server.cpu_seconds()
        result.messages = asyncio.run(_publish(server.url, design, topics, rate, seconds))
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
        redis_cpu = server.cpu_seconds() - cpu_before
        # Pools open their connections as they are used: count again, still parked.
        result.connections = max(result.connections, _connections(server.port))
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
            result.redis_cpu_us = redis_cpu / len(latencies) * 1e6
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        server.close()
    return result


def _recv(pipe: Connection, timeout: float) -> Any:
    if not pipe.poll(timeout):
        raise RuntimeError(f"a worker did not answer within {timeout} s")
    return pipe.recv()


def _blocked(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"INFO clients\r\n")
        reader = sock.makefile("rb")
        header = reader.readline()
        body = reader.read(int(header[1:-2]) + 2).decode()
    for line in body.splitlines():
        if line.startswith("blocked_clients:"):
            return int(line.split(":")[1])
    return 0


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


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.redis_fanout",
        description="Parked polls over 4 workers woken through Redis: one subscription"
        " per process (aiopurgatory.redis) vs one XREAD BLOCK per waiter.",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="1k and 5k parked (about a minute)")
    size.add_argument("--smoke", action="store_true", help="200 parked, for the test suite")
    parser.add_argument("--parked", type=int, nargs="+", help="parked waiters per run")
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
        for design in DESIGNS:
            result = run_one(design, parked, rate, seconds, fd_limit)
            results.append(result)
            print(table([result]).splitlines()[-1], flush=True)
    print()
    print(table(results))
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
