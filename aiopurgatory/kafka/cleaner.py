"""The log cleaner: compaction of the topics whose ``cleanup.policy`` has ``compact``.

Ground rules, Kafka's (its ``LogCleaner``):

- Only closed segments are cleaned, below the high watermark; the active segment never.
  A segment whose records are younger than ``min.compaction.lag.ms`` (by the broker's
  clock, which a test moves) is not cleaned yet, nor what follows it.
- A log is cleaned when its dirty bytes (closed segments past the cleaner's checkpoint)
  are at least ``min.cleanable.dirty.ratio`` of the cleanable bytes, or when its oldest
  dirty record is older than ``max.compaction.lag.ms`` (which also rolls the active
  segment that old, as Kafka's ``maxSegmentMs``), or when a tombstone or marker kept
  is past its delete horizon (not Kafka's: it waits for the ratio). The dirtiest log
  goes first.
- Per key, the record with the highest offset stays, at its offset: offsets never
  change. A batch keeps its base offset and last offset delta (so the offsets it takes
  and its producer's sequence read the same) and its codec (compressed again, as
  Kafka's cleaner keeps a batch's compression type); a batch left empty goes, a gap in
  the log that a consumer skips. Records without a key go.
- A tombstone (null value) stays ``delete.retention.ms`` after the cleaning that first
  kept it (the delete horizon, KIP-534, kept beside the batch here rather than in its
  header), then goes with its key.
- The log's newest batch is kept whole (Kafka's is in the active segment, never
  cleaned; here an idle active segment is rolled by the clock, so that a test moving it
  sees its records cleaned): a consumer in a gap always has a batch ahead.
- Transactions, as Kafka's cleaner: the cleanable range stops at the partition's last
  stable offset (the first offset of its earliest open transaction), so an open
  transaction's records are neither cleaned nor mapped (they hide nothing). Below it,
  a transactional batch not in the aborted index is committed: mapped and rewritten as
  any batch (its attributes, producer id, epoch and base sequence kept). An aborted
  one's records go, never mapped. Markers are never mapped (their key is the control
  record's). A marker whose transaction had a batch in the pass stays as it is; one
  found with nothing left to mark stays ``delete.retention.ms`` after that pass (its
  delete horizon, as a tombstone's, KIP-534), then goes; an abort marker found so
  drops its aborted-index entry with the swap (Kafka writes the cleaned segment's
  transaction index without it), so a read_committed fetch never lists an abort whose
  marker is gone. As Kafka's, a marker thus outlives its records by a pass (the next
  cleaning, when the dirty ratio or a horizon calls for one) plus the retention.

Where it still differs from Kafka: the cleanable range ends exactly at the LSO (Kafka
cleans the segment holding it whole, mapping only what lies before it); a batch left
empty goes even if it is its producer's last (Kafka keeps that one empty: here the
producer's sequence state lives in memory, not in the log); a rewritten batch is
compressed at its codec's default level (Kafka: the topic's ``compression.*.level``).

The work is incremental: a job (one partition) reads at most ``log_cleaner_step_bytes``
and :data:`STEP_BATCHES` batches per step, and stops once the records it inflated reach
``log_cleaner_step_bytes`` (a batch read compressed may hold a thousand times its bytes),
and lets the loop run between steps; the key
map holds at most :data:`MAX_KEYS` keys (a dirty section with more is cleaned in several passes, as
Kafka's bounded offset map does). Only swapping the rewritten range in is one step of
its own, O(entries) (with the aborted index's entries found markerless, O(entries of
the index)). Compressing a rewritten batch again costs at most what the step inflated, so
a step inflates and compresses about ``log_cleaner_step_bytes``, or one batch (up to
``max_request_bytes`` inflated) when it is larger. What a client asks never makes the
cleaner work: it runs on its
own tick (``log_cleaner_backoff_ms``, real time), on :meth:`Cleaner.settle` (the
broker's ``advance``), and step after step while a job lasts.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable, Collection
from typing import Final, Protocol

from .configs import LONG_MAX, TopicSettings, check_topic_configs, cleanup_policy
from .core import BrokerCore
from .limits import Limits
from .log import Partition, TopicPartition
from .records import (
    BATCH_ATTRIBUTES,
    BATCH_PRODUCER_ID,
    BATCH_RECORDS_COUNT,
    CONTROL,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    TRANSACTIONAL,
    Record,
    StoredBatch,
    batch_records,
    rebuilt_batch,
    timestamp_so_far,
)

__all__ = ["MAX_KEYS", "STEP_BATCHES", "Cleaner", "CleanerStats", "TxnIndex"]

log = logging.getLogger(__name__)

MAX_KEYS: Final = 1 << 20
"""Keys one pass maps at most (Kafka bounds its offset map by
``log.cleaner.dedupe.buffer.size``): past it, the pass stops at that batch."""


STEP_BATCHES: Final = 64
"""Batches one step reads at most (besides ``log_cleaner_step_bytes``): small batches
cost the cleaner per batch more than per byte."""


class TxnIndex(Protocol):
    """What the cleaner asks of the transaction coordinator (:mod:`.transactions`)."""

    def lso(self, partition: Partition[StoredBatch]) -> int:
        """The partition's last stable offset: the cleaner stops there."""
        ...

    def aborted_ranges(
        self, tp: TopicPartition, start: int, end: int
    ) -> list[tuple[int, int, int]]:
        """(producer id, first offset, marker offset) of the aborted transactions
        overlapping ``[start, end)``."""
        ...

    def cleaned_aborts(self, tp: TopicPartition, markers: Collection[int]) -> None:
        """The aborted transactions whose abort markers are at ``markers`` have no
        record left: read_committed fetches need them no more."""
        ...


