"""Replicas and leader epochs in the broker core: which followers count for the HW, the
epochs a new leader begins, the truncation to its log and what follows it (parked
produces and fetches, producers' sequences, transactions), and OffsetForLeaderEpoch on
the wire."""

from __future__ import annotations

import asyncio
import collections
import struct
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.record.default_records import DefaultRecordBatch
from kio.schema.errors import ErrorCode
from kio.schema.offset_for_leader_epoch.v2 import request as epoch_v2
from kio.schema.offset_for_leader_epoch.v2.response import (
    OffsetForLeaderEpochResponse as EpochResponseV2,
)
from kio.schema.offset_for_leader_epoch.v4 import request as epoch_v4
from kio.schema.offset_for_leader_epoch.v4.response import (
    OffsetForLeaderEpochResponse as EpochResponseV4,
)
from kio.schema.types import TopicName
from kio.serial import entity_reader
from kio.static.primitive import i32

import aiopurgatory as ap
from aiopurgatory.kafka import KafkaBroker
from aiopurgatory.kafka.core import BrokerCore
from aiopurgatory.kafka.groups import GroupCoordinator
from aiopurgatory.kafka.leadership import epoch_error
from aiopurgatory.kafka.limits import Limits
from aiopurgatory.kafka.log import Error, Partition, TopicPartition
from aiopurgatory.kafka.producers import ProducerTable
from aiopurgatory.kafka.protocol import OFFSET_FOR_LEADER_EPOCH, SERVED
from aiopurgatory.kafka.records import BATCH_LEADER_EPOCH, TRANSACTIONAL, IncomingBatch, StoredBatch
from aiopurgatory.kafka.transactions import TransactionCoordinator

from ..support.kafka_wire import A0, A1, Batch, encoded
from ..support.kafka_wire import batch as wire_batch


def partition(followers: int = 2) -> Partition[Batch]:
    return Partition(A0, followers)


# -- the HW's slots ---------------------------------------------------------------------


def test_the_hw_counts_only_the_chosen_slots_and_never_moves_down() -> None:
    p = partition(followers=3)
    p.append([Batch(10, 5)])
    p.update_follower(0, 5)
    p.update_follower(2, 4)
    assert p.hw == 0  # slot 1 holds it back: every slot counts by default
    assert p.set_hw_slots((0, 2)) is True  # slot 1 left the ISR: the HW moves
    assert p.hw == 4
    assert p.update_follower(2, 5) is True
    assert p.hw == 5
    p.append([Batch(10, 1)])
    assert p.update_follower(1, 6) is False  # not counted
    assert p.set_hw_slots(None) is False  # all again: slot 2 lags, the HW stays
    assert p.hw == 5
    assert p.set_hw_slots(()) is True  # no follower in sync: the leader alone
    assert p.hw == 6


@pytest.mark.parametrize("slots", [(0, 0), (3,), (-1,)])
def test_bad_hw_slots_are_refused(slots: tuple[int, ...]) -> None:
    p = partition(followers=3)
    with pytest.raises(ValueError, match="HW slots"):
        p.set_hw_slots(slots)
    assert p.hw_slots is None


@pytest.mark.anyio
async def test_the_core_answers_what_an_hw_move_by_slots_completes() -> None:
    core: BrokerCore[Batch] = BrokerCore(followers=2, clock=ap.ManualClock())
    core.create_topic("a", 1)
    try:
        produce = core.produce({A0: [Batch(10, 2)]}, timeout=10.0)
        core.fetch({A0: 2}, min_bytes=0, max_wait=0.0, replica=0)
        assert not produce.done()  # follower 1 has nothing yet
        assert core.set_hw_slots(A0, (0,)) is True
        assert produce.done()
        assert (await produce) == {A0: Error.NONE}
        assert core.set_hw_slots(A0, (0,)) is False
        with pytest.raises(ValueError, match="unknown partition"):
            core.set_hw_slots(TopicPartition("nope", 0), None)
    finally:
        core.close()


# -- leader epochs ----------------------------------------------------------------------


