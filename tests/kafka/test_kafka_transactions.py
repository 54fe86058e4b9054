"""Transactions (KIP-98) as aiokafka, confluent-kafka and kafka-python use them: commit,
abort, read_committed and read_uncommitted consumers, offsets sent in a transaction,
fencing, and the broker aborting a transaction past its timeout (issue 35).

Every wait is bounded by a watchdog (``asyncio.timeout``, the clients' own timeouts).
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import kafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError as AioKafkaError
from aiokafka.record.default_records import DefaultRecordBatch
from kio.schema.add_partitions_to_txn.v1 import request as add_partitions_v1
from kio.schema.add_partitions_to_txn.v1.response import (
    AddPartitionsToTxnResponse as AddPartitionsResponse,
)
from kio.schema.end_txn.v1 import request as end_txn_v1
from kio.schema.end_txn.v1.response import EndTxnResponse as EndTxnResponseV1
from kio.schema.end_txn.v2 import request as end_txn_v2
from kio.schema.end_txn.v2.response import EndTxnResponse as EndTxnResponseV2
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v1 import InitProducerIdRequest, InitProducerIdResponse
from kio.schema.offset_fetch.v7 import request as offset_fetch_v7
from kio.schema.offset_fetch.v7.response import OffsetFetchResponse as OffsetFetchResponseV7
from kio.schema.types import GroupId, ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32

from aiopurgatory.kafka import (
    BrokerCore,
    BrokerThread,
    GroupCoordinator,
    KafkaBroker,
    Limits,
    TopicPartition,
    protocol,
)
from aiopurgatory.kafka.producers import ProducerTable
from aiopurgatory.kafka.records import (
    CONTROL,
    TRANSACTIONAL,
    IncomingBatch,
    StoredBatch,
    control_batch,
)
from aiopurgatory.kafka.transactions import TransactionCoordinator
from aiopurgatory.testing import ManualClock

from ..support.kafka_broker import assert_unknown_server_error_at_every_version, produced
from ..support.kafka_wire import FlexibleWire, Wire, batch, fetch_from, name, produce_request
from ..support.kafka_wire import ms as wire_ms

WATCHDOG = 10.0
"""Seconds any one test waits at most for what it expects."""


async def read_values(
    bootstrap: str, topic: str, isolation: str, end: int, *, group: str | None = None
) -> list[bytes]:
    """Every value a consumer with ``isolation`` reads from ``topic``'s partition 0 until
    its position reaches ``end`` (markers and aborted records skipped)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=group,
    )
    await consumer.start()
    try:
        tp = AioTopicPartition(topic, 0)
        consumer.assign([tp])
        values: list[bytes] = []
        while await consumer.position(tp) < end:
            batches = await consumer.getmany(tp, timeout_ms=200)
            values.extend(record.value for record in batches.get(tp, []))
        return values
    finally:
        await consumer.stop()


async def transactional(
    bootstrap: str, transactional_id: str, **options: object
) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=transactional_id, **options
    )
    await producer.start()
    return producer


# -- aiokafka ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_aiokafka_commit_and_abort_read_committed_and_uncommitted() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic = name("t")
        producer = await transactional(broker.bootstrap, name("tx"))
        try:
            async with producer.transaction():
                await producer.send(topic, b"c1")
                await producer.send(topic, b"c2")
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"a1")
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send_and_wait(topic, b"c3")
        finally:
            await producer.stop()
        (offsets,) = broker.offsets(topic)
        assert broker.last_stable_offset(topic) == offsets.high_watermark
        committed = await read_values(
            broker.bootstrap, topic, "read_committed", offsets.high_watermark
        )
        assert committed == [b"c1", b"c2", b"c3"]
        everything = await read_values(
            broker.bootstrap, topic, "read_uncommitted", offsets.high_watermark
        )
        assert everything == [b"c1", b"c2", b"a1", b"c3"]


