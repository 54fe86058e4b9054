"""Hostile peers and topics (issue 44): a topic deleted and created again in one loop turn
gets its followers; CreateTopics and DeleteTopics refuse a name listed twice, as Kafka
does; Metadata and the admin APIs answer a name listed many times without building an
answer per listing, and a ListOffsets a partition named twice once (as Kafka's
ReplicaManager answers it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from kio.schema.alter_configs.v0 import request as alter_configs_v0
from kio.schema.alter_configs.v0.response import AlterConfigsResponse as AlterConfigsResponseV0
from kio.schema.create_partitions.v1 import request as create_partitions_v1
from kio.schema.create_partitions.v1.response import (
    CreatePartitionsResponse as CreatePartitionsResponseV1,
)
from kio.schema.create_topics.v2 import request as create_topics_v2
from kio.schema.create_topics.v2.response import CreateTopicsResponse as CreateTopicsResponseV2
from kio.schema.create_topics.v4 import request as create_topics_v4
from kio.schema.create_topics.v4.response import CreateTopicsResponse as CreateTopicsResponseV4
from kio.schema.create_topics.v5 import request as create_topics_v5
from kio.schema.create_topics.v5.response import CreateTopicsResponse as CreateTopicsResponseV5
from kio.schema.delete_records.v1 import request as delete_records_v1
from kio.schema.delete_records.v1.response import DeleteRecordsResponse as DeleteRecordsResponseV1
from kio.schema.delete_topics.v3 import request as delete_topics_v3
from kio.schema.delete_topics.v3.response import DeleteTopicsResponse as DeleteTopicsResponseV3
from kio.schema.delete_topics.v5 import request as delete_topics_v5
from kio.schema.delete_topics.v5.response import DeleteTopicsResponse as DeleteTopicsResponseV5
from kio.schema.describe_configs.v1 import request as describe_configs_v1
from kio.schema.describe_configs.v1.response import (
    DescribeConfigsResponse as DescribeConfigsResponseV1,
)
from kio.schema.describe_configs.v4 import request as describe_configs_v4
from kio.schema.describe_configs.v4.response import (
    DescribeConfigsResponse as DescribeConfigsResponseV4,
)
from kio.schema.errors import ErrorCode
from kio.schema.incremental_alter_configs.v0 import request as incremental_v0
from kio.schema.incremental_alter_configs.v0.response import (
    IncrementalAlterConfigsResponse as IncrementalAlterConfigsResponseV0,
)
from kio.schema.list_offsets.v5 import request as list_offsets
from kio.schema.list_offsets.v5.response import ListOffsetsResponse
from kio.schema.metadata.v8 import request as metadata_v8
from kio.schema.metadata.v8.response import MetadataResponse as MetadataResponseV8
from kio.schema.metadata.v9 import request as metadata_v9
from kio.schema.metadata.v9.response import MetadataResponse as MetadataResponseV9
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_reader
from kio.static.primitive import i8, i16, i32, i64

from aiopurgatory.kafka import BrokerThread, KafkaBroker
from aiopurgatory.kafka.admin_api import BROKER, TOPIC
from aiopurgatory.kafka.configs import check_topic_configs

from ..support.kafka_wire import (
    REPLICA_LAG,
    WATCHDOG,
    FlexibleWire,
    Wire,
    address,
    cluster_broker,
    cluster_thread,
    create,
    encoded,
    metadata_request,
    ms,
    name,
    read_frame,
    running,
    send,
)


@pytest.fixture
def cluster() -> Iterator[BrokerThread]:
    with running(cluster_thread()) as thread:
        yield thread


def creatable(schema: Any, topic: str, configs: dict[str, str] | None = None) -> Any:
    """One topic of a CreateTopics request (``schema``: a kio ``create_topics.vN.request``):
    one partition, the broker's replication factor."""
    return schema.CreatableTopic(
        name=TopicName(topic),
        num_partitions=i32(1),
        replication_factor=i16(-1),
        assignments=(),
        configs=tuple(
            schema.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()
        ),
    )


def create_topics_request(schema: Any, *topics: Any, validate_only: bool = False) -> Any:
    return schema.CreateTopicsRequest(
        topics=tuple(topics), timeout=ms(5), validate_only=validate_only
    )


# -- item 7: deleted and created again in one loop turn ------------------------------------


