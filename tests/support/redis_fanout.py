"""A purgatory joined to a started :class:`~aiopurgatory.redis.RedisFanout`: one "process"
of the fan-out tests, with failure detection fast enough for tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiopurgatory as ap
from aiopurgatory.redis import (
    RedisFanout,
)

# Fast failure detection for tests: the defaults (1 s ping, 2 s timeouts) suit servers.
FAST: dict[str, Any] = {
    "socket_timeout": 0.5,
    "connect_timeout": 0.5,
    "ping_interval": 0.25,
    "ping_timeout": 0.5,
    "reconnect_min": 0.02,
    "reconnect_max": 0.2,
}


@asynccontextmanager
async def joined(
    url: str, name: str, *, connected_within: float = 5.0, **options: Any
) -> AsyncIterator[tuple[ap.Purgatory, RedisFanout]]:
    """A purgatory attached to a started, connected fanout: one "process"."""
    kwargs = {**FAST, **options}
    async with ap.Purgatory(name) as purgatory, RedisFanout(url, name=name, **kwargs) as fanout:
        fanout.attach(purgatory)
        assert await fanout.wait_connected(connected_within), fanout.stats
        yield purgatory, fanout