@pytest.mark.anyio
async def test_read_committed_waits_for_the_commit_and_list_offsets_answers_the_lso() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic = name("t")
        plain = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await plain.start()
        producer = await transactional(broker.bootstrap, name("tx"))
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            fetch_max_wait_ms=20_000,  # parked until the LSO moves, far longer than the test
        )
        try:
            await plain.send_and_wait(topic, b"before")  # offset 0
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"pending")  # offset 1, open
            tp = AioTopicPartition(topic, 0)
            assert broker.last_stable_offset(topic) == 1
            assert broker.offsets(topic)[0].high_watermark == 2
            await consumer.start()
            consumer.assign([tp])
            assert (await consumer.end_offsets([tp]))[tp] == 1  # ListOffsets: the LSO
            assert (await consumer.getone()).value == b"before"
            reader = asyncio.create_task(consumer.getone())
            await asyncio.sleep(0.3)  # the fetch parks in the purgatory meanwhile
            assert not reader.done()
            started = time.monotonic()
            await producer.commit_transaction()
            record = await reader
            assert record.value == b"pending"
            assert time.monotonic() - started < 5.0  # the commit completed the fetch
            assert broker.last_stable_offset(topic) == broker.offsets(topic)[0].high_watermark
        finally:
            await consumer.stop()
            await producer.stop()
            await plain.stop()


@pytest.mark.anyio
async def test_a_parked_read_committed_fetch_is_not_woken_by_an_open_transaction() -> None:
    # Found by aiokafka's own suite (test_consumer_transactional_commit): a read_committed
    # fetch already parked when a transactional batch arrives was completed with it, the
    # append waking the fetch before the open transaction held the LSO back.
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic = name("t")
        broker.create_topic(topic)
        producer = await transactional(broker.bootstrap, name("tx"))
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            fetch_max_wait_ms=20_000,
        )
        tp = AioTopicPartition(topic, 0)
        try:
            await consumer.start()
            consumer.assign([tp])
            reader = asyncio.create_task(consumer.getone())
            await asyncio.sleep(0.3)  # parked at offset 0
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"pending")
            assert broker.last_stable_offset(topic) == 0
            await asyncio.sleep(0.5)
            assert not reader.done()
            await producer.commit_transaction()
            assert (await reader).value == b"pending"
        finally:
            await consumer.stop()
            await producer.stop()


@pytest.mark.anyio
async def test_the_lso_is_never_below_the_log_start() -> None:
    """DeleteRecords and retention past an open transaction's first offset: the LSO is
    the log start (Kafka's UnifiedLog), for ListOffsets read_committed and Fetch."""
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic, other = name("t"), name("t")
        producer = await transactional(broker.bootstrap, name("tx"))
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=broker.bootstrap, isolation_level="read_committed"
        )
        await admin.start()
        await consumer.start()
        try:
            await producer.begin_transaction()
            for value in (b"p0", b"p1", b"p2"):
                await producer.send_and_wait(topic, value)  # offsets 0-2, open
            for _ in range(3):
                await producer.send_and_wait(other, b"x" * 100)
            tp, other_tp = AioTopicPartition(topic, 0), AioTopicPartition(other, 0)
            assert broker.last_stable_offset(topic) == 0
            assert await admin.delete_records({tp: RecordsToDelete(2)}) == {tp: 2}
            assert broker.last_stable_offset(topic) == 2
            assert await consumer.end_offsets([tp, other_tp]) == {tp: 2, other_tp: 0}
            resource = ConfigResource(ConfigResourceType.TOPIC, other, {"retention.bytes": "0"})
            await admin.alter_configs([resource])  # only the newest batch stays
            assert broker.offsets(other)[0].log_start == 2
            assert await consumer.end_offsets([other_tp]) == {other_tp: 2}
            wire = Wire(broker.bootstrap)
            try:
                answer = await asyncio.to_thread(committed_fetch, wire, topic, 2)
            finally:
                wire.sock.close()
            assert answer.error_code is ErrorCode.none
            assert (answer.log_start_offset, answer.last_stable_offset) == (2, 2)
            assert answer.records is None or len(answer.records) == 0
            await producer.commit_transaction()
            assert await consumer.end_offsets([tp]) == {tp: 4}  # the marker at 3
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            assert (await consumer.getone()).value == b"p2"
        finally:
            await consumer.stop()
            await admin.close()
            await producer.stop()


