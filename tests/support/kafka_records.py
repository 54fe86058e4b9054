"""Kafka record batches built by hand, for the hostile tests: v2 batches (CRC-32C,
varints), compressed with the clients' codecs or not, produced raw and read back from
the log (:mod:`tests.support.kafka_codecs` frames the codecs by hand).

Built here rather than by a client library, so that the tests can send batches no
client would: wrong CRCs, lying counts, codecs framed the way Kafka refuses.
"""

from __future__ import annotations

import datetime
import gzip
import io
import struct
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import codec as aiokafka_codec
from crc32c import crc32c
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.errors import ErrorCode
from kio.schema.produce.v8.response import ProduceResponse
from kio.static.primitive import TZAwareMicros, i8, i16, i32, i64

from .kafka_wire import (
    Wire,
    fetch_from,
    produce_request,
)

_HEAD: struct.Struct = struct.Struct(">qiibI")

_BODY: struct.Struct = struct.Struct(">hiqqqhii")

NOW_MS = 1_700_000_000_000


def plain_batch(
    records: Sequence[tuple[bytes | None, bytes | None]], at: datetime.datetime
) -> bytes:
    """A well-formed v2 batch, as kio writes it: (key, value) records at offsets from 0,
    each stamped ``at``, no producer id, no codec."""
    stamp = TZAwareMicros.parse(at)
    buffer = io.BytesIO()
    write_new_batch(
        buffer,
        NewRecordBatch(
            producer_id=i64(-1),
            producer_epoch=i16(-1),
            base_sequence=i32(-1),
            records=tuple(
                Record(attributes=i8(0), timestamp=stamp, offset=i64(i), key=k, value=v, headers=())
                for i, (k, v) in enumerate(records)
            ),
            attributes=i16(0),
        ),
    )
    return buffer.getvalue()


def varint(value: int) -> bytes:
    """A zigzag varint (Kafka's record fields)."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def record(offset_delta: int, value: bytes, timestamp_delta: int = 0) -> bytes:
    body = (
        b"\x00"  # attributes
        + varint(timestamp_delta)
        + varint(offset_delta)
        + varint(-1)  # null key
        + varint(len(value))
        + value
        + varint(0)  # no headers
    )
    return varint(len(body)) + body


def raw_batch(
    values: Sequence[bytes],
    *,
    offset_deltas: Sequence[int] | None = None,
    last_offset_delta: int | None = None,
    count: int | None = None,
    pid: int = -1,
    sequence: int = -1,
    epoch: int = -1,
    base_offset: int = 0,
    max_timestamp: int | None = None,
    bad_crc: bool = False,
    records: bytes | None = None,
    gzipped: bool = False,
    codec: int = 0,
) -> bytes:
    """A v2 batch of ``values`` (record i stamped NOW_MS + i), CRC-32C correct unless
    ``bad_crc``; each header field and the records' offset deltas as told (by default
    what an honest producer writes)."""
    deltas = list(range(len(values))) if offset_deltas is None else list(offset_deltas)
    if records is None:
        records = b"".join(
            record(d, v, i) for i, (d, v) in enumerate(zip(deltas, values, strict=True))
        )
    if gzipped:
        codec = 1
    if codec:
        records = COMPRESS[codec](records)
    body = (
        _BODY.pack(
            codec,  # attributes: the codec (0: none), create time
            len(values) - 1 if last_offset_delta is None else last_offset_delta,
            NOW_MS,
            NOW_MS + max(len(values) - 1, 0) if max_timestamp is None else max_timestamp,
            pid,
            epoch if pid >= 0 or epoch != -1 else -1,
            sequence,
            len(values) if count is None else count,
        )
        + records
    )
    crc = crc32c(body) ^ (1 if bad_crc else 0)
    return _HEAD.pack(base_offset, 4 + 1 + 4 + len(body), 0, 2, crc) + body


COMPRESS: dict[int, Callable[[bytes], bytes]] = {
    1: gzip.compress,
    2: aiokafka_codec.snappy_encode,  # snappy-java's stream, as Kafka's Java producer writes
    3: aiokafka_codec.lz4_encode,
    4: aiokafka_codec.zstd_encode,
}

DECOMPRESS: dict[int, Callable[[bytes], bytes]] = {
    1: gzip.decompress,
    2: aiokafka_codec.snappy_decode,
    3: aiokafka_codec.lz4_decode,
    4: aiokafka_codec.zstd_decode,
}


def read_records(data: bytes) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in ``data`` (a fetch's batches, uncompressed or
    compressed), as a consumer computes them: the batch's base offset plus the record's
    offset delta."""
    found = []
    at = 0
    while at + _HEAD.size <= len(data):
        base, length, _, _, _ = _HEAD.unpack_from(data, at)
        end = at + 12 + length
        (attributes,) = struct.unpack_from(">h", data, at + 21)
        count = struct.unpack_from(">i", data, at + 57)[0]
        records = data[at + 61 : end]
        if attributes & 0x07:
            records = DECOMPRESS[attributes & 0x07](records)
        pos = 0
        for _ in range(count):
            _, pos = read_varint(records, pos)  # length
            pos += 1
            _, pos = read_varint(records, pos)  # timestamp delta
            delta, pos = read_varint(records, pos)
            key, pos = read_varint(records, pos)
            pos += max(key, 0)
            size, pos = read_varint(records, pos)
            found.append((base + delta, bytes(records[pos : pos + size])))
            pos += size
            headers, pos = read_varint(records, pos)
            assert headers == 0
        at = end
    return found


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        byte = data[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (n >> 1) ^ -(n & 1), pos


def topic() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


def produce_raw(
    wire: Wire, name: str, records: bytes, *, partition: int = 0, acks: int = -1
) -> Any:
    """The partition's answer to one Produce v8 of ``records``."""
    request = produce_request([(name, [(partition, records)])], acks=acks)
    return wire.call(request, ProduceResponse).responses[0].partition_responses[0]


def log_of(wire: Wire, name: str, partition: int = 0) -> tuple[int, list[tuple[int, bytes]]]:
    """(high watermark, every record from offset 0) of a partition."""
    answer = fetch_from(wire, name, 0, partition=partition)
    assert answer.error_code is ErrorCode.none
    return int(answer.high_watermark), read_records(bytes(answer.records or b""))


FOUR = [b"a0", b"a1", b"a2", b"a3"]
