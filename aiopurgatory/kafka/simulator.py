"""A Kafka-like broker in one process, whose produce and fetch requests wait in purgatories.

Each partition has a leader log; followers fetch from it, and the high watermark (HW)
is the offset every replica has reached. What cannot be answered yet waits:

* ``DelayedProduce`` (acks=all) completes once the HW covers the produced records on
  every partition of the request, or at its timeout with ``REQUEST_TIMED_OUT`` for each
  partition still uncovered;
* ``DelayedFetch`` completes once ``min_bytes`` are readable past its offsets (up to
  the HW for consumers, up to the log end for followers), or after ``max_wait`` with
  whatever there is.

:func:`run_simulation` drives a :class:`Broker` with producer, consumer and follower
tasks; ``aiopurgatory demo`` traces it, and ``examples/broker/sim.py`` in the repository
is its command line. Not modelled: the ISR shrinking
around a follower that stalls (Kafka drops it after ``replica.lag.time.max.ms``), so a
stall holds the HW back and produces time out, which is the point here.

Ground rules: the log, the delayed operations and the core are the Kafka-protocol
broker's (:mod:`.log`, :mod:`.delayed`, :mod:`.core`), and this module imports nothing
else of the package, so the simulator runs without kio (the ``kafka`` extra). It adds
only what a simulation needs (a record of a size, strict fetches, the run and its
report); the names it uses from below are imported from their own modules, not from
here.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiopurgatory as ap
from aiopurgatory.timer import Clock

from .core import BrokerCore
from .core import check_seconds as _check_seconds
from .delayed import DelayedLogFetch, DelayedProduce
from .log import MAX_PARTITION_BYTES, Error, Partition, TopicPartition

__all__ = [
    "Broker",
    "DelayedFetch",
    "Percentiles",
    "Record",
    "SimulationConfig",
    "SimulationReport",
    "run_simulation",
]


@dataclass(frozen=True, slots=True)
class Record:
    size: int
    """Bytes."""
    produced_at: float
    """Broker clock time at which the leader appended it."""

    def __post_init__(self) -> None:
        if not (isinstance(self.size, int) and self.size >= 0):
            raise ValueError(f"a record's size must be an integer >= 0, got {self.size!r}")

    @property
    def count(self) -> int:
        return 1


class DelayedFetch(DelayedLogFetch[Record]):
    """The simulator's fetch: records."""

    __slots__ = ()


class Broker(BrokerCore[Record]):
    """The simulator's broker: one topic of :class:`Record` entries.

    Its fetches are strict: a consumer offset beyond the HW is a ValueError (the
    simulator's consumers never send one), where the Kafka-protocol broker answers
    OFFSET_OUT_OF_RANGE.
    """

    def __init__(
        self,
        topic: str = "events",
        partitions: int = 4,
        followers: int = 2,
        *,
        clock: Clock | None = None,
        observer: ap.OperationObserver | None = None,
    ) -> None:
        super().__init__(followers=followers, clock=clock, observer=observer)
        self.create_topic(topic, partitions)

    def produce(
        self, batches: Mapping[TopicPartition, Sequence[Record]], timeout: float
    ) -> DelayedProduce:
        """Append ``batches`` to the leader logs; the operation acknowledges them (acks=all).

        The whole request is validated before anything is appended: a bad one
        (unknown partition, empty, a bad timeout) raises ValueError and changes nothing.
        """
        _check_seconds("timeout", timeout)
        for records in batches.values():
            if not all(isinstance(record, Record) for record in records):
                raise ValueError("a batch holds Record objects")
        return super().produce(batches, timeout)

    def fetch(
        self,
        offsets: Mapping[TopicPartition, int],
        *,
        min_bytes: int,
        max_wait: float,
        replica: int | None = None,
        max_partition_bytes: int = MAX_PARTITION_BYTES,
        partition_max_bytes: Mapping[TopicPartition, int] | None = None,
        max_bytes: int | None = None,
    ) -> DelayedFetch:
        if replica is None:
            for tp, offset in offsets.items():
                partition = self._partition(tp)
                if not 0 <= offset <= partition.hw:
                    raise ValueError(
                        f"fetch offset {offset} out of range for {tp} (limit {partition.hw})"
                    )
        op = super().fetch(
            offsets,
            min_bytes=min_bytes,
            max_wait=max_wait,
            replica=replica,
            max_partition_bytes=max_partition_bytes,
            partition_max_bytes=partition_max_bytes,
            max_bytes=max_bytes,
        )
        assert isinstance(op, DelayedFetch)  # made by new_fetch below
        return op

    def new_fetch(
        self,
        offsets: Mapping[Partition[Record], int],
        *,
        min_bytes: int,
        max_wait: float,
        follower: bool,
        max_partition_bytes: int,
        partition_max_bytes: Mapping[Partition[Record], int],
        max_bytes: int | None,
    ) -> DelayedFetch:
        return DelayedFetch(
            offsets,
            min_bytes=min_bytes,
            max_wait=max_wait,
            follower=follower,
            max_partition_bytes=max_partition_bytes,
            partition_max_bytes=partition_max_bytes,
            max_bytes=max_bytes,
        )