@pytest.mark.anyio
async def test_aiokafka_offsets_sent_in_a_transaction_are_visible_at_commit_only() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic, group, tid = name("t"), name("g"), name("tx")
        broker.create_topic(topic)
        producer = await transactional(broker.bootstrap, tid)
        tp = AioTopicPartition(topic, 0)
        try:
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"out")
            await producer.send_offsets_to_transaction({tp: 5}, group)
            assert broker.committed(group) == {}
            assert broker.transaction(tid).pending_offsets == {group: {TopicPartition(topic, 0): 5}}
            await producer.commit_transaction()
            assert broker.committed(group) == {TopicPartition(topic, 0): 5}
            # An aborted transaction's offsets are dropped.
            await producer.begin_transaction()
            await producer.send_offsets_to_transaction({tp: 9}, group)
            await producer.abort_transaction()
            assert broker.committed(group) == {TopicPartition(topic, 0): 5}
            assert broker.transaction(tid).state == "CompleteAbort"
        finally:
            await producer.stop()


@pytest.mark.anyio
async def test_a_second_producer_with_the_same_id_fences_the_first() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic, tid = name("t"), name("tx")
        first = await transactional(broker.bootstrap, tid)
        second = None
        try:
            await first.begin_transaction()
            await first.send_and_wait(topic, b"zombie")
            epoch = broker.transaction(tid).producer_epoch
            second = await transactional(broker.bootstrap, tid)
            info = broker.transaction(tid)
            assert info.producer_epoch == epoch + 1
            assert info.state == "Empty"  # the old epoch's transaction was aborted first
            with pytest.raises(AioKafkaError):
                await first.commit_transaction()
            async with second.transaction():
                await second.send_and_wait(topic, b"live")
            end = broker.offsets(topic)[0].high_watermark
            assert await read_values(broker.bootstrap, topic, "read_committed", end) == [b"live"]
        finally:
            await first.stop()
            if second is not None:
                await second.stop()


@pytest.mark.anyio
async def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() -> None:
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic, tid = name("t"), name("tx")
        producer = await transactional(broker.bootstrap, tid, transaction_timeout_ms=300)
        try:
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"late")
            epoch = broker.transaction(tid).producer_epoch
            assert broker.transaction(tid).state == "Ongoing"
            assert broker.transactions.purgatory.num_delayed() == 1
            timer = broker.transactions.transactions[tid].timer
            assert timer is not None
            await timer  # the DelayedTxnTimeout expires: the abort ran before it wakes us
            assert timer.expired
            info = broker.transaction(tid)
            assert info.state == "CompleteAbort"
            assert info.producer_epoch == epoch + 1
            assert broker.transactions.purgatory.num_delayed() == 0
            assert broker.last_stable_offset(topic) == broker.offsets(topic)[0].high_watermark
            with pytest.raises(AioKafkaError):
                await producer.commit_transaction()
        finally:
            await producer.stop()
        end = broker.offsets(topic)[0].high_watermark
        assert await read_values(broker.bootstrap, topic, "read_committed", end) == []


# -- confluent-kafka and kafka-python (blocking clients, the broker in a thread) --------


def confluent_values(bootstrap: str, topic: str, isolation: str, count: int) -> list[bytes]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": name("reader"),
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + WATCHDOG
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                value = message.value()
                assert isinstance(value, bytes)
                values.append(value)
        return values
    finally:
        consumer.close()


