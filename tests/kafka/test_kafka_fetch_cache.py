"""The broker's fetch caches (aiopurgatory.kafka): Fetch frames kept decoded and empty
Fetch answers kept encoded, so that a consumer long-polling an idle partition costs
little. What is checked here: an answer is never stale (a record produced, a topic
deleted and recreated, DeleteRecords moving the log start, an open transaction holding
the last stable offset back), each answer carries its own correlation id, the cached
bytes are kio's encoding of the answer, and both caches stay within their bound."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import struct
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v11 import request as fetch
from kio.schema.fetch.v11.response import FetchResponse
from kio.schema.produce.v8 import request as produce
from kio.schema.produce.v8.response import ProduceResponse
from kio.schema.types import BrokerId, TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import Records, i8, i16, i32, i32Timedelta, i64

from aiopurgatory.kafka import KafkaBroker, protocol
from aiopurgatory.kafka.log import TopicPartition
from aiopurgatory.kafka.protocol import Encoded, LruCache, encode_response

from ..support.kafka_wire import batch, encoded

pytestmark = pytest.mark.anyio


def name() -> str:
    return f"fc-{uuid.uuid4().hex[:12]}"


def ms(milliseconds: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=milliseconds))


def fetch_request(
    topic: str, offset: int, max_wait_ms: int = 20, partitions: tuple[int, ...] = (0,)
) -> fetch.FetchRequest:
    return fetch.FetchRequest(
        replica_id=BrokerId(-1),
        max_wait=ms(max_wait_ms),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        topics=(
            fetch.FetchTopic(
                topic=TopicName(topic),
                partitions=tuple(
                    fetch.FetchPartition(
                        partition=i32(p), fetch_offset=i64(offset), partition_max_bytes=i32(1 << 20)
                    )
                    for p in partitions
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


class Client:
    """A raw connection: kio-encoded requests with a v1 header, one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.correlation_id = 100

    @classmethod
    async def connect(cls, broker: KafkaBroker) -> Client:
        host, port = broker.bootstrap.rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    async def call(self, request: Any, response_type: type[Any], client_id: str = "c") -> Any:
        self.correlation_id += 1
        self.writer.write(encoded(request, self.correlation_id, client_id=client_id))
        size = struct.unpack(">i", await self.reader.readexactly(4))[0]
        frame = await self.reader.readexactly(size)
        assert struct.unpack(">i", frame[:4])[0] == self.correlation_id
        return entity_reader(response_type)(frame, 4)[0]

    async def fetch(self, request: fetch.FetchRequest, client_id: str = "c") -> Any:
        response = await self.call(request, FetchResponse, client_id)
        return response.responses[0].partitions[0]

    async def produce(self, topic: str, values: list[bytes]) -> None:
        request = produce.ProduceRequest(
            transactional_id=None,
            acks=i16(-1),
            timeout=ms(5000),
            topic_data=(
                produce.TopicProduceData(
                    name=TopicName(topic),
                    partition_data=(
                        produce.PartitionProduceData(
                            index=i32(0), records=Records(batch(-1, -1, values))
                        ),
                    ),
                ),
            ),
        )
        response = await self.call(request, ProduceResponse)
        assert response.responses[0].partition_responses[0].error_code is ErrorCode.none

    def close(self) -> None:
        self.writer.close()


@contextlib.asynccontextmanager
async def connected(**options: Any) -> AsyncIterator[tuple[KafkaBroker, Client, str]]:
    """Within 15 s: a broker (``options``), a new topic of its default partition count,
    and a raw client to it (closed after)."""
    topic = name()
    async with asyncio.timeout(15), KafkaBroker(**options) as broker:
        broker.create_topic(topic, broker.default_partitions)
        client = await Client.connect(broker)
        try:
            yield broker, client, topic
        finally:
            client.close()


