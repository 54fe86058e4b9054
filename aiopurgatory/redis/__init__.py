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
(``tests/redis/test_redis_fanout_cluster.py``): a primary killed with SIGKILL, its replica
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

from .._extra import raise_missing_extra

# isort: off
# In the order the API reference shows them (mkdocstrings follows these imports).
try:
    from .errors import FanoutError, FanoutUnavailable, FanoutClosed
    from .stats import FanoutStats
    from .fanout import RedisFanout
    from .keys import encode_key, decode_key
except ImportError as _exc:  # without the extra: say which to install, not just "no redis"
    raise_missing_extra(_exc, "redis", "aiopurgatory.redis")
# isort: on

__all__ = [
    "FanoutClosed",
    "FanoutError",
    "FanoutStats",
    "FanoutUnavailable",
    "RedisFanout",
    "decode_key",
    "encode_key",
]

# The public names were defined here when the package was one module: they still say so
# (in reprs, tracebacks and pickles), wherever in the package they are written now.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
