"""Hostile compressed batches (issue 44, item 1, the codecs): a snappy, lz4 or zstd
batch's records are read once inflated and checked as an uncompressed batch's, so a
header claiming fewer offsets than its compressed records hold is refused
INVALID_RECORD (it was stored, and read back as offsets the next batch also took).
Records that do not inflate, or inflate beyond ``max_request_bytes``, are
CORRUPT_MESSAGE, refused without the broker holding what they would inflate to;
without cramjam, such batches are UNSUPPORTED_COMPRESSION_TYPE. Raw frames (batches
compressed here by cramjam) and real clients (confluent-kafka, aiokafka) producing
each codec and reading it back. Then how the codecs are read as Kafka reads them: zstd
records refused to a Fetch below v10 (KIP-110), LZ4 frames of linked blocks (Kafka reads
only independent blocks)."""

from __future__ import annotations

import asyncio
import importlib
import resource
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import confluent_kafka
import cramjam
import pytest
from aiokafka import AIOKafkaProducer
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v8 import request as fetch_v8_schema
from kio.schema.fetch.v8.response import FetchResponse as FetchV8Response
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import Records, i8, i16, i32, i64

from aiopurgatory.kafka import BrokerThread, codecs

from ..support.kafka_codecs import (
    CODECS,
    XERIAL_HEADER,
    compressed,
    lz4_frame,
    records_of,
    snappy_java,
    snappy_raw,
    with_codec,
    zstd_frame,
)
from ..support.kafka_records import FOUR, log_of, produce_raw, raw_batch, topic
from ..support.kafka_wire import Wire, aiokafka_read, create, fetch_from, ms, name

# -- each codec as a producer writes it ------------------------------------------------------


NEW_CODECS = [name for name in CODECS if name != "gzip"]


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    with BrokerThread() as address:
        yield address


@pytest.fixture(scope="module")
def small_broker() -> Iterator[str]:
    """A broker taking requests of at most 1 MiB: records inflate to at most that."""
    with BrokerThread(max_request_bytes=1 << 20) as address:
        yield address


# -- raw frames ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", list(CODECS))
def test_an_honest_compressed_batch_is_stored_and_read_back(broker: str, codec: str) -> None:
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        answer = produce_raw(wire, name, compressed(codec, records_of(FOUR), 4))
        assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 0)
        assert produce_raw(wire, name, raw_batch([b"b"])).base_offset == 4
        assert log_of(wire, name) == (5, [*enumerate(FOUR), (4, b"b")])


@pytest.mark.parametrize("codec", list(CODECS))
def test_a_compressed_batch_whose_header_lies_is_refused_invalid_record(
    broker: str, codec: str
) -> None:
    """The issue's case, compressed: a header saying one record (last offset delta 0,
    count 1) over four records at offset deltas 0..3, stored before as one offset and
    read back as 0..3, the next producer's offsets too."""
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        lying = compressed(codec, records_of(FOUR), 1)
        answer = produce_raw(wire, name, lying)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.invalid_record, -1)
        assert answer.error_message.startswith(
            "Incorrect declared batch size, records still remaining"
        ), answer.error_message
        deltas = produce_raw(wire, name, compressed(codec, records_of(FOUR, [0, 0, 0, 0]), 4))
        assert deltas.error_code is ErrorCode.invalid_record
        assert deltas.error_message.startswith("Record 1's offset delta (0) is not continuous")
        honest = produce_raw(wire, name, raw_batch([b"b1", b"b2", b"b3"]))
        assert (honest.error_code, honest.base_offset) == (ErrorCode.none, 0)
        assert log_of(wire, name) == (3, [(0, b"b1"), (1, b"b2"), (2, b"b3")])


GARBAGE: dict[str, bytes] = {
    "snappy-java": XERIAL_HEADER + struct.pack(">i", 9) + b"not snappy",
    "snappy-java cut short": snappy_java(records_of(FOUR))[:-3],
    "snappy-java block length past the end": XERIAL_HEADER + struct.pack(">i", 1 << 30),
    "snappy-java negative block length": XERIAL_HEADER + struct.pack(">i", -5) + b"xxxxx",
    "snappy raw": b"\xff\xff\xff\xff\x0fnot snappy at all",
    "lz4": b"not an lz4 frame",
    "lz4 cut short": lz4_frame(records_of(FOUR))[:-6],
    "zstd": b"not a zstd frame",
    "zstd cut short": zstd_frame(records_of(FOUR))[:-4],
}