def test_confluent_kafka_transactions() -> None:
    with BrokerThread() as bootstrap:
        topic, group, tid = name("t"), name("g"), name("tx")
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": tid}
        )
        producer.init_transactions(WATCHDOG)
        producer.begin_transaction()
        producer.produce(topic, b"c1")
        producer.commit_transaction(WATCHDOG)
        producer.begin_transaction()
        producer.produce(topic, b"a1")
        producer.flush(WATCHDOG)
        producer.abort_transaction(WATCHDOG)
        group_consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group}
        )
        try:
            producer.begin_transaction()
            producer.produce(topic, b"c2")
            producer.send_offsets_to_transaction(
                [confluent_kafka.TopicPartition(topic, 0, 7)],
                group_consumer.consumer_group_metadata(),
                WATCHDOG,
            )
            producer.commit_transaction(WATCHDOG)
        finally:
            group_consumer.close()
        assert confluent_values(bootstrap, topic, "read_committed", 2) == [b"c1", b"c2"]
        assert confluent_values(bootstrap, topic, "read_uncommitted", 3) == [b"c1", b"a1", b"c2"]


def test_confluent_kafka_fencing_and_committed_offsets() -> None:
    with BrokerThread() as bootstrap:
        thread_topic, group, tid = name("t"), name("g"), name("tx")
        first = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
        first.init_transactions(WATCHDOG)
        first.begin_transaction()
        first.produce(thread_topic, b"zombie")
        first.flush(WATCHDOG)
        second = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": tid})
        second.init_transactions(WATCHDOG)
        with pytest.raises(confluent_kafka.KafkaException) as raised:
            first.commit_transaction(WATCHDOG)
        assert raised.value.args[0].fatal()
        group_consumer = confluent_kafka.Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group}
        )
        try:
            second.begin_transaction()
            second.produce(thread_topic, b"live")
            second.send_offsets_to_transaction(
                [confluent_kafka.TopicPartition(thread_topic, 0, 3)],
                group_consumer.consumer_group_metadata(),
                WATCHDOG,
            )
            second.commit_transaction(WATCHDOG)
        finally:
            group_consumer.close()
        assert confluent_values(bootstrap, thread_topic, "read_committed", 1) == [b"live"]


def fetch_offsets(bootstrap: str, group: str, topic: str, require_stable: bool) -> list[Any]:
    """OffsetFetch v7 of partitions 0 and 1: (error, offset) of each."""
    wire = FlexibleWire(bootstrap)
    try:
        request = offset_fetch_v7.OffsetFetchRequest(
            group_id=GroupId(group),
            topics=(
                offset_fetch_v7.OffsetFetchRequestTopic(
                    name=TopicName(topic), partition_indexes=(i32(0), i32(1))
                ),
            ),
            require_stable=require_stable,
        )
        answer = wire.call(request, OffsetFetchResponseV7)
        assert answer.error_code is ErrorCode.none
        return [(p.error_code, p.committed_offset) for p in answer.topics[0].partitions]
    finally:
        wire.sock.close()


@pytest.mark.anyio
async def test_offset_fetch_require_stable_answers_unstable_offset_commit() -> None:
    """KIP-447: OffsetFetch v7 with require_stable answers UNSTABLE_OFFSET_COMMIT (88)
    for a partition whose transactional offset commit is pending, until the transaction
    ends; without require_stable, the last committed offset."""
    async with asyncio.timeout(WATCHDOG), KafkaBroker() as broker:
        topic, group = name("t"), name("g")
        broker.create_topic(topic, 2)
        producer = await transactional(broker.bootstrap, name("tx"))
        try:
            await producer.begin_transaction()
            await producer.send_offsets_to_transaction({AioTopicPartition(topic, 0): 3}, group)
            unstable = await asyncio.to_thread(fetch_offsets, broker.bootstrap, group, topic, True)
            assert unstable == [(ErrorCode.unstable_offset_commit, -1), (ErrorCode.none, -1)]
            loose = await asyncio.to_thread(fetch_offsets, broker.bootstrap, group, topic, False)
            assert loose == [(ErrorCode.none, -1), (ErrorCode.none, -1)]
            await producer.commit_transaction()
            stable = await asyncio.to_thread(fetch_offsets, broker.bootstrap, group, topic, True)
            assert stable == [(ErrorCode.none, 3), (ErrorCode.none, -1)]
            await producer.begin_transaction()
            await producer.send_offsets_to_transaction({AioTopicPartition(topic, 1): 5}, group)
            await producer.abort_transaction()
            aborted = await asyncio.to_thread(fetch_offsets, broker.bootstrap, group, topic, True)
            assert aborted == [(ErrorCode.none, 3), (ErrorCode.none, -1)]
        finally:
            await producer.stop()


