"""Redis Cluster: detection, the slot map, publishes routed to the owners, and one
subscriber per primary serving shard channels (see "Redis Cluster" in the package doc).

:class:`SlotRouter` reads the map (``CLUSTER SLOTS``) and sends each ``SPUBLISH`` to
its channel's owner through a bounded pool per node. :class:`ClusterSubscribers`
holds the per-primary subscribers and follows the map; what it needs of the fanout
that owns it (delivery, re-checks, the connected state) comes as :class:`FanoutHooks`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError, MovedError, RedisError, ResponseError

from .errors import WARN_EVERY, log
from .keys import text
from .subscriber import Backoff, Stale, confirmed, listen

__all__ = [
    "TOPOLOGY_RETRY_MAX",
    "ClusterSubscribers",
    "FanoutHooks",
    "NodeSubscriber",
    "SlotRouter",
    "is_cluster_node",
]

Address = tuple[str, int]

TOPOLOGY_RETRY_MAX: Final = 1.0
"""The longest wait between two reads of a cluster's slot map while some shard channel
is unsubscribed. Shorter than ``reconnect_max``: a failover ends when a replica is
promoted, and until this fanout reads the new map its processes miss the wake-ups of
the dead primary's shards (its re-check catches up, one wait later). A map read is
one ``CLUSTER SLOTS`` to any node, cheap enough once a second per process."""


async def is_cluster_node(
    client: aioredis.Redis, pool: aioredis.ConnectionPool, timeout: float
) -> bool:
    """Whether ``client``'s node is a Redis Cluster node (``INFO cluster``, within
    ``timeout``); ``pool`` is disconnected after. A node that refuses INFO (renamed
    by a managed service) is taken for a standalone Redis."""
    try:
        async with asyncio.timeout(timeout):
            info = await client.execute_command("INFO", "cluster")  # type: ignore[no-untyped-call]
    except ResponseError:
        info = None  # INFO refused (renamed by a managed service): standalone
    finally:
        await pool.disconnect()
    if isinstance(info, Mapping):
        return str(info.get("cluster_enabled", 0)) == "1"
    return b"cluster_enabled:1" in (info if isinstance(info, bytes) else str(info).encode())


class SlotRouter:
    """The slot map of the shard channels, and the publishes routed by it.

    Holds the hash slot of each shard channel, which node (``(host, port)``) serves
    it as the last map read said, and a bounded pool per node for the publishes
    (``SPUBLISH`` to the slot's owner, following ``MOVED``). :attr:`topology` (set by
    the owner once started) is set whenever the map may be stale.
    """

    __slots__ = (
        "_connect_timeout",
        "_lock",
        "_options",
        "_pool_size",
        "_pool_timeout",
        "_retries",
        "_url_node",
        "map_reads",
        "node_pools",
        "slot_owner",
        "slots",
        "topology",
        "version",
    )

    def __init__(
        self,
        channels: list[str],
        *,
        url_node: Address,
        options: Mapping[str, Any],
        pool_size: int,
        pool_timeout: float,
        publish_retries: int,
        connect_timeout: float,
    ) -> None:
        self.slots = {channel: key_slot(channel.encode()) for channel in channels}
        """The hash slot of each shard channel."""
        self.slot_owner: dict[int, Address] = {}
        """The node serving each of those slots, as the last map read said."""
        self.node_pools: dict[Address, aioredis.BlockingConnectionPool] = {}
        self.version = 0
        """Counts the maps read: a caller that found one stale names it."""
        self.map_reads = 0
        self.topology: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self._url_node = url_node
        self._options = {k: v for k, v in options.items() if k not in ("max_connections", "retry")}
        self._pool_size = pool_size
        self._pool_timeout = pool_timeout
        self._retries = publish_retries
        self._connect_timeout = connect_timeout

    def changed(self) -> None:
        """The map may be stale: wake whoever follows it."""
        if self.topology is not None:
            self.topology.set()

    def node_client(self, address: Address) -> aioredis.Redis:
        """A client over ``address``'s bounded pool (made on first use)."""
        pool = self.node_pools.get(address)
        if pool is None:
            host, port = address
            pool = aioredis.BlockingConnectionPool(
                host=host,
                port=port,
                max_connections=self._pool_size,
                timeout=self._pool_timeout,
                retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), self._retries),
                **self._options,
            )
            self.node_pools[address] = pool
        return aioredis.Redis(connection_pool=pool)

    async def refresh(self, seen: int | None = None) -> None:
        """Read the slot map (``CLUSTER SLOTS``) of the first node that answers.

        Concurrent callers share one read: ``seen``, the map version a caller found
        stale, skips the read if another caller replaced that version meanwhile.
        Only the owners of the shard channels' slots are kept (16 by default).
        """
        async with self._lock:
            if seen is not None and seen != self.version:
                return
            owners = set(self.slot_owner.values())
            candidates = list(owners)
            random.shuffle(candidates)  # spread the reads over the primaries
            known = [a for a in self.node_pools if a not in owners]
            random.shuffle(known)
            errors: list[str] = []
            tried: set[Address] = set()
            for address in (*candidates, self._url_node, *known):
                if address in tried:
                    continue
                tried.add(address)
                try:
                    async with asyncio.timeout(self._connect_timeout):
                        reply = await self.node_client(address).execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
                    ranges = _slot_ranges(reply, address[0])
                except (RedisError, OSError, TimeoutError, ValueError) as exc:
                    errors.append(f"{address[0]}:{address[1]}: {type(exc).__name__}: {exc}")
                    continue
                owner: dict[int, Address] = {}
                for slot in self.slots.values():
                    for start, end, primary, replicas in ranges:
                        if start <= slot <= end:
                            owner[slot] = primary
                            for replica in replicas:  # more places to ask next time
                                self.node_client(replica)
                            break
                if len(owner) < len(set(self.slots.values())):
                    errors.append(f"{address[0]}:{address[1]}: shard slots not covered")
                    continue
                self.slot_owner = owner
                self.version += 1
                self.map_reads += 1
                if address not in owner.values():
                    # A replica (the URL's, or asked because no owner answered): the
                    # publishes never go there, so hold no connection to it.
                    await self.node_pools[address].disconnect(inuse_connections=False)
                return
            raise ConnectionError("no cluster node gave the slot map: " + "; ".join(errors))

    async def publish(self, channel: str, payload: bytes) -> int:
        """SPUBLISH to the owner of the channel's slot, following MOVED and failures."""
        slot = self.slots[channel]
        last: Exception | None = None
        for _ in range(self._retries + 2):
            version = self.version
            address = self.slot_owner.get(slot)
            if address is None:
                await self.refresh(version)
                address = self.slot_owner[slot]
            try:
                receivers = await self.node_client(address).execute_command(  # type: ignore[no-untyped-call]
                    "SPUBLISH", channel, payload
                )
                return int(receivers)
            except MovedError as exc:
                # The slot has a new owner (a migration, a failover seen by the node):
                # go there now, and let the subscriber follow too.
                last = exc
                self.slot_owner[slot] = (exc.host, int(exc.port))
                self.changed()
            except (ConnectionError, TimeoutError, OSError) as exc:
                last = exc
                self.changed()
                try:
                    await self.refresh(version)
                except (RedisError, OSError, TimeoutError):
                    break  # no node answers: give up now
        assert last is not None
        raise last

    async def publish_many(self, messages: list[tuple[str, bytes]]) -> None:
        """One pipeline per owner, all at once; any failure: one by one, routed."""
        if not self.slot_owner:
            await self.refresh(self.version)
        groups: dict[Address, list[tuple[str, bytes]]] = {}
        for channel, payload in messages:
            address = self.slot_owner[self.slots[channel]]
            groups.setdefault(address, []).append((channel, payload))

        async def send(address: Address, group: list[tuple[str, bytes]]) -> None:
            try:
                async with self.node_client(address).pipeline(transaction=False) as pipe:
                    for channel, payload in group:
                        pipe.execute_command("SPUBLISH", channel, payload)
                    await pipe.execute()
            except (RedisError, OSError, TimeoutError):
                for channel, payload in group:
                    await self.publish(channel, payload)

        await asyncio.gather(*(send(a, g) for a, g in groups.items()))

    async def aclose(self) -> None:
        """Close every node's pool."""
        for pool in list(self.node_pools.values()):
            await pool.disconnect()
        self.node_pools.clear()


