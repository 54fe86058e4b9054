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