def test_a_confluent_read_committed_consumer_waits_for_a_pending_offset_commit() -> None:
    """librdkafka sets require_stable with isolation.level=read_committed: it retries
    UNSTABLE_OFFSET_COMMIT and starts from the offset the transaction commits, not from
    auto.offset.reset."""
    with BrokerThread() as bootstrap:
        topic, group = name("t"), name("g")
        plain = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
        for index in range(5):
            plain.produce(topic, b"%d" % index)
        assert plain.flush(WATCHDOG) == 0
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": name("tx")}
        )
        producer.init_transactions(WATCHDOG)
        producer.begin_transaction()
        metadata = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            producer.send_offsets_to_transaction(
                [confluent_kafka.TopicPartition(topic, 0, 3)],
                metadata.consumer_group_metadata(),
                WATCHDOG,
            )
        finally:
            metadata.close()
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.assign([confluent_kafka.TopicPartition(topic, 0)])
            assert consumer.poll(1.0) is None  # its OffsetFetch answered UNSTABLE_OFFSET_COMMIT
            producer.commit_transaction(WATCHDOG)
            deadline = time.monotonic() + WATCHDOG
            message = None
            while message is None and time.monotonic() < deadline:
                message = consumer.poll(0.2)
            assert message is not None
            assert message.error() is None
            assert (message.offset(), message.value()) == (3, b"3")
        finally:
            consumer.close()


def test_kafka_python_transactions() -> None:
    with BrokerThread() as bootstrap:
        topic, group, tid = name("t"), name("g"), name("tx")
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(topic, b"c1")
            producer.commit_transaction()
            producer.begin_transaction()
            producer.send(topic, b"a1").get(timeout=WATCHDOG)
            producer.abort_transaction()
            producer.begin_transaction()
            producer.send(topic, b"c2")
            producer.send_offsets_to_transaction(
                {kafka.TopicPartition(topic, 0): kafka.OffsetAndMetadata(4, "", -1)}, group
            )
            producer.commit_transaction()
        finally:
            producer.close(timeout=5)
        consumer = kafka.KafkaConsumer(
            bootstrap_servers=bootstrap,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            consumer_timeout_ms=2000,
        )
        try:
            consumer.assign([kafka.TopicPartition(topic, 0)])
            values: list[bytes] = []
            deadline = time.monotonic() + WATCHDOG
            while len(values) < 2 and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=200).values():
                    values.extend(record.value for record in records)
            assert values == [b"c1", b"c2"]
        finally:
            consumer.close()


def test_kafka_python_fencing() -> None:
    with BrokerThread() as bootstrap:
        topic, tid = name("t"), name("tx")
        first = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
        second = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
        try:
            first.init_transactions()
            first.begin_transaction()
            first.send(topic, b"zombie").get(timeout=WATCHDOG)
            second.init_transactions()
            with pytest.raises(kafka.errors.KafkaError):
                first.commit_transaction()
            second.begin_transaction()
            second.send(topic, b"live")
            second.commit_transaction()
        finally:
            first.close(timeout=5)
            second.close(timeout=5)


# -- the coordinator's refusals and the markers -----------------------------------------


