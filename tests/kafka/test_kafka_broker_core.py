"""The log core the Kafka-protocol broker shares with the simulator
(aiopurgatory.kafka.core.BrokerCore) storing batches: offsets per batch, reads by
bytes (KIP-74), retention per partition and in total, topic deletion, on virtual time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import aiopurgatory as ap
from aiopurgatory.kafka.core import BrokerCore
from aiopurgatory.kafka.log import Error

from ..support.kafka_wire import A0, A1, Batch

pytestmark = pytest.mark.anyio


@pytest.fixture
async def core() -> AsyncIterator[BrokerCore[Batch]]:
    broker: BrokerCore[Batch] = BrokerCore(
        followers=0, retain_bytes=1000, retain_total_bytes=1500, clock=ap.ManualClock()
    )
    broker.create_topic("a", 2)
    yield broker
    broker.close()


async def test_batches_take_their_record_counts_and_reads_start_at_the_holding_batch(
    core: BrokerCore[Batch],
) -> None:
    core.append({A0: [Batch(100, 3), Batch(100, 2), Batch(100, 4)]})
    partition = core.partitions[A0]
    assert (partition.leo, partition.hw) == (9, 9)
    # Offset 4 is inside the second batch: the read starts with it.
    assert [b.count for b in partition.read(4, partition.hw, 10_000)] == [2, 4]
    assert partition.available_bytes(4, 9) == 200
    # Bytes: the budget cuts between batches, but the first one always comes (KIP-74).
    assert [b.count for b in partition.read(0, 9, 150)] == [3]
    assert [b.count for b in partition.read(0, 9, 50)] == [3]
    assert partition.read(0, 9, 50, min_one=False) == []


async def test_a_fetch_limits_the_response_and_each_partition(core: BrokerCore[Batch]) -> None:
    core.append({A0: [Batch(300, 1), Batch(300, 1)], A1: [Batch(300, 1)]})
    fetch = core.fetch({A0: 0, A1: 0}, min_bytes=1, max_wait=1.0, max_bytes=400)
    result = await fetch
    # A0's first batch is returned even past a partition's share; A1 gets nothing:
    # only the first non-empty partition may exceed what is left of max_bytes.
    assert [len(result[A0]), len(result[A1])] == [1, 0]
    limited = core.fetch(
        {A0: 0, A1: 0}, min_bytes=1, max_wait=1.0, partition_max_bytes={A0: 300, A1: 300}
    )
    assert [len(v) for v in (await limited).values()] == [1, 1]


async def test_retention_per_partition_moves_the_log_start(core: BrokerCore[Batch]) -> None:
    core.append({A0: [Batch(400, 2) for _ in range(4)]})
    partition = core.partitions[A0]
    assert partition.retained_bytes <= 1000
    assert partition.log_start == 4  # two batches of 2 records dropped
    assert not partition.in_range(3)
    assert partition.in_range(4)
    # A fetch from a dropped offset is answered at once (the caller says out of range).
    fetch = core.fetch({A0: 0}, min_bytes=1, max_wait=10.0)
    assert fetch.done()
    assert (await fetch)[A0] == []


async def test_retention_in_total_drops_the_oldest_anywhere(core: BrokerCore[Batch]) -> None:
    core.append({A0: [Batch(400, 1), Batch(400, 1)]})
    core.append({A1: [Batch(400, 1), Batch(400, 1)]})
    assert core.retained_bytes <= 1500
    assert core.partitions[A0].log_start == 1  # A0's first batch was the oldest
    assert core.partitions[A1].log_start == 0
    assert not core.over_retention()


async def test_retention_never_drops_what_is_not_replicated() -> None:
    core: BrokerCore[Batch] = BrokerCore(
        followers=1, retain_bytes=500, retain_total_bytes=500, clock=ap.ManualClock()
    )
    try:
        core.create_topic("a", 1)
        core.append({A0: [Batch(400, 1), Batch(400, 1)]})
        partition = core.partitions[A0]
        assert (partition.hw, partition.log_start) == (0, 0)
        assert core.over_retention()  # full, and the follower has nothing yet
        core.fetch({A0: 2}, min_bytes=1, max_wait=1.0, replica=0)  # the follower catches up
        assert partition.hw == 2
        assert not core.over_retention()
        assert partition.log_start == 1
    finally:
        core.close()


async def test_deleting_a_topic_answers_what_waits_on_it() -> None:
    clock = ap.ManualClock()
    core: BrokerCore[Batch] = BrokerCore(followers=1, clock=clock)
    try:
        core.create_topic("a", 1)
        required = core.append({A0: [Batch(10, 1)]})
        produce = core.acknowledge(required, timeout=10.0)
        fetch = core.fetch({A0: 0}, min_bytes=1, max_wait=10.0)
        assert not produce.done()
        assert not fetch.done()
        assert core.delete_topic("a")
        assert await produce == {A0: Error.UNKNOWN_TOPIC_OR_PARTITION}
        assert (await fetch)[A0] == []
        assert core.retained_bytes == 0
        assert not core.delete_topic("a")
    finally:
        core.close()