@dataclass(frozen=True, slots=True)
class FanoutHooks:
    """What the cluster subscribers need of the fanout that owns them."""

    stopping: Callable[[], bool]
    """The fanout is closing: end quietly."""
    deliver: Callable[[Mapping[str, Any]], None]
    """A message read on a shard channel (a wake-up, or a reply to ignore)."""
    recheck: Callable[[frozenset[str]], None]
    """Re-check the keys these channels carry (their subscription was confirmed)."""
    failed: Callable[[str], None]
    """Count an error, and remember it as the last one."""
    coverage: Callable[[bool, int], None]
    """Whether every channel is confirmed somewhere now, and on how many primaries."""
    connected: Callable[[], bool]
    """The fanout counts itself connected."""
    last_error: Callable[[], str | None]
    """The last error the fanout met."""


class NodeSubscriber:
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


class ClusterSubscribers:
    """One subscriber per primary serving shard channels, following the slot map.

    What it needs of the fanout that owns it comes with each :meth:`session`, as
    :class:`FanoutHooks` (so that nothing ties the two while no session runs).
    """

    __slots__ = (
        "_backoff",
        "_channels",
        "_connect_timeout",
        "_name",
        "_options",
        "_ping_interval",
        "_ping_timeout",
        "_router",
        "nodes",
        "slot_moves",
    )

    def __init__(
        self,
        name: str,
        channels: list[str],
        router: SlotRouter,
        *,
        options: Mapping[str, Any],
        connect_timeout: float,
        ping_interval: float,
        ping_timeout: float,
        backoff: Backoff,
    ) -> None:
        self.nodes: dict[str, NodeSubscriber] = {}
        """The subscribers by ``"host:port"``."""
        self.slot_moves = 0
        """Shard channels a node dropped (``sunsubscribe`` pushes)."""
        self._name = name
        self._channels = channels
        self._router = router
        self._options = options
        self._connect_timeout = connect_timeout
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._backoff = backoff

    def confirmed(self) -> int:
        """Subscribers holding confirmed subscriptions now."""
        return sum(1 for n in self.nodes.values() if n.confirmed)

    def node_channels(self) -> dict[str, int]:
        """``"host:port"`` of each confirmed subscriber, and its channels now."""
        return {a: len(n.live) for a, n in self.nodes.items() if n.confirmed}

    async def session(self, hooks: FanoutHooks) -> None:
        """One subscriber per primary serving shard channels; follow the slot map.

        Reads the slot map, starts a subscriber on each primary that owns shard
        channels (SSUBSCRIBE, one command per channel), and waits: a subscriber that
        ends (its node died, refused with MOVED) or loses a channel (an
        ``sunsubscribe`` push: the slot moved) wakes this loop, which waits a backoff
        delay, reads the map again, and replaces the subscribers whose channels
        changed. Each new subscriber re-checks the keys of its channels once Redis
        confirmed all of them. Raises (to the fanout's backoff) only if no node answers.
        """
        router = self._router
        topology = router.topology
        assert topology is not None
        loop = asyncio.get_running_loop()
        failures = 0
        down_since = loop.time()
        last_warning = loop.time()
        try:
            while not hooks.stopping():
                topology.clear()
                await router.refresh()
                wanted: dict[str, tuple[str, int, list[str]]] = {}
                for channel in self._channels:
                    host, port = router.slot_owner[router.slots[channel]]
                    entry = (host, port, list[str]())
                    wanted.setdefault(f"{host}:{port}", entry)[2].append(channel)
                stale = [
                    address
                    for address, sub in self.nodes.items()
                    if sub.ended
                    or sub.lost
                    or address not in wanted
                    or sub.channels != frozenset(wanted[address][2])
                ]
                await self.stop(stale)
                for address, (host, port, channels) in wanted.items():
                    if address not in self.nodes:
                        sub = NodeSubscriber(address, host, port, frozenset(channels))
                        self.nodes[address] = sub
                        sub.task = asyncio.get_running_loop().create_task(
                            self._run(sub, hooks), name=f"aiopurgatory-{self._name}-{address}"
                        )
                self._changed(hooks)
                await topology.wait()
                now = loop.time()
                if hooks.connected():
                    failures = 0
                    down_since = now
                else:
                    failures += 1
                    if now - max(down_since, last_warning) >= WARN_EVERY:
                        last_warning = now
                        live = sum(len(sub.live) for sub in self.nodes.values())
                        log.warning(
                            "%s: %d of %d shard channels subscribed for %.1f s (%d attempts;"
                            " the latest error: %s)",
                            self._name,
                            live,
                            len(self._channels),
                            now - down_since,
                            failures,
                            hooks.last_error(),
                        )
                await asyncio.sleep(min(self._backoff.delay(failures), TOPOLOGY_RETRY_MAX))
        finally:
            await self.stop(list(self.nodes))

    async def stop(self, addresses: list[str]) -> None:
        """Stop the subscribers of these nodes (and wait for them)."""
        tasks = []
        for address in addresses:
            sub = self.nodes.pop(address, None)
            if sub is not None and sub.task is not None:
                sub.stopping = True
                tasks.append(sub.task)
        while tasks:  # as the fanout's aclose(): a cancellation can be lost inside redis-py
            for task in tasks:
                task.cancel()
            _, pending = await asyncio.wait(tasks, timeout=0.1)
            tasks = list(pending)

    async def _run(self, sub: NodeSubscriber, hooks: FanoutHooks) -> None:
        """One primary's subscriber: SSUBSCRIBE its channels, re-check, deliver."""
        pool = aioredis.ConnectionPool(host=sub.host, port=sub.port, **self._options)
        pubsub = aioredis.Redis(connection_pool=pool).pubsub()

        def handle(message: Mapping[str, Any]) -> None:
            self._message(sub, message, hooks)

        try:
            async with asyncio.timeout(self._connect_timeout):
                for channel in sorted(sub.channels):
                    await pubsub.ssubscribe(channel)
                await confirmed(pubsub, sub.channels, "ssubscribe", handle)
            sub.live = set(sub.channels)
            sub.confirmed = True
            # Confirmed: whatever was published to these channels before, this
            # re-check sees in the shared state; after it, every wake-up is delivered.
            hooks.recheck(sub.channels)
            self._changed(hooks)
            await listen(
                pubsub,
                handle,
                ping_interval=self._ping_interval,
                ping_timeout=self._ping_timeout,
                stopping=hooks.stopping,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not sub.stopping:
                error = f"{sub.address}: {type(exc).__name__}: {exc}"
                hooks.failed(error)
                expected = isinstance(exc, RedisError | OSError | TimeoutError | Stale)
                say = log.warning if sub.confirmed or not expected else log.debug
                say(
                    "%s: the subscriber at %s ended (%s); following the slot map",
                    self._name,
                    sub.address,
                    error,
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
                if not sub.stopping and not hooks.stopping():
                    self._changed(hooks)
                    self._router.changed()

    def _message(self, sub: NodeSubscriber, message: Mapping[str, Any], hooks: FanoutHooks) -> None:
        if message["type"] == "sunsubscribe":
            # Not asked for: the node no longer serves this channel's slot (failover,
            # migration). Follow the map; the new owner's subscriber re-checks.
            channel = text(message["channel"])
            if channel in sub.live:
                sub.live.discard(channel)
                sub.lost = True
                self.slot_moves += 1
                log.info(
                    "%s: %s dropped %s (its slot moved); following the slot map",
                    self._name,
                    sub.address,
                    channel,
                )
                self._changed(hooks)
                self._router.changed()
            return
        hooks.deliver(message)

    def _changed(self, hooks: FanoutHooks) -> None:
        """Tell the fanout whether every channel is confirmed somewhere now."""
        if hooks.stopping():
            return
        live = sum(len(sub.live) for sub in self.nodes.values())
        hooks.coverage(live == len(self._channels), len(self.nodes))


def _slot_ranges(reply: object, default_host: str) -> list[tuple[int, int, Address, list[Address]]]:
    """``CLUSTER SLOTS`` (RESP2/RESP3, raw or as redis-py parses it) as
    ``(start, end, primary, replicas)``, each node ``(host, port)``."""

    def node(entry: Any) -> Address:
        host = text(entry[0]) or default_host  # "" means the node asked
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
