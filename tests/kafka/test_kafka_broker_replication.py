"""Replication and topic administration on the Kafka-protocol broker (aiopurgatory.kafka):
followers simulated in process (``--replicas``, ``--follower-delay-ms``) hold the high
watermark back, so acks=all waits (or times out) and consumers see only what every
replica has; CreateTopics and DeleteTopics from the three clients' admin APIs."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import confluent_kafka
import confluent_kafka.admin
import kafka.admin
import kafka.errors
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import RequestTimedOutError
from confluent_kafka.cimpl import NewTopic as ConfluentNewTopic
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11.response import FetchResponse
from kio.schema.produce.v8.response import ProduceResponse

from ..support.kafka_broker import OLD_DEFAULTS
from ..support.kafka_wire import (
    Wire,
    batch,
    create,
    fetch_from,
    fetch_request,
    produce_request,
    send,
)
from ..support.servers import start_server, stop_server

FOLLOWER_DELAY = 1.0


@pytest.fixture(scope="module")
def slow_broker() -> Iterator[str]:
    """Followers that take a second to write what they fetched."""
    process, address = start_server(
        "-m aiopurgatory.kafka",
        r"(127\.0\.0\.1:\d+)",
        *OLD_DEFAULTS,
        "--follower-delay-ms",
        str(int(FOLLOWER_DELAY * 1000)),
    )
    yield address
    assert stop_server(process) == 0


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    process, address = start_server("-m aiopurgatory.kafka", r"(127\.0\.0\.1:\d+)", *OLD_DEFAULTS)
    yield address
    assert stop_server(process) == 0


def test_acks_all_times_out_on_slow_followers_while_acks_1_succeeds(slow_broker: str) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    wire = Wire(slow_broker)
    try:
        create(wire, name)
        started = time.monotonic()
        leader_only = send(wire, name, [b"v"], acks=1, timeout=0.3)
        acks_1 = time.monotonic() - started
        started = time.monotonic()
        replicated = send(wire, name, [b"v"], acks=-1, timeout=0.3)
        acks_all = time.monotonic() - started
    finally:
        wire.sock.close()
    assert leader_only.error_code is ErrorCode.none
    assert acks_1 < 0.2
    assert replicated.error_code is ErrorCode.request_timed_out
    assert 0.3 <= acks_all < 0.3 + 0.5  # at the request's own timeout_ms
    print(
        f"acks=1 answered in {acks_1 * 1e3:.1f} ms; acks=all timed out in {acks_all * 1e3:.0f} ms"
    )


@pytest.mark.anyio
async def test_aiokafka_acks_all_against_slow_followers(slow_broker: str) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    async with asyncio.timeout(20):
        leader = AIOKafkaProducer(bootstrap_servers=slow_broker, acks=1)
        await leader.start()
        try:
            await leader.send_and_wait(name, b"fast", partition=0)
        finally:
            await leader.stop()
        # The scenario's setting: a request timeout below the followers' delay.
        replicated = AIOKafkaProducer(
            bootstrap_servers=slow_broker, acks="all", request_timeout_ms=400
        )
        await replicated.start()
        try:
            with pytest.raises(RequestTimedOutError):
                await replicated.send_and_wait(name, b"slow", partition=0)
        finally:
            await replicated.stop()


def test_consumers_see_only_what_every_replica_has(slow_broker: str) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    wire, consumer = Wire(slow_broker), Wire(slow_broker)
    try:
        create(wire, name)
        # The consumer parks first (nothing below the HW yet), then the record comes.
        consumer.send(fetch_request(name, 0, max_wait=5.0, min_bytes=1))
        time.sleep(0.2)
        assert send(wire, name, [b"v"], acks=1, timeout=5.0).error_code is ErrorCode.none
        produced = time.monotonic()
        response = consumer.receive(FetchResponse)
        waited = time.monotonic() - produced
    finally:
        wire.sock.close()
        consumer.sock.close()
    partition = response.responses[0].partitions[0]
    assert partition.error_code is ErrorCode.none
    assert partition.high_watermark == 1
    assert partition.records  # answered once the followers had it, not at max wait
    assert FOLLOWER_DELAY - 0.05 <= waited < FOLLOWER_DELAY + 0.5
    print(f"record visible to consumers {waited * 1e3:.0f} ms after acks=1 (follower delay 1000)")


def test_a_fetch_parked_on_a_deleted_topic_is_answered_at_once(broker: str) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    wire = Wire(broker)
    try:
        create(wire, name)
        wire.send(fetch_request(name, 0, max_wait=10.0, min_bytes=1))
        time.sleep(0.2)
        admin = kafka.admin.KafkaAdminClient(bootstrap_servers=broker)
        try:
            admin.delete_topics([name])
        finally:
            admin.close()
        deleted = time.monotonic()
        response = wire.receive(FetchResponse)
        waited = time.monotonic() - deleted
    finally:
        wire.sock.close()
    assert response.responses[0].partitions[0].error_code is ErrorCode.unknown_topic_or_partition
    assert waited < 0.5


@pytest.mark.anyio
async def test_aiokafka_admin_creates_and_deletes_topics(broker: str) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    async with asyncio.timeout(20):
        admin = AIOKafkaAdminClient(bootstrap_servers=broker)
        await admin.start()
        try:
            created = await admin.create_topics([NewTopic(name, 5, 3)])
            assert [t[1] for t in created.topic_errors] == [0]
            again = await admin.create_topics([NewTopic(name, 5, 3)])
            assert [t[1] for t in again.topic_errors] == [ErrorCode.topic_already_exists]
            bad = await admin.create_topics([NewTopic(name + "x", 1, 7)])
            assert [t[1] for t in bad.topic_errors] == [ErrorCode.invalid_replication_factor]
            assert name in await admin.list_topics()
            described = await admin.describe_topics([name])
            assert len(described[0]["partitions"]) == 5
            await admin.delete_topics([name])
            assert name not in await admin.list_topics()
        finally:
            await admin.close()


def test_kafka_python_admin_creates_and_deletes_topics(broker: str) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=broker)
    try:
        admin.create_topics([kafka.admin.NewTopic(name, 4, 3)])
        with pytest.raises(kafka.errors.TopicAlreadyExistsError):
            admin.create_topics([kafka.admin.NewTopic(name, 4, 3)])
        assert name in admin.list_topics()
        admin.delete_topics([name])
        assert name not in admin.list_topics()
    finally:
        admin.close()


def test_confluent_admin_creates_and_deletes_topics(broker: str) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": broker})
    for future in admin.create_topics([ConfluentNewTopic(name, 2, 3)]).values():
        assert future.result(10) is None
    assert len(admin.list_topics(name, timeout=10).topics[name].partitions) == 2
    again = admin.create_topics([ConfluentNewTopic(name, 2, 3)])
    with pytest.raises(confluent_kafka.KafkaException, match="already exists"):
        again[name].result(10)
    for future in admin.delete_topics([name]).values():
        assert future.result(10) is None
    assert name not in admin.list_topics(timeout=10).topics


def test_fetch_beyond_the_log_end_is_out_of_range_at_once(broker: str) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    wire = Wire(broker)
    try:
        create(wire, name)
        assert send(wire, name, [b"v"], acks=-1, timeout=5.0).error_code is ErrorCode.none
        started = time.monotonic()
        beyond = fetch_from(wire, name, 5, max_wait=5.0, min_bytes=1)
        waited = time.monotonic() - started
        at_end = fetch_from(wire, name, 1, max_wait=0.2, min_bytes=1)
    finally:
        wire.sock.close()
    assert beyond.error_code is ErrorCode.offset_out_of_range
    assert waited < 0.5  # not held for max_wait
    assert at_end.error_code is ErrorCode.none  # the log end itself is in range: it waits
    assert at_end.high_watermark == 1


def test_the_first_batch_comes_even_when_larger_than_the_limit(broker: str) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    wire = Wire(broker)
    try:
        create(wire, name)
        big = batch(-1, -1, [bytes(50_000)])
        request = produce_request([(name, [(0, big)])])
        produced = wire.call(request, ProduceResponse).responses[0].partition_responses[0]
        assert produced.error_code is ErrorCode.none
        answer = fetch_from(wire, name, 0, max_wait=1.0, min_bytes=1, partition_max=1000)
    finally:
        wire.sock.close()
    assert answer.error_code is ErrorCode.none
    assert len(answer.records) == len(big)  # KIP-74: the whole batch, not 1000 bytes