def test_epochs_begin_at_the_log_end_and_answer_where_each_ended() -> None:
    p = partition(followers=0)
    assert (p.epoch, p.epoch_history) == (0, [(0, 0)])
    p.append([Batch(10, 3)])
    assert p.begin_epoch() == 1
    p.append([Batch(10, 2)])
    assert p.begin_epoch() == 2
    assert p.begin_epoch() == 3  # epoch 2 wrote nothing: it leaves the history
    p.append([Batch(10, 4)])
    assert p.epoch_history == [(0, 0), (1, 3), (3, 5)]
    assert p.end_offset_for(0) == (0, 3)
    assert p.end_offset_for(1) == (1, 5)
    assert p.end_offset_for(2) == (1, 5)  # the largest epoch <= 2 is 1
    assert p.end_offset_for(3) == (3, 9)  # the current one: the log end
    assert p.end_offset_for(4) == (-1, -1)
    assert p.end_offset_for(-1) == (-1, -1)


def test_an_epoch_below_the_first_known_answers_the_first_start() -> None:
    p = partition(followers=0)
    p.begin_epoch()  # epoch 0 wrote nothing: replaced by 1 at offset 0
    p.append([Batch(10, 2)])
    p.begin_epoch()
    assert p.epoch_history == [(1, 0), (2, 2)]
    assert p.end_offset_for(0) == (0, 0)  # as Kafka's epoch cache answers


# -- truncation -------------------------------------------------------------------------


def test_truncation_drops_the_log_from_an_entry_and_clamps_the_followers() -> None:
    p = partition(followers=2)
    p.append([Batch(10, 2), Batch(20, 3)])
    p.update_follower(0, 2)
    p.update_follower(1, 5)
    assert p.hw == 2
    p.begin_epoch()
    p.append([Batch(40, 1)])
    assert p.epoch_history == [(0, 0), (1, 5)]
    for bad in (1, 3, 7, -1):  # below the HW, inside an entry, past the log end
        with pytest.raises(ValueError, match="truncation offset"):
            p.truncate(bad)
    assert p.leo == 6
    assert p.truncate(6) == (0, 0)  # the log end: nothing to drop
    assert p.truncate(2) == (60, 2)
    assert (p.leo, p.hw, p.retained_bytes, p.retained_count) == (2, 2, 10, 1)
    assert p.follower_leos == [2, 2]
    # Epoch 1 started past the truncation: the current epoch restarts at its offset.
    assert p.epoch_history == [(0, 0), (1, 2)]
    assert p.end_offset_for(0) == (0, 2)
    p.append([Batch(5, 1)])
    assert [b.size for b in p.retained()] == [10, 5]
    assert p.read(2, p.leo, 100) == [Batch(5, 1)]


@pytest.mark.anyio
async def test_a_new_leader_answers_what_waits_and_keeps_the_totals() -> None:
    core: BrokerCore[Batch] = BrokerCore(
        followers=2, retain_total_bytes=10_000, clock=ap.ManualClock()
    )
    core.create_topic("a", 2)
    try:
        core.append({A0: [Batch(100, 2)]})
        core.fetch({A0: 2}, min_bytes=0, max_wait=0.0, replica=0)
        core.fetch({A0: 2}, min_bytes=0, max_wait=0.0, replica=1)
        assert core.partitions[A0].hw == 2
        both = core.produce({A0: [Batch(100, 3)], A1: [Batch(50, 1)]}, timeout=10.0)
        follower = core.fetch({A0: 2}, min_bytes=1_000_000, max_wait=10.0, replica=0)
        consumer = core.fetch({A0: 2}, min_bytes=1, max_wait=10.0)
        assert [both.done(), follower.done(), consumer.done()] == [False, False, False]
        assert core.change_leader(A0, 2) == 1
        # Answered at once: the truncated batch NOT_LEADER_OR_FOLLOWER, the other
        # partition (no new leader) as it stands; the fetches read nothing of A0.
        assert (await both) == {A0: Error.NOT_LEADER_OR_FOLLOWER, A1: Error.REQUEST_TIMED_OUT}
        assert (await follower) == {A0: []}
        assert (await consumer) == {A0: []}
        assert consumer.stale(core.partitions[A0])
        assert (core.retained_bytes, core._retained_count) == (150, 2)
        # The arrivals of dropped entries went with them.
        assert [(p.tp, o) for p, o in core._arrivals] == [(A0, 0), (A1, 0)]
        with pytest.raises(ValueError, match="truncation offset"):
            core.change_leader(A0, 1)
        assert core.partitions[A0].epoch == 1  # refused: nothing changed
    finally:
        core.close()


