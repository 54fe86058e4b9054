"""One subscriber connection's life: confirmations, PINGs, the reconnect backoff.

Shared by the standalone subscriber (:mod:`.fanout`) and the per-primary ones of a
cluster (:mod:`.cluster`); what a message means is the caller's ``handle``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio.client import PubSub

from .keys import text

__all__ = ["Backoff", "Stale", "confirmed", "listen"]

Handle = Callable[[Mapping[str, Any]], None]


class Stale(Exception):
    """The subscriber connection stopped answering PINGs."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays between attempts: doubling from ``low`` up to ``high``, each shortened
    by up to ``jitter`` times itself, so that many processes do not retry in step."""

    low: float
    high: float
    jitter: float

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` consecutive failed attempts."""
        delay = min(self.high, self.low * 2.0 ** min(failures, 60))
        return delay * (1.0 - self.jitter * random.random())


async def confirmed(
    pubsub: PubSub, channels: Iterable[str], confirmation: str, handle: Handle
) -> None:
    """Wait until Redis confirmed (a ``confirmation`` reply) each of ``channels``;
    any other message read meanwhile goes to ``handle``."""
    pending = set(channels)
    while pending:
        message = await pubsub.get_message(timeout=None)
        if message is None:
            continue
        if message["type"] == confirmation:
            pending.discard(text(message["channel"]))
        else:
            handle(message)


async def listen(
    pubsub: PubSub,
    handle: Handle,
    *,
    ping_interval: float,
    ping_timeout: float,
    stopping: Callable[[], bool],
) -> None:
    """Hand every message to ``handle`` until ``stopping()``; raises :class:`Stale`
    when a PING (sent after ``ping_interval`` of silence) has no reply in
    ``ping_timeout``, or redis-py's error when the connection fails."""
    loop = asyncio.get_running_loop()
    ping_sent: float | None = None
    while not stopping():
        if ping_sent is None:
            wait = ping_interval
        else:
            wait = max(0.0, ping_sent + ping_timeout - loop.time())
        message = await pubsub.get_message(timeout=wait)
        if message is None:
            if ping_sent is None:
                await pubsub.ping()
                ping_sent = loop.time()
            elif loop.time() >= ping_sent + ping_timeout:
                # The loop may have been busy past the deadline while the reply
                # sat in the socket: look once more without waiting.
                message = await pubsub.get_message(timeout=0.0)
                if message is None:
                    raise Stale(f"no reply to PING within {ping_timeout} s")
                ping_sent = None
                handle(message)
            continue
        ping_sent = None  # anything received shows the connection is alive
        handle(message)
