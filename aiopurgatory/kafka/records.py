"""Record batches (the v2 format, magic 2): parsing what producers send, storing it.

Ground rules: a batch is checked (framing, magic, CRC32C) before anything keeps it, and
stored as its bytes with the broker's base offset written in (the CRC does not cover
the base offset, so rewriting it keeps the batch valid). Nothing here knows partitions
or producers' state.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Final

from crc32c import crc32c
from kio.serial.readers import read_int8, read_int16, read_int32, read_int64, read_uint32

__all__ = ["BadBatch", "IncomingBatch", "StoredBatch", "control_batch", "split_batches"]

# The v2 record batch header (Kafka's message format documentation): byte offsets of
# the fields the broker reads or rewrites; the CRC32C covers attributes to the end.
BATCH_BASE_OFFSET: Final = 0
BATCH_LENGTH: Final = 8
BATCH_LEADER_EPOCH: Final = 12
BATCH_MAGIC: Final = 16
BATCH_CRC: Final = 17
BATCH_ATTRIBUTES: Final = 21
BATCH_LAST_OFFSET_DELTA: Final = 23
BATCH_MAX_TIMESTAMP: Final = 35
BATCH_PRODUCER_ID: Final = 43
BATCH_PRODUCER_EPOCH: Final = 51
BATCH_BASE_SEQUENCE: Final = 53
BATCH_HEADER_BYTES: Final = 61
LOG_OVERHEAD: Final = 12
"""Base offset and length: the bytes of a batch before what its length counts."""
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

    @property
    def size(self) -> int:
        return len(self.data)


def timestamp_so_far(batch: StoredBatch) -> int:
    return batch.timestamp_so_far


def max_timestamp(batch: StoredBatch) -> int:
    return batch.max_timestamp


class BadBatch(Exception):
    """A record batch the broker will not store: answered CORRUPT_MESSAGE."""


@dataclasses.dataclass(slots=True)
class IncomingBatch:
    data: bytearray
    count: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool = False


def split_batches(records: bytes) -> list[IncomingBatch]:
    """The v2 batches in a produce request's records, each checked (magic, CRC)."""
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
        if attributes & CONTROL:
            # Commit and abort markers are the transaction coordinator's to write.
            raise BadBatch("a producer may not send control batches")
        producer_id = read_int64(view, at + BATCH_PRODUCER_ID)[0]
        if attributes & TRANSACTIONAL and producer_id < 0:
            raise BadBatch("a transactional batch without a producer id")
        delta, _ = read_int32(view, at + BATCH_LAST_OFFSET_DELTA)
        if delta < 0:
            raise BadBatch(f"last offset delta {delta} < 0")
        batches.append(
            IncomingBatch(
                data=bytearray(view[at:end]),
                count=delta + 1,
                max_timestamp=read_int64(view, at + BATCH_MAX_TIMESTAMP)[0],
                producer_id=producer_id,
                producer_epoch=read_int16(view, at + BATCH_PRODUCER_EPOCH)[0],
                base_sequence=read_int32(view, at + BATCH_BASE_SEQUENCE)[0],
                transactional=bool(attributes & TRANSACTIONAL),
            )
        )
        at = end
    if not batches:
        raise BadBatch("no record batch")
    return batches


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