# -- the simulation ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimulationConfig:
    """What to simulate; times in seconds, rates per second."""

    duration: float = 10.0
    partitions: int = 4
    followers: int = 2
    producers: int = 4
    produce_rate: float = 100.0
    """Produce requests per second, per producer."""
    partitions_per_request: int = 2
    records_per_batch: int = 5
    record_size: int = 100
    produce_timeout: float = 0.5
    consumers: int = 2
    fetch_min_bytes: int = 4096
    fetch_max_wait: float = 0.2
    follower_max_wait: float = 0.5
    replica_lag: float = 0.005
    """How long a follower takes to write what it fetched before it fetches again."""
    stall_at: float = 3.0
    """When follower 0 stops fetching (seconds into the run)..."""
    stall_for: float = 1.0
    """...and for how long (0: it never stalls)."""
    seed: int = 0

    def __post_init__(self) -> None:
        at_least = {"partitions": 1, "producers": 1, "records_per_batch": 1, "record_size": 1}
        at_least |= {"followers": 0, "consumers": 0, "fetch_min_bytes": 0}
        for name, least in at_least.items():
            if getattr(self, name) < least:
                raise ValueError(f"{name} must be >= {least}, got {getattr(self, name)!r}")
        if not 1 <= self.partitions_per_request <= self.partitions:
            raise ValueError("partitions_per_request must be between 1 and partitions")
        if not (math.isfinite(self.produce_rate) and self.produce_rate > 0):
            raise ValueError(f"produce_rate must be > 0, got {self.produce_rate!r}")
        seconds = ("duration", "produce_timeout", "fetch_max_wait", "follower_max_wait")
        for name in (*seconds, "replica_lag", "stall_at", "stall_for"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Nearest-rank percentiles of a sample, in seconds (NaN when it is empty)."""

    count: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Percentiles:
        if not samples:
            return cls(0, math.nan, math.nan, math.nan)
        ordered = sorted(samples)

        def rank(q: float) -> float:
            return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]

        return cls(len(ordered), rank(0.5), rank(0.99), ordered[-1])

    def __str__(self) -> str:
        ms = [f"{v * 1e3:.1f}" for v in (self.p50, self.p99, self.max)]
        return f"p50 {ms[0]} ms, p99 {ms[1]} ms, max {ms[2]} ms (n={self.count})"


@dataclass(frozen=True, slots=True)
class SimulationReport:
    """What a run did: partition batches, latencies and the purgatories' final counts."""

    config: SimulationConfig
    elapsed: float
    produce_requests: int
    records_produced: int
    acknowledged: int
    """Partition batches acknowledged (acks=all satisfied)."""
    timed_out: int
    """Partition batches answered REQUEST_TIMED_OUT."""
    records_fetched: int
    """Records delivered to consumers, summed over consumers."""
    produce_latency: Percentiles
    """Request to acknowledgement, for requests acknowledged on every partition."""
    fetch_wait: Percentiles
    """How long consumer fetches waited."""
    end_to_end: Percentiles
    """Append to delivery to a consumer."""
    produce_stats: ap.PurgatoryStats
    fetch_stats: ap.PurgatoryStats

    def format(self) -> str:
        def outcomes(stats: ap.PurgatoryStats) -> str:
            return (
                f"{stats.completed} completed, {stats.expired} expired, "
                f"{stats.cancelled} cancelled, {stats.pending} pending"
            )

        return "\n".join(
            [
                f"simulated:        {self.elapsed:.2f} s",
                f"produced:         {self.produce_requests} requests, "
                f"{self.records_produced} records",
                f"acknowledged:     {self.acknowledged} partition batches",
                f"timed out:        {self.timed_out} partition batches",
                f"fetched:          {self.records_fetched} records by consumers",
                f"produce latency:  {self.produce_latency}",
                f"fetch wait:       {self.fetch_wait}",
                f"end to end:       {self.end_to_end}",
                f"produce purgatory: {outcomes(self.produce_stats)}",
                f"fetch purgatory:   {outcomes(self.fetch_stats)}",
            ]
        )


class _Simulation:
    def __init__(self, config: SimulationConfig, observer: ap.OperationObserver | None) -> None:
        self.config = config
        self.broker = Broker(
            partitions=config.partitions, followers=config.followers, observer=observer
        )
        self.loop = asyncio.get_running_loop()
        self.start = self.loop.time()
        self.rng = random.Random(config.seed)
        self.acks: set[asyncio.Task[None]] = set()
        self.produce_requests = 0
        self.records_produced = 0
        self.acknowledged = 0
        self.timed_out = 0
        self.records_fetched = 0
        self.produce_latency: list[float] = []
        self.fetch_wait: list[float] = []
        self.end_to_end: list[float] = []

    async def run(self) -> SimulationReport:
        config = self.config
        producers = [asyncio.create_task(self.produce()) for _ in range(config.producers)]
        others = [asyncio.create_task(self.follow(r)) for r in range(config.followers)]
        others += [asyncio.create_task(self.consume()) for _ in range(config.consumers)]
        try:
            await asyncio.sleep(config.duration)
            await _cancel(producers)
            # Every request sent gets its answer: by the HW or at its timeout.
            if self.acks:
                await asyncio.wait(self.acks)
            elapsed = self.loop.time() - self.start
        finally:
            await _cancel(producers + others + list(self.acks))
            self.broker.close()
        return SimulationReport(
            config=config,
            elapsed=elapsed,
            produce_requests=self.produce_requests,
            records_produced=self.records_produced,
            acknowledged=self.acknowledged,
            timed_out=self.timed_out,
            records_fetched=self.records_fetched,
            produce_latency=Percentiles.of(self.produce_latency),
            fetch_wait=Percentiles.of(self.fetch_wait),
            end_to_end=Percentiles.of(self.end_to_end),
            produce_stats=self.broker.produce_purgatory.stats,
            fetch_stats=self.broker.fetch_purgatory.stats,
        )

    async def produce(self) -> None:
        config = self.config
        tps = list(self.broker.partitions)
        interval = 1.0 / config.produce_rate
        next_at = self.loop.time()
        while True:
            next_at += interval
            await asyncio.sleep(next_at - self.loop.time())
            now = self.loop.time()
            batches = {
                tp: [Record(config.record_size, now) for _ in range(config.records_per_batch)]
                for tp in self.rng.sample(tps, config.partitions_per_request)
            }
            op = self.broker.produce(batches, config.produce_timeout)
            self.produce_requests += 1
            self.records_produced += config.partitions_per_request * config.records_per_batch
            task = asyncio.create_task(self.acknowledge(op, now))
            self.acks.add(task)
            task.add_done_callback(self.acks.discard)

    async def acknowledge(self, op: DelayedProduce, sent: float) -> None:
        errors = await op
        failed = sum(error is not Error.NONE for error in errors.values())
        self.acknowledged += len(errors) - failed
        self.timed_out += failed
        if not failed:
            self.produce_latency.append(self.loop.time() - sent)

    async def follow(self, replica: int) -> None:
        config = self.config
        offsets = dict.fromkeys(self.broker.partitions, 0)
        stall_from = self.start + config.stall_at
        stall_until = stall_from + config.stall_for
        while True:
            now = self.loop.time()
            if replica == 0 and stall_from <= now < stall_until:
                await asyncio.sleep(stall_until - now)
            fetched = await self.broker.fetch(
                offsets, min_bytes=1, max_wait=config.follower_max_wait, replica=replica
            )
            if any(fetched.values()):
                await asyncio.sleep(config.replica_lag)  # writing them to its own log
            for tp, records in fetched.items():
                offsets[tp] += len(records)

    async def consume(self) -> None:
        config = self.config
        offsets = dict.fromkeys(self.broker.partitions, 0)
        while True:
            asked = self.loop.time()
            fetched = await self.broker.fetch(
                offsets, min_bytes=config.fetch_min_bytes, max_wait=config.fetch_max_wait
            )
            now = self.loop.time()
            self.fetch_wait.append(now - asked)
            for tp, records in fetched.items():
                offsets[tp] += len(records)
                self.records_fetched += len(records)
                self.end_to_end.extend(now - record.produced_at for record in records)


async def _cancel(tasks: Sequence[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def run_simulation(
    config: SimulationConfig | None = None, *, observer: ap.OperationObserver | None = None
) -> SimulationReport:
    """Run a simulated broker for ``config.duration`` seconds of the loop's time.

    ``observer`` is given to both purgatories (for example an
    :class:`aiopurgatory.trace.TraceRecorder`).
    """
    return await _Simulation(config or SimulationConfig(), observer).run()
