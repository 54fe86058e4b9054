"""A fanout's options (:class:`FanoutOptions`): checked once, then what redis-py is given.

Ground rules:

- Every option is checked here, in :meth:`FanoutOptions.__post_init__`, and nowhere
  else; the error names the option and the value (the messages :class:`RedisFanout`
  documents under "Raises").
- The defaults are :class:`RedisFanout`'s keyword arguments (its signature is what
  users read); this class has none, so that the two cannot disagree.
- What each pool is built with (the data pool, the standalone subscriber's, a cluster
  node's, the ``RedisCluster`` client's) is decided here, from the options alone;
  building them, and when, is the fanout's business.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import redis.asyncio as aioredis
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff

from .keys import MAX_SHARDS
from .subscriber import Backoff

__all__ = ["FanoutOptions"]

_SECONDS: Final = (
    "socket_timeout",
    "connect_timeout",
    "pool_timeout",
    "reconnect_min",
    "reconnect_max",
    "ping_interval",
    "ping_timeout",
)
"""The options that are a number of seconds (> 0, finite), in the order checked."""

_MAX_POOL_SIZE: Final = 1024
_MAX_PUBLISH_RETRIES: Final = 100


@dataclass(frozen=True, slots=True)
class FanoutOptions:
    """What :class:`RedisFanout` was given, checked (the meaning of each is in its doc).

    Raises:
        TypeError: ``url`` is not a str.
        ValueError: an option out of its range, naming the option and the value.
    """

    url: str
    prefix: str
    shards: int
    sharded_pubsub: bool | None
    pool_size: int
    pool_timeout: float
    socket_timeout: float
    connect_timeout: float
    publish_retries: int
    reconnect_min: float
    reconnect_max: float
    reconnect_jitter: float
    ping_interval: float
    ping_timeout: float
    local_wakeups: bool
    name: str
    redis_options: Mapping[str, Any]
    """A read-only copy of what was given."""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str):
            raise TypeError(f"url must be a str, got {self.url!r}")
        if not isinstance(self.prefix, str) or not self.prefix:
            raise ValueError(f"prefix must be a non-empty str, got {self.prefix!r}")
        _check_int("shards", self.shards, 1, MAX_SHARDS)
        _check_int("pool_size", self.pool_size, 1, _MAX_POOL_SIZE)
        _check_int("publish_retries", self.publish_retries, 0, _MAX_PUBLISH_RETRIES)
        for option in _SECONDS:
            value = getattr(self, option)
            if not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{option} must be a finite number of seconds > 0, got {value!r}")
        if self.reconnect_max < self.reconnect_min:
            raise ValueError(
                f"reconnect_max ({self.reconnect_max!r}) must be >= reconnect_min"
                f" ({self.reconnect_min!r})"
            )
        jitter = self.reconnect_jitter
        if not isinstance(jitter, int | float) or not 0 <= jitter <= 1:
            raise ValueError(f"reconnect_jitter must be within [0, 1], got {jitter!r}")
        # A copy, so that the caller's dict changing later changes nothing here (the
        # pools of a cluster's nodes are built from it long after the constructor).
        object.__setattr__(self, "redis_options", MappingProxyType(dict(self.redis_options)))

    @property
    def publish_deadline(self) -> float:
        """A cluster publish ends within this (:class:`FanoutUnavailable` after it):
        each try waits for a pooled connection, connects and sends, then one map
        refresh."""
        per_try = self.pool_timeout + self.socket_timeout + 2 * self.connect_timeout
        return (self.publish_retries + 2) * per_try

    def backoff(self) -> Backoff:
        """The subscribers' reconnect delays."""
        return Backoff(self.reconnect_min, self.reconnect_max, self.reconnect_jitter)

    def common(self) -> dict[str, Any]:
        """What every connection gets: the timeouts, then ``redis_options`` (which win)."""
        return {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            **self.redis_options,
        }

    def data_pool(self) -> aioredis.BlockingConnectionPool:
        """The pool of publishes and of the application's commands (``fanout.client``).

        Bounded: a command waits (up to ``pool_timeout``) for a free connection instead
        of opening more. One retry with a short jittered backoff: after a Redis restart
        every pooled connection is dead, and without it the first command on each would
        fail although Redis is back.
        """
        return aioredis.BlockingConnectionPool.from_url(
            self.url,
            max_connections=self.pool_size,
            timeout=self.pool_timeout,
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), self.publish_retries),
            **self.common(),
        )

    def subscriber_pool(self) -> aioredis.ConnectionPool:
        """The one connection of the URL's node's subscriber (and of detection).

        No retries inside redis-py: its retry would silently reconnect and resubscribe,
        hiding the gap the fanout must close with a re-check. Built from the URL's
        options as :meth:`data_pool` is (the query string wins over ``redis_options``),
        then made to read raw bytes whatever the user asked for: a wake-up's payload is
        bytes (a key may be bytes, and the origin is compared as bytes), and
        ``decode_responses`` would turn every wake-up into a str that no longer matches.
        The data pool keeps the user's choice.
        """
        return aioredis.ConnectionPool(**{**self.common(), **parse_url(self.url), **_raw_one()})

    def node_options(self) -> dict[str, Any]:
        """A cluster node subscriber's pool options: :meth:`subscriber_pool`'s without the
        URL's host and port (each node has its own); the router's pools take them too."""
        url_options = parse_url(self.url)
        return {
            **self.common(),
            **{k: v for k, v in url_options.items() if k not in ("host", "port", "path")},
            **_raw_one(),
        }

    def cluster_options(self) -> dict[str, Any]:
        """The options of the application's ``RedisCluster`` client (``pool_size``
        connections at most per node)."""
        return {**self.common(), "max_connections": self.pool_size}


def _raw_one() -> dict[str, Any]:
    """A subscriber's connection: one, no retry inside redis-py, raw bytes."""
    return {
        "max_connections": 1,
        "retry": Retry(NoBackoff(), 0, supported_errors=()),
        "decode_responses": False,
    }


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an int within [{low}, {high}], got {value!r}")
