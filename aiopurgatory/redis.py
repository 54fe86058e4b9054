"""Wake-ups across processes and machines through Redis pub/sub (the ``redis`` extra).

:class:`RedisFanout` joins purgatories in any number of processes: ``await
fanout.publish(key)`` in one process re-checks the operations watching ``key`` in every
purgatory attached anywhere. The data lives in Redis (or wherever the operations'
``try_complete`` reads it); a wake-up only says "look again", so completion stays
exactly once however often a wake-up arrives::

    async with Purgatory("polls") as p, RedisFanout("redis://host:6379/0") as fanout:
        fanout.attach(p)
        ok = await p.wait_for(["orders"], lambda: seen_offset() > last, timeout=30)
        ...
        await fanout.client.xadd("orders", {...})   # the bounded data pool
        await fanout.publish("orders")             # wakes "orders" everywhere

Design, and why
---------------
*One subscriber connection per process.* Each fanout holds one pub/sub connection,
whatever the number of purgatories, waiters and keys, and a small bounded pool
(``pool_size``, a :class:`redis.asyncio.BlockingConnectionPool`) for data commands and
publishes. Counted with ``CLIENT LIST``: 1 subscriber + at most ``pool_size``.

*A fixed set of sharded channels, not a channel per key.* A key is encoded canonically
(``str``, ``bytes`` or ``int``: a tag byte and its UTF-8, raw or decimal form; other
types raise ``TypeError``, since no encoding of them is stable across processes) and
hashed with CRC-32 (stable across processes, machines and Python versions, unlike
``hash()``, which is salted per process) onto one of ``shards`` channels named
``<prefix>:{<n>}`` (``aiopurgatory:{0}`` ... ``aiopurgatory:{15}``). Every process
subscribes to all of them once, at connect time.
A channel per key would cost a SUBSCRIBE round trip (and a window in which a wake-up
is lost) each time a new key gets its first waiter, and an UNSUBSCRIBE after its last;
with long-poll keys coming and going that churn dominates. A fixed set never changes,
so resubscribing after a reconnect is one command, and the receiver filters cheaply:
a message for a key nobody here watches costs one dict lookup per attached purgatory.
The price is that every process hears every wake-up; past a few hundred processes,
partition keys across several prefixes. The shard number sits in a hash tag (``{n}``)
so that with sharded pub/sub (Redis 7 ``SSUBSCRIBE``/``SPUBLISH``) the shards land on
different hash slots, hence on different nodes of a Redis Cluster, and a publish
travels within its shard's node instead of being broadcast through every node.

*Redis Cluster: the same URL.* The first connection asks the URL's node ``INFO
cluster``; a node of a cluster (primary or replica) turns the fanout into its cluster
form, and the user writes nothing else. There, sharded pub/sub is always used
(``sharded_pubsub=False`` is ignored, with a warning: classic pub/sub would broadcast
every wake-up through the whole cluster bus). The fanout reads the slot map
(``CLUSTER SLOTS``, keeping only the owners of the shard channels' slots) and holds
*one subscriber connection per primary that serves shard channels*, each holding its
channels (one SSUBSCRIBE per channel: channels of different slots cannot share one,
CROSSSLOT). The default names spread: ``{0}`` ... ``{15}`` hash to slots 13907, 9842,
5649, 1584, 14039, 9974, 5781, 1716, 14171, 10106, 247, 4310, 8373, 12436, 115, 4178,
that is 6, 6 and 4 shards on the three primaries of a default 3-primary cluster
(slots 0-5460, 5461-10922, 10923-16383); other ``shards`` values are not checked to
cover every primary. Publishes go with ``SPUBLISH`` straight to the owner of the
channel's slot, through a bounded pool per primary (``pool_size`` connections,
waiting up to ``pool_timeout`` for a free one), following ``MOVED``. So a process holds
on each primary at most 1 subscriber + ``pool_size`` connections, and none on
replicas (the URL's node, if a replica, is asked for the map and released).
:attr:`RedisFanout.cluster_client` is a redis-py ``RedisCluster`` for the
application's data, built on first use, with its own pools. An application that
sends a wake-up from its own Lua script (``message_for``) names the script's keys
with :meth:`RedisFanout.hash_tag` (``{n}``, the channel's hash tag), so that the keys
and the channel share one slot: Redis 7.0 runs SPUBLISH inside a script, and a
failover or migration moves the data and its channel together.

*Topology changes are reconnects.* A primary's subscriber that fails (the node died,
stopped answering PINGs, answered MOVED), or that the node tells its channel's slot
moved away (Redis 7 sends an ``sunsubscribe`` push for each shard channel of a slot
whose ownership changes: failover, migration, a node added and given slots), makes the
fanout read the map again (after a backoff delay, as above) and replace the
subscribers whose channels changed. Each new subscriber, once Redis confirmed all of
its channels, re-checks the keys those channels carry (the affected shards only: the
others never stopped being delivered). A publish that fails on a connection error
re-reads the map and tries once more, a MOVED is followed at once; otherwise it
raises :class:`FanoutUnavailable`, within ``(publish_retries + 2) * (pool_timeout +
socket_timeout + 2 * connect_timeout)`` at most, never a silent drop: a publish that
Redis took while a process was not yet subscribed at the new owner is seen by that
process's re-check. Measured on a local 3+3 cluster with ``cluster-node-timeout`` 1 s
(``tests/test_redis_fanout_cluster.py``): a primary killed with SIGKILL, its replica
promoted 2.0-2.8 s later, the parked waiters of its shards woken 0.07-0.2 s after the
promotion; meanwhile publishes to those shards raised ``FanoutUnavailable`` in under
0.2 s each, and the others were not disturbed. A migrated slot: waiters woken 0.07-0.25
s after ``CLUSTER SETSLOT ... NODE``.

*Coalescing.* A received wake-up calls ``purgatory.notify(key)``: the wake-ups of one
key read in one loop pass (a burst arrives in a few socket reads) share one re-check.

*State the operations read.* ``try_complete`` is synchronous, so it reads what this
process holds. When that is a copy of state kept in Redis, pass ``refresh``: an async
callable given the batch of woken keys, which updates the copy (e.g. one ``MGET`` or
pipeline) before they are notified. The batch holds every key a wake-up arrived for,
watched here or not: a waiter that read the state and is about to watch its key must
not find a stale copy because the wake-up of a change made just after its read came
before its watch. So the copy's owner marks its interest in a key before it reads
the state (e.g. a count of the waiters on their way), and ``refresh`` updates the keys
marked and skips the others, for the cost of a set lookup; the keys are notified after
it, and by then the waiter watches, or its first check sees the fresh copy. Wake-ups
that arrive while a refresh runs form the next batch (each key once), so a burst
costs one refresh. A refresh that raises is logged and counted
(``stats.refresh_errors``); the keys are notified anyway.

*No lost wake-up.* Pub/sub forgets what is published while a subscriber is away. So
each time the subscription is (re)established, only after Redis confirmed every
channel, every attached purgatory re-checks every key it watches (``notify`` of each):
whatever changed while we were away is seen by that re-check, and whatever is
published after the confirmation is delivered. Attaching a purgatory re-checks its
keys too.

*Failures.* A dropped connection, a restart, or a server that stops answering (a PING
is sent after ``ping_interval`` of silence; no reply within ``ping_timeout`` ends the
connection) makes the fanout reconnect with exponential backoff
(``reconnect_min`` doubling up to ``reconnect_max``) and jitter (each delay drawn from
``[delay * (1 - reconnect_jitter), delay]``), so that many processes do not reconnect in
step. Meanwhile operations still end by their own timeouts (the purgatory does not
depend on Redis), :attr:`RedisFanout.stats` tells (``connected``, ``reconnects``,
``errors``, ``last_error``), the log says so (logger ``aiopurgatory.redis``: a warning
when the subscription is lost and while it stays down, info when it is back), and
:meth:`RedisFanout.publish` raises :class:`FanoutUnavailable` (a
:class:`~aiopurgatory.PurgatoryError`): at once when Redis refuses connections, after
about ``socket_timeout`` per try (``publish_retries + 1`` tries) when it does not
answer, and after ``pool_timeout`` when every pooled connection stays busy.

*One purgatory's failure is its own.* Attached purgatories are bound to the fanout's
loop (an unused one at attach or start), since the fanout notifies them from there; a
wake-up or re-check of one that raises anyway is counted (``stats.delivery_errors``)
and logged (a warning with its traceback at most once per 30 s), and the others are
woken all the same: the subscription is not torn down for it.

*The publisher's own process* is woken locally, at once and synchronously, before the
PUBLISH is sent (so it works even when Redis is down; with ``refresh``, through it);
the copy of the message that comes back through the subscription carries this
fanout's origin id and is skipped (``stats.own_messages``). Messages published by
other means (``message_for``, e.g. inside a Lua script with the data write) carry no
origin unless asked, and wake this process through the subscription like any other.

Guarantees: a wake-up reaches each connected process at least once (a reconnect turns
lost wake-ups into a full re-check); completion is decided by each operation's
``try_complete`` and stays exactly once. Nothing orders wake-ups of different keys.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, Final, Self

import redis.asyncio as aioredis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError, MovedError, RedisError, ResponseError

from .errors import PurgatoryError
from .purgatory import Purgatory

__all__ = [
    "FanoutClosed",
    "FanoutError",
    "FanoutStats",
    "FanoutUnavailable",
    "RedisFanout",
    "decode_key",
    "encode_key",
]

_log = logging.getLogger(__name__)

# Message payload: ORIGIN "|" TAG BODY. ORIGIN is a fanout's random hex id or empty;
# TAG says how BODY encodes the key.
_SEP: Final = b"|"
_TAG_STR: Final = b"s"
_TAG_BYTES: Final = b"b"
_TAG_INT: Final = b"i"
_MAX_SHARDS: Final = 16384  # Redis Cluster's hash slots: more shards could not spread
# While the subscription stays down, repeat the warning this often (seconds), not
# once per attempt: the backoff already bounds attempts, the log should not flood.
_WARN_EVERY: Final = 30.0
_TOPOLOGY_RETRY_MAX: Final = 1.0
"""The longest wait between two reads of a cluster's slot map while some shard channel
is unsubscribed. Shorter than ``reconnect_max``: a failover ends when a replica is
promoted, and until this fanout reads the new map its processes miss the wake-ups of
the dead primary's shards (its re-check catches up, one wait later). A map read is
one ``CLUSTER SLOTS`` to any node, cheap enough once a second per process."""


class FanoutError(PurgatoryError):
    """Base class of the errors :class:`RedisFanout` raises."""


class FanoutUnavailable(FanoutError):
    """Redis did not take the publish (unreachable, timed out, pool exhausted).

    Local watchers were already woken; the remote ones will re-check when their
    subscription comes back only if their connection dropped too, so a caller that
    must reach them retries (or answers 503). ``__cause__`` is redis-py's error.
    """


class FanoutClosed(FanoutError, RuntimeError):
    """The fanout was closed, or is used before it was started."""


@dataclass(frozen=True, slots=True)
class FanoutStats:
    """A snapshot of a :class:`RedisFanout`'s counters (``fanout.stats``).

    Read on the fanout's loop; every field is a count since the fanout started unless
    said otherwise.
    """

    connected: bool
    """Subscribed to every channel right now."""
    connects: int
    """Subscriptions established, the first one included."""
    reconnects: int
    """Subscriptions established after a loss."""
    disconnects: int
    """Subscriptions lost."""
    errors: int
    """Failed connects/subscribes/reads, stale connections."""
    last_error: str | None
    """The last error met, as text (None before any)."""
    messages: int
    """Wake-up messages received."""
    own_messages: int
    """Messages this fanout published, skipped (woken locally)."""
    malformed: int
    """Messages that are not a fanout wake-up."""
    wakeups: int
    """``notify()`` calls made on attached purgatories."""
    rechecks: int
    """Full re-checks (one per subscription established or attach)."""
    published: int
    """Wake-ups published to Redis."""
    publish_errors: int
    """Publishes that failed (each raised FanoutUnavailable)."""
    refreshes: int
    """Calls of the refresh hook."""
    refresh_errors: int
    """Calls of the refresh hook that raised."""
    delivery_errors: int
    """Wake-ups or re-checks of one attached purgatory that raised (the others were
    woken all the same)."""
    attached: int
    """Purgatories attached now."""
    channels: int
    """Shard channels subscribed to (``shards``)."""
    cluster: bool | None = None
    """The URL names a Redis Cluster node (None until the first connection told)."""
    subscribers: int = 0
    """Subscriber connections holding confirmed subscriptions now (one per primary
    serving shard channels on a cluster; one on a standalone Redis)."""
    topology_refreshes: int = 0
    """Slot maps read from the cluster (at start, then after each change seen)."""
    slot_moves: int = 0
    """Shard channels a cluster node dropped (an ``sunsubscribe`` push: the slot moved
    away, by a failover or a migration); each was subscribed again at its new owner."""
    node_channels: Mapping[str, int] = field(default_factory=dict)
    """On a cluster: ``"host:port"`` of each primary subscribed to, and how many shard
    channels that subscription holds now."""


def encode_key(key: Hashable) -> bytes:
    """The canonical, process-independent encoding of a key (``str``, ``bytes``, ``int``).

    Raises ``TypeError`` for any other type: a tuple or an object has no encoding that
    every process is sure to decode into an equal key.
    """
    if isinstance(key, str):
        return _TAG_STR + key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return _TAG_BYTES + key
    if isinstance(key, int):  # bool too: True == 1 is the same purgatory key
        return _TAG_INT + b"%d" % key
    raise TypeError(
        f"a RedisFanout key must be a str, bytes or int (they have an encoding every"
        f" process decodes alike), got {type(key).__name__}: {key!r}"
    )


def decode_key(data: bytes) -> str | bytes | int:
    """The inverse of :func:`encode_key`; ``ValueError`` for anything else."""
    tag, body = data[:1], data[1:]
    if tag == _TAG_STR:
        return body.decode("utf-8", "surrogatepass")
    if tag == _TAG_BYTES:
        return body
    if tag == _TAG_INT:
        return int(body)
    raise ValueError(f"not an encoded key: {data[:40]!r}")


class _Stale(Exception):
    """The subscriber connection stopped answering PINGs."""


class RedisFanout:
    """Joins purgatories across processes through Redis pub/sub (see the module doc).

    ``url`` is a redis-py URL (``redis://``, ``rediss://``, ``unix://``) of a standalone
    Redis or of any node of a Redis Cluster, primary or replica (found out on the first
    connection; see "Redis Cluster" in the module doc);
    ``redis_options`` go to both connection pools (e.g. ``password``, ``ssl_ca_certs``),
    except ``decode_responses`` (in ``redis_options`` or in the URL's query string),
    which only the data pool (:attr:`client`) honours: the subscriber always reads the
    wake-ups' raw bytes.
    Use it as an async context manager, or ``start()`` then ``await aclose()``, on one
    event loop; attach purgatories of that loop (``purgatories=`` or :meth:`attach`).

    Options (seconds unless said):

    - ``prefix``, ``shards``: the channels ``<prefix>:{0}`` ... ``<prefix>:{shards-1}``;
      every process joined must use the same two values.
    - ``sharded_pubsub``: SSUBSCRIBE/SPUBLISH (Redis 7) instead of SUBSCRIBE/PUBLISH;
      None (the default): sharded on a Redis Cluster, classic on a standalone Redis.
      On a cluster it is always sharded (False is ignored, with a warning).
    - ``pool_size``: connections for publishes and :attr:`client` (the subscriber is one
      more); on a cluster, per primary; ``pool_timeout``: how long a command waits for
      a free one.
    - ``socket_timeout``, ``connect_timeout``: per command / per connect and subscribe.
    - ``publish_retries``: extra tries of a command on a connection error (a pooled
      connection found dead after a restart succeeds on its retry).
    - ``reconnect_min``, ``reconnect_max``, ``reconnect_jitter``: the subscriber's
      backoff, doubling from min to max, each delay shortened by up to jitter * delay.
    - ``ping_interval``, ``ping_timeout``: a silent subscriber connection is PINGed after
      ``ping_interval``; no reply within ``ping_timeout`` and it is replaced.
    - ``local_wakeups``: :meth:`publish` wakes this process's watchers itself (default);
      False, and they are woken by their own message coming back through Redis.
    - ``refresh``: see "State the operations read" in the module doc.
    - ``name``: for logs, errors and ``repr``; ``redis_options``: passed to redis-py.

    Raises:
        TypeError: ``url`` is not a str.
        ValueError: an option out of its range (a number of seconds not finite and
            above 0, ``shards`` or ``pool_size`` below 1, ``reconnect_max`` below
            ``reconnect_min``, ``reconnect_jitter`` outside [0, 1], an empty
            ``prefix``), naming the option and the value.
    """

    __slots__ = (
        "_channels",
        "_client",
        "_closed",
        "_cluster",
        "_cluster_client",
        "_cluster_options",
        "_common",
        "_connect_timeout",
        "_connected",
        "_counts",
        "_delivery_warned",
        "_detect_lock",
        "_ever_connected",
        "_last_error",
        "_local",
        "_loop",
        "_malformed_warned",
        "_map_lock",
        "_map_version",
        "_node_pools",
        "_nodes",
        "_origin",
        "_ping_interval",
        "_ping_timeout",
        "_pool",
        "_pool_size",
        "_pool_timeout",
        "_publish_cmd",
        "_publish_deadline",
        "_publish_failures",
        "_publish_retries",
        "_publish_warned",
        "_purgatories",
        "_ready",
        "_reconnect_jitter",
        "_reconnect_max",
        "_reconnect_min",
        "_refresh",
        "_refresh_event",
        "_refresher",
        "_sharded",
        "_sharded_given",
        "_slot_owner",
        "_slots",
        "_sub_client",
        "_sub_pool",
        "_task",
        "_to_refresh",
        "_topology",
        "name",
        "prefix",
        "shards",
        "url",
    )

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        purgatories: Iterable[Purgatory] = (),
        prefix: str = "aiopurgatory",
        shards: int = 16,
        sharded_pubsub: bool | None = None,
        pool_size: int = 4,
        pool_timeout: float = 5.0,
        socket_timeout: float = 2.0,
        connect_timeout: float = 2.0,
        publish_retries: int = 1,
        reconnect_min: float = 0.05,
        reconnect_max: float = 5.0,
        reconnect_jitter: float = 0.5,
        ping_interval: float = 1.0,
        ping_timeout: float = 1.0,
        local_wakeups: bool = True,
        name: str = "redis-fanout",
        redis_options: Mapping[str, Any] | None = None,
        refresh: Callable[[list[Hashable]], Awaitable[object]] | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, got {url!r}")
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty str, got {prefix!r}")
        _check_int("shards", shards, 1, _MAX_SHARDS)
        _check_int("pool_size", pool_size, 1, 1024)
        _check_int("publish_retries", publish_retries, 0, 100)
        for option, value in (
            ("socket_timeout", socket_timeout),
            ("connect_timeout", connect_timeout),
            ("pool_timeout", pool_timeout),
            ("reconnect_min", reconnect_min),
            ("reconnect_max", reconnect_max),
            ("ping_interval", ping_interval),
            ("ping_timeout", ping_timeout),
        ):
            if not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{option} must be a finite number of seconds > 0, got {value!r}")
        if reconnect_max < reconnect_min:
            raise ValueError(
                f"reconnect_max ({reconnect_max!r}) must be >= reconnect_min ({reconnect_min!r})"
            )
        if not isinstance(reconnect_jitter, int | float) or not 0 <= reconnect_jitter <= 1:
            raise ValueError(f"reconnect_jitter must be within [0, 1], got {reconnect_jitter!r}")
        self.url = url
        """The Redis URL given."""
        self.name = name
        """The fanout's name, for logs and errors."""
        self.prefix = prefix
        """The channels' common prefix (the same in every process joined)."""
        self.shards = shards
        """How many shard channels keys are hashed onto (the same in every process)."""
        # None: decided by what the URL names (SSUBSCRIBE on a cluster, SUBSCRIBE on
        # a standalone Redis), once the first connection told (_detect).
        self._sharded_given = sharded_pubsub
        self._sharded = bool(sharded_pubsub)
        self._publish_cmd = "SPUBLISH" if sharded_pubsub else "PUBLISH"
        self._cluster: bool | None = None
        self._cluster_client: RedisCluster | None = None
        self._detect_lock = asyncio.Lock()
        self._nodes: dict[str, _NodeSubscriber] = {}
        self._topology: asyncio.Event | None = None
        # On a cluster: the hash slot of each shard channel, which node ("host:port")
        # serves it as the last map read said, and a bounded pool per node for the
        # publishes (SPUBLISH to the slot's owner, following MOVED).
        self._slot_owner: dict[int, tuple[str, int]] = {}
        self._node_pools: dict[tuple[str, int], aioredis.BlockingConnectionPool] = {}
        self._map_lock = asyncio.Lock()
        self._map_version = 0
        self._pool_size = pool_size
        self._pool_timeout = pool_timeout
        self._publish_retries = publish_retries
        # A cluster publish ends within this (FanoutUnavailable after it): each try
        # waits for a pooled connection, connects and sends, then one map refresh.
        self._publish_deadline = (publish_retries + 2) * (
            pool_timeout + socket_timeout + 2 * connect_timeout
        )
        self._channels = [f"{prefix}:{{{n}}}" for n in range(shards)]
        self._slots = {channel: key_slot(channel.encode()) for channel in self._channels}
        self._local = local_wakeups
        self._origin = os.urandom(8).hex().encode()
        self._connect_timeout = connect_timeout
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._reconnect_min = reconnect_min
        self._reconnect_max = reconnect_max
        self._reconnect_jitter = reconnect_jitter
        options = dict(redis_options or {})
        common: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
            **options,
        }
        # Data and publishes: a bounded pool that waits (up to pool_timeout) for a
        # free connection instead of opening more. One retry with a short jittered
        # backoff: after a Redis restart every pooled connection is dead, and without
        # it the first command on each would fail although Redis is back.
        self._pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=pool_size,
            timeout=pool_timeout,
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), publish_retries),
            **common,
        )
        self._client = aioredis.Redis(connection_pool=self._pool)
        # The subscriber: one connection, and no retries inside redis-py (whose retry
        # would silently reconnect and resubscribe, hiding the gap this class must
        # close with a re-check). Built from the URL's options as from_url builds the
        # data pool (the query string wins over redis_options), then made to read raw
        # bytes whatever the user asked for: a wake-up's payload is bytes (a key may be
        # bytes, and the origin is compared as bytes), and decode_responses would turn
        # every wake-up into a str that no longer matches. The data pool keeps the
        # user's choice.
        self._sub_pool = aioredis.ConnectionPool(
            **{
                **common,
                **parse_url(url),
                "max_connections": 1,
                "retry": Retry(NoBackoff(), 0, supported_errors=()),
                "decode_responses": False,
            }
        )
        self._sub_client = aioredis.Redis(connection_pool=self._sub_pool)
        # On a cluster: the options of each node subscriber (the sub pool's, without
        # the URL's host and port) and of the publishing RedisCluster client.
        self._common: dict[str, Any] = {
            **common,
            **{k: v for k, v in parse_url(url).items() if k not in ("host", "port", "path")},
            "max_connections": 1,
            "retry": Retry(NoBackoff(), 0, supported_errors=()),
            "decode_responses": False,
        }
        self._cluster_options: dict[str, Any] = {**common, "max_connections": pool_size}
        self._purgatories: list[Purgatory] = []
        self._refresh = refresh
        self._to_refresh: dict[Hashable, None] = {}
        self._refresh_event: asyncio.Event | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self._closed = False
        self._connected = False
        self._ever_connected = False
        self._last_error: str | None = None
        self._publish_warned = -math.inf  # loop time of the last publish warning
        self._publish_failures = 0  # since that warning
        self._malformed_warned = -math.inf  # time.monotonic() of the last such warning
        self._delivery_warned = -math.inf  # time.monotonic() of the last such warning
        self._counts: dict[str, int] = dict.fromkeys(
            (
                "connects",
                "reconnects",
                "disconnects",
                "errors",
                "messages",
                "own_messages",
                "malformed",
                "wakeups",
                "rechecks",
                "published",
                "publish_errors",
                "refreshes",
                "refresh_errors",
                "delivery_errors",
                "topology_refreshes",
                "slot_moves",
            ),
            0,
        )
        for purgatory in purgatories:
            self.attach(purgatory)

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def start(self) -> None:
        """Start the subscriber task on the running loop (idempotent while open).

        Purgatories attached before and not used yet are bound to this loop (see
        :meth:`attach`).

        Raises:
            FanoutClosed: the fanout is closed.
            RuntimeError: no loop is running, or an attached purgatory runs on another.
        """
        if self._closed:
            raise FanoutClosed(f"fanout {self.name!r} is closed")
        if self._task is not None:
            return
        loop = asyncio.get_running_loop()
        for purgatory in self._purgatories:
            _check_same_loop(purgatory, loop)
        for purgatory in self._purgatories:
            _bind(purgatory)
        self._loop = loop
        self._ready = asyncio.Event()
        self._topology = asyncio.Event()
        self._task = loop.create_task(self._run(), name=f"aiopurgatory-{self.name}")
        if self._refresh is not None:
            self._refresh_event = asyncio.Event()
            self._refresher = loop.create_task(
                self._refresh_loop(), name=f"aiopurgatory-{self.name}-refresh"
            )
        if self._to_refresh and self._refresh_event is not None:
            self._refresh_event.set()  # keys queued by attach() before start()

    async def aclose(self) -> None:
        """Stop the subscriber task (and wait for it), close both pools. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = {t for t in (self._task, self._refresher) if t is not None}
        self._task = self._refresher = None
        # Cancel until they end: a cancellation can be lost inside redis-py (its pool
        # turns one into ConnectionError) or in Python 3.11's asyncio.timeout when it
        # coincides with the timeout; the tasks also stop at their next turn because
        # _closed is set.
        while tasks:
            for task in tasks:
                task.cancel()
            _, tasks = await asyncio.wait(tasks, timeout=0.1)
            if tasks:
                _log.debug("%s: %d task(s) survived a cancellation", self.name, len(tasks))
        await self._stop_nodes(list(self._nodes))  # ended with the task, unless cancelled
        self._to_refresh.clear()
        self._set_connected(False)
        self._purgatories.clear()
        await self._sub_pool.disconnect()
        await self._pool.disconnect()
        for pool in list(self._node_pools.values()):
            await pool.disconnect()
        self._node_pools.clear()
        if self._cluster_client is not None:
            await self._cluster_client.aclose()

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` began."""
        return self._closed

    @property
    def connected(self) -> bool:
        """True while subscribed to every channel (after the re-check was scheduled)."""
        return self._connected

    async def wait_connected(self, timeout: float | None = None) -> bool:
        """Wait until subscribed; False if ``timeout`` passed first."""
        ready = self._ready
        if ready is None or self._closed:
            raise FanoutClosed(f"fanout {self.name!r} is not running (start it first)")
        try:
            async with asyncio.timeout(timeout):
                await ready.wait()
        except TimeoutError:
            return False
        return True

    @property
    def client(self) -> aioredis.Redis:
        """A redis-py client over the bounded data pool, for the application's commands.

        Raises:
            FanoutError: the URL names a Redis Cluster node (use :attr:`cluster_client`).
        """
        if self._cluster:
            raise FanoutError(
                f"fanout {self.name!r} is on a Redis Cluster: use fanout.cluster_client"
                " (a redis-py RedisCluster) for the application's commands"
            )
        return self._client

    @property
    def cluster(self) -> bool | None:
        """True if the URL names a Redis Cluster node, False for a standalone Redis,
        None until the first connection told (see :meth:`detect`)."""
        return self._cluster

    @property
    def cluster_client(self) -> RedisCluster | None:
        """On a cluster, a redis-py ``RedisCluster`` client for the application's
        commands (built on first use; ``pool_size`` connections at most per node, its
        own, apart from the fanout's); None on a standalone Redis or before
        :meth:`detect` (or the subscriber) found out. Closed by :meth:`aclose`."""
        if not self._cluster or self._closed:
            return None
        if self._cluster_client is None:
            self._cluster_client = RedisCluster.from_url(self.url, **self._cluster_options)
        return self._cluster_client

    async def detect(self) -> bool:
        """Whether the URL names a Redis Cluster node (asked once: ``INFO cluster``).

        The subscriber and the first publish ask on their own; call it to know before.

        Raises:
            FanoutUnavailable: Redis did not answer (within ``connect_timeout``).
            FanoutClosed: the fanout is closed.
        """
        if self._closed:
            raise FanoutClosed(f"fanout {self.name!r} is closed")
        try:
            await self._detect()
        except (RedisError, OSError, TimeoutError) as exc:
            raise FanoutUnavailable(
                f"fanout {self.name!r} could not reach {self._where()}: {exc}"
            ) from exc
        return bool(self._cluster)

    # -- purgatories --------------------------------------------------------------------

    def attach(self, purgatory: Purgatory) -> None:
        """Wake ``purgatory``'s watchers on events from everywhere; re-checks its keys.

        Attaching twice is a no-op. Every key it watches is re-checked once, so that
        waiters registered before the attach miss nothing.

        A purgatory not used yet is bound to the fanout's loop here (or by
        :meth:`start`, if the fanout is not started): the fanout notifies it from that
        loop, so using it on another loop afterwards raises ``RuntimeError`` at that
        use instead of breaking every wake-up later.

        Raises:
            TypeError: not a :class:`~aiopurgatory.Purgatory`.
            ValueError: the purgatory is closed.
            RuntimeError: it runs on another event loop than the fanout's, or the
                fanout is started and this is called outside its loop.
            FanoutClosed: the fanout is closed.
        """
        if not isinstance(purgatory, Purgatory):
            raise TypeError(f"expected a Purgatory, got {purgatory!r}")
        if self._closed:
            raise FanoutClosed(f"fanout {self.name!r} is closed")
        if purgatory.closed:
            raise ValueError(f"{purgatory!r} is closed")
        if self._loop is not None:
            _check_same_loop(purgatory, self._loop)
            if asyncio._get_running_loop() is not self._loop:
                # Not thread-safe, and an unused purgatory could not be bound here.
                raise RuntimeError(
                    f"attach {purgatory!r} from the loop fanout {self.name!r} runs on"
                    " (loop.call_soon_threadsafe(fanout.attach, purgatory))"
                )
        if any(p is purgatory for p in self._purgatories):
            return
        if self._loop is not None:
            _bind(purgatory)
        self._purgatories.append(purgatory)
        # Events raised before it was attached were not meant for it, but its waiters
        # may have registered meanwhile: one look costs little and loses nothing.
        self._recheck(purgatory)

    def detach(self, purgatory: Purgatory) -> None:
        """Stop waking ``purgatory`` (no error if it was not attached)."""
        self._purgatories = [p for p in self._purgatories if p is not purgatory]

    @property
    def purgatories(self) -> tuple[Purgatory, ...]:
        """The purgatories attached now."""
        return tuple(self._purgatories)

    # -- publishing ---------------------------------------------------------------------

    @property
    def channels(self) -> tuple[str, ...]:
        """The shard channels, ``<prefix>:{0}`` ... (index = shard number)."""
        return tuple(self._channels)

    def channel_of(self, key: Hashable) -> str:
        """The channel that carries ``key``'s wake-ups (CRC-32 of its encoding, mod shards).

        Raises:
            TypeError: ``key`` is not a ``str``, ``bytes`` or ``int``.
        """
        return self._channels[zlib.crc32(encode_key(key)) % self.shards]

    def hash_tag(self, key: Hashable) -> str:
        """The hash tag of :meth:`channel_of` ``(key)``: ``"{n}"`` for the default names.

        On a Redis Cluster, a key whose name holds it as its first ``{...}`` (e.g.
        ``f"orders:{fanout.hash_tag('o1')}:stream"``) lives in the hash slot of ``key``'s
        wake-up channel: one Lua script can then write ``key``'s data and send its
        wake-up (:meth:`message_for`, with :attr:`publish_command`) atomically on one
        node, and a failover or slot migration moves the data and the channel together.
        On a standalone Redis it is just a part of the name.

        Raises:
            TypeError: ``key`` is not a ``str``, ``bytes`` or ``int``.
            ValueError: the channel name has no hash tag (a ``prefix`` holding an empty
                ``{}``): Redis hashes the whole name, which no other key shares.
        """
        channel = self.channel_of(key)
        start = channel.find("{")
        end = channel.find("}", start + 1)
        if start < 0 or end <= start + 1:
            raise ValueError(f"channel {channel!r} has no hash tag (prefix {self.prefix!r})")
        return channel[start : end + 1]

    def message_for(self, key: Hashable, *, from_here: bool = False) -> tuple[str, bytes]:
        """``(channel, payload)`` of a wake-up for ``key``, to send with
        :attr:`publish_command` from the application's own script or transaction (so
        the data write and its wake-up go together). With ``from_here`` the copy that
        comes back to this process is skipped: then call :meth:`notify_local` yourself.
        """
        encoded = encode_key(key)
        origin = self._origin if from_here else b""
        return self._channels[zlib.crc32(encoded) % self.shards], origin + _SEP + encoded

    @property
    def publish_command(self) -> str:
        """``"PUBLISH"``, or ``"SPUBLISH"`` with ``sharded_pubsub`` or on a cluster."""
        return self._publish_cmd

    def notify_local(self, key: Hashable) -> int:
        """``notify(key)`` on every attached purgatory watching it; returns how many.

        A purgatory that raises is logged and counted (``stats.delivery_errors``);
        the others are notified all the same.

        Raises:
            TypeError: ``key`` is unhashable (the caller's error, not a purgatory's).
        """
        hash(key)
        woken = 0
        for purgatory in self._live():
            try:
                if purgatory.watchers_of(key):
                    purgatory.notify(key)
                    woken += 1
            except Exception as exc:
                self._delivery_failed(purgatory, exc)
        self._counts["wakeups"] += woken
        return woken

    async def publish(self, key: Hashable) -> int:
        """Wake ``key``'s watchers everywhere; returns the number of remote subscribers
        Redis delivered to (this process included when it is subscribed).

        Watchers in this process are notified first, synchronously (with
        ``local_wakeups``, the default), even if Redis is down. Raises
        :class:`FanoutUnavailable` if Redis did not take the message, ``TypeError`` for
        a key that is not ``str``/``bytes``/``int``, :class:`FanoutClosed` once closed.
        """
        if self._closed:
            raise FanoutClosed(f"fanout {self.name!r} is closed")
        channel, payload = self.message_for(key, from_here=self._local)
        if self._local:
            self._wake(key)
        try:
            if self._cluster is None:
                await self._detect()
            if self._cluster:
                async with asyncio.timeout(self._publish_deadline):
                    receivers = await self._cluster_publish(channel, payload)
            else:
                command = self._client.execute_command
                receivers = await command(self._publish_cmd, channel, payload)  # type: ignore[no-untyped-call]
        except (RedisError, OSError, TimeoutError) as exc:
            self._publish_failed(exc)
            raise FanoutUnavailable(
                f"fanout {self.name!r} could not publish a wake-up for {key!r} on"
                f" {channel!r} at {self._where()}: {exc}"
            ) from exc
        self._counts["published"] += 1
        return int(receivers)

    async def publish_many(self, keys: Iterable[Hashable]) -> None:
        """:meth:`publish` of several keys in one round trip (a pipeline)."""
        if self._closed:
            raise FanoutClosed(f"fanout {self.name!r} is closed")
        messages = [(key, *self.message_for(key, from_here=self._local)) for key in keys]
        if not messages:
            return
        if self._local:
            for key, _, _ in messages:
                self._wake(key)
        try:
            if self._cluster is None:
                await self._detect()
            if self._cluster:
                async with asyncio.timeout(self._publish_deadline):
                    await self._cluster_publish_many([(c, p) for _, c, p in messages])
            else:
                async with self._client.pipeline(transaction=False) as pipe:
                    for _, channel, payload in messages:
                        pipe.execute_command(self._publish_cmd, channel, payload)
                    await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            self._publish_failed(exc)
            raise FanoutUnavailable(
                f"fanout {self.name!r} could not publish {len(messages)} wake-ups at"
                f" {self._where()}: {exc}"
            ) from exc
        self._counts["published"] += len(messages)

    # -- stats --------------------------------------------------------------------------

    @property
    def stats(self) -> FanoutStats:
        """A snapshot of the counters (a new :class:`FanoutStats` on each read)."""
        c = self._counts
        return FanoutStats(
            connected=self._connected,
            connects=c["connects"],
            reconnects=c["reconnects"],
            disconnects=c["disconnects"],
            errors=c["errors"],
            last_error=self._last_error,
            messages=c["messages"],
            own_messages=c["own_messages"],
            malformed=c["malformed"],
            wakeups=c["wakeups"],
            rechecks=c["rechecks"],
            published=c["published"],
            publish_errors=c["publish_errors"],
            refreshes=c["refreshes"],
            refresh_errors=c["refresh_errors"],
            delivery_errors=c["delivery_errors"],
            attached=len(self._purgatories),
            channels=len(self._channels),
            cluster=self._cluster,
            subscribers=(
                sum(1 for n in self._nodes.values() if n.confirmed)
                if self._cluster
                else int(self._connected)
            ),
            topology_refreshes=c["topology_refreshes"],
            slot_moves=c["slot_moves"],
            node_channels={a: len(n.live) for a, n in self._nodes.items() if n.confirmed},
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self._connected else "disconnected"
        return f"<RedisFanout {self.name!r} {self._where()} {state}>"

    # -- the subscriber -----------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0  # consecutive failed attempts
        down_since = loop.time()
        last_warning = -math.inf
        while not self._stopping():
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # anything: the subscriber must never die silently
                if self._stopping():
                    return
                now = loop.time()
                was_connected = self._connected
                self._set_connected(False)
                self._counts["errors"] += 1
                self._last_error = f"{type(exc).__name__}: {exc}"
                expected = isinstance(exc, RedisError | OSError | TimeoutError | _Stale)
                if was_connected:
                    self._counts["disconnects"] += 1
                    failures = 0
                    down_since = now
                    last_warning = now
                    _log.warning(
                        "%s: lost the subscription at %s (%s); reconnecting",
                        self.name,
                        self._where(),
                        self._last_error,
                        exc_info=not expected,
                    )
                elif now - last_warning >= _WARN_EVERY or not expected:
                    last_warning = now
                    _log.warning(
                        "%s: cannot subscribe at %s for %.1f s (%d attempts): %s",
                        self.name,
                        self._where(),
                        now - down_since,
                        failures + 1,
                        self._last_error,
                        exc_info=not expected,
                    )
                else:
                    _log.debug("%s: attempt %d failed: %s", self.name, failures + 1, exc)
            if self._stopping():
                return
            delay = self._backoff(failures)
            failures += 1
            await asyncio.sleep(delay)

    def _backoff(self, failures: int) -> float:
        delay = min(self._reconnect_max, self._reconnect_min * 2.0 ** min(failures, 60))
        return delay * (1.0 - self._reconnect_jitter * random.random())

    async def _detect(self) -> None:
        """Ask the URL's node once whether it is a cluster node (``INFO cluster``)."""
        async with self._detect_lock:
            if self._cluster is not None:
                return
            try:
                async with asyncio.timeout(self._connect_timeout):
                    info = await self._sub_client.execute_command("INFO", "cluster")  # type: ignore[no-untyped-call]
            except ResponseError:
                info = None  # INFO refused (renamed by a managed service): standalone
            finally:
                await self._sub_pool.disconnect()
            if isinstance(info, Mapping):
                enabled = str(info.get("cluster_enabled", 0)) == "1"
            else:
                enabled = b"cluster_enabled:1" in (
                    info if isinstance(info, bytes) else str(info).encode()
                )
            if not enabled:
                self._cluster = False
                return
            if self._sharded_given is False:
                _log.warning(
                    "%s: %s is a Redis Cluster node: sharded_pubsub=False is ignored"
                    " (a cluster is served with SSUBSCRIBE/SPUBLISH, one subscriber per"
                    " primary)",
                    self.name,
                    self._where(),
                )
            self._sharded = True
            self._publish_cmd = "SPUBLISH"
            self._cluster = True
            _log.debug("%s: %s is a Redis Cluster node", self.name, self._where())

    # -- routing on a cluster -----------------------------------------------------------

    def _node_client(self, address: tuple[str, int]) -> aioredis.Redis:
        """A client over ``address``'s bounded pool (made on first use)."""
        pool = self._node_pools.get(address)
        if pool is None:
            host, port = address
            pool = aioredis.BlockingConnectionPool(
                host=host,
                port=port,
                max_connections=self._pool_size,
                timeout=self._pool_timeout,
                retry=Retry(
                    ExponentialWithJitterBackoff(base=0.01, cap=0.1), self._publish_retries
                ),
                **{k: v for k, v in self._common.items() if k not in ("max_connections", "retry")},
            )
            self._node_pools[address] = pool
        return aioredis.Redis(connection_pool=pool)

    def _url_address(self) -> tuple[str, int]:
        kwargs = self._pool.connection_kwargs
        return str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379))

    async def _refresh_map(self, seen: int | None = None) -> None:
        """Read the slot map (``CLUSTER SLOTS``) of the first node that answers.

        Concurrent callers share one read: ``seen``, the map version a caller found
        stale, skips the read if another caller replaced that version meanwhile.
        Only the owners of the shard channels' slots are kept (16 by default).
        """
        async with self._map_lock:
            if seen is not None and seen != self._map_version:
                return
            owners = set(self._slot_owner.values())
            candidates = list(owners)
            random.shuffle(candidates)  # spread the reads over the primaries
            known = [a for a in self._node_pools if a not in owners]
            random.shuffle(known)
            url_node = self._url_address()
            errors: list[str] = []
            tried: set[tuple[str, int]] = set()
            for address in (*candidates, url_node, *known):
                if address in tried:
                    continue
                tried.add(address)
                try:
                    async with asyncio.timeout(self._connect_timeout):
                        reply = await self._node_client(address).execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
                    ranges = _slot_ranges(reply, address[0])
                except (RedisError, OSError, TimeoutError, ValueError) as exc:
                    errors.append(f"{address[0]}:{address[1]}: {type(exc).__name__}: {exc}")
                    continue
                owner: dict[int, tuple[str, int]] = {}
                for slot in self._slots.values():
                    for start, end, primary, replicas in ranges:
                        if start <= slot <= end:
                            owner[slot] = primary
                            for replica in replicas:  # more places to ask next time
                                self._node_client(replica)
                            break
                if len(owner) < len(set(self._slots.values())):
                    errors.append(f"{address[0]}:{address[1]}: shard slots not covered")
                    continue
                self._slot_owner = owner
                self._map_version += 1
                self._counts["topology_refreshes"] += 1
                if address not in owner.values():
                    # A replica (the URL's, or asked because no owner answered): the
                    # publishes never go there, so hold no connection to it.
                    await self._node_pools[address].disconnect(inuse_connections=False)
                return
            raise ConnectionError("no cluster node gave the slot map: " + "; ".join(errors))

    async def _cluster_publish(self, channel: str, payload: bytes) -> int:
        """SPUBLISH to the owner of the channel's slot, following MOVED and failures."""
        slot = self._slots[channel]
        last: Exception | None = None
        for _ in range(self._publish_retries + 2):
            version = self._map_version
            address = self._slot_owner.get(slot)
            if address is None:
                await self._refresh_map(version)
                address = self._slot_owner[slot]
            try:
                receivers = await self._node_client(address).execute_command(  # type: ignore[no-untyped-call]
                    "SPUBLISH", channel, payload
                )
                return int(receivers)
            except MovedError as exc:
                # The slot has a new owner (a migration, a failover seen by the node):
                # go there now, and let the subscriber follow too.
                last = exc
                self._slot_owner[slot] = (exc.host, int(exc.port))
                self._changed_topology()
            except (ConnectionError, TimeoutError, OSError) as exc:
                last = exc
                self._changed_topology()
                try:
                    await self._refresh_map(version)
                except (RedisError, OSError, TimeoutError):
                    break  # no node answers: give up now
        assert last is not None
        raise last

    async def _cluster_publish_many(self, messages: list[tuple[str, bytes]]) -> None:
        """One pipeline per owner, all at once; any failure: one by one, routed."""
        if not self._slot_owner:
            await self._refresh_map(self._map_version)
        groups: dict[tuple[str, int], list[tuple[str, bytes]]] = {}
        for channel, payload in messages:
            address = self._slot_owner[self._slots[channel]]
            groups.setdefault(address, []).append((channel, payload))

        async def send(address: tuple[str, int], group: list[tuple[str, bytes]]) -> None:
            try:
                async with self._node_client(address).pipeline(transaction=False) as pipe:
                    for channel, payload in group:
                        pipe.execute_command("SPUBLISH", channel, payload)
                    await pipe.execute()
            except (RedisError, OSError, TimeoutError):
                for channel, payload in group:
                    await self._cluster_publish(channel, payload)

        await asyncio.gather(*(send(a, g) for a, g in groups.items()))

    def _changed_topology(self) -> None:
        if self._topology is not None:
            self._topology.set()

    async def _session(self) -> None:
        """Subscribe, re-check everything, then deliver until the connection fails."""
        if self._cluster is None:
            await self._detect()
        if self._cluster:
            await self._cluster_session()
            return
        pubsub = self._sub_client.pubsub()
        try:
            async with asyncio.timeout(self._connect_timeout):
                await self._subscribe(pubsub)
            self._subscribed()
            await self._listen(pubsub, self._handle)
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]

    # -- the subscribers on a cluster ---------------------------------------------------

    async def _cluster_session(self) -> None:
        """One subscriber per primary serving shard channels; follow the slot map.

        Reads the slot map, starts a subscriber on each primary that owns shard
        channels (SSUBSCRIBE, one command per channel), and waits: a subscriber that
        ends (its node died, refused with MOVED) or loses a channel (an
        ``sunsubscribe`` push: the slot moved) wakes this loop, which waits a backoff
        delay, reads the map again, and replaces the subscribers whose channels
        changed. Each new subscriber re-checks the keys of its channels once Redis
        confirmed all of them. Raises (to _run's backoff) only if no node answers.
        """
        topology = self._topology
        assert topology is not None
        loop = asyncio.get_running_loop()
        failures = 0
        down_since = loop.time()
        last_warning = loop.time()
        try:
            while not self._stopping():
                topology.clear()
                await self._refresh_map()
                wanted: dict[str, tuple[str, int, list[str]]] = {}
                for channel in self._channels:
                    host, port = self._slot_owner[self._slots[channel]]
                    entry = (host, port, list[str]())
                    wanted.setdefault(f"{host}:{port}", entry)[2].append(channel)
                stale = [
                    address
                    for address, sub in self._nodes.items()
                    if sub.ended
                    or sub.lost
                    or address not in wanted
                    or sub.channels != frozenset(wanted[address][2])
                ]
                await self._stop_nodes(stale)
                for address, (host, port, channels) in wanted.items():
                    if address not in self._nodes:
                        sub = _NodeSubscriber(address, host, port, frozenset(channels))
                        self._nodes[address] = sub
                        sub.task = asyncio.get_running_loop().create_task(
                            self._node_run(sub), name=f"aiopurgatory-{self.name}-{address}"
                        )
                self._cluster_changed()
                await topology.wait()
                now = loop.time()
                if self._connected:
                    failures = 0
                    down_since = now
                else:
                    failures += 1
                    if now - max(down_since, last_warning) >= _WARN_EVERY:
                        last_warning = now
                        live = sum(len(sub.live) for sub in self._nodes.values())
                        _log.warning(
                            "%s: %d of %d shard channels subscribed for %.1f s (%d attempts;"
                            " the latest error: %s)",
                            self.name,
                            live,
                            len(self._channels),
                            now - down_since,
                            failures,
                            self._last_error,
                        )
                await asyncio.sleep(min(self._backoff(failures), _TOPOLOGY_RETRY_MAX))
        finally:
            await self._stop_nodes(list(self._nodes))

    async def _stop_nodes(self, addresses: list[str]) -> None:
        tasks = []
        for address in addresses:
            sub = self._nodes.pop(address, None)
            if sub is not None and sub.task is not None:
                sub.stopping = True
                tasks.append(sub.task)
        while tasks:  # as aclose(): a cancellation can be lost inside redis-py
            for task in tasks:
                task.cancel()
            _, pending = await asyncio.wait(tasks, timeout=0.1)
            tasks = list(pending)

    async def _node_run(self, sub: _NodeSubscriber) -> None:
        """One primary's subscriber: SSUBSCRIBE its channels, re-check, deliver."""
        pool = aioredis.ConnectionPool(host=sub.host, port=sub.port, **self._common)
        pubsub = aioredis.Redis(connection_pool=pool).pubsub()
        try:
            async with asyncio.timeout(self._connect_timeout):
                for channel in sorted(sub.channels):
                    await pubsub.ssubscribe(channel)
                pending = set(sub.channels)
                while pending:
                    message = await pubsub.get_message(timeout=None)
                    if message is None:
                        continue
                    if message["type"] == "ssubscribe":
                        pending.discard(_text(message["channel"]))
                    else:
                        self._node_message(sub, message)
            sub.live = set(sub.channels)
            sub.confirmed = True
            # Confirmed: whatever was published to these channels before, this
            # re-check sees in the shared state; after it, every wake-up is delivered.
            for purgatory in self._live():
                self._recheck(purgatory, sub.channels)
            self._cluster_changed()
            await self._listen(pubsub, partial(self._node_message, sub))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not sub.stopping:
                self._counts["errors"] += 1
                self._last_error = f"{sub.address}: {type(exc).__name__}: {exc}"
                expected = isinstance(exc, RedisError | OSError | TimeoutError | _Stale)
                log = _log.warning if sub.confirmed or not expected else _log.debug
                log(
                    "%s: the subscriber at %s ended (%s); following the slot map",
                    self.name,
                    sub.address,
                    self._last_error,
                    exc_info=not expected,
                )
        finally:
            sub.ended = True
            sub.confirmed = False
            sub.live.clear()
            try:
                await pubsub.aclose()  # type: ignore[no-untyped-call]
                await pool.disconnect()
            finally:
                if not sub.stopping and not self._stopping():
                    self._cluster_changed()
                    self._changed_topology()

    def _node_message(self, sub: _NodeSubscriber, message: Mapping[str, Any]) -> None:
        if message["type"] == "sunsubscribe":
            # Not asked for: the node no longer serves this channel's slot (failover,
            # migration). Follow the map; the new owner's subscriber re-checks.
            channel = _text(message["channel"])
            if channel in sub.live:
                sub.live.discard(channel)
                sub.lost = True
                self._counts["slot_moves"] += 1
                _log.info(
                    "%s: %s dropped %s (its slot moved); following the slot map",
                    self.name,
                    sub.address,
                    channel,
                )
                self._cluster_changed()
                self._changed_topology()
            return
        self._handle(message)

    def _cluster_changed(self) -> None:
        """Connected when every channel is confirmed somewhere; count the transitions."""
        if self._stopping():
            return
        live = sum(len(sub.live) for sub in self._nodes.values())
        now = live == len(self._channels)
        if now == self._connected:
            return
        if now:
            self._counts["connects"] += 1
            if self._ever_connected:
                self._counts["reconnects"] += 1
                _log.info(
                    "%s: subscribed again on %d primaries (%d channels)",
                    self.name,
                    len(self._nodes),
                    len(self._channels),
                )
            self._ever_connected = True
        else:
            self._counts["disconnects"] += 1
        self._set_connected(now)

    async def _subscribe(self, pubsub: PubSub) -> None:
        if self._sharded:
            # One command per channel: on a cluster, channels of different hash slots
            # cannot share an SSUBSCRIBE (CROSSSLOT).
            for channel in self._channels:
                await pubsub.ssubscribe(channel)
            confirmation = "ssubscribe"
        else:
            await pubsub.subscribe(*self._channels)
            confirmation = "subscribe"
        pending = set(self._channels)
        while pending:
            message = await pubsub.get_message(timeout=None)
            if message is None:
                continue
            kind = message["type"]
            if kind == confirmation:
                pending.discard(_text(message["channel"]))
            else:
                self._handle(message)

    def _subscribed(self) -> None:
        self._counts["connects"] += 1
        if self._ever_connected:
            self._counts["reconnects"] += 1
            _log.info(
                "%s: subscribed again at %s (%d channels); re-checking every watched key",
                self.name,
                self._where(),
                len(self._channels),
            )
        else:
            _log.debug("%s: subscribed at %s", self.name, self._where())
        self._ever_connected = True
        self._set_connected(True)
        # Confirmed: from here on every wake-up is delivered; whatever was published
        # before, this re-check sees in the shared state.
        for purgatory in self._live():
            self._recheck(purgatory)

    async def _listen(self, pubsub: PubSub, handle: Callable[[Mapping[str, Any]], None]) -> None:
        loop = asyncio.get_running_loop()
        ping_sent: float | None = None
        while not self._stopping():
            if ping_sent is None:
                wait = self._ping_interval
            else:
                wait = max(0.0, ping_sent + self._ping_timeout - loop.time())
            message = await pubsub.get_message(timeout=wait)
            if message is None:
                if ping_sent is None:
                    await pubsub.ping()
                    ping_sent = loop.time()
                elif loop.time() >= ping_sent + self._ping_timeout:
                    # The loop may have been busy past the deadline while the reply
                    # sat in the socket: look once more without waiting.
                    message = await pubsub.get_message(timeout=0.0)
                    if message is None:
                        raise _Stale(f"no reply to PING within {self._ping_timeout} s")
                    ping_sent = None
                    handle(message)
                continue
            ping_sent = None  # anything received shows the connection is alive
            handle(message)

    def _handle(self, message: Mapping[str, Any]) -> None:
        kind = message["type"]
        if kind not in ("message", "smessage"):
            return  # pong, (un)subscribe confirmations
        self._counts["messages"] += 1
        data = message["data"]
        if not isinstance(data, bytes):
            self._malformed(data)
            return
        origin, sep, encoded = data.partition(_SEP)
        if not sep:
            self._malformed(data)
            return
        if origin == self._origin:
            self._counts["own_messages"] += 1  # woken locally when published
            return
        try:
            key = decode_key(encoded)
        except ValueError:
            self._malformed(data)
            return
        self._wake(key)

    def _publish_failed(self, exc: BaseException) -> None:
        # Each failure raises to its caller; the log says it once per _WARN_EVERY,
        # with the count, instead of once per request during an outage.
        self._counts["publish_errors"] += 1
        self._publish_failures += 1
        now = asyncio.get_running_loop().time()
        if now - self._publish_warned >= _WARN_EVERY:
            _log.warning(
                "%s: %d publish(es) failed at %s since the last warning, the latest: %r",
                self.name,
                self._publish_failures,
                self._where(),
                exc,
            )
            self._publish_warned = now
            self._publish_failures = 0
        else:
            _log.debug("%s: publish failed: %r", self.name, exc)

    def _malformed(self, data: object) -> None:
        self._counts["malformed"] += 1
        # A warning (at most once per _WARN_EVERY): messages that are not wake-ups on
        # our channels mean a misconfigured peer (another prefix scheme, another
        # encoding), whose wake-ups are all being lost; debug alone hid that.
        now = time.monotonic()
        if now - self._malformed_warned >= _WARN_EVERY:
            self._malformed_warned = now
            _log.warning(
                "%s: ignored a message that is not a wake-up (%d so far): %.80r",
                self.name,
                self._counts["malformed"],
                data,
            )
        else:
            _log.debug("%s: ignored a message that is not a wake-up: %.80r", self.name, data)

    # -- helpers ------------------------------------------------------------------------

    def _live(self) -> list[Purgatory]:
        """Attached purgatories still open (closed ones are dropped on the way)."""
        live = [p for p in self._purgatories if not p.closed]
        if len(live) != len(self._purgatories):
            self._purgatories = live
        return live

    def _recheck(self, purgatory: Purgatory, channels: frozenset[str] | None = None) -> None:
        """Notify every key ``purgatory`` watches (or those carried by ``channels``)."""
        if purgatory.closed or purgatory.loop is None:
            return  # never used: nothing watches anything there yet
        keys = purgatory.keys()
        if channels is not None:
            keys = [key for key in keys if self._carried_by(key, channels)]
        self._counts["rechecks"] += 1
        if self._refresh is not None:
            self._to_refresh.update(dict.fromkeys(keys))
            if self._refresh_event is not None:
                self._refresh_event.set()
            return
        try:
            for key in keys:
                purgatory.notify(key)  # one coalesced pass on the next loop iteration
        except Exception as exc:
            # Its failure is its own: the other purgatories are still re-checked, and
            # the subscription (which this runs inside) stays up.
            self._delivery_failed(purgatory, exc)
            return
        self._counts["wakeups"] += len(keys)

    def _carried_by(self, key: Hashable, channels: frozenset[str]) -> bool:
        try:
            return self.channel_of(key) in channels
        except TypeError:
            return True  # no channel carries it: re-check it with every shard

    def _delivery_failed(self, purgatory: Purgatory, exc: Exception) -> None:
        # Counted each time, logged with its traceback once per _WARN_EVERY: a
        # purgatory that fails does so on every wake-up, and the log must not flood.
        self._counts["delivery_errors"] += 1
        self._last_error = f"delivery to {purgatory.name!r}: {type(exc).__name__}: {exc}"
        now = time.monotonic()  # attach may get here before the fanout has a loop
        if now - self._delivery_warned >= _WARN_EVERY:
            self._delivery_warned = now
            _log.warning(
                "%s: waking %r failed (%d failures so far; the other purgatories are"
                " woken all the same)",
                self.name,
                purgatory,
                self._counts["delivery_errors"],
                exc_info=exc,
            )
        else:
            _log.debug("%s: waking %r failed: %r", self.name, purgatory, exc)

    def _wake(self, key: Hashable) -> None:
        """A wake-up for ``key``: notify now, or after the refresh hook ran."""
        if self._refresh is None:
            self.notify_local(key)
            return
        # Watched or not: nobody may watch it yet while a waiter, its state read, is
        # on its way to watch it; refresh must see the key for that waiter's copy.
        self._to_refresh[key] = None
        if self._refresh_event is not None:  # None before start(): it sets the event
            self._refresh_event.set()

    async def _refresh_loop(self) -> None:
        """Batches of woken keys: ``await refresh(keys)``, then notify them.

        One batch at a time: keys woken while a refresh runs wait for the next batch,
        so a burst costs one refresh, not one per wake-up.
        """
        refresh = self._refresh
        event = self._refresh_event
        assert refresh is not None
        assert event is not None
        while not self._stopping():
            await event.wait()
            event.clear()
            keys = list(self._to_refresh)
            self._to_refresh = {}
            if not keys:
                continue
            self._counts["refreshes"] += 1
            try:
                await refresh(keys)
            except Exception as exc:
                # The operations still get their check (against what the application
                # holds); they end by their timeouts if that is stale.
                self._counts["refresh_errors"] += 1
                self._last_error = f"refresh: {type(exc).__name__}: {exc}"
                _log.warning(
                    "%s: refresh of %d keys failed: %r",
                    self.name,
                    len(keys),
                    exc,
                    exc_info=not isinstance(exc, RedisError | OSError),
                )
            for key in keys:
                self.notify_local(key)

    def _stopping(self) -> bool:
        """aclose() was called (a method, so that type checkers do not narrow it)."""
        return self._closed

    def _set_connected(self, connected: bool) -> None:
        self._connected = connected
        ready = self._ready
        if ready is not None:
            if connected:
                ready.set()
            else:
                ready.clear()

    def _where(self) -> str:
        kwargs = self._pool.connection_kwargs
        if "path" in kwargs:
            return f"unix:{kwargs['path']}"
        where = f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
        return f"the cluster of {where}" if self._cluster else where


