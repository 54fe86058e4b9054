"""Record batches (the v2 format, magic 2): parsing what producers send, storing it.

Ground rules: a batch is checked (framing, magic, CRC32C) before anything keeps it, and
stored as its bytes with the broker's base offset written in (the CRC does not cover
the base offset, so rewriting it keeps the batch valid). Nothing here knows partitions
or producers' state.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from crc32c import crc32c
from kio.serial.readers import read_int8, read_int16, read_int32, read_int64, read_uint32

__all__ = ["BadBatch", "IncomingBatch", "StoredBatch", "split_batches"]

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
        if attributes & TRANSACTIONAL:
            raise BadBatch("transactional batches are not served")
        delta, _ = read_int32(view, at + BATCH_LAST_OFFSET_DELTA)
        if delta < 0:
            raise BadBatch(f"last offset delta {delta} < 0")
        batches.append(
            IncomingBatch(
                data=bytearray(view[at:end]),
                count=delta + 1,
                max_timestamp=read_int64(view, at + BATCH_MAX_TIMESTAMP)[0],
                producer_id=read_int64(view, at + BATCH_PRODUCER_ID)[0],
                producer_epoch=read_int16(view, at + BATCH_PRODUCER_EPOCH)[0],
                base_sequence=read_int32(view, at + BATCH_BASE_SEQUENCE)[0],
            )
        )
        at = end
    if not batches:
        raise BadBatch("no record batch")
    return batches
