"""The counters of a fanout, as a snapshot (:class:`FanoutStats`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["FanoutStats"]


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
