"""Kafka 4's consumer group protocol (KIP-848) against the broker: topic ids in
Metadata, the consumer-group coordinator on virtual time, the wire APIs
(ConsumerGroupHeartbeat, ConsumerGroupDescribe, OffsetCommit with member epochs) and
confluent-kafka with ``group.protocol=consumer``."""

from __future__ import annotations

import uuid
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata_v12
from kio.schema.metadata.v12.response import MetadataResponse as MetadataResponseV12
from kio.schema.types import TopicName

from aiopurgatory.kafka import BrokerThread
from tests.support.kafka_wire import FlexibleWire, name

ZERO_ID = uuid.UUID(int=0)


def _metadata_v12(
    wire: FlexibleWire, names: list[str] | None = None, ids: list[uuid.UUID] | None = None
) -> Any:
    topics = [
        metadata_v12.MetadataRequestTopic(topic_id=ZERO_ID, name=TopicName(n)) for n in names or ()
    ]
    topics += [metadata_v12.MetadataRequestTopic(topic_id=i, name=None) for i in ids or ()]
    request = metadata_v12.MetadataRequest(
        topics=tuple(topics) if names is not None or ids is not None else None,
        allow_auto_topic_creation=True,
        include_topic_authorized_operations=False,
    )
    return wire.call(request, MetadataResponseV12)


def test_metadata_v12_topic_ids_by_name_and_by_id_new_on_recreate() -> None:
    topic = name("ids")
    with BrokerThread() as address, FlexibleWire(address) as wire:
        (listed,) = _metadata_v12(wire, [topic]).topics
        assert listed.error_code is ErrorCode.none
        assert listed.topic_id != ZERO_ID
        first = listed.topic_id
        assert first is not None
        assert _metadata_v12(wire, [topic]).topics[0].topic_id == first  # kept
        (by_id,) = _metadata_v12(wire, ids=[first]).topics
        assert (by_id.error_code, by_id.name, len(by_id.partitions)) == (ErrorCode.none, topic, 1)
        everything: dict[Any, Any] = {t.name: t.topic_id for t in _metadata_v12(wire).topics}
        assert everything[topic] == first
        assert everything["__consumer_offsets"] != ZERO_ID
        unknown = uuid.uuid4()
        (missing,) = _metadata_v12(wire, ids=[unknown]).topics
        assert (missing.error_code, missing.name) == (ErrorCode.unknown_topic_id, None)
        # Deleted and created again: a new id; the old one is unknown.
        assert wire_delete(address, topic)
        (again,) = _metadata_v12(wire, [topic]).topics
        assert again.topic_id not in (first, ZERO_ID)
        assert _metadata_v12(wire, ids=[first]).topics[0].error_code is ErrorCode.unknown_topic_id


def wire_delete(address: str, topic: str) -> bool:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": address})
    admin.delete_topics([topic])[topic].result(10)
    return True
