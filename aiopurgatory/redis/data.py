"""The application's data clients (``fanout.client``, ``fanout.cluster_client``): one
behaviour on one Redis and on a Redis Cluster.

Ground rules:

- ``pool_size`` bounds the commands in flight through a data client, on either form;
  one more *waits* (up to ``pool_timeout``) for one to end. On one Redis the
  ``BlockingConnectionPool`` waits; redis-py's cluster client does not (a command
  over its per-node ``max_connections`` raises ``MaxConnectionsError`` at once, so a
  burst of requests failed on a cluster where it waited on one Redis). Here a
  semaphore of ``pool_size`` in front of every command and pipeline makes it wait:
  fewer than ``pool_size`` in flight in all means fewer on each node, so the
  per-node pools (``pool_size`` each) never run dry.
- "Redis is unavailable" is one exception, :class:`~.errors.FanoutUnavailable`, from
  every call a request makes: a connection refused or lost, a timeout, no free
  connection within ``pool_timeout``, a cluster down or failing over (CLUSTERDOWN,
  MASTERDOWN, TRYAGAIN, a slot not covered, READONLY from a demoted primary). It is
  also a redis-py ``ConnectionError``, so handlers written for redis-py still catch
  it; the original error is its ``__cause__``. Any other error (a wrong command, a
  script's error, NOSCRIPT) is redis-py's own, unchanged.
- Only the entry points are wrapped (a command, a pipeline's ``execute``): redis-py's
  own retries and redirections run inside, untouched.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import Any, Final

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    ConnectionError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from .errors import FanoutUnavailable

__all__ = ["UNAVAILABLE", "DataClient", "DataCluster", "unavailable"]

UNAVAILABLE: Final = (
    ConnectionError,
    RedisTimeoutError,
    ClusterDownError,  # and MASTERDOWN
    TryAgainError,
    SlotNotCoveredError,
    ReadOnlyError,
    OSError,
    TimeoutError,
)
"""The errors that mean "Redis is unavailable now" (a retry later may succeed)."""

_MISCONFIGURED: Final = (AuthenticationError, AuthorizationError)
"""ConnectionErrors that a retry will not cure: left as redis-py raised them."""


_inside: ContextVar[DataCluster | None] = ContextVar("aiopurgatory_redis_gate", default=None)
"""The client whose place the running task holds (its child tasks inherit it)."""


def unavailable(exc: BaseException, name: str) -> FanoutUnavailable | None:
    """The :class:`FanoutUnavailable` to raise from ``exc``, or None to let it go."""
    if isinstance(exc, (FanoutUnavailable, *_MISCONFIGURED)):
        return None
    if isinstance(exc, RedisClusterException):
        # The cluster client, asking its nodes for the slot map again while none
        # answers (a primary just killed, the others slow), raises "Redis Cluster
        # cannot be connected" from the last node's ConnectionError: unavailable too
        # (seen in a full parallel test run). Its other errors are the caller's.
        cause = exc.__cause__
        if not isinstance(cause, UNAVAILABLE) or isinstance(cause, _MISCONFIGURED):
            return None
    elif not isinstance(exc, UNAVAILABLE):
        return None
    return FanoutUnavailable(f"fanout {name!r}: Redis unavailable: {type(exc).__name__}: {exc}")


class DataClient(aioredis.Redis):
    """``fanout.client``: redis-py's client over the bounded data pool, raising
    :class:`FanoutUnavailable` for Redis unavailable (the module doc)."""

    fanout_name = "redis-fanout"
    """Named in the errors (set by the fanout)."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except Exception as exc:
            error = unavailable(exc, self.fanout_name)
            if error is None:
                raise
            raise error from exc

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        pipe = _DataPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        pipe.fanout_name = self.fanout_name
        return pipe


class _DataPipeline(Pipeline):
    fanout_name = "redis-fanout"

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error)
        except Exception as exc:
            error = unavailable(exc, self.fanout_name)
            if error is None:
                raise
            raise error from exc


class DataCluster(RedisCluster):
    """``fanout.cluster_client``: redis-py's ``RedisCluster`` whose commands wait for
    one of ``pool_size`` places (up to ``pool_timeout``) and raise
    :class:`FanoutUnavailable` for Redis unavailable (the module doc). Call
    :meth:`bound` once built."""

    __slots__ = ("_gate", "_gate_size", "_gate_timeout", "fanout_name")

    def bound(self, size: int, timeout: float, name: str) -> DataCluster:
        """At most ``size`` commands (or pipelines) in flight; one more waits up to
        ``timeout`` seconds. Returns itself."""
        self._gate: asyncio.Semaphore | None = None  # made on the loop that first uses it
        self._gate_size = size
        self._gate_timeout = timeout
        self.fanout_name = name
        return self

    async def gated(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``await call(*args, **kwargs)`` holding a place; errors as the module doc says.

        A call made while this task (or a task it started) holds a place takes none:
        redis-py re-sends a pipeline's redirected commands (MOVED, ASK, TRYAGAIN) one by
        one from inside the pipeline's call, and waiting there for a second place
        would deadlock once every place is held by such a pipeline.
        """
        if _inside.get() is self:
            return await self._translated(call, *args, **kwargs)
        if self._gate is None:
            self._gate = asyncio.Semaphore(self._gate_size)
        gate = self._gate
        try:
            async with asyncio.timeout(self._gate_timeout):
                await gate.acquire()
        except TimeoutError:
            raise FanoutUnavailable(
                f"fanout {self.fanout_name!r}: Redis unavailable: no connection free within"
                f" pool_timeout ({self._gate_timeout} s; {self._gate_size} commands in flight,"
                " pool_size)"
            ) from None
        token = _inside.set(self)
        try:
            return await self._translated(call, *args, **kwargs)
        finally:
            _inside.reset(token)
            gate.release()

    async def _translated(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await call(*args, **kwargs)
        except Exception as exc:
            error = unavailable(exc, self.fanout_name)
            if error is None:
                raise
            raise error from exc

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        return await self.gated(super().execute_command, *args, **kwargs)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        super().pipeline(transaction, shard_hint)  # redis-py's checks of the arguments
        # (mypy reads an attribute redis-py's stubs declare as abstract; it is set.)
        if transaction:  # redis-py 6+: cluster transactions
            return _DataClusterPipeline(self, transaction)  # type: ignore[abstract]
        return _DataClusterPipeline(self)  # type: ignore[abstract]


class _DataClusterPipeline(ClusterPipeline):
    __slots__ = ("_gated_by",)

    def __init__(self, client: DataCluster, *args: Any) -> None:
        super().__init__(client, *args)
        self._gated_by = client  # redis-py names its own reference differently across versions

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        # One place for the whole pipeline: it holds at most one connection per node.
        return await self._gated_by.gated(super().execute, raise_on_error, allow_redirections)