class CleanerStats:
    """What the cleaner did: for the bench and the tests."""

    __slots__ = ("longest_step", "passes", "records_read", "records_removed", "seconds")

    def __init__(self) -> None:
        self.passes = 0
        self.records_read = 0
        """Records the rewrites read (the cleanable ranges, dirty and clean)."""
        self.records_removed = 0
        self.seconds = 0.0
        """Time spent in steps."""
        self.longest_step = 0.0
        """The longest step (seconds): the longest the cleaner held the loop."""


class _Job:
    """One pass over one partition: map the dirty section, rewrite the cleanable range,
    swap it in."""

    __slots__ = (
        "aborted",
        "cursor",
        "dropped",
        "end",
        "horizon",
        "keys",
        "mapping",
        "out",
        "partition",
        "seen_aborts",
        "settings",
        "start",
        "unmarked",
    )

    def __init__(self, partition: Partition[StoredBatch], settings: TopicSettings) -> None:
        self.partition = partition
        self.settings = settings
        self.start = partition.log_start
        self.end = 0
        self.cursor = 0
        self.mapping = True
        """Mapping the dirty section (then rewriting from :attr:`start`)."""
        self.keys: dict[bytes, int] = {}
        """Key to the offset of its latest record in the dirty section."""
        self.out: list[tuple[int, StoredBatch]] = []
        self.horizon = LONG_MAX
        """The earliest delete horizon of the tombstones and markers kept."""
        self.aborted: dict[int, list[tuple[int, int]]] = {}
        """Producer id to the (first offset, marker offset) ranges of its aborted
        transactions overlapping the range cleaned, by first offset."""
        self.unmarked: set[int] = set()
        """The producers whose committed batches the rewrite read since their last
        marker (Kafka's ``ongoingCommittedTxns``): their next commit marker stays."""
        self.seen_aborts: set[int] = set()
        """The marker offsets of the aborted transactions whose batches the rewrite
        removed: those abort markers stay (this pass)."""
        self.dropped: list[int] = []
        """The marker offsets of the aborted transactions found with no batch left:
        their aborted-index entries go with the swap."""