@pytest.mark.anyio
async def test_a_covered_partition_stays_acknowledged_across_a_leader_change() -> None:
    core: BrokerCore[Batch] = BrokerCore(followers=1, clock=ap.ManualClock())
    core.create_topic("a", 2)
    try:
        produce = core.produce({A0: [Batch(10, 1)], A1: [Batch(10, 1)]}, timeout=10.0)
        core.fetch({A0: 1}, min_bytes=0, max_wait=0.0, replica=0)  # A0 covered
        assert not produce.done()
        core.change_leader(A0, 1)
        assert not produce.done()  # what the HW covered survives any truncation
        core.change_leader(A1, 1)
        assert (await produce) == {A0: Error.NONE, A1: Error.NOT_LEADER_OR_FOLLOWER}
    finally:
        core.close()


# -- producers and transactions after a truncation --------------------------------------


def incoming(pid: int, sequence: int, count: int = 1, epoch: int = 0) -> IncomingBatch:
    return IncomingBatch(bytearray(), count, 0, pid, epoch, sequence)


def test_a_truncated_batch_is_appended_again_on_its_retry() -> None:
    table = ProducerTable(max_producer_states=10)
    pid = table.new_id()
    assert pid is not None
    first, second, third = incoming(pid, 0, 2), incoming(pid, 2, 3), incoming(pid, 5)
    for batch, base in ((first, 0), (second, 2), (third, 5)):
        assert table.sequence_error(A0, batch) == (ErrorCode.none, None)
        table.remember(A0, batch, base)
    assert table.sequence_error(A0, second) == (ErrorCode.none, 2)  # a duplicate
    table.truncate(A0, 2)
    # Forgotten: its retry is appended again, and the next in order after it.
    assert table.sequence_error(A0, second) == (ErrorCode.none, None)
    assert table.sequence_error(A0, third)[0] is ErrorCode.out_of_order_sequence_number
    assert table.sequence_error(A0, first) == (ErrorCode.none, 0)  # still a duplicate
    table.truncate(A0, 0)
    assert (A0, pid) not in table.states  # nothing left since sequence 0
    assert table.sequence_error(A0, first) == (ErrorCode.none, None)
    table.remember(A1, first, 0)
    table.truncate(A1, 7)  # nothing past it: unchanged
    assert table.sequence_error(A1, first) == (ErrorCode.none, 0)


def data_batch(pid: int, epoch: int) -> bytes:
    return wire_batch(pid, 0, [b"v"], epoch=epoch, attributes=TRANSACTIONAL)


@pytest.mark.anyio
async def test_transactions_follow_a_truncation() -> None:
    core: BrokerCore[StoredBatch] = BrokerCore(followers=1, clock=ap.ManualClock())
    producers = ProducerTable(max_producer_states=10)
    groups = GroupCoordinator()
    txns = TransactionCoordinator(core, producers, groups, Limits(), clock=ap.ManualClock())
    tp = TopicPartition("t", 0)
    try:
        core.create_topic("t", 1)
        partition = core.partitions[tp]
        error, pid, epoch = txns.init_producer("a", 5000, -1, -1, ErrorCode.producer_fenced)
        assert error is ErrorCode.none
        txn = txns.transactions["a"]
        txns.add_partitions(txn, [tp])
        batch = IncomingBatch(bytearray(), 1, 0, pid, epoch, 0, transactional=True)
        txns.appended(tp, batch, 0)
        core.append({tp: [StoredBatch(data_batch(pid, epoch), 1, 0, 0)]})
        assert txns.lso(partition) == 0
        # The open transaction's only batch is truncated: it holds the LSO no more.
        core.change_leader(tp, 0)
        txns.truncate(tp, 0)
        assert (txns.open_firsts, txn.first_offsets) == ({}, {})
        # Written again, replicated, aborted: then the abort marker alone is truncated.
        txns.appended(tp, batch, 0)
        core.append({tp: [StoredBatch(data_batch(pid, epoch), 1, 0, 0)]})
        core.fetch({tp: 1}, min_bytes=0, max_wait=0.0, replica=0)
        assert txns.end(txn, commit=False) is ErrorCode.none
        assert (partition.leo, txns.aborted[tp]) == (2, [(1, pid, 0)])
        assert core.change_leader(tp, 1) == 2
        txns.truncate(tp, 1)
        # Written again by the coordinator, at the new leader's epoch.
        assert (partition.leo, txns.aborted[tp]) == (2, [(1, pid, 0)])
        marker = partition.retained()[-1]
        decoded = DefaultRecordBatch(marker.data)
        assert decoded.is_control_batch
        assert decoded.validate_crc()
        assert (decoded.producer_id, decoded.producer_epoch, decoded.base_offset) == (pid, 0, 1)
        assert struct.unpack_from(">i", marker.data, BATCH_LEADER_EPOCH)[0] == 2
        assert txns.aborted_in(tp, 0, 2) == [(pid, 0)]
    finally:
        txns.close()
        groups.close()
        core.close()


