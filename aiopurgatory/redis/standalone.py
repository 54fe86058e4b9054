"""A standalone Redis: the one subscriber connection (:class:`StandaloneSubscriber`).

The counterpart of :class:`~.cluster.ClusterSubscribers` for a Redis that is not a
cluster node. Ground rules:

- One connection, no retries inside redis-py (see
  :meth:`~.options.FanoutOptions.subscriber_pool`): a lost connection ends the
  session with redis-py's error, and the fanout's backoff loop starts the next one.
- ``subscribed`` is called only once Redis confirmed every channel: from then on
  every wake-up is delivered, so the re-check it triggers misses nothing.
- What a message means, and what to count, is the fanout's (``deliver``,
  ``subscribed``); this object only holds the subscription.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub

from .subscriber import confirmed, listen

__all__ = ["StandaloneSubscriber"]


class StandaloneSubscriber:
    """The subscriber of a standalone Redis: all the shard channels on one connection.

    ``pool`` (one connection) is also the one the fanout asks, before the first
    session, whether the URL names a cluster node (:attr:`client`).
    """

    __slots__ = (
        "_channels",
        "_connect_timeout",
        "_ping_interval",
        "_ping_timeout",
        "_sharded",
        "client",
        "pool",
    )

    def __init__(
        self,
        pool: aioredis.ConnectionPool,
        channels: list[str],
        *,
        sharded: bool,
        connect_timeout: float,
        ping_interval: float,
        ping_timeout: float,
    ) -> None:
        self.pool = pool
        """The subscriber's pool (one connection)."""
        self.client = aioredis.Redis(connection_pool=pool)
        """A client over :attr:`pool`."""
        self._channels = channels
        self._sharded = sharded
        self._connect_timeout = connect_timeout
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout

    async def session(
        self,
        *,
        deliver: Callable[[Mapping[str, Any]], None],
        subscribed: Callable[[], None],
        stopping: Callable[[], bool],
    ) -> None:
        """Subscribe (within ``connect_timeout``), call ``subscribed``, then hand every
        message to ``deliver`` until ``stopping()`` or the connection fails (raising
        redis-py's error, or :class:`~.subscriber.Stale` for a silent server)."""
        pubsub = self.client.pubsub()
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._subscribe(pubsub, deliver)
            subscribed()
            await listen(
                pubsub,
                deliver,
                ping_interval=self._ping_interval,
                ping_timeout=self._ping_timeout,
                stopping=stopping,
            )
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def aclose(self) -> None:
        """Close the connection (the session ended or was cancelled first)."""
        await self.pool.disconnect()

    async def _subscribe(
        self, pubsub: PubSub, deliver: Callable[[Mapping[str, Any]], None]
    ) -> None:
        if self._sharded:
            # One command per channel: on a cluster, channels of different hash slots
            # cannot share an SSUBSCRIBE (CROSSSLOT).
            for channel in self._channels:
                await pubsub.ssubscribe(channel)
            confirmation = "ssubscribe"
        else:
            await pubsub.subscribe(*self._channels)
            confirmation = "subscribe"
        await confirmed(pubsub, self._channels, confirmation, deliver)
