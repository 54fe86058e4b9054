"""Record batches (the v2 format, magic 2): parsing what producers send, storing it.

Ground rules: a batch is checked (framing, magic, CRC32C, and what Kafka's log
validator checks: the header's offset range against its record count, and each record
read to its end) before anything keeps it, and stored as its bytes with the broker's
base offset written in (the CRC does not cover the base offset, so rewriting it keeps
the batch valid). A batch's header is not trusted: the offsets it takes are its
records', so a batch claiming fewer offsets than it holds would give its records the
offsets of the next batch's. Nothing here knows partitions or producers' state.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Final, NamedTuple

from crc32c import crc32c
from kio.serial.errors import BufferUnderflow
from kio.serial.readers import (
    read_int8,
    read_int16,
    read_int32,
    read_int64,
    read_signed_varint,
    read_signed_varlong,
    read_uint32,
)

from .codecs import ZSTD, NoCodec, NotInflated, deflate, inflate

__all__ = [
    "BadBatch",
    "IncomingBatch",
    "InvalidRecord",
    "Record",
    "StoredBatch",
    "UnsupportedCompression",
    "batch_records",
    "control_batch",
    "first_keyless",
    "rebuilt_batch",
    "split_batches",
]

# The v2 record batch header (Kafka's message format documentation): byte offsets of
# the fields the broker reads or rewrites; the CRC32C covers attributes to the end.
BATCH_BASE_OFFSET: Final = 0
BATCH_LENGTH: Final = 8
BATCH_LEADER_EPOCH: Final = 12
BATCH_MAGIC: Final = 16
BATCH_CRC: Final = 17
BATCH_ATTRIBUTES: Final = 21
BATCH_LAST_OFFSET_DELTA: Final = 23
BATCH_FIRST_TIMESTAMP: Final = 27
BATCH_MAX_TIMESTAMP: Final = 35
BATCH_PRODUCER_ID: Final = 43
BATCH_PRODUCER_EPOCH: Final = 51
BATCH_BASE_SEQUENCE: Final = 53
BATCH_RECORDS_COUNT: Final = 57
BATCH_HEADER_BYTES: Final = 61
LOG_OVERHEAD: Final = 12
"""Base offset and length: the bytes of a batch before what its length counts."""
COMPRESSION: Final = 0x07
NONE: Final = 0
TRANSACTIONAL: Final = 0x10
CONTROL: Final = 0x20


@dataclasses.dataclass(slots=True)
class StoredBatch:
    """A producer's record batch as stored: its bytes with the base offset assigned."""

    data: bytes
    count: int
    max_timestamp: int
    timestamp_so_far: int
    """The largest max timestamp of this batch and of every batch before it in its
    partition. Batches' own timestamps need not increase (producers set them), this
    does: the first batch whose own max timestamp reaches a time is the first whose
    running maximum does, found by bisection (Kafka's time index keeps the same)."""

    horizon: int = -1
    """The delete horizon (ms) the cleaner set when it first kept this batch's
    tombstones (Kafka's KIP-534 keeps it in the batch header): they go once the
    broker's clock passes it; -1: not cleaned yet, or none to keep."""

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def end(self) -> int:
        """The offset after its last: base offset plus the offsets it takes (kept as
        they were when the cleaner removes records, as Kafka keeps a batch's last
        offset)."""
        return int.from_bytes(self.data[:8], "big") + self.count


def timestamp_so_far(batch: StoredBatch) -> int:
    return batch.timestamp_so_far


def max_timestamp(batch: StoredBatch) -> int:
    return batch.max_timestamp


class BadBatch(Exception):
    """A record batch the broker will not store: answered CORRUPT_MESSAGE."""


class InvalidRecord(BadBatch):
    """A well-framed batch whose header or records Kafka's log validator refuses:
    answered INVALID_RECORD, with its message (Kafka's words) in the Produce answer's
    ``error_message`` where the version has one."""


class UnsupportedCompression(BadBatch):
    """A batch compressed by a codec not served here (snappy, LZ4 or zstd without
    cramjam, or an unknown codec id): answered UNSUPPORTED_COMPRESSION_TYPE, as Kafka
    answers a codec it does not take, rather than stored unread."""


@dataclasses.dataclass(slots=True)
class IncomingBatch:
    data: bytearray
    count: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool = False


ZSTD_SINCE: Final = 7
"""The first Produce version whose records may be zstd (KIP-110)."""
ZSTD_FETCH_SINCE: Final = 10
"""The first Fetch version that may be answered zstd records (KIP-110): an older
consumer cannot read them."""
_CODEC_BYTE: Final = BATCH_ATTRIBUTES + 1
"""The attributes' low byte (big-endian int16), which holds the codec."""


