"""Topics kept in Redis, for long-poll servers running as many workers (``--redis``).

Shared by the aiohttp and the ASGI servers. Every worker, on any machine, reads and
writes the same Redis, and one :class:`aiopurgatory.redis.RedisFanout` per process
wakes the polls parked there when any worker publishes.

Layout (``P`` is the prefix, ``aiopurgatory-long-poll`` by default):

- ``P:s:<topic>``: a Stream of the topic's messages; the entry of offset ``n`` has the
  explicit ID ``n-1`` (``0-0`` is not a valid ID), field ``v`` the text.
- ``P:h:<topic>``: a hash: ``next`` (the offset the next message gets), ``gen`` (which
  incarnation of the topic this is: offsets start again after it expires; unique
  across topics) and ``charged`` (the bytes it holds, as the in-memory topics charge
  them).
- ``P:names``: a hash from each live topic's ``gen`` to its name.
- ``P:topics``: a sorted set of topic names scored by their last use (ms, Redis time),
  bounded by ``max_topics``; idle ones expire after ``topic_ttl``.
- ``P:order``: every retained message in publish order (``gen offset charge``: a few
  digits, whatever the topic's name, which is stored once per topic, not once per
  message, where the byte limit would not see it), ``P:retained`` their bytes, bounded
  by ``max_retained_bytes``: the oldest message across all topics is dropped first,
  exactly as in memory. ``P:forgotten`` counts entries of expired topics still in
  ``P:order`` (compacted past half).

A POST is one Lua script: expire idle topics, append (HINCRBY ``next``, XADD), drop
the oldest beyond the byte limit, and PUBLISH the wake-up: atomic, so no worker sees
a wake-up before the data, and the offset a POST answers is readable by every worker's
GET at once. A GET reads its topic's ``next`` and the messages after its offset in one
script. A poll that must wait is watched in this process's purgatory under the topic's
name; its condition reads a local copy of ``next`` (``try_complete`` is synchronous),
which the fanout's ``refresh`` hook updates (one pipeline per batch of woken topics)
before the polls are re-checked. A GET counts itself among its topic's polls before
its read, and the fanout hands ``refresh`` every topic woken, polled or not: so the
wake-up of a POST that lands between a GET's read and its watch still updates the copy
the GET then checks (no second read per parked poll).

On a Redis Cluster (the URL names any of its nodes: the fanout finds out) the same
layout is kept once per *slot group*: a topic's keys are named ``P:{n}:s:<topic>``,
``P:{n}:h:<topic>``, and its group's ``P:{n}:names``, ``P:{n}:topics``,
``P:{n}:order``, ``P:{n}:retained``, ... where ``{n}`` is the hash tag of the topic's
wake-up channel (``RedisFanout.hash_tag``, one of the fanout's 16 shards). So every
key a POST's script touches, and the channel it SPUBLISHes the wake-up on, hash to one
slot: the script stays atomic on one node, and a failover or a slot migration moves a
topic, its group and its channel together. The limits across topics are kept per
group: each of the ``shards`` groups holds at most ``ceil(max_retained_bytes /
shards)`` bytes (but at least one largest message) and ``ceil(max_topics / shards)``
topics, its oldest message dropped first; so the totals stay within the limits (but
for the rounding up), but a group fills before the others when the topics hash
unevenly. Data commands go through
the fanout's ``cluster_client`` (redis-py's RedisCluster), at most ``pool_size`` of
them in flight per process (hence at most ``pool_size`` connections per primary).
On a standalone Redis nothing changes: one group, the keys above, the limits exact.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import urllib.parse
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import NoScriptError, RedisError

import aiopurgatory as ap
from aiopurgatory.redis import RedisFanout

if TYPE_CHECKING or __package__:
    from .topics import MESSAGE_OVERHEAD, Limits, StoreUnavailable, TooManyTopics
else:  # imported by server.py run as a script: the topics module beside it
    from topics import MESSAGE_OVERHEAD, Limits, StoreUnavailable, TooManyTopics

_log = logging.getLogger("long-poll.redis")

PREFIX: Final = "aiopurgatory-long-poll"
READ_COUNT: Final = 1000
"""Messages one GET fetches at most (then cut to ``max_response_bytes``)."""
LAST_ID: Final = 2**64 - 1
"""The largest first part of a Stream entry ID: no offset reaches it."""

PUBLISH_LUA: Final = """
local p, name, msg = ARGV[1], ARGV[2], ARGV[3]
local charge = tonumber(ARGV[4])
local max_bytes, max_topics, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local topics = p .. ':topics'
-- Forget idle topics (64 at most per publish, as in memory).
local idle = redis.call('ZRANGE', topics, '-inf', now - ttl, 'BYSCORE', 'LIMIT', 0, 64)
local names = p .. ':names'
for _, old in ipairs(idle) do
  local oh = p .. ':h:' .. old
  local ostream = p .. ':s:' .. old
  redis.call('DECRBY', p .. ':retained', tonumber(redis.call('HGET', oh, 'charged') or '0'))
  redis.call('INCRBY', p .. ':forgotten', redis.call('XLEN', ostream))
  local ogen = redis.call('HGET', oh, 'gen')
  if ogen then redis.call('HDEL', names, ogen) end
  redis.call('DEL', oh, ostream)
  redis.call('ZREM', topics, old)