@pytest.mark.anyio
async def test_a_topic_deleted_and_created_in_one_turn_gets_its_followers() -> None:
    """A common reset between tests: ``delete_topic`` then ``create_topic`` with no await
    between. The new topic's replicas fetch at once, so its ISR stays whole and an
    acks=all produce with ``min.insync.replicas=2`` is acknowledged."""
    async with asyncio.timeout(WATCHDOG), cluster_broker() as broker:
        topic = name("again")
        broker.create_topic(topic, 2)
        await asyncio.sleep(0.1)  # the first topic's followers fetching, parked
        broker.delete_topic(topic)
        broker.create_topic(topic, 2)
        broker.admin_api.apply(
            topic, check_topic_configs({"min.insync.replicas": "2"}, broker.limits)
        )
        await asyncio.sleep(3 * REPLICA_LAG)  # a follower not fetching leaves the ISR
        for partition in range(2):
            assert broker.isr(topic, partition) == broker.replicas_of(topic, partition)
        producer = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap, acks="all", request_timeout_ms=3000
        )
        await producer.start()
        try:
            for partition in range(2):
                await producer.send_and_wait(topic, b"x", partition=partition)
        finally:
            await producer.stop()
        assert [o.high_watermark for o in broker.offsets(topic)] == [1, 1]


@pytest.mark.anyio
async def test_one_node_starts_one_set_of_simulated_followers_per_topic() -> None:
    """On one node the simulated followers of a topic created, deleted and created again
    in one turn are those of the last topic only: a task started for the first follows
    nothing (it once looked its partition up by name when it first ran)."""
    async with asyncio.timeout(WATCHDOG), KafkaBroker(replicas=3) as broker:
        topic = name("again")
        broker.create_topic(topic, 1)
        broker.delete_topic(topic)
        broker.create_topic(topic, 1)
        await asyncio.sleep(0.1)
        assert len(broker.followers) == 2  # replicas=3: two followers of the new one
        broker.delete_topic(topic)
        await asyncio.sleep(0.1)
        assert not broker.followers


def test_pipelined_delete_and_create_topics_leave_the_new_topic_replicated(
    cluster: BrokerThread,
) -> None:
    topic = name("piped")
    with Wire(address(cluster, 0)) as wire:
        first = create_topics_request(
            create_topics_v4, creatable(create_topics_v4, topic, {"min.insync.replicas": "2"})
        )
        assert wire.call(first, CreateTopicsResponseV4).topics[0].error_code is ErrorCode.none
        time.sleep(0.1)  # its followers parked in fetches
        delete = delete_topics_v3.DeleteTopicsRequest(
            topic_names=(TopicName(topic),), timeout=ms(5)
        )
        # Both frames in one write: handled one after the other, in one loop turn.
        wire.sock.sendall(encoded(delete, 1) + encoded(first, 2))
        deleted = entity_reader(DeleteTopicsResponseV3)(read_frame(wire.sock), 4)[0]
        created = entity_reader(CreateTopicsResponseV4)(read_frame(wire.sock), 4)[0]
    assert deleted.responses[0].error_code is ErrorCode.none
    assert created.topics[0].error_code is ErrorCode.none
    time.sleep(3 * REPLICA_LAG)
    assert cluster.isr(topic) == cluster.replicas_of(topic)
    with Wire(address(cluster, cluster.leader(topic))) as wire:
        assert send(wire, topic, [b"x"], timeout=3.0).error_code is ErrorCode.none
    assert cluster.offsets(topic)[0].high_watermark == 1


# -- item 14: CreateTopics and DeleteTopics naming a topic twice ---------------------------


@pytest.mark.parametrize(
    ("schema", "response", "wire_type"),
    [
        (create_topics_v2, CreateTopicsResponseV2, Wire),
        (create_topics_v5, CreateTopicsResponseV5, FlexibleWire),
    ],
    ids=["v2", "v5-flexible"],
)
def test_create_topics_naming_a_topic_twice_creates_it_from_neither(
    cluster: BrokerThread, schema: Any, response: type[Any], wire_type: type[Wire]
) -> None:
    """Kafka's controller answers a name listed twice once, INVALID_REQUEST "Duplicate
    topic name.", after the others, and creates it from neither entry; the others are
    created."""
    twice, thrice, once = name("twice"), name("thrice"), name("once")
    request = create_topics_request(
        schema,
        creatable(schema, twice, {"retention.ms": "1000"}),
        creatable(schema, thrice),
        creatable(schema, once),
        creatable(schema, twice),
        creatable(schema, thrice),
        creatable(schema, thrice),
    )
    with wire_type(address(cluster, 0)) as wire:
        answer = wire.call(request, response)
    assert [(t.name, t.error_code, t.error_message) for t in answer.topics] == [
        (once, ErrorCode.none, None),
        (twice, ErrorCode.invalid_request, "Duplicate topic name."),
        (thrice, ErrorCode.invalid_request, "Duplicate topic name."),
    ]
    assert once in cluster.topics
    assert twice not in cluster.topics
    assert thrice not in cluster.topics