class _NodeSubscriber:
    """One primary's subscriber connection on a cluster (state for its task)."""

    __slots__ = (
        "address",
        "channels",
        "confirmed",
        "ended",
        "host",
        "live",
        "lost",
        "port",
        "stopping",
        "task",
    )

    def __init__(self, address: str, host: str, port: int, channels: frozenset[str]) -> None:
        self.address = address
        self.host = host
        self.port = port
        self.channels = channels
        """The shard channels this primary serves, as the slot map said."""
        self.live: set[str] = set()
        """Channels confirmed and not dropped since."""
        self.confirmed = False
        self.ended = False
        self.lost = False
        """The node dropped a channel (sunsubscribe): replace this subscriber."""
        self.stopping = False
        self.task: asyncio.Task[None] | None = None


def _slot_ranges(
    reply: object, default_host: str
) -> list[tuple[int, int, tuple[str, int], list[tuple[str, int]]]]:
    """``CLUSTER SLOTS`` (RESP2/RESP3, raw or as redis-py parses it) as
    ``(start, end, primary, replicas)``, each node ``(host, port)``."""

    def node(entry: Any) -> tuple[str, int]:
        host = _text(entry[0]) or default_host  # "" means the node asked
        return host, int(entry[1])

    ranges = []
    if isinstance(reply, Mapping):  # redis-py's parse_cluster_slots
        for (start, end), info in reply.items():
            replicas = [node(r) for r in info.get("replicas", ())]
            ranges.append((int(start), int(end), node(info["primary"]), replicas))
        return ranges
    if not isinstance(reply, list):
        raise ValueError(f"unexpected CLUSTER SLOTS reply: {reply!r:.80}")
    for entry in reply:
        ranges.append((int(entry[0]), int(entry[1]), node(entry[2]), [node(r) for r in entry[3:]]))
    return ranges


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an int within [{low}, {high}], got {value!r}")


def _bind(purgatory: Purgatory) -> None:
    """Bind a purgatory not used yet to the running loop (a no-op once bound)."""
    if purgatory.loop is None:
        purgatory.bind_loop()


def _check_same_loop(purgatory: Purgatory, loop: asyncio.AbstractEventLoop) -> None:
    if purgatory.loop is not None and purgatory.loop is not loop:
        raise RuntimeError(
            f"{purgatory!r} runs on another event loop than the fanout: attach"
            " purgatories of the loop the fanout was started on"
        )