def before_zstd(batches: list[StoredBatch]) -> list[StoredBatch]:
    """``batches`` up to the first zstd one: what a Fetch older than v10 may be given.

    A batch's codec is its attributes' low bits, read from the header: one byte per
    batch, only for those old fetches. Kafka answers UNSUPPORTED_COMPRESSION_TYPE to
    such a fetch of a topic configured for zstd; here batches are stored as their
    producers compressed them, so the consumer reads what it can, and is answered that
    error where a zstd batch comes first (the caller's part)."""
    for at, batch in enumerate(batches):
        if batch.data[_CODEC_BYTE] & COMPRESSION == ZSTD:
            return batches[:at]
    return batches


def split_batches(
    records: bytes, max_uncompressed: int = 16 * 1024 * 1024, produce_version: int = ZSTD_SINCE
) -> list[IncomingBatch]:
    """The v2 batches in a produce request's records, each checked: framing, magic,
    CRC, its offset range and records (:class:`InvalidRecord`). Kafka takes one batch
    per partition and request (every client sends one); several are served here, each
    checked as the one (a test builds a long log in one request). A compressed batch's
    records are read once inflated (:mod:`.codecs`), up to ``max_uncompressed`` bytes
    (CORRUPT_MESSAGE beyond, or if they do not inflate; UNSUPPORTED_COMPRESSION_TYPE
    for a codec not served, and for zstd in a Produce older than version 7, as Kafka
    refuses it)."""
    batches = []
    view = memoryview(records)
    at = 0
    while at < len(view):
        if len(view) - at < BATCH_HEADER_BYTES:
            raise BadBatch("truncated batch header")
        length, _ = read_int32(view, at + BATCH_LENGTH)
        end = at + LOG_OVERHEAD + length
        if length < BATCH_HEADER_BYTES - LOG_OVERHEAD or end > len(view):
            raise BadBatch(f"batch length {length} does not fit the records")
        magic, _ = read_int8(view, at + BATCH_MAGIC)
        if magic != 2:
            raise BadBatch(f"record batch magic {magic}, only v2 (magic 2) is served")
        crc, _ = read_uint32(view, at + BATCH_CRC)
        if crc != crc32c(view[at + BATCH_ATTRIBUTES : end]):
            raise BadBatch("record batch CRC mismatch")
        attributes, _ = read_int16(view, at + BATCH_ATTRIBUTES)
        count = _offset_range(view, at)
        if attributes & CONTROL:
            # Commit and abort markers are the transaction coordinator's to write.
            raise InvalidRecord("Clients are not allowed to write control records")
        producer_id = read_int64(view, at + BATCH_PRODUCER_ID)[0]
        base_sequence = read_int32(view, at + BATCH_BASE_SEQUENCE)[0]
        if producer_id >= 0 and base_sequence < 0:
            raise InvalidRecord(
                f"Invalid sequence number {base_sequence} in record batch with producerId"
                f" {producer_id}"
            )
        if attributes & TRANSACTIONAL and producer_id < 0:
            raise BadBatch("a transactional batch without a producer id")
        data = bytearray(view[at:end])
        stamped: int = read_int64(view, at + BATCH_MAX_TIMESTAMP)[0]
        first_timestamp: int = read_int64(view, at + BATCH_FIRST_TIMESTAMP)[0]
        codec = attributes & COMPRESSION
        if codec == ZSTD and produce_version < ZSTD_SINCE:
            raise UnsupportedCompression(
                f"Produce requests with version {produce_version} are not allowed to use"
                " ZStandard compression"
            )
        if codec == NONE:
            newest = _check_records(view, at + BATCH_HEADER_BYTES, end, count, first_timestamp)
        else:
            try:
                inflated = inflate(codec, view[at + BATCH_HEADER_BYTES : end], max_uncompressed)
            except NoCodec as exc:
                raise UnsupportedCompression(str(exc)) from None
            except NotInflated as exc:
                raise BadBatch(str(exc)) from None
            newest = _check_records(inflated, 0, len(inflated), count, first_timestamp)
        if newest != stamped:
            # The records' own largest timestamp, as Kafka stamps the batch with it.
            stamped = newest
            struct.pack_into(">q", data, BATCH_MAX_TIMESTAMP, newest)
            struct.pack_into(">I", data, BATCH_CRC, crc32c(data[BATCH_ATTRIBUTES:]))
        batches.append(
            IncomingBatch(
                data=data,
                count=count,
                max_timestamp=stamped,
                producer_id=producer_id,
                producer_epoch=read_int16(view, at + BATCH_PRODUCER_EPOCH)[0],
                base_sequence=base_sequence,
                transactional=bool(attributes & TRANSACTIONAL),
            )
        )
        at = end
    if not batches:
        raise BadBatch("no record batch")
    return batches