def test_a_marker_is_a_valid_control_batch_the_clients_decode() -> None:
    batch = DefaultRecordBatch(
        bytes(control_batch(1234, 5, commit=True, coordinator_epoch=0, timestamp=99))
    )
    assert batch.validate_crc()
    assert batch.is_control_batch
    assert batch.is_transactional
    assert (batch.producer_id, batch.producer_epoch) == (1234, 5)
    (record,) = list(batch)
    assert record.key == b"\x00\x00\x00\x01"  # version 0, type 1: commit
    assert record.value == b"\x00\x00\x00\x00\x00\x00"  # version 0, coordinator epoch 0


@pytest.mark.anyio
async def test_refused_requests_change_nothing() -> None:
    async with KafkaBroker(
        transaction_max_timeout_ms=5000, max_transactional_ids=2, max_transaction_partitions=2
    ) as broker:
        txns = broker.transactions
        fenced = ErrorCode.producer_fenced
        assert (
            txns.init_producer("a", 6000, -1, -1, fenced)[0]
            is ErrorCode.invalid_transaction_timeout
        )
        assert "a" not in txns.transactions
        assert txns.init_producer("", 5000, -1, -1, fenced)[0] is ErrorCode.invalid_request
        assert txns.check("", 1000, 0, fenced) is ErrorCode.invalid_request
        error, pid, epoch = txns.init_producer("a", 5000, -1, -1, fenced)
        assert (error, epoch) == (ErrorCode.none, 0)
        assert txns.init_producer("b", 5000, -1, -1, fenced)[0] is ErrorCode.none
        # The table of transactional ids is full (of idle ids: a new one would take the
        # least recently used one's place, tests/kafka/test_kafka_hostile_tables.py); a refused
        # InitProducerId takes no place.
        assert (
            txns.init_producer("c", 6000, -1, -1, fenced)[0]
            is ErrorCode.invalid_transaction_timeout
        )
        assert sorted(txns.transactions) == ["a", "b"]
        # A transactional batch to a partition its transaction did not add is refused.
        broker.create_topic("t", 3)
        batch = IncomingBatch(bytearray(), 1, 0, pid, 0, 0, transactional=True)
        assert txns.produce_error(TopicPartition("t", 0), batch) is ErrorCode.invalid_txn_state
        txn = txns.transactions["a"]
        partitions = [TopicPartition("t", i) for i in range(3)]
        # More partitions than a transaction may hold: refused whole.
        assert set(txns.add_partitions(txn, partitions).values()) == {ErrorCode.invalid_request}
        assert txn.state.value == "Empty"
        assert not txn.partitions
        # An unknown partition: refused, the others not attempted, nothing added.
        errors = txns.add_partitions(txn, [TopicPartition("t", 0), TopicPartition("nope", 0)])
        assert errors == {
            TopicPartition("t", 0): ErrorCode.operation_not_attempted,
            TopicPartition("nope", 0): ErrorCode.unknown_topic_or_partition,
        }
        assert not txn.partitions
        assert txns.add_partitions(txn, partitions[:1]) == {partitions[0]: ErrorCode.none}
        assert txns.produce_error(partitions[0], batch) is ErrorCode.none
        old = IncomingBatch(bytearray(), 1, 0, pid, 0, 0, transactional=True)
        # A new producer with the id: the open transaction aborted, the old epoch fenced.
        assert txns.init_producer("a", 5000, -1, -1, fenced)[2] == 1
        assert txns.produce_error(partitions[0], old) is ErrorCode.invalid_producer_epoch
        assert txns.check("a", pid, 0, fenced) is fenced
        assert txns.check("a", pid + 99, 1, fenced) is ErrorCode.invalid_producer_id_mapping
        # Ending what is not open: INVALID_TXN_STATE.
        assert txns.end(txn, commit=True) is ErrorCode.invalid_txn_state
        # Offsets: only for a group the transaction added, and bounded.
        assert txns.add_partitions(txn, []) == {}
        assert txn.state.value == "Empty"  # nothing added, nothing begun
        assert txns.commit_offsets(txn, "g", {("t", 0): (1, "")}) is ErrorCode.invalid_txn_state
        assert txns.add_offsets(txn, "g") is ErrorCode.none
        assert txns.commit_offsets(txn, "h", {("t", 0): (1, "")}) is ErrorCode.invalid_txn_state
        many = {("t", i): (i, "") for i in range(3)}
        small = Limits(max_transaction_offsets=2)
        txns.limits = small
        assert txns.commit_offsets(txn, "g", many) is ErrorCode.invalid_request
        assert txn.pending == {}
        assert txns.commit_offsets(txn, "g", dict(list(many.items())[:2])) is ErrorCode.none
        assert txns.end(txn, commit=False) is ErrorCode.none
        assert broker.committed("g") == {}  # aborted: dropped
        assert txns.end(txn, commit=False) is ErrorCode.none  # a retry
        assert txns.end(txn, commit=True) is ErrorCode.invalid_txn_state


