"""A real ``redis-server`` for tests: started on a free loopback port, stopped after.

The server and its blocking RESP client live in ``bench/redis_nodes.py`` (the
benchmarks start the same servers); this module re-exports them and adds the fixture.
Nothing here needs an event loop: the tests drive the server (``CLIENT KILL``,
``CLIENT LIST``, SIGSTOP/SIGCONT, restart) from any thread or loop through a tiny
blocking RESP client, so a test never depends on the client library it is testing to
observe the server.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.redis_nodes import (
    REDIS_SERVER,
    SKIP_REASON,
    RedisServer,
    RespError,
    RespValue,
    free_port,
    read_reply,
)

__all__ = [
    "REDIS_SERVER",
    "SKIP_REASON",
    "RedisServer",
    "RespError",
    "RespValue",
    "free_port",
    "fresh",
    "read_reply",
    "redis_server",
]


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


def fresh(server: RedisServer) -> RedisServer:
    """``server`` running, thawed and empty: what each test of a module starts from
    (an earlier test may have stopped, frozen or filled the module's server)."""
    if server.proc is None or server.proc.poll() is not None:
        server.proc = None
        server.start()
    server.thaw()
    server.command("FLUSHALL")
    return server
