"""The admin APIs (issue 35): groups, configs, partitions, records and the cluster, through
aiokafka's, confluent-kafka's and kafka-python's admin clients, and raw frames for the
refusals a client would not send."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import confluent_kafka
import kafka
import kafka.admin
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigSource,
)
from confluent_kafka.admin._config import ConfigResource as ConfluentConfigResource
from confluent_kafka.cimpl import NewPartitions as ConfluentNewPartitions
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.api_versions.v0.response import ApiVersionsResponse
from kio.schema.create_partitions.v1 import request as create_partitions
from kio.schema.create_partitions.v1.response import CreatePartitionsResponse
from kio.schema.create_topics.v4 import request as create_topics
from kio.schema.create_topics.v4.response import CreateTopicsResponse
from kio.schema.delete_groups.v1 import request as delete_groups
from kio.schema.delete_groups.v1.response import DeleteGroupsResponse
from kio.schema.delete_records.v1 import request as delete_records
from kio.schema.delete_records.v1.response import DeleteRecordsResponse
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v0 import request as incremental
from kio.schema.incremental_alter_configs.v0.response import IncrementalAlterConfigsResponse
from kio.schema.metadata.v8 import request as metadata
from kio.schema.metadata.v8.response import MetadataResponse
from kio.schema.offset_delete.v0 import request as offset_delete
from kio.schema.offset_delete.v0.response import OffsetDeleteResponse
from kio.schema.types import GroupId, TopicName
from kio.serial import entity_reader
from kio.static.primitive import i8, i16, i32, i64

from aiopurgatory.kafka import (
    BrokerCore,
    BrokerThread,
    KafkaBroker,
    Limits,
    TopicPartition,
    protocol,
)
from aiopurgatory.kafka.admin_api import subscription_topics
from aiopurgatory.kafka.configs import ConfigError, check_topic_configs
from aiopurgatory.kafka.protocol import SERVED

from ..support.kafka_broker import offsets, produced
from ..support.kafka_wire import Wire, batch, create, fetch_from, ms, produce_request

ADMIN_APIS = {15: (0, 5), 16: (0, 5), 21: (0, 2), 32: (1, 4), 33: (0, 2)}
ADMIN_APIS |= {37: (0, 3), 42: (0, 2), 44: (0, 1), 47: (0, 0), 60: (0, 1)}


@pytest.fixture(scope="module")
def thread() -> Iterator[BrokerThread]:
    broker = BrokerThread()
    broker.start()
    yield broker
    broker.stop()


def name() -> str:
    return f"a-{uuid.uuid4().hex[:10]}"


def fill(wire: Wire, topic: str, batches: int, partition: int = 0) -> None:
    """``batches`` batches of one 100-byte record each, acks=1."""
    for _ in range(batches):
        request = produce_request([(topic, [(partition, batch(-1, -1, [b"x" * 100]))])], acks=1)
        assert produced(wire, request)[0][0] is ErrorCode.none


def stable(thread: BrokerThread, group: str) -> bool:
    return group in thread.list_groups() and thread.group(group).state == "Stable"


def earliest(wire: Wire, topic: str, partition: int = 0) -> int:
    ((error, _, offset),) = offsets(wire, [(topic, partition, -2)])
    assert error is ErrorCode.none
    return offset


def fetch_error(wire: Wire, topic: str, offset: int) -> ErrorCode:
    error: ErrorCode = fetch_from(wire, topic, offset).error_code
    return error


def set_config(wire: Wire, topic: str, key: str, value: str, validate_only: bool = False) -> Any:
    request = incremental.IncrementalAlterConfigsRequest(
        resources=(
            incremental.AlterConfigsResource(
                resource_type=i8(2),
                resource_name=topic,
                configs=(
                    incremental.AlterableConfig(name=key, config_operation=i8(0), value=value),
                ),
            ),
        ),
        validate_only=validate_only,
    )
    return wire.call(request, IncrementalAlterConfigsResponse).responses[0]


# -- versions, metadata -----------------------------------------------------------------


def test_api_versions_list_the_admin_apis(thread: BrokerThread) -> None:
    assert {key: SERVED[key] for key in ADMIN_APIS} == ADMIN_APIS
    wire = Wire(thread.bootstrap)
    try:
        answer = wire.call(ApiVersionsRequest(), ApiVersionsResponse)
        listed = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in answer.api_keys}
        assert {key: listed[key] for key in ADMIN_APIS} == ADMIN_APIS
    finally:
        wire.sock.close()


def test_consumer_offsets_is_internal_and_not_writable(thread: BrokerThread) -> None:
    wire = Wire(thread.bootstrap)
    try:
        answer = wire.call(
            metadata.MetadataRequest(
                topics=None,
                allow_auto_topic_creation=True,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            ),
            MetadataResponse,
        )
        internal = {t.name: t for t in answer.topics}["__consumer_offsets"]
        assert internal.is_internal
        assert len(internal.partitions) == 50
        request = produce_request([("__consumer_offsets", [(0, batch(-1, -1, [b"x"]))])])
        assert produced(wire, request) == [(ErrorCode.invalid_topic_exception, -1)]
    finally:
        wire.sock.close()
    assert "__consumer_offsets" not in thread.topics  # no topic was made of it
    admin = AdminClient({"bootstrap.servers": thread.bootstrap})
    listed = admin.list_topics(timeout=5).topics
    assert "__consumer_offsets" in listed  # librdkafka lists it; consumers skip it


# -- DescribeGroups, ListGroups, DeleteGroups, OffsetDelete ------------------------------


@pytest.mark.anyio
async def test_aiokafka_admin_describes_and_lists_groups() -> None:
    topic, group = name(), name()
    async with asyncio.timeout(15), KafkaBroker() as broker:
        broker.create_topic(topic)
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group)
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await consumer.start()
        await admin.start()
        try:
            while not consumer.assignment():
                await consumer.getmany(timeout_ms=20)  # the group joins in the background
            assert (group, "consumer") in await admin.list_consumer_groups()
            (described,) = await admin.describe_consumer_groups([group])
            ((error, group_id, state, protocol_type, protocol, members, *_),) = described.groups
            assert (error, group_id, state, protocol_type, protocol) == (
                0,
                group,
                "Stable",
                "consumer",
                "roundrobin",
            )
            assert len(members) == 1
            await consumer.commit({AioTopicPartition(topic, 0): 0})
            await consumer.stop()
            (described,) = await admin.describe_consumer_groups([group])
            assert described.groups[0][2] == "Empty"
            (unknown,) = await admin.describe_consumer_groups([name()])
            assert unknown.groups[0][2] == "Dead"
        finally:
            await consumer.stop()
            await admin.close()


def test_confluent_admin_lists_describes_and_deletes_groups(thread: BrokerThread) -> None:
    topic, group = name(), name()
    thread.create_topic(topic)
    admin = AdminClient({"bootstrap.servers": thread.bootstrap})
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": thread.bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 10
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.05)
        listed = admin.list_consumer_groups().result(5)
        assert group in {g.group_id for g in listed.valid}
        empty = {confluent_kafka.ConsumerGroupState.EMPTY}
        listed = admin.list_consumer_groups(states=empty).result(5)
        assert group not in {g.group_id for g in listed.valid}  # ListGroups v4's filter
        described = admin.describe_consumer_groups([group])[group].result(5)
        assert described.state == confluent_kafka.ConsumerGroupState.STABLE
        assert len(described.members) == 1
        assert described.coordinator.id == 0
        # A group with members stays: GROUP_NOT_EMPTY (Kafka's NON_EMPTY_GROUP, 68).
        with pytest.raises(confluent_kafka.KafkaException, match="NON_EMPTY_GROUP"):
            admin.delete_consumer_groups([group])[group].result(5)
        consumer.commit(offsets=[confluent_kafka.TopicPartition(topic, 0, 0)], asynchronous=False)
        consumer.close()
        assert thread.committed(group)
        assert admin.delete_consumer_groups([group])[group].result(5) is None
        assert group not in thread.list_groups()  # its offsets went with it
        with pytest.raises(confluent_kafka.KafkaException, match="GROUP_ID_NOT_FOUND"):
            admin.delete_consumer_groups([group])[group].result(5)
    finally:
        consumer.close()


def test_an_emptied_consumer_group_keeps_its_protocol_type(thread: BrokerThread) -> None:
    # Kafka keeps "consumer" once the last member left; librdkafka calls a group without
    # a protocol type a simple consumer group (KafkaJS's listGroups showed "" here).
    topic, group, committed_only = name(), name(), name()
    thread.create_topic(topic)
    admin = AdminClient({"bootstrap.servers": thread.bootstrap})
    consumer = confluent_kafka.Consumer({"bootstrap.servers": thread.bootstrap, "group.id": group})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 10
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.05)
        consumer.commit(offsets=[confluent_kafka.TopicPartition(topic, 0, 0)], asynchronous=False)
        consumer.close()
        # Offsets only, never a member: no protocol type, as in Kafka.
        admin.alter_consumer_group_offsets(
            [
                confluent_kafka.ConsumerGroupTopicPartitions(
                    committed_only, [confluent_kafka.TopicPartition(topic, 0, 0)]
                )
            ]
        )[committed_only].result(5)
        assert thread.group(group).state == "Empty"
        assert thread.group(group).protocol_type == "consumer"
        listed = {g.group_id: g for g in admin.list_consumer_groups().result(5).valid}
        assert listed[group].is_simple_consumer_group is False
        assert listed[committed_only].is_simple_consumer_group is True
        described = admin.describe_consumer_groups([group])[group].result(5)
        assert described.is_simple_consumer_group is False
    finally:
        consumer.close()


def test_kafka_python_deletes_offsets_of_unsubscribed_topics(thread: BrokerThread) -> None:
    subscribed, other, group = name(), name(), name()
    thread.create_topic(subscribed)
    thread.create_topic(other)
    tps = [kafka.TopicPartition(subscribed, 0), kafka.TopicPartition(other, 0)]
    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=thread.bootstrap)
    consumer = None
    try:
        # Committed while the group is empty, then a member subscribes to one topic.
        admin.alter_group_offsets(group, {tp: kafka.OffsetAndMetadata(1, "", -1) for tp in tps})
        consumer = kafka.KafkaConsumer(
            subscribed, bootstrap_servers=thread.bootstrap, group_id=group, enable_auto_commit=False
        )
        deadline = time.monotonic() + 10
        while not stable(thread, group) and time.monotonic() < deadline:
            consumer.poll(timeout_ms=50)
        answer = admin.delete_group_offsets(group, tps)
        assert answer[tps[0]] is kafka.errors.GroupSubscribedToTopicError
        assert answer[tps[1]] is kafka.errors.NoError
        assert set(thread.committed(group)) == {(subscribed, 0)}
        cluster = admin.describe_cluster()
        assert cluster["cluster_id"] == "aiopurgatory-kafka-broker"
        assert [b["broker_id"] for b in cluster["brokers"]] == [0]
    finally:
        if consumer is not None:
            consumer.close()
        admin.close()


def test_group_admin_refusals_on_raw_frames(thread: BrokerThread) -> None:
    wire = Wire(thread.bootstrap)
    try:
        unknown = wire.call(
            offset_delete.OffsetDeleteRequest(group_id=GroupId(name()), topics=()),
            OffsetDeleteResponse,
        )
        assert unknown.error_code is ErrorCode.group_id_not_found
        answer = wire.call(
            delete_groups.DeleteGroupsRequest(groups_names=(GroupId(""), GroupId(""))),
            DeleteGroupsResponse,
        )
        # Listed twice, answered once; an empty id is no group id.
        assert [r.error_code for r in answer.results] == [ErrorCode.invalid_group_id]
    finally:
        wire.sock.close()


def test_subscription_topics_reads_the_consumer_protocol() -> None:
    metadata_ = (
        b"\x00\x01" + b"\x00\x00\x00\x02" + b"\x00\x01a" + b"\x00\x02bc" + b"\xff\xff\xff\xff"
    )
    assert subscription_topics(metadata_) == ["a", "bc"]
    assert subscription_topics(b"\x00") is None
    assert subscription_topics(b"\x00\x01\x00\x00\x00\x01\x00\x09a") is None


# -- DescribeConfigs, AlterConfigs, IncrementalAlterConfigs ------------------------------


@pytest.mark.anyio
async def test_aiokafka_admin_retention_bytes_drops_old_batches() -> None:
    topic = name()
    async with asyncio.timeout(15), KafkaBroker() as broker:
        broker.create_topic(topic)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await producer.start()
        await admin.start()
        try:
            for _ in range(10):
                await producer.send_and_wait(topic, b"x" * 100)
            assert broker.offsets(topic)[0].log_start == 0
            resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"retention.bytes": "400"})
            (altered,) = await admin.alter_configs([resource])
            assert [r[0] for r in altered.resources] == [0]
            # Batches of ~170 bytes: two stay within 400 bytes, the older ones went.
            assert broker.offsets(topic)[0].log_start == 8
            (described,) = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic, {"retention.bytes": None})]
            )
            entries = described.resources[0][4]
            assert [(e[0], e[1]) for e in entries] == [("retention.bytes", "400")]
            (broker_configs,) = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.BROKER, "0")]
            )
            values = {e[0]: e[1] for e in broker_configs.resources[0][4]}
            assert values["num.partitions"] == "1"
            assert values["offsets.topic.num.partitions"] == "50"
        finally:
            await producer.stop()
            await admin.close()


def test_confluent_admin_describes_and_alters_configs(thread: BrokerThread) -> None:
    topic = name()
    thread.create_topic(topic)
    admin = AdminClient({"bootstrap.servers": thread.bootstrap})
    resource = ConfluentConfigResource("topic", topic)
    configs = admin.describe_configs([resource])[resource].result(5)
    assert configs["cleanup.policy"].value == "delete"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    set_ms = ConfluentConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    assert admin.incremental_alter_configs([set_ms])[set_ms].result(5) is None
    configs = admin.describe_configs([resource])[resource].result(5)
    assert configs["retention.ms"].value == "1000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    # Compaction appended to the default policy (issue 48): both, in Kafka's order.
    compact = ConfluentConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)
        ],
    )
    assert admin.incremental_alter_configs([compact])[compact].result(5) is None
    configs = admin.describe_configs([resource])[resource].result(5)
    assert configs["cleanup.policy"].value == "compact,delete"
    archive = ConfluentConfigResource(
        "topic",
        topic,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "archive", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_CONFIG"):
        admin.incremental_alter_configs([archive])[archive].result(5)
    # AlterConfigs replaces the whole set: retention.ms is back to its default.
    whole = ConfluentConfigResource("topic", topic, set_config={"max.message.bytes": "500"})
    assert admin.alter_configs([whole])[whole].result(5) is None
    configs = admin.describe_configs([resource])[resource].result(5)
    assert configs["retention.ms"].value == "604800000"
    assert configs["max.message.bytes"].value == "500"
    assert configs["cleanup.policy"].value == "delete"
    broker = ConfluentConfigResource("broker", "0")
    broker_configs = admin.describe_configs([broker])[broker].result(5)
    assert broker_configs["group.initial.rebalance.delay.ms"].value == "0"
    assert broker_configs["num.partitions"].is_read_only
    change = ConfluentConfigResource("broker", "0", set_config={"num.partitions": "3"})
    with pytest.raises(confluent_kafka.KafkaException, match="dynamically"):
        admin.alter_configs([change])[change].result(5)


def test_max_message_bytes_and_validate_only_on_raw_frames(thread: BrokerThread) -> None:
    topic = name()
    wire = Wire(thread.bootstrap)
    try:
        create(wire, topic)
        answer = set_config(wire, topic, "max.message.bytes", "150", validate_only=True)
        assert answer.error_code is ErrorCode.none
        fill(wire, topic, 1)  # validate_only changed nothing
        assert set_config(wire, topic, "max.message.bytes", "150").error_code is ErrorCode.none
        big = produce_request([(topic, [(0, batch(-1, -1, [b"x" * 100]))])], acks=1)
        assert produced(wire, big) == [(ErrorCode.message_too_large, -1)]
        small = produce_request([(topic, [(0, batch(-1, -1, [b"x"]))])], acks=1)
        assert produced(wire, small)[0][0] is ErrorCode.none
        for key, value in (
            ("max.message.bytes", "many"),
            ("retention.bytes", "-2"),
            ("cleanup.policy", "compact,archive"),
            ("segment.bytes", "1"),
        ):
            refused = set_config(wire, topic, key, value)
            assert refused.error_code is ErrorCode.invalid_config, key
        assert set_config(wire, name(), "retention.ms", "1").error_code is (
            ErrorCode.unknown_topic_or_partition
        )
        assert produced(wire, big) == [(ErrorCode.message_too_large, -1)]  # still 150
    finally:
        wire.sock.close()


def test_topic_configs_are_kept_normalised() -> None:
    padded = {"retention.bytes": " 400" + " " * 10_000, "cleanup.policy": " delete ,"}
    settings = check_topic_configs(padded, Limits())
    assert settings.values == {"retention.bytes": "400", "cleanup.policy": "delete"}
    assert settings.retain_bytes == 400
    assert check_topic_configs({"retention.bytes": "-1"}, Limits()).retain_bytes is None
    with pytest.raises(ConfigError, match="out of range"):
        check_topic_configs({"max.message.bytes": str(2**31)}, Limits())
    with pytest.raises(ConfigError):
        check_topic_configs({"retention.ms": "1" * 5000}, Limits())  # beyond int()'s digits


# -- retention.ms -------------------------------------------------------------------------


async def wait_for(condition: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.anyio
async def test_aiokafka_retention_ms_ages_old_batches_out() -> None:
    """retention.ms from CreateTopics and AlterConfigs: batches stamped before it go from
    the front of the log at the next check; -1 and the default (7 days) keep them."""
    aged, kept, forever = name(), name(), name()
    hour_ago = int(time.time() * 1000) - 3_600_000
    async with asyncio.timeout(20), KafkaBroker(retention_check_ms=20) as broker:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        await admin.start()
        await consumer.start()
        try:
            await admin.create_topics(
                [
                    NewTopic(aged, 1, 1, topic_configs={"retention.ms": "60000"}),
                    NewTopic(kept, 1, 1),
                    NewTopic(forever, 1, 1, topic_configs={"retention.ms": "-1"}),
                ]
            )
            for topic in (aged, kept, forever):
                for _ in range(3):
                    await producer.send_and_wait(topic, b"old", timestamp_ms=hour_ago)
            await producer.send_and_wait(aged, b"new")
            await wait_for(lambda: broker.offsets(aged)[0].log_start == 3)
            tp = AioTopicPartition(aged, 0)
            assert await consumer.beginning_offsets([tp]) == {tp: 3}
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            records = await consumer.getmany(tp, timeout_ms=5000)
            assert [r.value for r in records[tp]] == [b"new"]
            await asyncio.sleep(0.1)  # several checks
            assert broker.offsets(kept)[0].log_start == 0  # 7 days by default
            assert broker.offsets(forever)[0].log_start == 0
            # AlterConfigs: the next check applies it; everything expired: the log is
            # empty from its end on.
            resource = ConfigResource(ConfigResourceType.TOPIC, kept, {"retention.ms": "1000"})
            (altered,) = await admin.alter_configs([resource])
            assert [r[0] for r in altered.resources] == [0]
            await wait_for(lambda: broker.offsets(kept)[0].log_start == 3)
            assert broker.offsets(kept)[0].high_watermark == 3
        finally:
            await producer.stop()
            await consumer.stop()
            await admin.close()


def test_confluent_incremental_alter_configs_applies_retention_ms() -> None:
    thread = BrokerThread(retention_check_ms=20)
    thread.start()
    try:
        topic = name()
        producer = confluent_kafka.Producer({"bootstrap.servers": thread.bootstrap})
        for _ in range(2):
            producer.produce(topic, b"old", timestamp=int(time.time() * 1000) - 600_000)
            producer.flush(5)
        producer.produce(topic, b"new")
        assert producer.flush(5) == 0
        admin = AdminClient({"bootstrap.servers": thread.bootstrap})
        resource = ConfluentConfigResource(
            "topic",
            topic,
            incremental_configs=[
                ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        assert admin.incremental_alter_configs([resource])[resource].result(5) is None
        deadline = time.monotonic() + 5
        while thread.offsets(topic)[0].log_start != 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        described = ConfluentConfigResource("broker", "0")
        configs = admin.describe_configs([described])[described].result(5)
        assert configs["log.retention.check.interval.ms"].value == "20"
        assert configs["log.retention.ms"].value == "604800000"
    finally:
        thread.stop()


def test_create_topics_refuses_a_bad_config_on_raw_frames(thread: BrokerThread) -> None:
    topic = name()
    wire = Wire(thread.bootstrap)
    try:
        for configs, error in (
            ((("retention.ms", "-2"),), ErrorCode.invalid_config),
            ((("segment.bytes", "1"),), ErrorCode.invalid_config),
            ((("retention.ms", "1"), ("retention.ms", "2")), ErrorCode.invalid_request),
        ):
            request = create_topics.CreateTopicsRequest(
                topics=(
                    create_topics.CreatableTopic(
                        name=TopicName(topic),
                        num_partitions=i32(1),
                        replication_factor=i16(1),
                        assignments=(),
                        configs=tuple(
                            create_topics.CreatableTopicConfig(name=k, value=v) for k, v in configs
                        ),
                    ),
                ),
                timeout=ms(5),
                validate_only=False,
            )
            answer = wire.call(request, CreateTopicsResponse).topics[0]
            assert answer.error_code is error, configs
            assert topic not in thread.topics
    finally:
        wire.sock.close()


@pytest.mark.anyio
async def test_time_retention_in_the_core_stops_at_the_high_watermark() -> None:
    @dataclasses.dataclass
    class Entry:
        size: int
        count: int
        stamp: int

    core: BrokerCore[Entry] = BrokerCore(followers=1, retain_bytes=None)
    try:
        core.create_topic("t", 1)
        core.retain_ms = 100
        tp = TopicPartition("t", 0)
        partition = core.partitions[tp]
        core.append({tp: [Entry(10, 2, 0), Entry(10, 2, 500), Entry(10, 2, 0)]})
        core.retain_time(1000, lambda e: e.stamp)
        assert partition.log_start == 0  # the follower has nothing: the HW is 0
        partition.update_follower(0, 4)
        core.retain_time(1000, lambda e: e.stamp)
        # The first two are past it and below the HW; the third is old but not replicated.
        assert (partition.log_start, core.retained_bytes) == (4, 10)
        partition.update_follower(0, 6)
        core.retain_time(1000, lambda e: e.stamp)
        assert (partition.log_start, core.retained_bytes) == (6, 10)  # the newest stays
        core.topic_retain_ms["t"] = None
        core.append({tp: [Entry(10, 1, 0), Entry(10, 1, 0)]})
        partition.update_follower(0, 8)
        core.retain_time(1000, lambda e: e.stamp)
        assert partition.log_start == 6
    finally:
        core.close()


@pytest.mark.anyio
async def test_the_retention_check_is_a_timer_cancelled_at_shutdown() -> None:
    broker = KafkaBroker(retention_check_ms=10_000)
    await broker.start()  # armed when it listens
    handle = broker._retention_check
    assert handle is not None
    await broker.aclose()
    assert broker._retention_check is None
    assert handle.cancelled()


# -- CreatePartitions, DeleteRecords, DescribeCluster ------------------------------------


@pytest.mark.anyio
async def test_aiokafka_admin_creates_partitions_and_deletes_records() -> None:
    topic = name()
    async with asyncio.timeout(15), KafkaBroker() as broker:
        broker.create_topic(topic)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        await admin.start()
        await consumer.start()
        try:
            await admin.create_partitions({topic: NewPartitions(3)})
            assert broker.topics[topic] == 3
            await producer.client.force_metadata_update()
            sent = await producer.send_and_wait(topic, b"new", partition=2)
            assert sent.partition == 2
            for _ in range(5):
                await producer.send_and_wait(topic, b"x", partition=0)
            tp = AioTopicPartition(topic, 0)
            low = await admin.delete_records({tp: RecordsToDelete(3)})
            assert low == {tp: 3}
            assert (await consumer.beginning_offsets([tp])) == {tp: 3}
            assert await admin.delete_records({tp: RecordsToDelete(-1)}) == {tp: 5}
            assert broker.offsets(topic)[0].log_start == 5
        finally:
            await producer.stop()
            await consumer.stop()
            await admin.close()


def test_confluent_admin_partitions_records_and_cluster(thread: BrokerThread) -> None:
    topic = name()
    thread.create_topic(topic)
    admin = AdminClient({"bootstrap.servers": thread.bootstrap})
    admin.create_partitions([ConfluentNewPartitions(topic, 2)], validate_only=True)[topic].result(5)
    assert thread.topics[topic] == 1
    assert admin.create_partitions([ConfluentNewPartitions(topic, 2)])[topic].result(5) is None
    assert thread.topics[topic] == 2
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_PARTITIONS"):
        admin.create_partitions([ConfluentNewPartitions(topic, 2)])[topic].result(5)
    with pytest.raises(confluent_kafka.KafkaException, match="INVALID_PARTITIONS"):
        admin.create_partitions([ConfluentNewPartitions(topic, 65)])[topic].result(5)
    wire = Wire(thread.bootstrap)
    try:
        fill(wire, topic, 4, partition=1)
    finally:
        wire.sock.close()
    tp = confluent_kafka.TopicPartition(topic, 1, 2)
    deleted = admin.delete_records([tp])[tp].result(5)
    assert deleted.low_watermark == 2
    beyond = confluent_kafka.TopicPartition(topic, 1, 9)
    with pytest.raises(confluent_kafka.KafkaException, match="OFFSET_OUT_OF_RANGE"):
        admin.delete_records([beyond])[beyond].result(5)
    cluster = admin.describe_cluster().result(5)
    assert cluster.cluster_id == "aiopurgatory-kafka-broker"
    assert [node.id for node in cluster.nodes] == [0]
    assert cluster.controller.id == 0


def test_delete_records_and_create_partitions_on_raw_frames(thread: BrokerThread) -> None:
    topic = name()
    wire = Wire(thread.bootstrap)

    def delete(offset: int, partition: int = 0) -> tuple[ErrorCode, int]:
        request = delete_records.DeleteRecordsRequest(
            topics=(
                delete_records.DeleteRecordsTopic(
                    name=TopicName(topic),
                    partitions=(
                        delete_records.DeleteRecordsPartition(
                            partition_index=i32(partition), offset=i64(offset)
                        ),
                    ),
                ),
            ),
            timeout=ms(5),
        )
        part = wire.call(request, DeleteRecordsResponse).topics[0].partitions[0]
        return part.error_code, int(part.low_watermark)

    def grow(count: int, validate_only: bool = False) -> ErrorCode:
        request = create_partitions.CreatePartitionsRequest(
            topics=(
                create_partitions.CreatePartitionsTopic(
                    name=TopicName(topic), count=i32(count), assignments=None
                ),
            ),
            timeout=ms(5),
            validate_only=validate_only,
        )
        error: ErrorCode = wire.call(request, CreatePartitionsResponse).results[0].error_code
        return error

    try:
        create(wire, topic)
        fill(wire, topic, 5)
        assert delete(6) == (ErrorCode.offset_out_of_range, -1)
        assert delete(-2) == (ErrorCode.offset_out_of_range, -1)
        assert delete(0, partition=7) == (ErrorCode.unknown_topic_or_partition, -1)
        assert earliest(wire, topic) == 0  # the refusals changed nothing
        assert delete(3) == (ErrorCode.none, 3)
        assert delete(1) == (ErrorCode.none, 3)  # never back
        assert earliest(wire, topic) == 3
        assert fetch_error(wire, topic, 2) is ErrorCode.offset_out_of_range
        assert fetch_error(wire, topic, 3) is ErrorCode.none
        assert grow(1) is ErrorCode.invalid_partitions
        assert grow(0) is ErrorCode.invalid_partitions
        assert grow(65) is ErrorCode.invalid_partitions
        assert grow(4, validate_only=True) is ErrorCode.none
        assert thread.topics[topic] == 1
        assert grow(4) is ErrorCode.none
        assert thread.topics[topic] == 4
        fill(wire, topic, 1, partition=3)
        assert [o.high_watermark for o in thread.offsets(topic)] == [5, 0, 0, 1]
    finally:
        wire.sock.close()


@pytest.mark.anyio
async def test_a_failing_admin_handler_answers_unknown_server_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = KafkaBroker()
    try:
        broker.core.create_topic("t", 1)

        def boom(*args: object) -> None:
            raise RuntimeError("a bug")

        monkeypatch.setattr(broker.core, "delete_records", boom)
        monkeypatch.setattr(broker.core, "set_retain_bytes", boom)
        partition = SimpleNamespace(partition_index=0, offset=0)
        request = SimpleNamespace(
            topics=(SimpleNamespace(name="t", partitions=(partition,)),), timeout=None
        )
        answer = await broker.admin_api.delete_records(request, 2)
        assert answer.topics[0].partitions[0].error_code is ErrorCode.unknown_server_error
        config = SimpleNamespace(name="retention.bytes", config_operation=0, value="1")
        resource = SimpleNamespace(resource_type=2, resource_name="t", configs=(config,))
        request = SimpleNamespace(resources=(resource,), validate_only=False)
        answer = await broker.admin_api.incremental_alter_configs(request, 1)
        assert answer.responses[0].error_code is ErrorCode.unknown_server_error
        assert broker.admin_api.overrides == {}  # nothing recorded of the failed change
    finally:
        broker.groups.close()
        broker.core.close()


@pytest.mark.anyio
async def test_every_admin_api_answers_at_every_version_served() -> None:
    """Each handler's answer encodes and decodes at each version advertised, the versions
    no client here negotiates included."""
    broker = KafkaBroker()
    try:
        broker.create_topic("t")
        ns = SimpleNamespace
        config = ns(name="retention.ms", value="5", config_operation=0)
        requests: dict[int, Any] = {
            15: ns(groups=("g",), include_authorized_operations=False),
            16: ns(states_filter=(), types_filter=()),
            21: ns(topics=(ns(name="t", partitions=(ns(partition_index=0, offset=-1),)),)),
            32: ns(
                resources=(
                    ns(resource_type=2, resource_name="t", configuration_keys=None),
                    ns(resource_type=4, resource_name="0", configuration_keys=None),
                ),
                include_synonyms=True,
            ),
            33: ns(
                resources=(ns(resource_type=2, resource_name="t", configs=(config,)),),
                validate_only=True,
            ),
            37: ns(topics=(ns(name="t", count=1, assignments=None),), validate_only=True),
            42: ns(groups_names=("g",)),
            44: ns(
                resources=(ns(resource_type=2, resource_name="t", configs=(config,)),),
                validate_only=True,
            ),
            47: ns(group_id="g", topics=()),
            60: ns(include_cluster_authorized_operations=False, endpoint_type=1),
        }
        for api_key, request in requests.items():
            low, high = SERVED[api_key]
            for version in range(low, high + 1):
                response = await broker.handlers[api_key](request, version)
                frame = protocol.encode_response(7, response)
                schema = protocol.response_schema(api_key, version)
                _, used = entity_reader(schema.__header_schema__)(frame, 4)
                assert entity_reader(schema)(frame, 4 + used)[0] == response, (api_key, version)
    finally:
        broker.groups.close()
        broker.core.close()


@pytest.mark.anyio
async def test_new_partitions_get_their_followers_and_the_topic_retention() -> None:
    topic = name()
    async with asyncio.timeout(15), KafkaBroker(replicas=3) as broker:
        broker.create_topic(topic)
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0)
        await admin.start()
        await producer.start()
        try:
            resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"retention.bytes": "0"})
            await admin.alter_configs([resource])
            await admin.create_partitions({topic: NewPartitions(2)})
            await producer.client.force_metadata_update()
            # acks=all on the new partition: answered once its two followers have it.
            for _ in range(3):
                sent = await producer.send_and_wait(topic, b"x" * 100, partition=1)
            assert sent.offset == 2
            # retention.bytes 0 reached the new partition: only the newest batch stays.
            assert broker.offsets(topic)[1].log_start == 2
        finally:
            await producer.stop()
            await admin.close()


@pytest.mark.anyio
async def test_delete_records_in_the_core_keeps_the_byte_accounting() -> None:
    @dataclasses.dataclass
    class Entry:
        size: int
        count: int

    core: BrokerCore[Entry] = BrokerCore(followers=0, retain_bytes=None, retain_total_bytes=1000)
    try:
        core.create_topic("t", 1)
        tp = TopicPartition("t", 0)
        core.append({tp: [Entry(100, 2) for _ in range(5)]})  # offsets 0-9, 500 bytes
        assert core.delete_records(tp, 5) == 5  # inside the third entry: it stays whole
        assert core.retained_bytes == 300
        assert core.delete_records(tp, 10) == 10  # everything: the newest entry stays
        assert core.retained_bytes == 100
        assert core.partitions[tp].read(10, 10, 1000) == []
        with pytest.raises(ValueError, match="outside"):
            core.delete_records(tp, 11)
        core.set_retain_bytes("t", 0)
        assert core.retained_bytes == 100
    finally:
        core.close()