@pytest.mark.parametrize("case", list(GARBAGE))
def test_compressed_records_that_do_not_inflate_are_corrupt_message(broker: str, case: str) -> None:
    codec_id = CODECS[case.split(" cut")[0].split(" block")[0].split(" negative")[0]][0]
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        batch = with_codec(raw_batch([b"x"], records=GARBAGE[case]), codec_id)
        answer = produce_raw(wire, name, batch)
        assert (answer.error_code, answer.base_offset) == (ErrorCode.corrupt_message, -1)
        assert log_of(wire, name) == (0, [])


def zstd_bomb(inflated: int) -> bytes:
    """zstd frames, back to back, inflating to ``inflated`` zero bytes in all."""
    frame = zstd_frame(b"\x00" * (1 << 20))
    return frame * (inflated >> 20)


BOMBS: dict[str, tuple[int, Callable[[], bytes]]] = {
    # Each inflates to 4 MiB or more (zstd: 4 GiB), the broker's bound being 1 MiB.
    "snappy-java": (2, lambda: snappy_java(b"\x00" * (4 << 20))),
    "snappy-java, one block": (2, lambda: snappy_java(b"\x00" * (4 << 20), block=4 << 20)),
    "snappy raw": (2, lambda: snappy_raw(b"\x00" * (4 << 20))),
    "lz4": (3, lambda: lz4_frame(b"\x00" * (16 << 20))),
    "zstd": (4, lambda: zstd_bomb(4 << 30)),
}


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


@pytest.mark.parametrize("case", list(BOMBS))
def test_a_compressed_batch_inflating_beyond_the_bound_is_refused_quickly(
    small_broker: str, case: str
) -> None:
    """A small batch inflating past max_request_bytes is refused CORRUPT_MESSAGE at
    the bound: quickly, and without the broker (in this process) holding what it
    would inflate to (the zstd one inflates to 4 GiB)."""
    codec_id, make = BOMBS[case]
    bomb = with_codec(raw_batch([b"x"], records=make()), codec_id)
    assert len(bomb) < 512 << 10
    name = topic()
    with Wire(small_broker) as wire:
        create(wire, name)
        before = peak_rss()
        started = time.monotonic()
        answer = produce_raw(wire, name, bomb)
        took = time.monotonic() - started
        assert (answer.error_code, answer.base_offset) == (ErrorCode.corrupt_message, -1)
        assert took < 2.0
        assert peak_rss() - before < 256 << 20
        assert log_of(wire, name) == (0, [])


def test_records_inflating_to_exactly_the_bound_are_taken(small_broker: str) -> None:
    """The bound is what the records may inflate to: one record filling it is read."""
    value_size = (1 << 20) - 11
    records = records_of([b"\x00" * value_size])
    assert len(records) == 1 << 20
    name = topic()
    with Wire(small_broker) as wire:
        create(wire, name)
        for codec in NEW_CODECS:
            batch = compressed(codec, records, 1)
            assert produce_raw(wire, name, batch).error_code is ErrorCode.none, codec
        over = compressed("zstd", records_of([b"\x00" * (value_size + 1)]), 1)
        assert produce_raw(wire, name, over).error_code is ErrorCode.corrupt_message