end
local h = p .. ':h:' .. name
if not redis.call('ZSCORE', topics, name) then
  if redis.call('ZCARD', topics) >= max_topics then return -1 end
  local stale = redis.call('HGET', h, 'gen')
  if stale then redis.call('HDEL', names, stale) end
  redis.call('DEL', h, p .. ':s:' .. name)
  local new_gen = redis.call('INCR', p .. ':gens')
  redis.call('HSET', h, 'gen', new_gen, 'next', 0, 'charged', 0)
  redis.call('HSET', names, new_gen, name)
end
redis.call('ZADD', topics, now, name)
local offset = redis.call('HINCRBY', h, 'next', 1) - 1
local gen = redis.call('HGET', h, 'gen')
redis.call('XADD', p .. ':s:' .. name, offset .. '-1', 'v', msg)
redis.call('HINCRBY', h, 'charged', charge)
-- The topic by its gen, not its name: a long name would be stored once per message
-- and escape the byte limit (7,000-character names held 56 times the limit).
redis.call('RPUSH', p .. ':order', gen .. ' ' .. offset .. ' ' .. charge)
local retained = redis.call('INCRBY', p .. ':retained', charge)
-- The oldest message across all topics goes first.
while retained > max_bytes do
  local e = redis.call('LPOP', p .. ':order')
  if not e then break end
  local g, o, c = string.match(e, '^(%d+) (%d+) (%d+)')
  local n = redis.call('HGET', names, g)
  if n then
    redis.call('XDEL', p .. ':s:' .. n, o .. '-1')
    -- (On a cluster, while the group's slot migrates, that topic's keys may be on the
    -- other side already: never create its hash here.)
    if redis.call('EXISTS', p .. ':h:' .. n) == 1 then
      redis.call('HINCRBY', p .. ':h:' .. n, 'charged', -tonumber(c))
    end
    retained = redis.call('DECRBY', p .. ':retained', c)
  else
    redis.call('DECRBY', p .. ':forgotten', 1)  -- its topic expired: freed already
  end
