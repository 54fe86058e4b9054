"""The fanout (:class:`RedisFanout`): its life, the purgatories attached, publishes,
what the subscribers deliver, re-checks and the refresh hook (the package doc has the
design). Its options are checked in :mod:`.options`; the standalone subscriber is in
:mod:`.standalone`, a cluster's subscribers and routing in :mod:`.cluster`."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from types import TracebackType
from typing import Any, Final, Self

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from ..purgatory import Purgatory
from .cluster import ClusterSubscribers, FanoutHooks, SlotRouter, is_cluster_node
from .data import DataClient, DataCluster
from .errors import WARN_EVERY, FanoutClosed, FanoutError, FanoutUnavailable, log
from .keys import SEP, channel_names, decode_key, encode_key, hash_tag, shard_of
from .options import FanoutOptions
from .standalone import StandaloneSubscriber
from .stats import FanoutStats
from .subscriber import Stale

__all__ = ["RedisFanout"]

_COUNTERS: Final = (
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
)
"""The counts behind :attr:`RedisFanout.stats` (the fields of :class:`FanoutStats`
that count), each from 0 at construction."""


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
        "_backoff",
        "_channels",
        "_client",
        "_closed",
        "_cluster",
        "_cluster_client",
        "_connected",
        "_counts",
        "_data",
        "_delivery_warned",
        "_detect_lock",
        "_ever_connected",
        "_last_error",
        "_loop",
        "_malformed_warned",
        "_options",
        "_origin",
        "_pool",
        "_publish_cmd",
        "_publish_failures",
        "_publish_warned",
        "_purgatories",
        "_ready",
        "_refresh",
        "_refresh_event",
        "_refresher",
        "_router",
        "_standalone",
        "_subscribers",
        "_task",
        "_to_refresh",
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
        # Checked here, all at once, before anything is built (FanoutOptions' doc).
        options = FanoutOptions(
            url=url,
            prefix=prefix,
            shards=shards,
            sharded_pubsub=sharded_pubsub,
            pool_size=pool_size,
            pool_timeout=pool_timeout,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            publish_retries=publish_retries,
            reconnect_min=reconnect_min,
            reconnect_max=reconnect_max,
            reconnect_jitter=reconnect_jitter,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            local_wakeups=local_wakeups,
            name=name,
            redis_options=redis_options or {},
        )
        self._options = options
        self.url = url
        """The Redis URL given."""
        self.name = name
        """The fanout's name, for logs and errors."""
        self.prefix = prefix
        """The channels' common prefix (the same in every process joined)."""
        self.shards = shards
        """How many shard channels keys are hashed onto (the same in every process)."""
        # Until the first connection told (_detect): SPUBLISH only if asked for; a
        # cluster node turns it to SPUBLISH whatever was asked.
        self._publish_cmd = "SPUBLISH" if sharded_pubsub else "PUBLISH"
        self._cluster: bool | None = None
        self._cluster_client: DataCluster | None = None
        self._detect_lock = asyncio.Lock()
        self._channels = channel_names(prefix, shards)
        self._origin = os.urandom(8).hex().encode()
        self._backoff = options.backoff()  # one, shared by both kinds of subscriber
        self._pool = options.data_pool()
        # Publishes use a plain client (their errors become FanoutUnavailable in
        # _send); the application's commands the one that says so itself (.data).
        self._client = aioredis.Redis(connection_pool=self._pool)
        self._data = DataClient(connection_pool=self._pool)
        self._data.fanout_name = name
        self._standalone = StandaloneSubscriber(
            options.subscriber_pool(),
            self._channels,
            sharded=bool(sharded_pubsub),
            connect_timeout=connect_timeout,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
        )
        # On a cluster: the node subscribers and the publishes' router, unused (no
        # connection) until _detect found a cluster node.
        node_options = options.node_options()
        kwargs = self._pool.connection_kwargs
        self._router = SlotRouter(
            self._channels,
            url_node=(str(kwargs.get("host", "localhost")), int(kwargs.get("port", 6379))),
            options=node_options,
            pool_size=pool_size,
            pool_timeout=pool_timeout,
            publish_retries=publish_retries,
            connect_timeout=connect_timeout,
        )
        self._subscribers = ClusterSubscribers(
            name,
            self._channels,
            self._router,
            options=node_options,
            connect_timeout=connect_timeout,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            backoff=self._backoff,
        )
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
        self._counts: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
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
        self._router.topology = asyncio.Event()
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
                log.debug("%s: %d task(s) survived a cancellation", self.name, len(tasks))
        subscribers = self._subscribers
        await subscribers.stop(list(subscribers.nodes))  # ended with the task, unless cancelled
        self._to_refresh.clear()
        self._set_connected(False)
        self._purgatories.clear()
        await self._standalone.aclose()
        await self._pool.disconnect()
        await self._router.aclose()
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

        At most ``pool_size`` commands in flight; one more waits up to
        ``pool_timeout``. Redis unavailable (refused, lost, timed out, no connection
        free in time) raises :class:`FanoutUnavailable` (a redis-py
        ``ConnectionError`` too), as :meth:`publish` does; other errors are redis-py's.

        Raises:
            FanoutError: the URL names a Redis Cluster node (use :attr:`cluster_client`).
        """
        if self._cluster:
            raise FanoutError(
                f"fanout {self.name!r} is on a Redis Cluster: use fanout.cluster_client"
                " (a redis-py RedisCluster) for the application's commands"
            )
        return self._data

    @property
    def cluster(self) -> bool | None:
        """True if the URL names a Redis Cluster node, False for a standalone Redis,
        None until the first connection told (see :meth:`detect`)."""
        return self._cluster

    @property
    def cluster_client(self) -> RedisCluster | None:
        """On a cluster, a redis-py ``RedisCluster`` client for the application's
        commands (built on first use; its own connections, apart from the fanout's);
        None on a standalone Redis or before :meth:`detect` (or the subscriber) found
        out. Closed by :meth:`aclose`.

        As :attr:`client` on one Redis: at most ``pool_size`` commands (or pipelines)
        in flight, one more waits up to ``pool_timeout`` (redis-py's own cluster
        client would raise ``MaxConnectionsError`` at once), so at most ``pool_size``
        connections per node; Redis unavailable (also CLUSTERDOWN, TRYAGAIN, READONLY
        during a failover) raises :class:`FanoutUnavailable`."""
        if not self._cluster or self._closed:
            return None
        if self._cluster_client is None:
            options = self._options
            cluster = DataCluster.from_url(self.url, **options.cluster_options())
            assert isinstance(cluster, DataCluster)  # from_url builds cls
            self._cluster_client = cluster.bound(options.pool_size, options.pool_timeout, self.name)
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
        return self._channels[shard_of(encode_key(key), self.shards)]

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
        tag = hash_tag(channel)
        if tag is None:
            raise ValueError(f"channel {channel!r} has no hash tag (prefix {self.prefix!r})")
        return tag

    def message_for(self, key: Hashable, *, from_here: bool = False) -> tuple[str, bytes]:
        """``(channel, payload)`` of a wake-up for ``key``, to send with
        :attr:`publish_command` from the application's own script or transaction (so
        the data write and its wake-up go together). With ``from_here`` the copy that
        comes back to this process is skipped: then call :meth:`notify_local` yourself.
        """
        encoded = encode_key(key)
        origin = self._origin if from_here else b""
        return self._channels[shard_of(encoded, self.shards)], origin + SEP + encoded

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
        local = self._options.local_wakeups
        channel, payload = self.message_for(key, from_here=local)
        if local:
            self._wake(key)
        return await self._send([(channel, payload)], f"a wake-up for {key!r} on {channel!r}")

    async def publish_many(self, keys: Iterable[Hashable]) -> None:
        """:meth:`publish` of several keys in one round trip (a pipeline)."""
        if self._closed:
            raise FanoutClosed(f"fanout {self.name!r} is closed")
        local = self._options.local_wakeups
        messages = [(key, *self.message_for(key, from_here=local)) for key in keys]
        if not messages:
            return
        if local:
            for key, _, _ in messages:
                self._wake(key)
        await self._send([(c, p) for _, c, p in messages], f"{len(messages)} wake-ups")

    async def _send(self, messages: list[tuple[str, bytes]], what: str) -> int:
        """PUBLISH (SPUBLISH on a cluster) each of ``messages`` in one round trip.

        Returns the receivers of a single message (0 for several). Raises
        :class:`FanoutUnavailable`, naming ``what``, if Redis did not take them.
        """
        receivers: Any = 0
        try:
            if self._cluster is None:
                await self._detect()
            if self._cluster:
                async with asyncio.timeout(self._options.publish_deadline):
                    if len(messages) == 1:
                        receivers = await self._router.publish(*messages[0])
                    else:
                        await self._router.publish_many(messages)
            elif len(messages) == 1:
                command = self._client.execute_command
                receivers = await command(self._publish_cmd, *messages[0])  # type: ignore[no-untyped-call]
            else:
                async with self._client.pipeline(transaction=False) as pipe:
                    for channel, payload in messages:
                        pipe.execute_command(self._publish_cmd, channel, payload)
                    await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            self._publish_failed(exc)
            raise FanoutUnavailable(
                f"fanout {self.name!r} could not publish {what} at {self._where()}: {exc}"
            ) from exc
        self._counts["published"] += len(messages)
        return int(receivers)

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
            subscribers=(self._subscribers.confirmed() if self._cluster else int(self._connected)),
            topology_refreshes=self._router.map_reads,
            slot_moves=self._subscribers.slot_moves,
            node_channels=self._subscribers.node_channels(),
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
                expected = isinstance(exc, RedisError | OSError | TimeoutError | Stale)
                if was_connected:
                    self._counts["disconnects"] += 1
                    failures = 0
                    down_since = now
                    last_warning = now
                    log.warning(
                        "%s: lost the subscription at %s (%s); reconnecting",
                        self.name,
                        self._where(),
                        self._last_error,
                        exc_info=not expected,
                    )
                elif now - last_warning >= WARN_EVERY or not expected:
                    last_warning = now
                    log.warning(
                        "%s: cannot subscribe at %s for %.1f s (%d attempts): %s",
                        self.name,
                        self._where(),
                        now - down_since,
                        failures + 1,
                        self._last_error,
                        exc_info=not expected,
                    )
                else:
                    log.debug("%s: attempt %d failed: %s", self.name, failures + 1, exc)
            if self._stopping():
                return
            delay = self._backoff.delay(failures)
            failures += 1
            await asyncio.sleep(delay)

    async def _detect(self) -> None:
        """Ask the URL's node once whether it is a cluster node (``INFO cluster``)."""
        async with self._detect_lock:
            if self._cluster is not None:
                return
            standalone = self._standalone
            enabled = await is_cluster_node(
                standalone.client, standalone.pool, self._options.connect_timeout
            )
            if not enabled:
                self._cluster = False
                return
            if self._options.sharded_pubsub is False:
                log.warning(
                    "%s: %s is a Redis Cluster node: sharded_pubsub=False is ignored"
                    " (a cluster is served with SSUBSCRIBE/SPUBLISH, one subscriber per"
                    " primary)",
                    self.name,
                    self._where(),
                )
            self._publish_cmd = "SPUBLISH"
            self._cluster = True
            log.debug("%s: %s is a Redis Cluster node", self.name, self._where())

    async def _session(self) -> None:
        """Subscribe, re-check everything, then deliver until the connection fails."""
        if self._cluster is None:
            await self._detect()
        if self._cluster:
            await self._subscribers.session(
                FanoutHooks(
                    stopping=self._stopping,
                    deliver=self._handle,
                    recheck=self._recheck_channels,
                    failed=self._failed,
                    coverage=self._covered,
                    connected=lambda: self._connected,
                    last_error=lambda: self._last_error,
                )
            )
            return
        await self._standalone.session(
            deliver=self._handle, subscribed=self._subscribed, stopping=self._stopping
        )

    # -- what the cluster's subscribers tell (FanoutHooks) ------------------------------

    def _recheck_channels(self, channels: frozenset[str]) -> None:
        for purgatory in self._live():
            self._recheck(purgatory, channels)

    def _failed(self, error: str) -> None:
        self._counts["errors"] += 1
        self._last_error = error

    def _covered(self, covered: bool, primaries: int) -> None:
        """Connected when every channel is confirmed somewhere; count the transitions."""
        if covered == self._connected:
            return
        if covered:
            self._counts["connects"] += 1
            if self._ever_connected:
                self._counts["reconnects"] += 1
                log.info(
                    "%s: subscribed again on %d primaries (%d channels)",
                    self.name,
                    primaries,
                    len(self._channels),
                )
            self._ever_connected = True
        else:
            self._counts["disconnects"] += 1
        self._set_connected(covered)

    # -- what the standalone subscriber tells, and messages from either ----------------

    def _subscribed(self) -> None:
        self._counts["connects"] += 1
        if self._ever_connected:
            self._counts["reconnects"] += 1
            log.info(
                "%s: subscribed again at %s (%d channels); re-checking every watched key",
                self.name,
                self._where(),
                len(self._channels),
            )
        else:
            log.debug("%s: subscribed at %s", self.name, self._where())
        self._ever_connected = True
        self._set_connected(True)
        # Confirmed: from here on every wake-up is delivered; whatever was published
        # before, this re-check sees in the shared state.
        for purgatory in self._live():
            self._recheck(purgatory)

    def _handle(self, message: Mapping[str, Any]) -> None:
        kind = message["type"]
        if kind not in ("message", "smessage"):
            return  # pong, (un)subscribe confirmations
        self._counts["messages"] += 1
        data = message["data"]
        if not isinstance(data, bytes):
            self._malformed(data)
            return
        origin, sep, encoded = data.partition(SEP)
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
        # Each failure raises to its caller; the log says it once per WARN_EVERY,
        # with the count, instead of once per request during an outage.
        self._counts["publish_errors"] += 1
        self._publish_failures += 1
        now = asyncio.get_running_loop().time()
        if now - self._publish_warned >= WARN_EVERY:
            log.warning(
                "%s: %d publish(es) failed at %s since the last warning, the latest: %r",
                self.name,
                self._publish_failures,
                self._where(),
                exc,
            )
            self._publish_warned = now
            self._publish_failures = 0
        else:
            log.debug("%s: publish failed: %r", self.name, exc)

    def _malformed(self, data: object) -> None:
        self._counts["malformed"] += 1
        # A warning (at most once per WARN_EVERY): messages that are not wake-ups on
        # our channels mean a misconfigured peer (another prefix scheme, another
        # encoding), whose wake-ups are all being lost; debug alone hid that.
        now = time.monotonic()
        if now - self._malformed_warned >= WARN_EVERY:
            self._malformed_warned = now
            log.warning(
                "%s: ignored a message that is not a wake-up (%d so far): %.80r",
                self.name,
                self._counts["malformed"],
                data,
            )
        else:
            log.debug("%s: ignored a message that is not a wake-up: %.80r", self.name, data)

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
        # Counted each time, logged with its traceback once per WARN_EVERY: a
        # purgatory that fails does so on every wake-up, and the log must not flood.
        self._counts["delivery_errors"] += 1
        self._last_error = f"delivery to {purgatory.name!r}: {type(exc).__name__}: {exc}"
        now = time.monotonic()  # attach may get here before the fanout has a loop
        if now - self._delivery_warned >= WARN_EVERY:
            self._delivery_warned = now
            log.warning(
                "%s: waking %r failed (%d failures so far; the other purgatories are"
                " woken all the same)",
                self.name,
                purgatory,
                self._counts["delivery_errors"],
                exc_info=exc,
            )
        else:
            log.debug("%s: waking %r failed: %r", self.name, purgatory, exc)

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
                log.warning(
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