def _offset_range(view: memoryview, at: int) -> int:
    """The offsets the batch at ``at`` takes, as Kafka's log validator checks a client's
    batch: base offset 0 (the broker assigns offsets), last offset delta + 1 records,
    and as many records counted. InvalidRecord, in Kafka's words, otherwise."""
    base, _ = read_int64(view, at + BATCH_BASE_OFFSET)
    if base != 0:
        raise InvalidRecord(
            f"The baseOffset of the record batch in the append should be 0, but it is {base}"
        )
    delta, _ = read_int32(view, at + BATCH_LAST_OFFSET_DELTA)
    if delta < 0:
        raise InvalidRecord(f"Batch has an invalid offset range: [0, {delta}]")
    count, _ = read_int32(view, at + BATCH_RECORDS_COUNT)
    if count <= 0:
        raise InvalidRecord(f"Invalid reported count for record batch: {count}")
    if delta + 1 != count:
        raise InvalidRecord(
            f"Inconsistent batch offset range [0, {delta}] and count of records {count}"
        )
    return count


def _check_records(view: memoryview, pos: int, end: int, count: int, first_timestamp: int) -> int:
    """Read the ``count`` records in ``view[pos:end]`` (a batch's, uncompressed or
    inflated; the first stamped ``first_timestamp``) as Kafka reads them: each within
    its length, its offset delta its index (so its offset is the batch's base plus its
    place, and offsets stay unique), none missing, nothing after the last. Returns
    their largest timestamp (-1 if none has one). InvalidRecord otherwise."""
    newest = -1
    try:
        for index in range(count):
            if pos >= end:
                raise InvalidRecord("Incorrect declared batch size, premature EOF reached")
            length, used = read_signed_varint(view, pos)
            pos += used
            start = pos
            if length < 0 or end - pos < length:
                raise InvalidRecord(
                    f"Invalid record size: expected {length} bytes in record payload, but"
                    f" the batch has only {end - pos} remaining bytes"
                )
            record_end = pos + length
            record = view[:record_end]  # a record never reads past its own length
            pos += 1  # attributes
            timestamp_delta, used = read_signed_varlong(record, pos)
            pos += used
            offset_delta, used = read_signed_varint(record, pos)
            pos += used
            if offset_delta != index:
                raise InvalidRecord(
                    f"Record {index}'s offset delta ({offset_delta}) is not continuous."
                    f" Expected offset delta: {index}"
                )
            newest = max(newest, first_timestamp + timestamp_delta)
            for _ in range(2):  # key, value
                size, used = read_signed_varint(record, pos)
                pos += used + max(size, 0)
            headers, used = read_signed_varint(record, pos)
            pos += used
            if headers < 0:
                raise InvalidRecord(f"Found invalid number of record headers {headers}")
            for _ in range(headers):
                size, used = read_signed_varint(record, pos)
                if size < 0:
                    raise InvalidRecord(f"Invalid negative header key size {size}")
                pos += used + size
                size, used = read_signed_varint(record, pos)
                pos += used + max(size, 0)
            if pos != record_end:
                raise InvalidRecord(
                    f"Invalid record size: expected to read {length} bytes in record"
                    f" payload, but instead read {pos - start}"
                )
    except (BufferUnderflow, ValueError) as exc:  # a record cut short, a varint too long
        raise InvalidRecord(f"Invalid record: {exc}") from None
    if pos != end:
        raise InvalidRecord("Incorrect declared batch size, records still remaining in file")
    return newest


# A control record (Kafka's message format documentation): attributes 0, timestamp and
# offset deltas 0, a 4-byte key, a 6-byte value, no headers; its length is a zigzag varint.
_CONTROL_RECORD: Final = struct.Struct(">bbbbhhbhib")
_CONTROL_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
CONTROL_ABORT: Final = 0
CONTROL_COMMIT: Final = 1