@pytest.mark.anyio
async def test_a_failing_transaction_api_answers_unknown_server_error_at_every_version() -> None:
    async with KafkaBroker() as broker:
        topics = (SimpleNamespace(name="t", partitions=(SimpleNamespace(partition_index=3),)),)
        requests = {
            protocol.INIT_PRODUCER_ID: SimpleNamespace(),
            protocol.ADD_PARTITIONS_TO_TXN: SimpleNamespace(
                v3_and_below_topics=(SimpleNamespace(name="t", partitions=(3,)),)
            ),
            protocol.ADD_OFFSETS_TO_TXN: SimpleNamespace(),
            protocol.END_TXN: SimpleNamespace(),
            protocol.TXN_OFFSET_COMMIT: SimpleNamespace(topics=topics),
        }
        for api_key, request in requests.items():
            assert_unknown_server_error_at_every_version(broker, api_key, request)


@pytest.mark.anyio
async def test_timeouts_and_expiry_on_virtual_time() -> None:
    """The DelayedTxnTimeout aborts an open transaction at its timeout exactly (writing
    an abort marker with the bumped epoch); an idle transactional id is forgotten after
    ``transactional_id_expiration_ms``, its producer id with it."""
    clock = ManualClock()
    core: BrokerCore[StoredBatch] = BrokerCore(followers=0)
    limits = Limits(transactional_id_expiration_ms=60_000)
    groups = GroupCoordinator()
    producers = ProducerTable(max_producer_states=10)
    txns = TransactionCoordinator(core, producers, groups, limits, clock=clock)
    try:
        core.create_topic("t", 1)
        tp = TopicPartition("t", 0)
        error, pid, epoch = txns.init_producer("a", 1000, -1, -1, ErrorCode.producer_fenced)
        assert (error, epoch) == (ErrorCode.none, 0)
        txn = txns.transactions["a"]
        assert txns.add_partitions(txn, [tp]) == {tp: ErrorCode.none}
        batch = IncomingBatch(bytearray(), 1, 0, pid, 0, 0, transactional=True)
        txns.appended(tp, batch, 0)  # as the produce path does after appending at 0
        partition = core.partitions[tp]
        assert txns.lso(partition) == 0
        await clock.advance(0.999)
        assert txn.state.value == "Ongoing"
        await clock.advance(0.002)
        assert txn.state.value == "CompleteAbort"
        assert txn.epoch == 1  # the producer at epoch 0 is fenced
        assert partition.leo == 1  # the abort marker
        (marker,) = partition.retained()
        decoded = DefaultRecordBatch(marker.data)
        assert decoded.is_control_batch
        assert (decoded.producer_id, decoded.producer_epoch) == (pid, 1)
        assert txns.aborted_in(tp, 0, 1) == [(pid, 0)]
        assert txns.lso(partition) == partition.hw
        # Idle: forgotten after the expiration, not before.
        await clock.advance(59.9)
        assert "a" in txns.transactions
        await clock.advance(0.2)
        assert "a" not in txns.transactions
        assert pid not in txns.by_producer
    finally:
        txns.close()
        groups.close()
        core.close()


