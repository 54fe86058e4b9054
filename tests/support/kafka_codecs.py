"""Kafka's codecs framed by hand, for the hostile tests: gzip, snappy-java's stream and
raw snappy blocks, LZ4 frames of independent blocks, zstd frames, and v2 batches whose
records they compress (:mod:`tests.support.kafka_records` writes the batches).

Framed here rather than by a client library, so that a test can send a framing a client
would not (raw snappy, linked LZ4 blocks) and see the broker answer as Kafka does.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable
from typing import Any

import cramjam
from crc32c import crc32c

from .kafka_records import raw_batch, record

XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


def snappy_java(data: bytes, block: int = 32 * 1024) -> bytes:
    """snappy-java's stream (Kafka's Java producer): its header, then each block of
    ``block`` bytes as a big-endian length and a raw snappy block."""
    out = [XERIAL_HEADER]
    for at in range(0, len(data), block):
        compressed = bytes(cramjam.snappy.compress_raw(data[at : at + block]))
        out += [struct.pack(">i", len(compressed)), compressed]
    return b"".join(out)


def snappy_raw(data: bytes) -> bytes:
    """One raw snappy block (librdkafka's snappy)."""
    return bytes(cramjam.snappy.compress_raw(data))


def lz4_frame(data: bytes) -> bytes:
    """The LZ4 frame format, independent blocks (KIP-57, as Kafka writes it)."""
    compressor = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
    compressor.compress(data)
    return bytes(compressor.finish())


def zstd_frame(data: bytes) -> bytes:
    return bytes(cramjam.zstd.compress(data))


CODECS: dict[str, tuple[int, Callable[[bytes], bytes]]] = {
    "gzip": (1, gzip.compress),
    "snappy-java": (2, snappy_java),
    "snappy raw": (2, snappy_raw),
    "lz4": (3, lz4_frame),
    "zstd": (4, zstd_frame),
}


def compressed(codec: str, records: bytes, count: int, **header: Any) -> bytes:
    """A batch of ``count`` records whose (uncompressed) ``records`` are compressed by
    ``codec``; its header fields as told, its attributes the codec, CRC right."""
    codec_id, compress = CODECS[codec]
    return with_codec(raw_batch([b""] * count, records=compress(records), **header), codec_id)


def with_codec(batch: bytes, codec_id: int) -> bytes:
    fixed = bytearray(batch)
    struct.pack_into(">h", fixed, 21, codec_id)
    struct.pack_into(">I", fixed, 17, crc32c(bytes(fixed[21:])))
    return bytes(fixed)


def records_of(values: list[bytes], deltas: list[int] | None = None) -> bytes:
    deltas = list(range(len(values))) if deltas is None else deltas
    return b"".join(record(d, v, i) for i, (d, v) in enumerate(zip(deltas, values, strict=True)))
