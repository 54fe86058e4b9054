"""Topics with bounded memory, shared by the aiohttp and the ASGI long-poll servers.

Every limit is a field of :class:`Limits` and a command-line option of both servers
(:func:`add_options`, :func:`limits_from`): message bytes, bytes retained across all
topics (oldest dropped first, offsets keep growing), number of topics (idle topics
expire), bytes per response, longest wait, connections, the idle/header timeout and
the time to read a request body.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from aiopurgatory.metrics import PurgatoryCollector

MESSAGE_OVERHEAD: Final = 128
"""Bytes charged per retained message besides its text (object headers, queue slots),
so that a flood of tiny messages is bounded by ``max_retained_bytes`` too."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one server holds at most; every field is a command-line option."""

    max_message_bytes: int = 64 * 1024
    """A POST body longer than this gets 413."""
    max_retained_bytes: int = 64 * 1024 * 1024
    """Messages kept across all topics; the oldest are dropped first."""
    max_topics: int = 10_000
    """Topics at once; a POST creating one more gets 503 until idle ones expire."""
    topic_ttl: float = 600.0
    """A topic nobody published to or waited on for this many seconds is forgotten."""
    max_response_bytes: int = 1024 * 1024
    """JSON bytes of messages in one response (at least one message, as in Kafka)."""
    max_timeout: float = 30.0
    """Cap on a GET's timeout, in seconds."""
    max_connections: int = 12_000
    """Open connections at once; more are answered 503 and closed."""
    idle_timeout: float = 15.0
    """Seconds a connection may go, from its start or its last response, before a
    request's headers are all in (slowloris); once they are, the body is
    :attr:`body_timeout`'s."""
    body_timeout: float = 15.0
    """Seconds to read a request's body once its headers are in: past it, 408 and the
    connection is closed (a body that never arrives is a slow client too)."""

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "max_retained_bytes", "max_topics"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("max_response_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("topic_ttl", "max_timeout", "idle_timeout", "body_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= 86_400 * 365):
                raise ValueError(f"{name} must be seconds in (0, 1 year], got {value!r}")
        if self.max_message_bytes > self.max_retained_bytes:
            raise ValueError("max_message_bytes must not exceed max_retained_bytes")


def add_options(parser: argparse.ArgumentParser) -> None:
    """One option per :class:`Limits` field, with its default in ``--help``."""
    docs = {
        "max_message_bytes": "longest POST body, in bytes (413 beyond)",
        "max_retained_bytes": "bytes of messages kept across all topics, oldest dropped first",
        "max_topics": "topics at once (a POST creating one more gets 503)",
        "topic_ttl": "seconds after which a topic nobody used is forgotten",
        "max_response_bytes": "JSON bytes of messages per response (at least one message)",
        "max_timeout": "cap on a GET's timeout, in seconds",
        "max_connections": "open connections at once (more get 503 and are closed)",
        "idle_timeout": (
            "seconds a connection may go, from its start or last response, before a"
            " request's headers are all in (the body is --body-timeout's)"
        ),
        "body_timeout": (
            "seconds to read a request body once its headers are in, a body that never"
            " arrives included (408 beyond)"
        ),
    }
    for field in fields(Limits):
        default = field.default
        assert isinstance(default, int | float)
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            type=type(default),
            default=default,
            help=f"{docs[field.name]} (default {default})",
        )


def limits_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Limits:
    """The limits the options give; a bad one ends the program with a usage error."""
    try:
        return Limits(**{field.name: getattr(args, field.name) for field in fields(Limits)})
    except ValueError as exc:
        parser.error(str(exc).replace("_", "-"))


class Topic:
    """An append-only log whose oldest messages the :class:`Topics` may drop."""

    __slots__ = ("base", "charged", "messages", "name", "used", "waiters")

    def __init__(self, name: str, now: float) -> None:
        self.name = name
        self.base = 0
        """Offset of ``messages[0]``."""
        self.messages: deque[str] = deque()
        self.used = now
        self.waiters = 0
        self.charged = 0
        """Bytes charged for ``messages``."""

    @property
    def end(self) -> int:
        """The offset the next message will get."""
        return self.base + len(self.messages)

    def read(self, after: int, max_bytes: int) -> list[dict[str, object]]:
        """Messages after offset ``after`` up to ``max_bytes`` of JSON (one at least);
        from the oldest retained if ``after`` was dropped."""
        start = max(after + 1 - self.base, 0)
        batch: list[dict[str, object]] = []
        size = 0
        for offset, value in enumerate(itertools.islice(self.messages, start, None), start):
            size += len(json.dumps(value)) + 32  # the value and its {"offset": n} wrapper
            if batch and size > max_bytes:
                break
            batch.append({"offset": self.base + offset, "value": value})
        return batch


class TooManyTopics(Exception):
    """A publish would create a topic beyond ``max_topics``."""


class StoreUnavailable(Exception):
    """The shared store (Redis, with ``--redis``) did not answer in time: 503."""


