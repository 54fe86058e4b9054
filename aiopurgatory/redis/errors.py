"""The errors a fanout raises, and how it tells of failures it survives (the log)."""

from __future__ import annotations

import logging
from typing import Final

from redis.exceptions import ConnectionError as RedisConnectionError

from ..errors import PurgatoryError

__all__ = ["WARN_EVERY", "FanoutClosed", "FanoutError", "FanoutUnavailable", "log"]

log: Final = logging.getLogger("aiopurgatory.redis")
"""Every module of the package logs here: the logger the docs name."""

WARN_EVERY: Final = 30.0
"""While a failure lasts, repeat its warning this often (seconds), not once per
attempt: the backoff already bounds attempts, the log should not flood."""


class FanoutError(PurgatoryError):
    """Base class of the errors :class:`RedisFanout` raises."""


class FanoutUnavailable(FanoutError, RedisConnectionError):
    """Redis is unavailable (unreachable, timed out, no free connection within
    ``pool_timeout``, a cluster failing over): from a publish, and from every command
    of the data clients (``fanout.client``, ``fanout.cluster_client``; see
    :mod:`.data`), so that a request's handler answers 503 on this one exception.

    For a publish: local watchers were already woken; the remote ones will re-check
    when their subscription comes back only if their connection dropped too, so a
    caller that must reach them retries (or answers 503). ``__cause__`` is redis-py's
    error. Also a redis-py ``ConnectionError``: handlers written for redis-py's errors
    still catch it.
    """


class FanoutClosed(FanoutError, RuntimeError):
    """The fanout was closed, or is used before it was started."""