@pytest.mark.parametrize(
    ("schema", "response", "wire_type"),
    [
        (delete_topics_v3, DeleteTopicsResponseV3, Wire),
        (delete_topics_v5, DeleteTopicsResponseV5, FlexibleWire),
    ],
    ids=["v3-no-message", "v5-flexible-message"],
)
def test_delete_topics_naming_a_topic_twice_deletes_neither(
    cluster: BrokerThread, schema: Any, response: type[Any], wire_type: type[Wire]
) -> None:
    """Kafka's controller answers a name listed twice once, first, INVALID_REQUEST
    ("Duplicate topic name." where the version has a message), and deletes nothing for
    it (it once deleted the topic and answered the second listing
    UNKNOWN_TOPIC_OR_PARTITION)."""
    twice, once = name("twice"), name("once")
    cluster.create_topic(twice)
    cluster.create_topic(once)
    names = (TopicName(twice), TopicName(once), TopicName(twice))
    with wire_type(address(cluster, 0)) as wire:
        answer = wire.call(schema.DeleteTopicsRequest(topic_names=names, timeout=ms(5)), response)
    results = [(r.name, r.error_code, getattr(r, "error_message", None)) for r in answer.responses]
    message = "Duplicate topic name." if schema is delete_topics_v5 else None
    assert results == [
        (twice, ErrorCode.invalid_request, message),
        (once, ErrorCode.none, None),
    ]
    assert twice in cluster.topics
    assert once not in cluster.topics


# -- item 5: a name listed many times is answered once -------------------------------------

REPEATS = 20_000
"""How often the requests below name one resource (a request of some 400 kB)."""


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerThread]:
    with running(BrokerThread()) as thread:
        yield thread


@pytest.mark.parametrize(
    ("schema", "response", "wire_type"),
    [(metadata_v8, MetadataResponseV8, Wire), (metadata_v9, MetadataResponseV9, FlexibleWire)],
    ids=["v8", "v9-flexible"],
)
def test_metadata_answers_a_topic_named_many_times_once(
    broker: BrokerThread, schema: Any, response: type[Any], wire_type: type[Wire]
) -> None:
    """Kafka reads the names into a set. Answered per listing, a 64-partition topic named
    20,000 times built a 44 MB answer and held the loop for seconds."""
    big, other = name("big"), name("other")
    broker.create_topic(big, 64)
    broker.create_topic(other, 1)
    names = [big] * REPEATS + [other, big, other]
    with wire_type(broker.bootstrap) as wire:
        started = time.monotonic()
        answer = wire.call(metadata_request(names, schema=schema), response)
        elapsed = time.monotonic() - started
    assert [(t.name, len(t.partitions)) for t in answer.topics] == [(big, 64), (other, 1)]
    assert elapsed < 5.0, elapsed


def describe_configs_request(
    schema: Any, *resources: tuple[int, str, tuple[str, ...] | None]
) -> Any:
    return schema.DescribeConfigsRequest(
        resources=tuple(
            schema.DescribeConfigsResource(
                resource_type=i8(kind), resource_name=resource, configuration_keys=keys
            )
            for kind, resource, keys in resources
        ),
        include_synonyms=True,
    )