async def test_a_parked_consumer_gets_the_record_produced_after_empty_answers() -> None:
    async with connected(replicas=3) as (broker, consumer, topic):
        producer = await Client.connect(broker)
        try:
            request = fetch_request(topic, 0)
            for _ in range(3):  # the same frame each time, but its correlation id
                part = await consumer.fetch(request)
                assert (part.error_code, part.high_watermark, part.records) == (
                    ErrorCode.none,
                    0,
                    None if part.records is None else b"",
                )
            assert len(broker._decoded_fetches) == 1
            assert len(broker.data_api._empty_answers) == 1
            # Parked (max wait 5 s): the record produced answers it at once.
            parked = asyncio.create_task(consumer.fetch(fetch_request(topic, 0, 5000)))
            await asyncio.sleep(0.1)
            assert not parked.done()
            await producer.produce(topic, [b"one"])
            part = await parked
            assert part.high_watermark == 1
            assert part.records
            # The short poll's next answer, from the same cached frame, carries it too.
            part = await consumer.fetch(request)
            assert part.high_watermark == 1
            assert part.records
            # And from offset 1 the empty answer says the new high watermark.
            part = await consumer.fetch(fetch_request(topic, 1))
            assert (part.error_code, part.high_watermark, part.log_start_offset) == (
                ErrorCode.none,
                1,
                0,
            )
            assert not part.records
        finally:
            producer.close()


async def test_a_topic_deleted_and_recreated_is_never_answered_from_before() -> None:
    async with connected(replicas=3) as (broker, client, topic):
        await client.produce(topic, [b"a", b"b"])
        at_end = fetch_request(topic, 2)
        part = await client.fetch(at_end)
        assert (part.error_code, part.high_watermark) == (ErrorCode.none, 2)
        # A fetch parked on it when it goes is answered UNKNOWN_TOPIC_OR_PARTITION.
        parked = asyncio.create_task(client.fetch(fetch_request(topic, 2, 5000)))
        await asyncio.sleep(0.1)
        broker.delete_topic(topic)
        part = await parked
        assert part.error_code is ErrorCode.unknown_topic_or_partition
        part = await client.fetch(at_end)
        assert (part.error_code, part.high_watermark) == (
            ErrorCode.unknown_topic_or_partition,
            -1,
        )
        # Recreated: empty again, so offset 2 is out of range and 0 is the end.
        broker.create_topic(topic)
        part = await client.fetch(at_end)
        assert (part.error_code, part.high_watermark) == (ErrorCode.offset_out_of_range, 0)
        part = await client.fetch(fetch_request(topic, 0))
        assert (part.error_code, part.high_watermark) == (ErrorCode.none, 0)


async def test_delete_records_moves_the_log_start_of_the_next_empty_answer() -> None:
    async with connected(replicas=3) as (broker, client, topic):
        for value in (b"a", b"b", b"c"):
            await client.produce(topic, [value])
        at_end = fetch_request(topic, 3)
        part = await client.fetch(at_end)
        assert (part.high_watermark, part.log_start_offset) == (3, 0)
        broker.core.delete_records(TopicPartition(topic, 0), 2)
        part = await client.fetch(at_end)
        assert (part.error_code, part.high_watermark, part.log_start_offset) == (
            ErrorCode.none,
            3,
            2,
        )
        # An offset now below the log start: out of range, not the cached answer.
        part = await client.fetch(fetch_request(topic, 1))
        assert part.error_code is ErrorCode.offset_out_of_range


async def test_the_last_stable_offset_of_an_empty_answer_follows_the_transactions() -> None:
    async with connected(replicas=3) as (broker, client, topic):
        tp = TopicPartition(topic, 0)
        await client.produce(topic, [b"a", b"b"])
        at_end = fetch_request(topic, 2)
        part = await client.fetch(at_end)
        assert (part.high_watermark, part.last_stable_offset) == (2, 2)
        # An open transaction's first offset at 1 holds the LSO there.
        broker.transactions.open_firsts[tp] = {7: 1}
        try:
            part = await client.fetch(at_end)
            assert (part.high_watermark, part.last_stable_offset) == (2, 1)
        finally:
            del broker.transactions.open_firsts[tp]
        part = await client.fetch(at_end)
        assert part.last_stable_offset == 2


