"""Issue 44's leftovers: what today's fixes left between them, each in Kafka's answer.

A partition named twice in a ListOffsets (answered once, as Kafka's ReplicaManager
answers it), zstd records fetched below Fetch v10 (KIP-110), LZ4 frames of linked
blocks (Kafka reads only independent blocks), and TLS peers that reset before their
handshake starts. Raw frames over loopback sockets, or the real clients; every wait is
bounded.
"""

from __future__ import annotations

from collections.abc import Callable

from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v5 import request as list_offsets
from kio.schema.list_offsets.v5.response import ListOffsetsResponse
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from aiopurgatory.kafka import BrokerThread

from .kafka_wire import Wire, create, name, send

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
