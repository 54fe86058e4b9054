"""The log cleaner: compaction of the topics whose ``cleanup.policy`` has ``compact``.

Ground rules, Kafka's (its ``LogCleaner``):

- Only closed segments are cleaned, below the high watermark; the active segment never.
  A segment whose records are younger than ``min.compaction.lag.ms`` (by the broker's
  clock, which a test moves) is not cleaned yet, nor what follows it.
- A log is cleaned when its dirty bytes (closed segments past the cleaner's checkpoint)
  are at least ``min.cleanable.dirty.ratio`` of the cleanable bytes, or when its oldest
  dirty record is older than ``max.compaction.lag.ms`` (which also rolls the active
  segment that old, as Kafka's ``maxSegmentMs``), or when a tombstone kept is past its
  delete horizon. The dirtiest log goes first.
- Per key, the record with the highest offset stays, at its offset: offsets never
  change. A batch keeps its base offset and last offset delta (so the offsets it takes
  and its producer's sequence read the same); a batch left empty goes, a gap in the log
  that a consumer skips. Records without a key go.
- A tombstone (null value) stays ``delete.retention.ms`` after the cleaning that first
  kept it (the delete horizon, KIP-534, kept beside the batch here rather than in its
  header), then goes with its key.
- The log's newest batch is kept whole (Kafka's is in the active segment, never
  cleaned; here an idle active segment is rolled by the clock, so that a test moving it
  sees its records cleaned): a consumer in a gap always has a batch ahead.
- The records of aborted transactions go, as Kafka's cleaner removes them (the abort
  markers stay, and the aborted-transaction index with them, so a read_committed
  consumer reads as before). Committed transactional batches and every marker are left
  as they are, and never hide an older record of their key (Kafka compacts committed
  records as any other and removes markers once nothing they cover is left: not yet
  here).

The work is incremental: a job (one partition) reads at most ``log_cleaner_step_bytes``
and :data:`STEP_BATCHES` batches per step and lets the loop run between steps; the key
map holds at most :data:`MAX_KEYS` keys (a dirty section with more is cleaned in several passes, as
Kafka's bounded offset map does). Only swapping the rewritten range in is one step of
its own, O(entries). What a client asks never makes the cleaner work: it runs on its
own tick (``log_cleaner_backoff_ms``, real time), on :meth:`Cleaner.settle` (the
broker's ``advance``), and step after step while a job lasts.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable
from typing import Final

from .configs import LONG_MAX, TopicSettings, check_topic_configs, cleanup_policy
from .core import BrokerCore
from .limits import Limits
from .log import Partition, TopicPartition
from .records import (
    BATCH_ATTRIBUTES,
    BATCH_PRODUCER_ID,
    BATCH_RECORDS_COUNT,
    CONTROL,
    TRANSACTIONAL,
    StoredBatch,
    batch_records,
    is_control,
    rebuilt_batch,
    timestamp_so_far,
)

__all__ = ["MAX_KEYS", "STEP_BATCHES", "Cleaner", "CleanerStats"]

log = logging.getLogger(__name__)

MAX_KEYS: Final = 1 << 20
"""Keys one pass maps at most (Kafka bounds its offset map by
``log.cleaner.dedupe.buffer.size``): past it, the pass stops at that batch."""


STEP_BATCHES: Final = 64
"""Batches one step reads at most (besides ``log_cleaner_step_bytes``): small batches
cost the cleaner per batch more than per byte."""


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
        "end",
        "horizon",
        "keys",
        "mapping",
        "out",
        "partition",
        "settings",
        "start",
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
        """The earliest delete horizon of the tombstones kept."""
        self.aborted: dict[int, list[tuple[int, int]]] = {}
        """Producer id to the (first offset, marker offset) ranges of its aborted
        transactions in the range cleaned, by first offset."""


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
        "aborted",
        "checkpoints",
        "core",
        "default",
        "limits",
        "now",
        "policy",
        "stats",
        "topics",
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
        """The earliest delete horizon of a partition's kept tombstones."""
        self.aborted: Callable[[TopicPartition, int, int], list[tuple[int, int, int]]] | None
        self.aborted = None
        """The aborted transactions of a partition's range: (producer id, first offset,
        marker offset) each (the transaction coordinator's); None: no transactions."""
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
        for batch in batches:
            base = batch.end - batch.count
            if base < job.cursor and batch.end <= job.cursor:
                continue
            if len(keys) >= MAX_KEYS:
                job.end = base  # the map is full: the rest is for the next pass
                break
            job.cursor = batch.end
            if is_control(batch.data):
                continue  # transactional: never hides an older record
            records = batch_records(batch.data, self.limits.max_request_bytes)
            for record in records:
                if record.key is not None:
                    keys[record.key] = base + record.offset_delta
        if not batches or job.cursor >= job.end:
            job.mapping = False
            job.cursor = job.start
            if self.aborted is not None:
                # One look at the index per pass (it holds one entry per abort marker).
                for pid, first, marker in self.aborted(job.partition.tp, job.start, job.end):
                    job.aborted.setdefault(pid, []).append((first, marker))

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
        for batch in batches:
            base = batch.end - batch.count
            job.cursor = batch.end
            if base < job.start:
                continue  # straddles the log start (DeleteRecords): left as it is
            if base >= job.end:
                break
            if job.aborted and _aborted(batch, base, job.aborted):
                self.stats.records_removed += batch_count(batch.data)
                continue  # an aborted transaction's: its marker stays
            if is_control(batch.data) or batch.end >= job.partition.leo:
                # Transactional; or the log's newest batch, kept whole as Kafka's active
                # segment keeps it (an idle one rolled here): a consumer in a gap at the
                # end of the log always has a batch ahead to move on to.
                job.out.append((base, batch))
                continue
            records = batch_records(batch.data, self.limits.max_request_bytes)
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

    def _batches(self, job: _Job) -> list[StoredBatch]:
        """The step's batches from the job's cursor: bounded in bytes and in count."""
        read = job.partition.read(job.cursor, job.end, self.limits.log_cleaner_step_bytes)
        return read[:STEP_BATCHES]

    def _swap(self, job: _Job) -> None:
        partition = job.partition
        self._job = None
        self.core.rewrite(partition, job.start, job.end, job.out)
        self.checkpoints[partition] = job.end
        if job.horizon < LONG_MAX:
            self._horizons[partition] = job.horizon
        else:
            self._horizons.pop(partition, None)


def batch_count(data: bytes) -> int:
    """The records a batch holds (its header's count)."""
    return int.from_bytes(data[BATCH_RECORDS_COUNT : BATCH_RECORDS_COUNT + 4], "big", signed=True)


def _aborted(batch: StoredBatch, base: int, aborted: dict[int, list[tuple[int, int]]]) -> bool:
    """Whether ``batch`` (at ``base``) is a transactional data batch of an aborted
    transaction: its producer's, begun at or before it, whose marker comes after it."""
    attributes = batch.data[BATCH_ATTRIBUTES + 1]  # the low byte
    if not attributes & TRANSACTIONAL or attributes & CONTROL:
        return False
    pid = int.from_bytes(batch.data[BATCH_PRODUCER_ID : BATCH_PRODUCER_ID + 8], "big", signed=True)
    ranges = aborted.get(pid)
    if not ranges:
        return False
    at = bisect.bisect_right(ranges, (base, LONG_MAX)) - 1
    return at >= 0 and ranges[at][0] <= base < ranges[at][1]