def control_batch(
    producer_id: int, producer_epoch: int, *, commit: bool, coordinator_epoch: int, timestamp: int
) -> bytearray:
    """A transaction marker: a v2 batch of one control record, CRC32C set, base offset 0.

    Attributes: control and transactional. The record's key is (version 0, type: 0 abort,
    1 commit), its value (version 0, the coordinator's epoch); base sequence -1, as
    Kafka writes markers (they take an offset, not a sequence).
    """
    body = _CONTROL_RECORD.pack(
        0,  # attributes
        0,  # timestamp delta: varint 0
        0,  # offset delta: varint 0
        4 << 1,  # key length 4, a zigzag varint
        0,  # key version
        CONTROL_COMMIT if commit else CONTROL_ABORT,
        6 << 1,  # value length 6
        0,  # value version
        coordinator_epoch,
        0,  # headers: none
    )
    record = bytes([len(body) << 1]) + body
    header_size = _CONTROL_HEADER.size
    batch = bytearray(header_size + len(record))
    _CONTROL_HEADER.pack_into(
        batch,
        0,
        0,  # base offset: the broker's to assign
        len(batch) - LOG_OVERHEAD,
        0,  # partition leader epoch
        2,  # magic
        0,  # CRC, computed below
        CONTROL | TRANSACTIONAL,
        0,  # last offset delta
        timestamp,
        timestamp,
        producer_id,
        producer_epoch,
        -1,  # base sequence
        1,  # records
    )
    batch[header_size:] = record
    struct.pack_into(">I", batch, BATCH_CRC, crc32c(bytes(batch[BATCH_ATTRIBUTES:])))
    return batch


# -- what the cleaner reads and rewrites (:mod:`.cleaner`) -------------------------------


class Record(NamedTuple):
    """One record of a stored batch, as the cleaner reads it."""

    offset_delta: int
    key: bytes | None
    tombstone: bool
    """A null value: a delete of its key."""
    raw: bytes
    """Its encoding, length prefix included: copied as it is into a rewritten batch
    (its deltas are relative to the batch's base offset and first timestamp, kept)."""


def batch_records(data: bytes, max_uncompressed: int) -> list[Record]:
    """The records of the v2 batch ``data``, checked when it was produced (so trusted:
    a malformed one raises ValueError), inflated first if compressed (NotInflated or
    NoCodec, from :mod:`.codecs`, if that fails)."""
    view = memoryview(data)
    codec = data[_CODEC_BYTE] & COMPRESSION
    if codec == NONE:
        body, pos, end = view, BATCH_HEADER_BYTES, len(view)
    else:
        body = inflate(codec, view[BATCH_HEADER_BYTES:], max_uncompressed)
        pos, end = 0, len(body)
    records = []
    try:
        while pos < end:
            start = pos
            length, used = read_signed_varint(body, pos)
            pos += used
            record_end = pos + length
            pos += 1  # attributes
            pos += read_signed_varlong(body, pos)[1]  # timestamp delta
            offset_delta, used = read_signed_varint(body, pos)
            pos += used
            size, used = read_signed_varint(body, pos)
            pos += used
            key = None if size < 0 else bytes(body[pos : pos + size])
            pos += max(size, 0)
            size, _ = read_signed_varint(body, pos)
            records.append(Record(offset_delta, key, size < 0, bytes(body[start:record_end])))
            pos = record_end
    except BufferUnderflow as exc:
        raise ValueError(f"a stored batch's records do not read: {exc}") from None
    return records


def rebuilt_batch(data: bytes, kept: list[Record]) -> bytes:
    """The batch ``data`` holding only the records ``kept`` (some of its own), as Kafka's
    cleaner rewrites a v2 batch: the same base offset, last offset delta, timestamps,
    attributes, producer id, epoch and base sequence (so the producer's state reads the
    same), compressed again with its own codec (Kafka's cleaner keeps a batch's
    compression type), its records count and length new, its CRC32C computed again."""
    body = b"".join(record.raw for record in kept)
    codec = data[_CODEC_BYTE] & COMPRESSION
    out = bytearray(data[:BATCH_HEADER_BYTES])
    out += body if codec == NONE else deflate(codec, body)
    struct.pack_into(">i", out, BATCH_LENGTH, len(out) - LOG_OVERHEAD)
    struct.pack_into(">i", out, BATCH_RECORDS_COUNT, len(kept))
    struct.pack_into(">I", out, BATCH_CRC, crc32c(bytes(out[BATCH_ATTRIBUTES:])))
    return bytes(out)


def first_keyless(data: bytes, max_uncompressed: int) -> int | None:
    """The index of the first record without a key in the batch ``data`` (None: every
    record has one): what a compacted topic refuses."""
    for index, record in enumerate(batch_records(data, max_uncompressed)):
        if record.key is None:
            return index
    return None