# -- leadership and OffsetForLeaderEpoch -------------------------------------------------


def test_epoch_errors_are_kafkas() -> None:
    assert epoch_error(-1, 3) is ErrorCode.none
    assert epoch_error(3, 3) is ErrorCode.none
    assert epoch_error(2, 3) is ErrorCode.fenced_leader_epoch
    assert epoch_error(4, 3) is ErrorCode.unknown_leader_epoch


async def call(address: str, request: Any, response_type: type[Any]) -> Any:
    """``request`` on a new connection; its answer decoded."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        header_type = request.__header_schema__
        writer.write(encoded(request, 7, header_type=header_type, client_id="epoch-test"))
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        frame = await reader.readexactly(size)
        answer_header, used = entity_reader(response_type.__header_schema__)(frame, 0)
        assert answer_header.correlation_id == 7
        return entity_reader(response_type)(frame, used)[0]
    finally:
        writer.close()


def epoch_request(mod: Any, topic: str, *asked: tuple[int, int, int]) -> Any:
    return mod.OffsetForLeaderEpochRequest(
        topics=(
            mod.OffsetForLeaderTopic(
                topic=TopicName(topic),
                partitions=tuple(
                    mod.OffsetForLeaderPartition(
                        partition=i32(index),
                        current_leader_epoch=i32(current),
                        leader_epoch=i32(epoch),
                    )
                    for index, current, epoch in asked
                ),
            ),
        ),
    )


@pytest.mark.anyio
async def test_offset_for_leader_epoch_on_the_wire() -> None:
    assert SERVED[OFFSET_FOR_LEADER_EPOCH] == (2, 4)
    async with asyncio.timeout(20), KafkaBroker() as broker:
        broker.create_topic("e", 2)
        tp = TopicPartition("e", 0)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        await producer.start()
        try:
            await producer.send_and_wait("e", b"one", partition=0)
            await producer.send_and_wait("e", b"two", partition=0)
            assert broker.core.change_leader(tp, 2) == 1  # a new leader, same log
            await producer.send_and_wait("e", b"three", partition=0)
        finally:
            await producer.stop()
        last = broker.core.partitions[tp].retained()[-1]
        assert struct.unpack_from(">i", last.data, BATCH_LEADER_EPOCH)[0] == 1  # stamped
        asked = [(0, -1, 0), (0, 1, 1), (0, 0, 0), (0, 2, 0), (1, -1, 0), (1, -1, 5)]
        answers = collections.defaultdict(list)
        for mod, response in ((epoch_v2, EpochResponseV2), (epoch_v4, EpochResponseV4)):
            found = await call(broker.bootstrap, epoch_request(mod, "e", *asked), response)
            ((topic,),) = [found.topics]
            assert topic.topic == "e"
            for part in topic.partitions:
                answers[mod].append(
                    (part.partition, part.error_code, part.leader_epoch, part.end_offset)
                )
            unknown = await call(broker.bootstrap, epoch_request(mod, "nope", (0, -1, 0)), response)
            error = unknown.topics[0].partitions[0].error_code
            assert error is ErrorCode.unknown_topic_or_partition
        assert (
            answers[epoch_v2]
            == answers[epoch_v4]
            == [
                (0, ErrorCode.none, 0, 2),  # epoch 0 ended where epoch 1 began
                (0, ErrorCode.none, 1, 3),  # the current epoch: the log end
                (0, ErrorCode.fenced_leader_epoch, -1, -1),  # the client's epoch is older
                (0, ErrorCode.unknown_leader_epoch, -1, -1),  # newer than the broker's
                (1, ErrorCode.none, 0, 0),
                (1, ErrorCode.none, -1, -1),  # an epoch the partition never had
            ]
        )