def add_scale_options(parser: argparse.ArgumentParser) -> None:
    """``--workers`` and the Redis options, the same in both servers."""
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes sharing the port (more than 1 needs --redis)",
    )
    parser.add_argument(
        "--redis",
        default=os.environ.get("REDIS_URL"),
        metavar="URL",
        help="keep the topics in Redis and wake polls across workers and machines"
        " (default: the REDIS_URL environment variable; none: in memory)",
    )
    parser.add_argument(
        "--redis-pool",
        type=int,
        default=4,
        help="Redis connections per worker for data and publishes, besides its one"
        " subscriber (default 4)",
    )
    parser.add_argument(
        "--redis-timeout",
        type=float,
        default=2.0,
        help="seconds a Redis command or connect may take (a pooled connection is"
        " waited for max(2, this)); a POST gets 503 within max(2, this) + 2 times this"
        " + 0.5 when Redis does not answer (default 2)",
    )


def check_scale_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not 1 <= args.workers <= 1024:
        parser.error(f"--workers must be between 1 and 1024, got {args.workers}")
    if args.workers > 1 and not args.redis:
        parser.error(
            "--workers above 1 needs --redis URL (or REDIS_URL): without a shared store"
            " a message published on one worker would never reach polls on another"
        )
    if not 1 <= args.redis_pool <= 1024:
        parser.error(f"--redis-pool must be between 1 and 1024, got {args.redis_pool}")
    if not (math.isfinite(args.redis_timeout) and 0 < args.redis_timeout <= 3600):
        parser.error(f"--redis-timeout must be seconds in (0, 3600], got {args.redis_timeout}")


class Topics:
    """The topics of one server, within ``limits`` of memory."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self.by_name: dict[str, Topic] = {}
        """In order of last use: the front is the first to expire."""
        self.retained_bytes = 0
        self._order: deque[tuple[Topic, int]] = deque()
        """Every retained message in publish order: (its topic, its charge)."""
        self._forgotten = 0
        """Entries of ``_order`` whose topic expired (their bytes already freed)."""

    def get(self, name: str) -> Topic | None:
        return self.by_name.get(name)

    def publish(self, name: str, message: str, size: int) -> int:
        """Append ``message`` (``size`` bytes of UTF-8); returns its offset."""
        now = self.clock()
        self.expire(now)
        topic = self.by_name.pop(name, None)
        if topic is None:
            if len(self.by_name) >= self.limits.max_topics:
                raise TooManyTopics(f"too many topics (at most {self.limits.max_topics})")
            topic = Topic(name, now)
        self.by_name[name] = topic  # the newest used goes to the back
        topic.used = now
        charge = size + MESSAGE_OVERHEAD
        topic.messages.append(message)
        topic.charged += charge
        self._order.append((topic, charge))
        self.retained_bytes += charge
        while self.retained_bytes > self.limits.max_retained_bytes:
            self._drop_oldest()
        return topic.end - 1

    def begin_wait(self, topic: Topic) -> None:
        topic.waiters += 1

    def end_wait(self, topic: Topic) -> None:
        topic.waiters -= 1
        topic.used = self.clock()

    def expire(self, now: float | None = None) -> int:
        """Forget the topics unused for ``topic_ttl`` with nobody waiting; returns how many."""
        now = self.clock() if now is None else now
        deadline = now - self.limits.topic_ttl
        expired = 0
        for topic in list(itertools.islice(self.by_name.values(), 64)):
            if topic.used > deadline:
                break
            if topic.waiters:
                self.by_name[topic.name] = self.by_name.pop(topic.name)  # still in use
                continue
            del self.by_name[topic.name]
            self._forgotten += len(topic.messages)
            self.retained_bytes -= topic.charged
            topic.messages.clear()
            topic.charged = 0
            expired += 1
        if self._forgotten > len(self._order) // 2:  # compact: O(1) amortised
            self._order = deque(e for e in self._order if self.by_name.get(e[0].name) is e[0])
            self._forgotten = 0
        return expired

    def _drop_oldest(self) -> None:
        topic, charge = self._order.popleft()
        if self.by_name.get(topic.name) is not topic:  # expired: freed already
            self._forgotten -= 1
            return
        topic.messages.popleft()
        topic.base += 1
        topic.charged -= charge
        self.retained_bytes -= charge


def metrics_registry() -> tuple[CollectorRegistry | None, PurgatoryCollector | None]:
    """A Prometheus registry and the collector in it, if the metrics extra is installed.

    The collector is meant to be the purgatory's observer (it counts what finishes),
    and to track it (its gauges); both servers serve the registry at ``/metrics``.
    """
    try:
        from prometheus_client import CollectorRegistry

        from aiopurgatory.metrics import PurgatoryCollector
    except ImportError:
        return None, None
    registry = CollectorRegistry()
    collector = PurgatoryCollector()
    registry.register(collector)
    return registry, collector
