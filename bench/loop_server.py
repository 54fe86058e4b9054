"""``python -m bench loop-server``: an aiohttp server under wrk, stock loop vs wheel loop.

The server (a process per loop) answers ``GET /`` with a handler that takes a
per-request timeout, ``async with asyncio.timeout(5): await asyncio.sleep(0)``, and
keeps idle connections ``--keepalive`` seconds (300: every idle connection holds an
armed keep-alive timer on the loop, which is the point). A client process opens
``--idle`` connections, sends one request on each and holds them idle; then wrk
(Debian's) loads the server for ``--duration`` seconds over ``--connections``
connections. Per loop: requests/s and wrk's latency, the server's CPU seconds during
the load (``/proc/PID/stat``), its RSS with the idle connections held and its peak
RSS (``VmHWM``), and the timers pending on its loop as the load starts.

Connections to one server port are bounded by the ephemeral ports of one source
address (``ip_local_port_range``), so the server listens on as many loopback ports as
:data:`PER_PORT` requires and the client spreads its connections over them. Both
processes raise ``RLIMIT_NOFILE`` to what ``--idle`` needs (a root process can raise
its hard limit only with CAP_SYS_RESOURCE;
without it the bench holds as many as the hard limit allows, and says so).

uvloop rows (stock uvloop beside wheel/uvloop) are included only once
``aiopurgatory.loop.wheel_loop_class(uvloop.Loop)`` accepts uvloop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from aiopurgatory import loop as apl

ROOT: Final = Path(__file__).resolve().parent.parent
HOST: Final = "127.0.0.1"
PER_PORT: Final = 20_000
"""Idle connections per server port: below the 28,232 ephemeral ports of Linux's
default range, with room for wrk's and for sockets still in TIME_WAIT."""
FD_MARGIN: Final = 256
"""Descriptors a process needs beside its idle connections (listeners, wrk's 64, the
interpreter's own)."""
HANDLER_TIMEOUT: Final = 5.0
CONNECT_CONCURRENCY: Final = 256
READY_TIMEOUT: Final = 30.0
HOLD_TIMEOUT: Final = 600.0
INSTALL_WRK: Final = "wrk is not installed: apt-get install -y wrk (Debian's package)"
REQUEST: Final = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


def loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The loops compared: asyncio's, and uvloop's once the wheel loop takes it."""
    loops: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "stock asyncio": asyncio.SelectorEventLoop,
        "wheel/asyncio": apl.loop_factory(),
    }
    try:
        import uvloop
    except ImportError:
        return loops
    try:
        wheel_uvloop = apl.loop_factory(uvloop.Loop)
    except NotImplementedError:
        return loops
    loops["stock uvloop"] = uvloop.Loop
    loops["wheel/uvloop"] = wheel_uvloop
    return loops


def uvloop_skipped() -> str | None:
    """Why the uvloop rows are left out, or None when they run."""
    try:
        import uvloop
    except ImportError:
        return "uvloop is not installed"
    try:
        apl.wheel_loop_class(uvloop.Loop)
    except NotImplementedError as exc:
        return f"wheel_loop_class(uvloop.Loop) raises NotImplementedError ({exc})"
    return None


def raise_nofile(wanted: int) -> int:
    """Raise this process's open-file limit to ``wanted`` if it can; the limit it got."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, max(hard, wanted)))
    except (ValueError, OSError):  # not root, or above fs.nr_open: as far as allowed
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- the server (a child process) ------------------------------------------------------


def _pending_timers(loop: asyncio.AbstractEventLoop) -> dict[str, int | None]:
    """Timers pending on ``loop``; the base heap's items too (private, read for the
    bench only: cancelled handles stay there until the base loop purges them)."""
    heap = getattr(loop, "_scheduled", None)
    if apl.is_wheel_loop(loop):
        pending: int | None = loop.wheel_timers()  # type: ignore[attr-defined]
    elif heap is not None:
        pending = sum(1 for h in heap if not h.cancelled())
    else:
        pending = None  # uvloop: its timers are libuv's
    return {"pending": pending, "heap_items": None if heap is None else len(heap)}


async def _serve(ports: int, keepalive: float) -> None:
    from aiohttp import web

    async def hello(request: web.Request) -> web.Response:
        async with asyncio.timeout(HANDLER_TIMEOUT):  # a per-request timeout
            await asyncio.sleep(0)
        return web.Response(text="ok")

    async def timers(request: web.Request) -> web.Response:
        return web.json_response(_pending_timers(asyncio.get_running_loop()))

    app = web.Application()
    app.router.add_get("/", hello)
    app.router.add_get("/timers", timers)
    runner = web.AppRunner(app, keepalive_timeout=keepalive, access_log=None)
    await runner.setup()
    for _ in range(ports):
        await web.TCPSite(runner, HOST, 0, backlog=4096).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    bound = [address[1] for address in runner.addresses]
    print(json.dumps({"ports": bound, "loop": type(loop).__qualname__}), flush=True)
    await stop.wait()
    await runner.cleanup()