@pytest.mark.parametrize(
    ("schema", "response", "wire_type"),
    [
        (describe_configs_v1, DescribeConfigsResponseV1, Wire),
        (describe_configs_v4, DescribeConfigsResponseV4, FlexibleWire),
    ],
    ids=["v1", "v4-flexible"],
)
def test_describe_configs_describes_a_resource_listed_many_times_once(
    broker: BrokerThread, schema: Any, response: type[Any], wire_type: type[Wire]
) -> None:
    """Kafka describes each listing again (an answer some 40 times the listing's size);
    here each resource is described once per set of keys asked, in the order first
    listed, so a request's answer is bounded by what it names, not how often."""
    topic = name("configs")
    broker.create_topic(topic)
    everything = (TOPIC, topic, None)
    retention = (TOPIC, topic, ("retention.ms",))
    node = (BROKER, "0", None)
    request = describe_configs_request(
        schema, *[everything] * REPEATS, retention, node, retention, node, (TOPIC, topic, ())
    )
    with wire_type(broker.bootstrap) as wire:
        started = time.monotonic()
        answer = wire.call(request, response)
        elapsed = time.monotonic() - started
    listed = [(r.resource_type, r.resource_name, r.error_code) for r in answer.results]
    assert listed == [
        (TOPIC, topic, ErrorCode.none),
        (TOPIC, topic, ErrorCode.none),
        (BROKER, "0", ErrorCode.none),
    ]
    assert len(answer.results[0].configs) > 1
    assert [c.name for c in answer.results[1].configs] == ["retention.ms"]
    assert elapsed < 5.0, elapsed


def test_describe_configs_lists_every_config_for_an_empty_key_list(broker: BrokerThread) -> None:
    """Kafka lists every config for a null key list and an empty one alike (an empty one
    once listed none)."""
    topic = name("configs")
    broker.create_topic(topic)
    with Wire(broker.bootstrap) as wire:
        everything = wire.call(
            describe_configs_request(describe_configs_v1, (TOPIC, topic, None)),
            DescribeConfigsResponseV1,
        )
        empty = wire.call(
            describe_configs_request(describe_configs_v1, (TOPIC, topic, ())),
            DescribeConfigsResponseV1,
        )
    assert len(everything.results[0].configs) > 1
    assert empty.results[0].configs == everything.results[0].configs


def test_an_injected_metadata_error_answers_a_topic_named_many_times_once(
    broker: BrokerThread,
) -> None:
    topic = name("injected")
    broker.inject("Metadata", "UNKNOWN_SERVER_ERROR", node=0)
    with Wire(broker.bootstrap) as wire:
        answer = wire.call(metadata_request([topic] * REPEATS), MetadataResponseV8)
    assert [(t.name, t.error_code) for t in answer.topics] == [
        (topic, ErrorCode.unknown_server_error)
    ]


# -- item 5, the other admin APIs taking lists: Kafka's answers to a name listed twice ----


def test_create_partitions_naming_a_topic_twice_grows_it_from_neither(
    broker: BrokerThread,
) -> None:
    """Kafka's controller answers the name once, INVALID_REQUEST "Duplicate topic name.",
    before the others (it answered each listing, with a message of its own)."""
    twice, once = name("twice"), name("once")
    broker.create_topic(twice)
    broker.create_topic(once)
    grown = [
        create_partitions_v1.CreatePartitionsTopic(
            name=TopicName(topic), count=i32(count), assignments=None
        )
        for topic, count in ((twice, 2), (once, 2), (twice, 3), (twice, 2))
    ]
    request = create_partitions_v1.CreatePartitionsRequest(
        topics=tuple(grown), timeout=ms(5), validate_only=False
    )
    with Wire(broker.bootstrap) as wire:
        answer = wire.call(request, CreatePartitionsResponseV1)
    assert [(r.name, r.error_code, r.error_message) for r in answer.results] == [
        (twice, ErrorCode.invalid_request, "Duplicate topic name."),
        (once, ErrorCode.none, None),
    ]
    assert broker.topics[twice] == 1
    assert broker.topics[once] == 2


@pytest.mark.parametrize("incremental", [False, True], ids=["alter", "incremental"])
def test_alter_configs_listing_a_resource_twice_changes_it_from_neither(
    broker: BrokerThread, incremental: bool
) -> None:
    """Kafka's controller answers the resource once, INVALID_REQUEST "Duplicate
    resource.", before the others (it answered each listing, with a message of its
    own)."""
    twice, once = name("twice"), name("once")
    broker.create_topic(twice)
    broker.create_topic(once)
    schema: Any = incremental_v0 if incremental else alter_configs_v0
    extra = {"config_operation": i8(0)} if incremental else {}

    def resource(topic: str, value: str) -> Any:
        config = schema.AlterableConfig(name="retention.ms", value=value, **extra)
        return schema.AlterConfigsResource(
            resource_type=i8(TOPIC), resource_name=topic, configs=(config,)
        )

    resources = (resource(twice, "1000"), resource(once, "2000"), resource(twice, "3000"))
    response: type[Any] = (
        IncrementalAlterConfigsResponseV0 if incremental else AlterConfigsResponseV0
    )
    request_type = (
        schema.IncrementalAlterConfigsRequest if incremental else schema.AlterConfigsRequest
    )
    with Wire(broker.bootstrap) as wire:
        answer = wire.call(request_type(resources=resources, validate_only=False), response)
    assert [(r.resource_name, r.error_code, r.error_message) for r in answer.responses] == [
        (twice, ErrorCode.invalid_request, "Duplicate resource."),
        (once, ErrorCode.none, None),
    ]
    overrides = broker.call(lambda b: dict(b.admin_api.overrides))
    assert twice not in overrides
    assert overrides[once] == {"retention.ms": "2000"}


