"""Issue 44's leftovers: what today's fixes left between them, each in Kafka's answer.

A partition named twice in a ListOffsets (answered once, as Kafka's ReplicaManager
answers it), zstd records fetched below Fetch v10 (KIP-110), LZ4 frames of linked
blocks (Kafka reads only independent blocks), and TLS peers that reset before their
handshake starts. Raw frames over loopback sockets, or the real clients; every wait is
bounded.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import cramjam
import pytest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v8 import request as fetch_v8_schema
from kio.schema.fetch.v8.response import FetchResponse as FetchV8Response
from kio.schema.list_offsets.v5 import request as list_offsets
from kio.schema.list_offsets.v5.response import ListOffsetsResponse
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from aiopurgatory.kafka import BrokerThread, KafkaBroker
from aiopurgatory.kafka.tls import TlsFiles

from ..support.kafka_codecs import compressed, lz4_frame, records_of, with_codec
from ..support.kafka_records import FOUR, log_of, produce_raw, raw_batch
from ..support.kafka_wire import Wire, create, fetch_from, ms, name, send, served_over_tls

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


# -- Fetch below v10: zstd batches -------------------------------------------------------------


def fetch_v8(wire: Wire, topic: str, offset: int, max_wait: float = 0.0) -> Any:
    """The partition's answer to a Fetch v8 (a consumer from before KIP-110)."""
    request = fetch_v8_schema.FetchRequest(
        replica_id=BrokerId(-1),
        max_wait=ms(max_wait),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(
            fetch_v8_schema.FetchTopic(
                topic=TopicName(topic),
                partitions=(
                    fetch_v8_schema.FetchPartition(
                        partition=i32(0),
                        fetch_offset=i64(offset),
                        log_start_offset=i64(-1),
                        partition_max_bytes=i32(1 << 20),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )
    return wire.call(request, FetchV8Response).responses[0].partitions[0]


def test_a_fetch_below_v10_is_refused_zstd_batches(kafka_broker_factory: Factory) -> None:
    """KIP-110: a Fetch older than v10 cannot read zstd. Where a zstd batch comes first
    the partition is answered UNSUPPORTED_COMPRESSION_TYPE (Kafka's answer, with its
    watermarks -1 and no records), at once however long the fetch may wait; the
    batches before it are served, and so is the zstd batch to a Fetch v10 or later.
    Asked again (the empty answers' cache), the same."""
    broker = kafka_broker_factory()
    topic = name("zstd")
    gzipped = compressed("gzip", records_of(FOUR), 4)
    zstd = compressed("zstd", records_of(FOUR), 4)
    plain = raw_batch([b"p"])
    with Wire(broker.bootstrap) as wire:
        create(wire, topic)
        for batch, base in [(gzipped, 0), (zstd, 4), (plain, 8)]:
            answer = produce_raw(wire, topic, batch)
            assert (answer.error_code, answer.base_offset) == (ErrorCode.none, base)
        for _ in range(2):
            old = fetch_v8(wire, topic, 4, max_wait=5.0)
            assert old.error_code is ErrorCode.unsupported_compression_type
            assert (old.high_watermark, old.last_stable_offset) == (-1, -1)
            assert not old.records
        old = fetch_v8(wire, topic, 0)
        assert (old.error_code, old.high_watermark) == (ErrorCode.none, 9)
        assert bytes(old.records)[12:] == gzipped[12:]  # the gzip batch, and no further
        old = fetch_v8(wire, topic, 8)
        assert (old.error_code, bytes(old.records)[12:]) == (ErrorCode.none, plain[12:])
        new = fetch_from(wire, topic, 4)  # v11
        assert new.error_code is ErrorCode.none
        assert bytes(new.records)[12 : 12 + len(zstd) - 12] == zstd[12:]


# -- LZ4: what Kafka's reader reads ------------------------------------------------------------


def lz4_linked(data: bytes) -> bytes:
    """An LZ4 frame of linked blocks (lz4's default; Kafka's reader refuses it)."""
    compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=True)
    compressor.compress(data)
    return bytes(compressor.finish())


def lz4_batch(frames: bytes, count: int) -> bytes:
    return with_codec(raw_batch([b""] * count, records=frames), 3)


def test_lz4_records_are_read_as_kafka_reads_them(kafka_broker_factory: Factory) -> None:
    """Kafka's LZ4 reader takes one frame of independent blocks and stops at its end
    mark. A frame of linked blocks is refused (CORRUPT_MESSAGE, as this broker answers
    records it cannot read; Kafka's reason "Dependent block stream is unsupported"),
    and so is a frame whose flags Kafka refuses; a batch whose header counts records
    of a second frame, which a Kafka consumer never reads, is refused INVALID_RECORD,
    its records being fewer than its offsets. Nothing of them is stored; an honest
    frame, with or without checksums, still is."""
    broker = kafka_broker_factory()
    topic = name("lz4")
    four = records_of(FOUR)
    eight = records_of(FOUR + FOUR)
    with Wire(broker.bootstrap) as wire:
        create(wire, topic)
        linked = produce_raw(wire, topic, lz4_batch(lz4_linked(four), 4))
        assert linked.error_code is ErrorCode.corrupt_message
        version_2 = bytearray(lz4_frame(four))
        version_2[4] = (version_2[4] & 0x3F) | 0x80
        refused = produce_raw(wire, topic, lz4_batch(bytes(version_2), 4))
        assert refused.error_code is ErrorCode.corrupt_message
        # Records 4..7 in a second frame: the header's 8 offsets, 4 records read.
        two_frames = lz4_frame(four) + lz4_frame(records_of(FOUR, [4, 5, 6, 7]))
        hidden = produce_raw(wire, topic, lz4_batch(two_frames, 8))
        assert hidden.error_code is ErrorCode.invalid_record
        assert log_of(wire, topic) == (0, [])
        compressor = cramjam.lz4.Compressor(content_checksum=True, block_linked=False)
        compressor.compress(eight)
        honest = produce_raw(wire, topic, lz4_batch(bytes(compressor.finish()), 8))
        assert (honest.error_code, honest.base_offset) == (ErrorCode.none, 0)
        assert log_of(wire, topic) == (8, list(enumerate(FOUR + FOUR)))


# -- TLS peers that reset before their handshake starts ----------------------------------------


def reset_at_once(address: tuple[str, int], count: int) -> None:
    """``count`` connections, each reset (SO_LINGER 0) at once: some before sending a
    byte, some after the first bytes of a ClientHello, some a moment later."""
    for i in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.settimeout(5)
        try:
            sock.connect(address)
            if i % 3 == 1:
                sock.send(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
            elif i % 3 == 2:
                time.sleep(0.001)
        except OSError:
            pass  # refused past max_connections' backlog: nothing to reset
        finally:
            sock.close()


@pytest.mark.anyio
async def test_tls_peers_resetting_before_the_handshake_leave_nothing(
    kafka_tls: TlsFiles, caplog: pytest.LogCaptureFixture
) -> None:
    """On asyncio and uvloop: 300 peers connect to a TLS listener and reset at once,
    before or while the handshake starts. Each connection ends quietly (no error
    logged, no exception left unretrieved, none escaping the connection's task), the
    count of connections returns to 0, and a TLS client is then served."""
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    caplog.set_level(logging.WARNING)
    try:
        async with (
            asyncio.timeout(30),
            KafkaBroker(
                ssl_context=kafka_tls.server_context(), auth_deadline_seconds=2.0
            ) as broker,
        ):
            host, port = broker.bootstrap.rsplit(":", 1)
            await asyncio.to_thread(reset_at_once, (host, int(port)), 300)
            for _ in range(100):  # 5 s: past the handshake's deadline and its grace
                if not broker.connections:
                    break
                await asyncio.sleep(0.05)
            assert len(broker.connections) == 0
            await served_over_tls(broker.bootstrap, kafka_tls.client_context())
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert reported == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