def serve_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loop_server _serve")
    p.add_argument("loop")
    p.add_argument("--ports", type=int, default=1)
    p.add_argument("--keepalive", type=float, default=300.0)
    p.add_argument("--nofile", type=int, default=FD_MARGIN)
    args = p.parse_args(argv)
    raise_nofile(args.nofile)
    with asyncio.Runner(loop_factory=loop_factories()[args.loop]) as runner:
        runner.run(_serve(args.ports, args.keepalive))
    return 0


# -- the idle connections (a child process) --------------------------------------------


class _Idle(asyncio.Protocol):
    """One idle keep-alive connection: one request, its answer, then nothing."""

    def __init__(self, answered: asyncio.Future[None]) -> None:
        self.answered = answered
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(REQUEST)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.answered.done():  # the answer is small: one segment on loopback
            self.answered.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.answered.done():
            self.answered.set_exception(ConnectionError("closed before its answer"))


async def _hold(ports: Sequence[int], n: int) -> None:
    loop = asyncio.get_running_loop()
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    held: list[tuple[asyncio.Transport, _Idle]] = []
    failed = 0

    async def one(i: int) -> None:
        nonlocal failed
        async with gate:
            answered: asyncio.Future[None] = loop.create_future()
            try:
                transport, protocol = await loop.create_connection(
                    lambda: _Idle(answered), HOST, ports[i % len(ports)]
                )
                await asyncio.wait_for(answered, 30)
            except (TimeoutError, OSError):
                failed += 1
                return
            held.append((transport, protocol))

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    seconds = time.perf_counter() - started
    print(json.dumps({"held": len(held), "failed": failed, "seconds": seconds}), flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    lost = sum(1 for _, protocol in held if protocol.closed)
    print(json.dumps({"lost": lost}), flush=True)
    for transport, _ in held:
        transport.abort()


def hold_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loop_server _hold")
    p.add_argument("n", type=int)
    p.add_argument("ports", help="comma-separated")
    args = p.parse_args(argv)
    raise_nofile(args.n + FD_MARGIN)
    ports = [int(port) for port in args.ports.split(",")]
    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        runner.run(_hold(ports, args.n))
    return 0


# -- the orchestration -----------------------------------------------------------------


def _child(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.loop_server", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _line(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The child's next JSON line, within ``timeout`` seconds."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError(f"no answer from child {proc.pid} in {timeout:g} s")
    line = proc.stdout.readline()
    if not line:
        err = proc.stderr.read() if proc.stderr else ""
        raise RuntimeError(f"child {proc.pid} ended: {err.strip()[-2000:]}")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, then what the child still printed (its last line)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (fields 14 and 15 of its stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def _timers(port: int) -> dict[str, int | None]:
    with urllib.request.urlopen(f"http://{HOST}:{port}/timers", timeout=30) as answer:
        timers: dict[str, int | None] = json.load(answer)
    return timers


_UNITS: Final = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"unexpected wrk duration {text!r}")
    return float(match[1]) * _UNITS[match[2]]


def parse_wrk(out: str) -> dict[str, float]:
    """Requests/s, latency p50/p99 (``--latency``) and errors from wrk's report."""
    found: dict[str, float] = {"errors": 0.0, "non_2xx": 0.0}
    for line in out.splitlines():
        words = line.split()
        if line.startswith("Requests/sec:"):
            found["requests_per_s"] = float(words[1])
        elif words[:1] == ["50%"]:
            found["p50_ms"] = _ms(words[1])
        elif words[:1] == ["99%"]:
            found["p99_ms"] = _ms(words[1])
        elif "requests in" in line:
            found["requests"] = float(words[0])
        elif line.strip().startswith("Socket errors:"):
            found["errors"] = float(sum(int(n) for n in re.findall(r"\d+", line)))
        elif line.strip().startswith("Non-2xx"):
            found["non_2xx"] = float(words[-1])
    if "requests_per_s" not in found:
        raise RuntimeError(f"no Requests/sec in wrk's output:\n{out}")
    return found


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One loop: its server, the idle connections, wrk; the record."""
    ports = max(1, math.ceil(args.idle / PER_PORT))
    server = _child(
        "_serve", name, "--ports", str(ports), "--keepalive", str(args.keepalive),
        "--nofile", str(args.idle + FD_MARGIN),
    )  # fmt: skip
    holder: subprocess.Popen[str] | None = None
    try:
        bound: list[int] = _line(server, READY_TIMEOUT)["ports"]
        holder = _child("_hold", str(args.idle), ",".join(map(str, bound)))
        hold = _line(holder, HOLD_TIMEOUT)
        if hold["failed"]:
            print(f"  {name}: {hold['failed']:,} idle connections failed", file=sys.stderr)
        before = _timers(bound[0])
        rss_idle = _status_mb(server.pid, "VmRSS")
        cpu = _cpu_seconds(server.pid)
        wall = time.perf_counter()
        wrk = subprocess.run(
            [args.wrk, "-t", str(args.threads), "-c", str(args.connections),
             "-d", f"{args.duration:g}s", "--latency", f"http://{HOST}:{bound[0]}/"],
            capture_output=True, text=True, check=True, timeout=args.duration + 60,
        )  # fmt: skip
        wall = time.perf_counter() - wall
        cpu = _cpu_seconds(server.pid) - cpu
        after = _timers(bound[0])
        peak = _status_mb(server.pid, "VmHWM")
        lost = json.loads(_stop(holder).strip().splitlines()[-1])["lost"]
        holder = None
        load = parse_wrk(wrk.stdout)
    finally:
        if holder is not None:
            _stop(holder)
        _stop(server)
    return {
        "suite": "loop-server",
        "impl": name,
        "idle": args.idle,
        "idle_held": hold["held"],
        "idle_failed": hold["failed"],
        "idle_lost": lost,
        "idle_setup_s": hold["seconds"],
        "ports": ports,
        "connections": args.connections,
        "threads": args.threads,
        "duration_s": args.duration,
        "keepalive_s": args.keepalive,
        "timers_pending": before["pending"],
        "heap_items": before["heap_items"],
        "timers_pending_after": after["pending"],
        "heap_items_after": after["heap_items"],
        **load,
        "cpu_s": cpu,
        "wall_s": wall,
        "cpu_us_per_request": cpu / load["requests"] * 1e6 if load.get("requests") else None,
        "rss_idle_mb": rss_idle,
        "rss_peak_mb": peak,
    }


def _table(records: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| loop | idle conns | timers pending | requests/s | p50 ms | p99 ms | server CPU s"
        " | CPU µs/request | RSS idle MB | peak RSS MB |",
        "|:--|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        per = r["cpu_us_per_request"]
        lines.append(
            f"| {r['impl']} | {r['idle_held']:,} | {r['timers_pending'] or 0:,} |"
            f" {r['requests_per_s']:,.0f} | {r.get('p50_ms', math.nan):.2f} |"
            f" {r.get('p99_ms', math.nan):.2f} | {r['cpu_s']:.2f} |"
            f" {per if per is not None else math.nan:.0f} |"
            f" {r['rss_idle_mb']:,.0f} | {r['rss_peak_mb']:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["_serve"]:
        return serve_main(argv[1:])
    if argv[:1] == ["_hold"]:
        return hold_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench loop-server", description=__doc__)
    p.add_argument("--idle", type=int, default=50_000, help="idle keep-alive connections")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of wrk's load")
    p.add_argument("--connections", type=int, default=64, help="wrk's connections")
    p.add_argument("--threads", type=int, default=1, help="wrk's threads")
    p.add_argument("--keepalive", type=float, default=300.0, help="aiohttp's keepalive_timeout")
    p.add_argument("--loops", help="comma-separated subset of the loops (default: all)")
    p.add_argument("--wrk", default="wrk", help="the wrk executable")
    p.add_argument("--json", help="write the records here")
    args = p.parse_args(argv)
    wrk = shutil.which(args.wrk)
    if wrk is None:
        print(INSTALL_WRK, file=sys.stderr)
        return 2
    args.wrk = wrk
    factories = loop_factories()
    names = args.loops.split(",") if args.loops else list(factories)
    unknown = set(names) - set(factories)
    if unknown:
        p.error(f"unknown loops {sorted(unknown)}; these run here: {list(factories)}")
    asked = args.idle
    limit = raise_nofile(args.idle + FD_MARGIN)
    if limit < args.idle + FD_MARGIN:
        args.idle = max(0, limit - FD_MARGIN)
        print(
            f"{asked:,} idle connections asked, {args.idle:,} held: RLIMIT_NOFILE's hard"
            f" limit is {limit:,} and this process may not raise it (that takes"
            " CAP_SYS_RESOURCE, even for root)",
            file=sys.stderr,
        )
    records = []
    for name in names:
        print(f"  {name}: {args.idle:,} idle connections, then wrk", file=sys.stderr)
        records.append({**run_one(name, args), "idle_asked": asked, "nofile_limit": limit})
    if args.idle < asked:
        print(f"{asked:,} idle connections asked; RLIMIT_NOFILE allows {args.idle:,} here")
    print(
        f"aiohttp, {args.idle:,} idle keep-alive connections (keepalive_timeout"
        f" {args.keepalive:g} s), wrk -t{args.threads} -c{args.connections}"
        f" -d{args.duration:g}s on GET / (asyncio.timeout({HANDLER_TIMEOUT:g}) around"
        " asyncio.sleep(0))"
    )
    print(_table(records))
    skipped = uvloop_skipped()
    if skipped:
        print(f"uvloop rows left out: {skipped}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