def test_delete_records_answers_a_partition_listed_twice_once_with_its_last_offset(
    broker: BrokerThread,
) -> None:
    """Kafka reads the partitions into a map: one answer per partition, the last offset
    listed taken (each listing was once applied and answered, the log start moving to
    the highest)."""
    topic = name("records")
    broker.create_topic(topic)
    with Wire(broker.bootstrap) as wire:
        assert send(wire, topic, [b"x"] * 5, acks=1).error_code is ErrorCode.none

        def listing(*offsets: int) -> Any:
            return delete_records_v1.DeleteRecordsTopic(
                name=TopicName(topic),
                partitions=tuple(
                    delete_records_v1.DeleteRecordsPartition(partition_index=i32(0), offset=i64(o))
                    for o in offsets
                ),
            )

        request = delete_records_v1.DeleteRecordsRequest(
            topics=(listing(1, 4), *[listing(3)] * REPEATS, listing(2)), timeout=ms(5)
        )
        answer = wire.call(request, DeleteRecordsResponseV1)
    assert [
        (t.name, [(p.partition_index, p.error_code, p.low_watermark) for p in t.partitions])
        for t in answer.topics
    ] == [(topic, [(0, ErrorCode.none, 2)])]
    assert broker.offsets(topic)[0].log_start == 2


Factory = Callable[..., BrokerThread]


# -- ListOffsets: a partition named twice ----------------------------------------------------


def list_offsets_request(
    topics: list[tuple[str, list[tuple[int, int]]]],
) -> list_offsets.ListOffsetsRequest:
    """One ListOffsets v5 of (topic, [(partition, timestamp)]) entries, as listed (a
    topic may be listed twice)."""
    return list_offsets.ListOffsetsRequest(
        replica_id=BrokerId(-1),
        isolation_level=i8(0),
        topics=tuple(
            list_offsets.ListOffsetsTopic(
                name=TopicName(topic),
                partitions=tuple(
                    list_offsets.ListOffsetsPartition(
                        partition_index=i32(index),
                        current_leader_epoch=i32(-1),
                        timestamp=i64(timestamp),
                    )
                    for index, timestamp in parts
                ),
            )
            for topic, parts in topics
        ),
    )


def listed(response: ListOffsetsResponse) -> list[tuple[str, int, ErrorCode, int]]:
    return [
        (str(topic.name), int(part.partition_index), part.error_code, int(part.offset))
        for topic in response.topics
        for part in topic.partitions
    ]


def test_list_offsets_answers_a_partition_named_twice_once(kafka_broker_factory: Factory) -> None:
    """A partition named 1,000 times (in one topic entry, and again in a second entry of
    the same topic) is answered once, INVALID_REQUEST, as Kafka's ReplicaManager
    answers a duplicated partition: one row per partition, by topic. The partitions
    named once are answered as ever."""
    broker = kafka_broker_factory(partitions=2)
    topic = name("lo")
    with Wire(broker.bootstrap) as wire:
        create(wire, topic)
        assert send(wire, topic, [b"a", b"b"]).error_code is ErrorCode.none
        request = list_offsets_request([(topic, [(0, -1)] * 1000 + [(1, -1)]), (topic, [(0, -2)])])
        answer = listed(wire.call(request, ListOffsetsResponse))
        assert answer == [
            (topic, 0, ErrorCode.invalid_request, -1),
            (topic, 1, ErrorCode.none, 0),
        ]
        # Named once, partition 0 is answered.
        answer = listed(wire.call(list_offsets_request([(topic, [(0, -1)])]), ListOffsetsResponse))
        assert answer == [(topic, 0, ErrorCode.none, 2)]