# -- on the wire: what the clients never send ------------------------------------------


def committed_fetch(wire: Wire, topic: str, offset: int = 0) -> Any:
    """A read_committed Fetch v11 of partition 0 from ``offset``, answered at once."""
    return fetch_from(wire, topic, offset, isolation=1, max_bytes=0x7FFFFFFF)


WIRE_TID = TransactionalId("w-tx")


def test_on_the_wire_unadded_partitions_control_batches_lso_and_fenced_versions() -> None:
    thread = BrokerThread()
    with thread as bootstrap:
        thread.create_topic("w", 2)
        wire = Wire(bootstrap)
        try:
            init = wire.call(
                InitProducerIdRequest(transactional_id=WIRE_TID, transaction_timeout=wire_ms(60)),
                InitProducerIdResponse,
            )
            assert (init.error_code, init.producer_epoch) == (ErrorCode.none, 0)
            pid = int(init.producer_id)
            data = batch(pid, 0, [b"v"], attributes=TRANSACTIONAL)
            # Not added to the transaction: refused, nothing appended.
            assert produced(wire, produce_request([("w", [(0, data)])])) == [
                (ErrorCode.invalid_txn_state, -1)
            ]
            added = wire.call(
                add_partitions_v1.AddPartitionsToTxnRequest(
                    v3_and_below_transactional_id=WIRE_TID,
                    v3_and_below_producer_id=ProducerId(pid),
                    v3_and_below_producer_epoch=i16(0),
                    v3_and_below_topics=(
                        add_partitions_v1.AddPartitionsToTxnTopic(
                            name=TopicName("w"), partitions=(i32(0),)
                        ),
                    ),
                ),
                AddPartitionsResponse,
            )
            result = added.results_by_topic_v3_and_below[0].results_by_partition[0]
            assert result.partition_error_code is ErrorCode.none
            # A control batch is the coordinator's to write.
            control = batch(pid, 0, [b"v"], attributes=TRANSACTIONAL | CONTROL)
            assert produced(wire, produce_request([("w", [(0, control)])])) == [
                (ErrorCode.invalid_record, -1)
            ]
            assert produced(wire, produce_request([("w", [(0, data), (1, data)])])) == [
                (ErrorCode.none, 0),
                (ErrorCode.invalid_txn_state, -1),
            ]
            pending = committed_fetch(wire, "w")
            assert (pending.high_watermark, pending.last_stable_offset) == (1, 0)
            assert pending.records == b""  # nothing below the LSO yet
            end = wire.call(
                end_txn_v1.EndTxnRequest(
                    transactional_id=WIRE_TID,
                    producer_id=ProducerId(pid),
                    producer_epoch=i16(0),
                    committed=False,
                ),
                EndTxnResponseV1,
            )
            assert end.error_code is ErrorCode.none
            aborted = committed_fetch(wire, "w")
            assert (aborted.high_watermark, aborted.last_stable_offset) == (2, 2)
            assert [(t.producer_id, t.first_offset) for t in aborted.aborted_transactions] == [
                (pid, 0)
            ]
            # A second producer: the first one's epoch 0 is fenced, as its version says.
            wire.call(
                InitProducerIdRequest(transactional_id=WIRE_TID, transaction_timeout=wire_ms(60)),
                InitProducerIdResponse,
            )
            for request, response, code in (
                (end_txn_v1, EndTxnResponseV1, ErrorCode.invalid_producer_epoch),
                (end_txn_v2, EndTxnResponseV2, ErrorCode.producer_fenced),
            ):
                stale = wire.call(
                    request.EndTxnRequest(
                        transactional_id=WIRE_TID,
                        producer_id=ProducerId(pid),
                        producer_epoch=i16(0),
                        committed=True,
                    ),
                    response,
                )
                assert stale.error_code is code
            assert thread.transaction("w-tx").producer_epoch == 1
        finally:
            wire.sock.close()