class Cleaner:
    """Compacts the compacted topics' partitions of ``core``, a bounded step at a time.

    Args:
        core: The log.
        limits: The broker's limits (``log_cleaner_backoff_ms``,
            ``log_cleaner_step_bytes``, ``max_request_bytes``: a batch inflates to that
            at most).
        now: The broker's clock, ms (a test moves it).
        policy: The broker's ``log.cleanup.policy``.
    """

    __slots__ = (
        "_closed",
        "_horizons",
        "_job",
        "_running",
        "_timer",
        "_waiters",
        "checkpoints",
        "core",
        "default",
        "limits",
        "now",
        "policy",
        "stats",
        "topics",
        "transactions",
    )

    def __init__(
        self,
        core: BrokerCore[StoredBatch],
        limits: Limits,
        now: Callable[[], int],
        policy: str = "delete",
    ) -> None:
        self.core = core
        self.limits = limits
        self.now = now
        self.policy = cleanup_policy(policy)
        self.default = check_topic_configs({}, limits)
        """The settings of a topic with no overrides."""
        self.topics: dict[str, TopicSettings] = {}
        """A topic's settings, where it has overrides (one per topic)."""
        self.checkpoints: dict[Partition[StoredBatch], int] = {}
        """Where each cleaned partition's dirty section starts (Kafka's
        cleaner-offset-checkpoint): one per partition of a compacted topic."""
        self._horizons: dict[Partition[StoredBatch], int] = {}
        """The earliest delete horizon of a partition's kept tombstones and markers."""
        self.transactions: TxnIndex | None = None
        """The transaction coordinator (the LSO, the aborted index); None: no
        transactions (every batch reads as committed)."""
        self._job: _Job | None = None
        self._closed = False
        self._running = False
        self._timer: asyncio.TimerHandle | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self.stats = CleanerStats()

    # -- configuration -------------------------------------------------------------------

    def settings(self, topic: str) -> TopicSettings:
        return self.topics.get(topic, self.default)

    def policy_of(self, topic: str) -> tuple[str, ...]:
        settings = self.topics.get(topic)
        if settings is None or settings.policy is None:
            return self.policy
        return settings.policy

    def compacted(self, topic: str) -> bool:
        """Whether ``topic``'s ``cleanup.policy`` has ``compact``."""
        return "compact" in self.policy_of(topic)

    def configure(self, topic: str, settings: TopicSettings) -> None:
        """``topic``'s configs changed (created, altered): its segments roll by them (a
        compacted one also by ``max.compaction.lag.ms``, as Kafka's ``maxSegmentMs``)."""
        if settings.values:
            self.topics[topic] = settings
        else:
            self.topics.pop(topic, None)
        self._roll_settings(topic)

    def _roll_settings(self, topic: str) -> None:
        settings = self.settings(topic)
        roll_ms = settings.segment_ms
        if self.compacted(topic):
            roll_ms = min(roll_ms, settings.max_lag_ms)
        self.core.set_segments(topic, settings.segment_bytes, roll_ms)

    def forget(self, topic: str) -> None:
        """``topic`` was deleted."""
        self.topics.pop(topic, None)
        for table in (self.checkpoints, self._horizons):
            for partition in [p for p in table if p.tp.topic == topic]:
                del table[partition]
        if self._job is not None and self._job.partition.tp.topic == topic:
            self._job = None

    # -- running ---------------------------------------------------------------------------

    def start(self) -> None:
        """Run on the running loop: wake every ``log_cleaner_backoff_ms``."""
        self._arm()

    def close(self) -> None:
        """Stop for good (the broker closes): no step, no tick after this."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._job = None
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def settle(self) -> None:
        """Clean what is due now (the broker's clock just moved), a step per loop
        iteration; returns once nothing is left to clean."""
        if self._closed:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._wake()
        await waiter

    def _arm(self) -> None:
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_later(self.limits.log_cleaner_backoff_ms / 1000, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._wake()

    def _wake(self) -> None:
        if not self._running and not self._closed:
            self._running = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        """One step, then the next on the next loop iteration; idle: wait for the tick."""
        if self._closed:
            self._running = False
            return
        started = time.perf_counter()
        try:
            busy = self.step()
        except Exception:
            log.exception("the log cleaner failed; this pass is dropped")
            self._job = None
            busy = False
        took = time.perf_counter() - started
        self.stats.seconds += took
        self.stats.longest_step = max(self.stats.longest_step, took)
        if busy:
            asyncio.get_running_loop().call_soon(self._run)
            return
        self._running = False
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._arm()

    def step(self) -> bool:
        """A bounded amount of work: pick a log, or map or rewrite a step of it, or swap
        it in. False when there is nothing to clean."""
        job = self._job
        if job is None:
            job = self._job = self._pick()
            return job is not None
        partition = job.partition
        if self.core.partitions.get(partition.tp) is not partition or (
            partition.log_start > job.start
        ):
            self._job = None  # deleted, or retention passed the range: the next pass
            return True
        if job.mapping:
            self._map(job)
        elif job.cursor < job.end:
            self._rewrite(job)
        else:
            self._swap(job)
        return True

    # -- picking a log -----------------------------------------------------------------------

    def _pick(self) -> _Job | None:
        """The dirtiest log due for cleaning (rolling the idle segments due first)."""
        now = self.now()
        best: tuple[float, _Job] | None = None
        for topic, count in self.core.topics.items():
            if not self.compacted(topic):
                continue
            settings = self.settings(topic)
            for index in range(count):
                partition = self.core.partitions[TopicPartition(topic, index)]
                partition.roll_due(now)
                job = _Job(partition, settings)
                ratio = self._due(job, now)
                if ratio is not None and (best is None or ratio > best[0]):
                    best = ratio, job
        if best is None:
            return None
        job = best[1]
        job.cursor = self.checkpoints.get(job.partition, job.start)
        job.cursor = max(job.cursor, job.start)
        if self.transactions is not None:
            # One look at the index per pass (one entry per abort marker): below the
            # LSO no transaction is open, so what is not aborted there is committed.
            tp = job.partition.tp
            for pid, first, marker in self.transactions.aborted_ranges(tp, job.start, job.end):
                job.aborted.setdefault(pid, []).append((first, marker))
        self.stats.passes += 1
        return job

    def _due(self, job: _Job, now: int) -> float | None:
        """Sets the job's end; returns its dirty ratio if it is due (a forced clean
        counts as more than any ratio), else None."""
        partition, settings = job.partition, job.settings
        if not partition.entries:
            return None
        limit = min(partition.active_start, partition.hw)
        if settings.min_lag_ms:
            young = partition.first_at_least(now - settings.min_lag_ms + 1, timestamp_so_far)
            if young is not None:
                limit = min(limit, young[0])
        segments = partition.segments
        end = segments[bisect.bisect_right(segments, limit) - 1] if limit >= segments[0] else 0
        if self.transactions is not None:
            # Kafka's first uncleanable offset is at most the LSO (a batch's first
            # offset): an open transaction's records are neither cleaned nor mapped.
            end = min(end, self.transactions.lso(partition))
        job.end = end
        dirty = max(self.checkpoints.get(partition, job.start), job.start)
        horizon = self._horizons.get(partition)
        if end <= dirty:
            if horizon is not None and horizon <= now and end > job.start:
                return 2.0  # tombstones to drop: a pass over the clean section
            return None
        dirty_bytes = partition.available_bytes(dirty, end)
        total = partition.available_bytes(job.start, end)
        ratio = dirty_bytes / total if total else 0.0
        first = partition.read(dirty, end, 1)
        if first and first[0].max_timestamp < now - settings.max_lag_ms:
            return 3.0 + ratio  # past max.compaction.lag.ms: whatever the ratio
        if horizon is not None and horizon <= now:
            return 2.0 + ratio
        return ratio if ratio >= settings.min_dirty_ratio else None

    # -- a pass ------------------------------------------------------------------------------

    def _map(self, job: _Job) -> None:
        """Map a step of the dirty section: each key to its latest offset."""
        batches = self._batches(job)
        keys = job.keys
        inflated = 0
        for batch in batches:
            if inflated >= self.limits.log_cleaner_step_bytes:
                break  # the step's bytes inflated: the rest on the next step
            base = batch.end - batch.count
            if base < job.cursor and batch.end <= job.cursor:
                continue
            if len(keys) >= MAX_KEYS:
                job.end = base  # the map is full: the rest is for the next pass
                break
            job.cursor = batch.end
            if _attributes(batch) & CONTROL:
                continue  # a marker: its record's key is not a record's
            if job.aborted and _abort_of(batch, base, job.aborted) is not None:
                continue  # never read: hides nothing
            records = batch_records(batch.data, self.limits.max_request_bytes)
            inflated += _inflated(records)
            for record in records:
                if record.key is not None:
                    keys[record.key] = base + record.offset_delta
        if not batches or job.cursor >= job.end:
            job.mapping = False
            job.cursor = job.start

    def _rewrite(self, job: _Job) -> None:
        """Rewrite a step of the cleanable range: keep each key's latest record, and a
        tombstone until its delete horizon."""
        now = self.now()
        batches = self._batches(job)
        if not batches:
            job.cursor = job.end
            return
        keys = job.keys
        retention = job.settings.delete_retention_ms
        inflated = 0
        for batch in batches:
            if inflated >= self.limits.log_cleaner_step_bytes:
                break  # inflated (and compressed again) the step's bytes: the rest next
            base = batch.end - batch.count
            job.cursor = batch.end
            if base >= job.end:
                break
            attributes = _attributes(batch)
            if attributes & CONTROL:
                marker = self._marker(job, batch, base, now) if base >= job.start else None
                if marker is not None:
                    job.out.append((base, marker))
                continue
            if attributes & TRANSACTIONAL:
                aborted = _abort_of(batch, base, job.aborted) if job.aborted else None
                if aborted is not None:
                    job.seen_aborts.add(aborted)  # its marker (and index entry) stay
                    if base >= job.start:
                        self.stats.records_removed += batch_count(batch.data)
                        continue
                else:
                    job.unmarked.add(_producer(batch))
            if base < job.start:
                continue  # straddles the log start (DeleteRecords): left as it is
            if batch.end >= job.partition.leo:
                # The log's newest batch, kept whole as Kafka's active segment keeps it
                # (an idle one rolled here): a consumer in a gap at the end of the log
                # always has a batch ahead to move on to.
                job.out.append((base, batch))
                continue
            records = batch_records(batch.data, self.limits.max_request_bytes)
            inflated += _inflated(records)
            self.stats.records_read += len(records)
            expired = 0 <= batch.horizon <= now
            kept = []
            tombstones = False
            for record in records:
                key = record.key
                if key is None or keys.get(key, -1) > base + record.offset_delta:
                    continue  # keyless, or a later record of its key
                if record.tombstone:
                    if expired:
                        continue
                    tombstones = True
                kept.append(record)
            self.stats.records_removed += len(records) - len(kept)
            if not kept:
                continue  # a gap
            horizon = -1
            if tombstones:
                horizon = batch.horizon if batch.horizon >= 0 else now + retention
                job.horizon = min(job.horizon, horizon)
            if len(kept) == len(records) and horizon == batch.horizon:
                job.out.append((base, batch))
                continue
            data = batch.data if len(kept) == len(records) else rebuilt_batch(batch.data, kept)
            job.out.append(
                (
                    base,
                    StoredBatch(
                        data, batch.count, batch.max_timestamp, batch.timestamp_so_far, horizon
                    ),
                )
            )

    def _marker(self, job: _Job, batch: StoredBatch, base: int, now: int) -> StoredBatch | None:
        """What stays of the marker ``batch`` (None: it goes). As Kafka's cleaner: one
        whose transaction had a batch in this pass stays as it is; one with nothing
        left to mark stays ``delete.retention.ms`` after the pass that first found it
        so (its delete horizon, KIP-534), then goes. An abort marker found so drops its
        aborted-index entry at once (Kafka's cleaned segment is written without it):
        no read_committed fetch lists it again."""
        pid = _producer(batch)
        records = batch_records(batch.data, self.limits.max_request_bytes)
        kind = _control_type(records[0].key) if records else None
        if kind == CONTROL_ABORT:
            discard = base not in job.seen_aborts
            if discard:
                job.dropped.append(base)
        elif kind == CONTROL_COMMIT:
            discard = pid not in job.unmarked
            job.unmarked.discard(pid)
        else:
            discard = not records  # an unknown control type stays; an empty one goes
        if not discard or batch.end >= job.partition.leo:
            return batch  # the log's newest batch stays whole
        if 0 <= batch.horizon <= now:
            self.stats.records_removed += len(records)
            return None
        if batch.horizon < 0:
            batch = StoredBatch(
                batch.data,
                batch.count,
                batch.max_timestamp,
                batch.timestamp_so_far,
                now + job.settings.delete_retention_ms,
            )
        job.horizon = min(job.horizon, batch.horizon)
        return batch

    def _batches(self, job: _Job) -> list[StoredBatch]:
        """The step's batches from the job's cursor: bounded in bytes and in count."""
        read = job.partition.read(job.cursor, job.end, self.limits.log_cleaner_step_bytes)
        return read[:STEP_BATCHES]

    def _swap(self, job: _Job) -> None:
        partition = job.partition
        self._job = None
        self.core.rewrite(partition, job.start, job.end, job.out)
        if job.dropped and self.transactions is not None:
            self.transactions.cleaned_aborts(partition.tp, job.dropped)
        self.checkpoints[partition] = job.end
        if job.horizon < LONG_MAX:
            self._horizons[partition] = job.horizon
        else:
            self._horizons.pop(partition, None)


def batch_count(data: bytes) -> int:
    """The records a batch holds (its header's count)."""
    return int.from_bytes(data[BATCH_RECORDS_COUNT : BATCH_RECORDS_COUNT + 4], "big", signed=True)


def _inflated(records: list[Record]) -> int:
    """The bytes of ``records`` as inflated: what reading them cost, and what compressing
    them again would."""
    return sum(len(record.raw) for record in records)


def _attributes(batch: StoredBatch) -> int:
    """The low byte of the batch's attributes (codec, transactional, control)."""
    return batch.data[BATCH_ATTRIBUTES + 1]


def _producer(batch: StoredBatch) -> int:
    return int.from_bytes(batch.data[BATCH_PRODUCER_ID : BATCH_PRODUCER_ID + 8], "big", signed=True)


def _control_type(key: bytes | None) -> int | None:
    """A control record's type (its key: version, type; int16 each), None if unread."""
    if key is None or len(key) < 4:
        return None
    return int.from_bytes(key[2:4], "big", signed=True)


def _abort_of(
    batch: StoredBatch, base: int, aborted: dict[int, list[tuple[int, int]]]
) -> int | None:
    """The marker offset of the aborted transaction the transactional data batch
    ``batch`` (at ``base``) belongs to: its producer's, begun at or before it, whose
    marker comes after it; None if it is not one's."""
    if _attributes(batch) & (TRANSACTIONAL | CONTROL) != TRANSACTIONAL:
        return None
    ranges = aborted.get(_producer(batch))
    if not ranges:
        return None
    at = bisect.bisect_right(ranges, (base, LONG_MAX)) - 1
    if at >= 0 and ranges[at][0] <= base < ranges[at][1]:
        return ranges[at][1]
    return None