async def test_the_caches_stay_within_their_bound_and_answer_right_beyond_it() -> None:
    async with connected(partitions=8, fetch_cache_entries=3) as (broker, client, topic):
        for round_ in range(2):
            for partition in range(8):
                request = fetch_request(topic, 0, partitions=(partition,))
                response = await client.call(request, FetchResponse, client_id=f"c{round_}")
                part = response.responses[0].partitions[0]
                assert (part.partition_index, part.error_code) == (partition, ErrorCode.none)
                assert len(broker._decoded_fetches) <= 3
                assert len(broker.data_api._empty_answers) <= 3
        assert len(broker._decoded_fetches) == 3
        assert len(broker.data_api._empty_answers) == 3


async def test_a_frame_too_large_to_keep_is_answered_and_not_kept() -> None:
    async with connected(partitions=64) as (broker, client, topic):
        request = fetch_request(topic, 0, partitions=tuple(range(64)) * 2)
        response = await client.call(request, FetchResponse, client_id="x" * 2000)
        assert [p.partition_index for p in response.responses[0].partitions] == list(range(64))
        assert len(broker._decoded_fetches) == 0


def test_an_encoded_answer_is_the_frame_kio_would_write() -> None:
    low, high = protocol.SERVED[protocol.FETCH]
    for version in range(low, high + 1):
        mod = protocol.response_module(protocol.FETCH, version)
        entity = protocol.make(
            protocol.response_schema(protocol.FETCH, version),
            throttle_time=protocol.ZERO,
            error_code=ErrorCode.none,
            session_id=0,
            responses=(
                protocol.make(
                    mod.FetchableTopicResponse,
                    topic="t",
                    partitions=(
                        protocol.make(
                            mod.PartitionData,
                            partition_index=0,
                            error_code=ErrorCode.none,
                            high_watermark=5,
                            last_stable_offset=5,
                            log_start_offset=1,
                            aborted_transactions=None,
                            preferred_read_replica=-1,
                            records=b"",
                        ),
                    ),
                ),
            ),
        )
        header_type = type(entity).__header_schema__
        buffer = io.BytesIO()
        entity_writer(header_type)(buffer, header_type(correlation_id=-7))
        entity_writer(type(entity))(buffer, entity)
        expected = struct.pack(">i", len(buffer.getvalue())) + buffer.getvalue()
        encoded = protocol.encode_body(entity)
        assert isinstance(encoded, Encoded)
        assert encode_response(-7, encoded) == expected
        assert encode_response(-7, entity) == expected


def test_lru_cache_evicts_the_least_recently_used() -> None:
    cache: LruCache[str, int] = LruCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # now "b" is the oldest
    cache.put("c", 3)
    assert (cache.get("b"), cache.get("a"), cache.get("c"), len(cache)) == (None, 1, 3, 2)
    cache.put("a", 4)  # replaced, not added
    assert (cache.get("a"), len(cache)) == (4, 2)
    empty: LruCache[str, int] = LruCache(0)
    empty.put("a", 1)
    assert (empty.get("a"), len(empty)) == (None, 0)
    with pytest.raises(ValueError, match="limit must be >= 0"):
        LruCache(-1)


async def test_the_idle_bound_holds_each_wait_not_the_connection_as_a_whole() -> None:
    # One timer per connection, re-armed lazily: a connection busy for longer than the
    # idle bound stays; one silent for it, or stuck halfway through a frame, goes.
    topic = name()
    async with asyncio.timeout(15), KafkaBroker(idle_seconds=0.4) as broker:
        broker.create_topic(topic)
        busy, silent, halfway = [await Client.connect(broker) for _ in range(3)]
        try:
            halfway.writer.write(struct.pack(">i", 100) + b"\0" * 10)
            loop = asyncio.get_running_loop()
            start = loop.time()
            while loop.time() - start < 1.2:  # three idle bounds, 0.25 s apart at most
                part = await busy.fetch(fetch_request(topic, 0, max_wait_ms=150))
                assert part.error_code is ErrorCode.none
                await asyncio.sleep(0.1)
            assert await silent.reader.read() == b""  # closed by the broker
            assert await halfway.reader.read() == b""
            part = await busy.fetch(fetch_request(topic, 0))
            assert part.error_code is ErrorCode.none
        finally:
            for client in (busy, silent, halfway):
                client.close()
