"""A real ``redis-server`` for tests: started on a free loopback port, stopped after.

Nothing here needs an event loop: the tests drive the server (``CLIENT KILL``,
``CLIENT LIST``, SIGSTOP/SIGCONT, restart) from any thread or loop through a tiny
blocking RESP client, so a test never depends on the client library it is testing to
observe the server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import BinaryIO, Final

import pytest

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
            return _read_reply(reader)

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


def _read_reply(reader: BinaryIO) -> RespValue:
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
        return None if n < 0 else [_read_reply(reader) for _ in range(n)]
    raise RespError(f"unexpected reply {line!r}")


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server for the test module; skipped only when the binary is missing."""
    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.close()