@pytest.mark.parametrize("codec", NEW_CODECS)
def test_without_cramjam_snappy_lz4_and_zstd_are_unsupported_compression_type(
    broker: str, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the codecs (cramjam missing), such a batch is refused, never stored
    unread: UNSUPPORTED_COMPRESSION_TYPE (76) with why; gzip is still served."""
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        codec_id = CODECS[codec][0]
        monkeypatch.delitem(codecs.INFLATERS, codec_id)
        answer = produce_raw(wire, name, compressed(codec, records_of(FOUR), 4))
        assert (answer.error_code, answer.base_offset) == (
            ErrorCode.unsupported_compression_type,
            -1,
        )
        assert "needs cramjam" in answer.error_message
        assert produce_raw(wire, name, compressed("gzip", records_of(FOUR), 4)).base_offset == 0
        monkeypatch.undo()
        assert produce_raw(wire, name, compressed(codec, records_of(FOUR), 4)).base_offset == 4


def test_an_unknown_codec_id_is_unsupported_compression_type(broker: str) -> None:
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        for codec_id in (5, 6, 7):
            batch = with_codec(raw_batch(FOUR), codec_id)
            answer = produce_raw(wire, name, batch)
            assert answer.error_code is ErrorCode.unsupported_compression_type
            assert answer.error_message == f"Unknown compression type id: {codec_id}"
        assert log_of(wire, name) == (0, [])


def test_the_codecs_are_not_served_when_cramjam_does_not_import() -> None:
    """The broker's modules imported where cramjam cannot be: gzip is served, the
    other codecs' batches are refused (not stored unread)."""
    script = """
import sys
sys.modules["cramjam"] = None  # import cramjam raises ImportError
from aiopurgatory.kafka import codecs, records
assert not codecs.HAVE_CRAMJAM and sorted(codecs.INFLATERS) == [1], codecs.INFLATERS
batch = bytes.fromhex(sys.argv[1])
try:
    records.split_batches(batch)
except records.UnsupportedCompression as exc:
    print("refused:", exc)
"""
    batch = compressed("zstd", records_of(FOUR), 4)
    done = subprocess.run(
        [sys.executable, "-c", script, batch.hex()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: zstd compression is not supported"), done.stdout


# -- real clients -------------------------------------------------------------------------------

VALUES = [f"value {i} ".encode() * (1 + i % 7) for i in range(200)]


@pytest.mark.parametrize("compression", ["snappy", "lz4", "zstd", "gzip"])
def test_confluent_kafka_compressed_batches_are_stored_and_read(
    broker: str, compression: str
) -> None:
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": broker, "compression.type": compression, "linger.ms": 20}
    )
    failures: list[Any] = []
    offsets: list[int] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(error)
        else:
            offsets.append(message.offset())

    for value in VALUES:
        producer.produce(name, value=value, on_delivery=delivered)
    assert producer.flush(20) == 0
    assert failures == []
    assert sorted(offsets) == list(range(len(VALUES)))
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": broker, "group.id": "unused", "enable.auto.commit": False}
    )
    read: list[tuple[int, bytes]] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(name, 0, 0)])
        deadline = time.monotonic() + 20
        while len(read) < len(VALUES) and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=500, timeout=0.5):
                assert message.error() is None, message.error()
                offset, got = message.offset(), message.value()
                assert offset is not None
                assert isinstance(got, bytes)
                read.append((offset, got))
    finally:
        consumer.close()
    assert read == list(enumerate(VALUES))
    with Wire(broker) as wire:
        # Stored compressed, as sent.
        assert log_of(wire, name) == (len(VALUES), list(enumerate(VALUES)))


@pytest.mark.anyio
@pytest.mark.parametrize("compression", ["snappy", "lz4", "zstd"])
async def test_aiokafka_compressed_batches_are_stored_and_read(
    broker: str, compression: str, anyio_backend: Any
) -> None:
    if anyio_backend[0] != "asyncio":
        pytest.skip("aiokafka runs on asyncio")
    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
    producer = AIOKafkaProducer(
        bootstrap_servers=broker, compression_type=compression, linger_ms=20
    )
    await asyncio.wait_for(producer.start(), 10)
    try:
        sent = [await producer.send(name, value) for value in VALUES]
        offsets = [(await asyncio.wait_for(future, 10)).offset for future in sent]
    finally:
        await producer.stop()
    assert offsets == list(range(len(VALUES)))
    read = await aiokafka_read(broker, name, len(VALUES))
    assert read == list(enumerate(VALUES))


@pytest.mark.parametrize(("version", "expected"), [(3, 76), (6, 76), (7, 0), (8, 0)])
def test_zstd_before_produce_version_7_is_unsupported_compression_type(
    broker: str, version: int, expected: int
) -> None:
    """Kafka refuses zstd records in a Produce older than version 7 (KIP-110):
    UNSUPPORTED_COMPRESSION_TYPE (its message, "Produce requests with version 6 are
    not allowed to use ZStandard compression", is logged: those versions carry none);
    the other codecs are taken at every version."""
    request_module = importlib.import_module(f"kio.schema.produce.v{version}.request")
    response_module = importlib.import_module(f"kio.schema.produce.v{version}.response")

    def produce(name: str, batch: bytes) -> Any:
        request = request_module.ProduceRequest(
            transactional_id=None,
            acks=i16(-1),
            timeout=ms(5),
            topic_data=(
                request_module.TopicProduceData(
                    name=TopicName(name),
                    partition_data=(
                        request_module.PartitionProduceData(index=i32(0), records=Records(batch)),
                    ),
                ),
            ),
        )
        answer = wire.call(request, response_module.ProduceResponse)
        return answer.responses[0].partition_responses[0]

    name = topic()
    with Wire(broker) as wire:
        create(wire, name)
        zstd = produce(name, compressed("zstd", records_of(FOUR), 4))
        assert (int(zstd.error_code), zstd.base_offset) == (expected, 0 if expected == 0 else -1)
        lz4 = produce(name, compressed("lz4", records_of(FOUR), 4))
        assert (lz4.error_code, lz4.base_offset) == (ErrorCode.none, 4 if expected == 0 else 0)


Factory = Callable[..., BrokerThread]


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