end
-- Entries of expired topics: compact once they are half of the list (O(1) amortised).
local forgotten = tonumber(redis.call('GET', p .. ':forgotten') or '0')
local order_len = redis.call('LLEN', p .. ':order')
if forgotten > 0 and forgotten * 2 > order_len then
  local kept = {}
  for _, e in ipairs(redis.call('LRANGE', p .. ':order', 0, -1)) do
    local g = string.match(e, '^(%d+) ')
    if redis.call('HEXISTS', names, g) == 1 then kept[#kept + 1] = e end
  end
  redis.call('DEL', p .. ':order')
  for i = 1, #kept, 1000 do
    redis.call('RPUSH', p .. ':order', unpack(kept, i, math.min(i + 999, #kept)))
  end
  redis.call('SET', p .. ':forgotten', 0)
end
redis.call(ARGV[8], ARGV[9], ARGV[10])
return offset
"""
"""ARGV: prefix, topic, message, charge, max_retained_bytes, max_topics, topic_ttl (ms),
publish command, wake-up channel, wake-up payload. Returns the offset, -1 when the
topic would be one too many."""

READ_LUA: Final = """
local p, name = ARGV[1], ARGV[2]
local h = p .. ':h:' .. name
local nxt = redis.call('HGET', h, 'next')
if not nxt then return {0, {}} end
if ARGV[4] == '1' then
  local t = redis.call('TIME')
  redis.call('ZADD', p .. ':topics', 'XX', tonumber(t[1]) * 1000, name)
end
local entries = redis.call('XRANGE', p .. ':s:' .. name, ARGV[3] .. '-0', '+', 'COUNT', ARGV[5])
return {tonumber(nxt), entries}
"""
"""ARGV: prefix, topic, first offset wanted, touch (1: the topic counts as used), count.
Returns ``[next offset, entries]``."""

TOUCH_LUA: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000
for i = 2, #ARGV do redis.call('ZADD', ARGV[1] .. ':topics', 'XX', now, ARGV[i]) end
return 0
"""


class BadOffset(Exception):
    """A GET's ``after`` is not between -1 and the topic's last offset."""

    def __init__(self, after: int, end: int) -> None:
        super().__init__(f"after must be between -1 and {end - 1} (the last offset), got {after}")


def _asks_to_decode(url: str) -> bool:
    """Whether a redis-py URL's query string turns decode_responses on."""
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("decode_responses", [])
    return any(v.lower() not in ("", "0", "false", "f", "n", "no") for v in values)


class RedisTopics:
    """The topics in Redis and this process's side of them: the fanout, the copy of
    the watched topics' next offsets, and the polls' waits."""

    def __init__(
        self,
        url: str,
        limits: Limits,
        *,
        prefix: str = PREFIX,
        pool_size: int = 4,
        timeout: float = 2.0,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if "{" in prefix or "}" in prefix:
            # On a cluster the keys' hash tag must be the first {...} of their names.
            raise ValueError(f"prefix must not contain braces, got {prefix!r}")
        if _asks_to_decode(url):
            # The fanout's subscriber ignores it, but the store's reads and scripts
            # compare Redis's replies as bytes: refused here rather than misread later.
            raise ValueError(
                "the long-poll store reads Redis's replies as bytes: remove"
                f" decode_responses from the Redis URL ({url!r})"
            )
        self.limits = limits
        self.prefix = prefix
        self.timeout = timeout
        # Every command is bounded: socket_timeout per try (2 tries), pool_timeout to
        # get a connection; the backstop below covers the rest (a POST never hangs).
        # The wait for a connection is at least 2 s whatever `timeout`: a burst of
        # polls queues for the pool while the loop is busy accepting them, and should
        # not get 503 for that.
        pool_timeout = max(2.0, timeout)
        self._fanout_options: dict[str, Any] = {
            "prefix": f"{prefix}:wake",
            "pool_size": pool_size,
            "pool_timeout": pool_timeout,
            "socket_timeout": timeout,
            "connect_timeout": timeout,
            "ping_interval": min(1.0, timeout),
            "ping_timeout": timeout,
            "refresh": self._refresh,
            "name": f"long-poll-{os.getpid()}",
        }
        self.url = url
        self._deadline = pool_timeout + 2 * timeout + 0.5
        # The fanout, its pools and what lives on the loop are made by each start and
        # closed by the aclose after it: an ASGI app runs one lifespan after another
        # (a second TestClient(app)), and a closed fanout cannot start again. The first
        # one is made here, unstarted, so that bad options fail at construction.
        self._fanout: RedisFanout | None = None
        self._unstarted: RedisFanout | None = RedisFanout(url, **self._fanout_options)
        self._client: Any = None
        """The data client: the fanout's ``client`` (standalone), replaced by its
        ``cluster_client`` once the fanout found a cluster (:meth:`_connect`)."""
        self._cluster = False
        self._resolved = False
        """Whether the fanout told what the URL names (then ``_client`` is final)."""
        self._publish: Any
        self._read: Any
        self._touch: Any
        self.ends: dict[str, int] = {}
        """The next offset of each topic polled here, as last seen."""
        self._polls: dict[str, int] = {}
        """Polls here per topic, reading or waiting (``ends`` holds these topics only)."""
        self._to_check: set[str] = set()
        self._to_touch: set[str] = set()
        self._work = asyncio.Event()
        self._woken_reads: dict[tuple[str, int], asyncio.Future[Any]] = {}
        self._worker: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def fanout(self) -> RedisFanout:
        """The fanout of the running start (:class:`StoreUnavailable` outside one)."""
        fanout = self._fanout
        if fanout is None:
            raise StoreUnavailable("the Redis store is not started")
        return fanout

    def start(self, purgatory: ap.Purgatory) -> None:
        """Make and start a fanout on the running loop and attach ``purgatory`` to it;
        :meth:`aclose` closes it, and a later start makes another."""
        if self._fanout is not None:
            raise RuntimeError("the Redis store is started already (aclose it first)")
        fanout, self._unstarted = self._unstarted, None
        if fanout is None:
            fanout = RedisFanout(self.url, **self._fanout_options)
        self._cluster = False
        self._resolved = False
        self._use(fanout)  # the standalone client; _connect replaces it on a cluster
        # Nothing of a previous run (maybe on a loop since closed) is carried over.
        self.ends.clear()
        self._polls.clear()
        self._to_check.clear()
        self._to_touch.clear()
        self._work = asyncio.Event()
        self._woken_reads.clear()
        fanout.attach(purgatory)
        fanout.start()
        self._fanout = fanout
        self._worker = asyncio.get_running_loop().create_task(self._housekeeping())

    def _use(self, fanout: RedisFanout) -> None:
        """The data client and scripts for what the fanout knows the URL names."""
        self._cluster = bool(fanout.cluster)
        client: Any = fanout.cluster_client if self._cluster else fanout.client
        self._publish = client.register_script(PUBLISH_LUA)
        self._read = client.register_script(READ_LUA)
        self._touch = client.register_script(TOUCH_LUA)
        self._client = client

    async def _connect(self) -> None:
        """Asks the URL's node whether it is a cluster node, once (the fanout's
        subscriber usually found out before the first request)."""
        if self._resolved:
            return
        fanout = self.fanout
        if fanout.cluster is None:
            try:
                await fanout.detect()
            except ap.PurgatoryError as exc:
                raise StoreUnavailable(f"Redis did not answer: {exc}") from exc
        if not self._resolved:
            self._resolved = True
            if fanout.cluster:
                self._use(fanout)

    def _group(self, name: str) -> str:
        """The prefix of topic ``name``'s keys and of its group's (see the module doc)."""
        if self._cluster:
            return f"{self.prefix}:{self.fanout.hash_tag(name)}"
        return self.prefix

    async def aclose(self) -> None:
        """Stop the housekeeping and close the fanout (idempotent)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            # Cancelled until it ends: redis-py can turn a cancellation into a
            # ConnectionError, which the housekeeping survives (as Redis failing) to
            # wait for work again, for ever. asyncio.wait, not `await worker` under
            # suppress(CancelledError): that would swallow our caller's cancellation.
            while not worker.done():
                worker.cancel()
                await asyncio.wait({worker}, timeout=0.1)
            if not worker.cancelled() and worker.exception() is not None:
                _log.error("housekeeping failed", exc_info=worker.exception())
        fanout, self._fanout = self._fanout, None
        if fanout is not None:
            await fanout.aclose()

    def stats(self) -> dict[str, Any]:
        """What this process knows without asking Redis (``/stats`` never waits on it)."""
        if self._fanout is None:
            return {"redis": False, "fanout": None}
        stats = self._fanout.stats
        return {"redis": stats.connected, "fanout": dataclasses.asdict(stats)}

    # -- the API the servers use ----------------------------------------------------------

    async def publish(self, name: str, message: str, size: int) -> int:
        """Append ``message`` to topic ``name``; returns its offset. Raises
        :class:`TooManyTopics`, or :class:`StoreUnavailable` when Redis did not answer."""
        limits = self.limits
        await self._connect()
        # No origin: the copy that comes back wakes this process too. Its polls are
        # woken below already, with the offset returned; but when the script ran after
        # we gave up on it (Redis frozen, then back), only that copy wakes them.
        channel, payload = self.fanout.message_for(name)
        max_bytes, max_topics = limits.max_retained_bytes, limits.max_topics
        if self._cluster:
            # Per slot group (module doc): the totals stay within the limits.
            shards = self.fanout.shards
            max_bytes = max(
                math.ceil(max_bytes / shards), limits.max_message_bytes + MESSAGE_OVERHEAD
            )
            max_topics = math.ceil(max_topics / shards)
        group = self._group(name)
        args = [
            group,
            name,
            message,
            size + MESSAGE_OVERHEAD,
            max_bytes,
            max_topics,
            int(limits.topic_ttl * 1000),
            self.fanout.publish_command,
            channel,
            payload,
        ]
        keys = [f"{group}:{k}" for k in ("topics", "names", "order", "retained", "forgotten")]
        keys += [f"{group}:gens", f"{group}:h:{name}", f"{group}:s:{name}"]
        offset = int(await self._call(self._publish, args, keys))
        if offset < 0:
            if self._cluster:
                raise TooManyTopics(
                    f"too many topics (at most {max_topics} in this topic's group of"
                    f" {limits.max_topics} across {self.fanout.shards} groups)"
                )
            raise TooManyTopics(f"too many topics (at most {limits.max_topics})")
        if name in self._polls:
            self.ends[name] = max(self.ends.get(name, 0), offset + 1)
            self.fanout.notify_local(name)
        return offset

    async def poll(
        self, purgatory: ap.Purgatory, name: str, after: int, timeout: float
    ) -> list[dict[str, object]] | None:
        """The messages after ``after``, waiting up to ``timeout`` for one; None if none
        came. Raises :class:`BadOffset`, :class:`StoreUnavailable`, or
        :class:`aiopurgatory.PurgatoryClosed` when the server shuts down."""
        if after < -1:
            raise BadOffset(after, 0)

        def has_news() -> bool:
            return self.ends.get(name, 0) > after + 1

        fanout = self.fanout
        # The subscription this read and the watch below fall within, if one is up.
        epoch = fanout.stats.connects if fanout.connected else -1
        # Counted before the read: a POST's wake-up that arrives after the read and
        # before the watch goes through the fanout's refresh all the same (it refreshes
        # every key woken, watched or not), which updates `ends` for the topics polled.
        self._polls[name] = self._polls.get(name, 0) + 1
        waited = False
        try:
            end, batch = await self._read_after(name, after, touch=True)
            if not after < end:
                raise BadOffset(after, end)
            if batch:
                return batch
            self.ends[name] = max(self.ends.get(name, 0), end)
            op = purgatory.try_complete_else_watch(ap.PredicateOperation(has_news, timeout), [name])
            waited = True
            if not op.done() and fanout.connected and fanout.stats.connects != epoch:
                # The subscription came back during the read: its re-check may have run
                # before this poll watched, and a wake-up lost while it was down went
                # nowhere; read `next` once more. (Down now: the next re-check sees it.)
                self._to_check.add(name)
                self._work.set()
            arrived = await op
        finally:
            left = self._polls[name] - 1
            if left:
                self._polls[name] = left
            else:
                del self._polls[name]
                self.ends.pop(name, None)
            if waited:
                # The topic counts as used at the end of a wait too; not awaited, so
                # that a poll's timeout never waits on Redis.
                self._to_touch.add(name)
                self._work.set()
        if not arrived:
            return None
        _, batch = await self._read_woken(name, after)
        return batch or None

    # -- helpers --------------------------------------------------------------------------

    async def _read_woken(self, name: str, after: int) -> tuple[int, list[dict[str, object]]]:
        """:meth:`_read_after` shared by the polls woken together with the same offset:
        one read per worker for a message a thousand polls wait for, not a thousand.

        Only after a wake-up: a read already in flight may predate the newest message,
        but it sees the one that woke its first poll, so its answer is never empty for
        a reason other than retention. A fresh GET never joins one (it must see every
        POST answered before it was sent).
        """
        key = (name, after)
        shared = self._woken_reads.get(key)
        if shared is None:
            shared = asyncio.ensure_future(self._read_after(name, after, touch=False))
            self._woken_reads[key] = shared

            def forget(future: asyncio.Future[Any]) -> None:
                if self._woken_reads.get(key) is future:
                    del self._woken_reads[key]
                if not future.cancelled():
                    future.exception()  # retrieved: each poll re-raises it on its own

            shared.add_done_callback(forget)
        # Shielded: a poll whose client hangs up must not cancel the others' read.
        return await asyncio.shield(shared)

    async def _read_after(
        self, name: str, after: int, *, touch: bool
    ) -> tuple[int, list[dict[str, object]]]:
        # An ``after`` beyond any offset (a client's error, answered 400 once the read
        # tells the topic's end) must not reach XRANGE as an ID it refuses: that error
        # would read as Redis failing (503).
        first = min(after + 1, LAST_ID)
        await self._connect()
        group = self._group(name)
        args = [group, name, first, int(touch), READ_COUNT]
        keys = [f"{group}:h:{name}", f"{group}:s:{name}", f"{group}:topics"]
        reply = await self._call(self._read, args, keys)
        end, entries = int(reply[0]), reply[1]
        batch: list[dict[str, object]] = []
        size = 0
        for entry_id, fields in entries:
            value = _field(fields, b"v").decode("utf-8")
            size += len(json.dumps(value)) + 32  # as the in-memory topics count it
            if batch and size > self.limits.max_response_bytes:
                break
            batch.append({"offset": int(entry_id.split(b"-", 1)[0]), "value": value})
        return end, batch

    async def _call(self, script: Any, args: list[Any], keys: list[str]) -> Any:
        """``script`` with ARGV ``args``; on a cluster, with ``keys`` as KEYS too: the
        keys it names itself (one slot), which route it to their node, and which Redis
        checks are all on one side of a slot being migrated (TRYAGAIN otherwise, which
        redis-py retries)."""
        try:
            # Backstop: redis-py bounds each try and the wait for a connection; this
            # bounds the sum whatever happens inside it.
            async with asyncio.timeout(self._deadline):
                if not self._cluster:  # a standalone Redis: the script finds its keys
                    return await script(args=args)
                # At most pool_size in flight, the others waiting: the fanout's
                # cluster_client waits for a connection as the standalone pool does.
                return await self._on_cluster(script, keys, args)
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"Redis did not answer: {type(exc).__name__}: {exc}") from exc

    async def _on_cluster(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA on the keys' node; a node that lacks the script (never sent there,
        or a replica just promoted: the script cache is not replicated) gets EVAL,
        which caches it there. Not redis-py's way (SCRIPT LOAD to every primary):
        while one primary is down, that would fail the POSTs to all the others."""
        try:
            return await self._client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self._client.eval(script.script, len(keys), *keys, *args)

    async def _refresh(self, keys: list[Hashable]) -> None:
        """The fanout's refresh hook: the next offsets of the woken topics watched here."""
        names = [k for k in keys if isinstance(k, str) and k in self._polls]
        if not names:
            return
        async with asyncio.timeout(self._deadline):
            await self._connect()
            async with self._client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hget(f"{self._group(name)}:h:{name}", "next")
                values = await pipe.execute()
        for name, value in zip(names, values, strict=True):
            if name in self._polls and value is not None:
                self.ends[name] = max(self.ends.get(name, 0), int(value))

    async def _housekeeping(self) -> None:
        """Re-reads for polls parked across a resubscription, and the touches of topics
        polls left."""
        while True:
            await self._work.wait()
            self._work.clear()
            check, self._to_check = self._to_check, set()
            touch, self._to_touch = self._to_touch, set()
            try:
                if check:
                    await self._refresh(list(check))
                    for name in check:
                        self.fanout.notify_local(name)
                if touch:
                    groups: dict[str, list[str]] = {}
                    for name in touch:
                        groups.setdefault(self._group(name), []).append(name)
                    for group, names in groups.items():
                        # One script per slot group (one on a standalone Redis).
                        await self._call(self._touch, [group, *names], [f"{group}:topics"])
            except (RedisError, OSError, TimeoutError, StoreUnavailable) as exc:
                # The polls end by their timeouts at worst; the fanout re-checks them
                # all when its subscription comes back.
                _log.warning("housekeeping failed: %r", exc)


def _field(fields: Any, name: bytes) -> bytes:
    if isinstance(fields, dict):
        value: bytes = fields[name]
        return value
    pairs = list(fields)
    return bytes(pairs[pairs.index(name) + 1])
