"""Compressed record batches: their records inflated to be read, never beyond a bound.

Ground rules: a producer's compressed records are inflated only to be checked (as an
uncompressed batch's records are checked); what the broker stores and serves is the
batch as sent. A small batch must not make the broker hold gigabytes, and nothing a
batch says about its own size is trusted (a zstd or LZ4 frame's content size, a snappy
block's length): every codec writes into one buffer of the bound plus one byte and
stops where it is full. The buffer is an anonymous mapping, whose pages the kernel
gives only as they are written, so a batch costs what it inflates to, not the bound.

The cleaner (:mod:`.cleaner`) compresses a batch it rewrote again with its own codec
(:func:`deflate`), as Kafka's cleaner keeps a batch's compression type, in the forms
Kafka writes: gzip, snappy-java's stream, an LZ4 frame of independent blocks (the one
Kafka reads), zstd.

gzip is the standard library's zlib; snappy, LZ4 and zstd are cramjam's (the ``kafka``
extra). Without cramjam those three codecs are not served: their batches are refused
(UNSUPPORTED_COMPRESSION_TYPE, Kafka's answer for a codec it does not take), never
stored unread, as a batch whose records were not read could give its records the
next batch's offsets.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Callable
from typing import Final

try:
    import cramjam
except ImportError:  # the kafka extra brings it; without it, see INFLATERS
    HAVE_CRAMJAM = False
else:
    HAVE_CRAMJAM = True

__all__ = [
    "CODEC_NAMES",
    "INFLATERS",
    "NoCodec",
    "NotInflated",
    "deflate",
    "inflate",
]

GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4
CODEC_NAMES: Final = {GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
"""A batch's compression codec (its attributes' low 3 bits; 0 is none) by name."""
GZIP_WBITS: Final = 16 + zlib.MAX_WBITS
"""zlib's window bits for a gzip stream (header and trailer), Kafka's gzip codec."""
XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
"""The snappy-java stream's magic (Kafka's Java producer writes that stream): 16 bytes
of header (magic, version, compatible version), then blocks, each a big-endian int32
length and a raw snappy block. Kafka (snappy-java) reads a stream without that magic
as one raw snappy block, which librdkafka writes."""
XERIAL_HEADER_BYTES: Final = 16
XERIAL_HEADER: Final = XERIAL_MAGIC + b"\x00\x00\x00\x01\x00\x00\x00\x01"
"""The stream header snappy-java writes: magic, version 1, compatible version 1."""
XERIAL_BLOCK_BYTES: Final = 32 * 1024
"""snappy-java's default block: what one raw block holds of the records at most."""
_BLOCK_LENGTH: Final = struct.Struct(">i")


class NotInflated(Exception):
    """Records that do not inflate, or inflate to more than the bound."""


class NoCodec(Exception):
    """A codec this broker cannot inflate (cramjam is not installed, or an unknown id)."""


Inflater = Callable[[memoryview, int], memoryview]
"""Inflate a batch's records, to at most the bound (NotInflated otherwise)."""


def inflate(codec: int, data: memoryview, limit: int) -> memoryview:
    """``data`` (a batch's records, compressed by ``codec``) inflated; NotInflated if
    they do not inflate or take more than ``limit`` bytes, NoCodec if ``codec`` is not
    served here."""
    inflater = INFLATERS.get(codec)
    if inflater is not None:
        return inflater(data, limit)
    name = CODEC_NAMES.get(codec)
    if name is None:
        raise NoCodec(f"Unknown compression type id: {codec}")
    raise NoCodec(
        f"{name} compression is not supported by this broker: it needs cramjam"
        " (pip install 'aiopurgatory[kafka]')"
    )


def _gunzip(data: memoryview, limit: int) -> memoryview:
    inflater = zlib.decompressobj(wbits=GZIP_WBITS)
    try:
        inflated = inflater.decompress(data, limit)
    except zlib.error as exc:
        raise NotInflated(f"gzip records do not inflate: {exc}") from None
    if inflater.unconsumed_tail:
        raise NotInflated(f"gzip records inflate to more than {limit} bytes")
    if not inflater.eof:
        raise NotInflated("gzip records end early")
    return memoryview(inflated)


def _bounded(name: str, into: Callable[[memoryview, memoryview], int]) -> Inflater:
    """A cramjam codec's inflater: ``into`` writes into a buffer of the bound plus one
    byte, and fails (cramjam's DecompressionError) where the records are corrupt or
    the buffer full. The buffer is an anonymous mapping: only the pages written are
    ever given memory, and it is unmapped when the last view of it goes."""

    def inflater(data: memoryview, limit: int) -> memoryview:
        out = memoryview(mmap.mmap(-1, limit + 1))
        try:
            size = into(data, out)
        except NotInflated:
            raise
        except Exception as exc:  # cramjam.DecompressionError, whatever the codec
            raise NotInflated(
                f"{name} records do not inflate within {limit} bytes: {exc}"
            ) from None
        if size > limit:
            raise NotInflated(f"{name} records inflate to more than {limit} bytes")
        return out[:size].toreadonly()  # kio's readers read read-only views

    return inflater


def _unsnappy(data: memoryview, out: memoryview) -> int:
    """Kafka's two snappy forms: the snappy-java stream (its magic, then length-prefixed
    raw blocks), or one raw block. A raw block states its inflated length first: one
    longer than what is left of the buffer is refused before anything is written."""
    if len(data) < XERIAL_HEADER_BYTES or data[: len(XERIAL_MAGIC)].tobytes() != XERIAL_MAGIC:
        return _snappy_block(data, out)
    size = 0
    at = XERIAL_HEADER_BYTES
    while at < len(data):
        if len(data) - at < _BLOCK_LENGTH.size:
            raise NotInflated("snappy block length cut short")
        (length,) = _BLOCK_LENGTH.unpack_from(data, at)
        at += _BLOCK_LENGTH.size
        if length < 0 or length > len(data) - at:
            raise NotInflated(f"snappy block length {length} does not fit the records")
        size += _snappy_block(data[at : at + length], out[size:])
        at += length
    return size


def _snappy_block(block: memoryview, out: memoryview) -> int:
    claimed = int(cramjam.snappy.decompress_raw_len(block))
    if claimed > len(out):
        raise NotInflated(f"a snappy block of {claimed} bytes does not fit the bound")
    return int(cramjam.snappy.decompress_raw_into(block, out))


def _unlz4(data: memoryview, out: memoryview) -> int:
    """The LZ4 frame format (Kafka's since magic 1, KIP-57), frames' content sizes
    not trusted: the buffer bounds what they inflate to. Only the first frame is
    inflated, and only one Kafka reads (:func:`lz4_frame_end`)."""
    return int(cramjam.lz4.decompress_into(data[: lz4_frame_end(data)], out))


LZ4_MAGIC: Final = 0x184D2204
"""An LZ4 frame's first four bytes (little-endian)."""
_LZ4_INDEPENDENT: Final = 0x20
_LZ4_BLOCK_CHECKSUM: Final = 0x10
_LZ4_CONTENT_SIZE: Final = 0x08
_LZ4_CONTENT_CHECKSUM: Final = 0x04
_LZ4_UNCOMPRESSED: Final = 0x80000000
_LE_UINT32: Final = struct.Struct("<I")


def lz4_frame_end(data: memoryview) -> int:
    """Where the first LZ4 frame of ``data`` ends; NotInflated if Kafka does not read it.

    Kafka's reader (its own, not lz4's) takes one frame of independent blocks, version
    1, no dictionary, blocks of 64 KiB to 4 MiB, and stops at its end mark: bytes
    after it are never read. lz4's decoder reads linked blocks and frame after frame,
    so records a Kafka consumer cannot read, or never reads, would be counted here.
    So the frame descriptor is checked as Kafka checks it (its messages), and the
    blocks walked by their lengths (no inflating) to the end mark."""
    end = len(data)
    if end < 7 or _LE_UINT32.unpack_from(data, 0)[0] != LZ4_MAGIC:
        raise NotInflated("lz4 records: Stream unsupported (invalid magic bytes)")
    flg, bd = data[4], data[5]
    if flg & 0x03:
        raise NotInflated("lz4 records: Reserved bits must be 0")
    if not flg & _LZ4_INDEPENDENT:
        raise NotInflated("lz4 records: Dependent block stream is unsupported")
    if flg >> 6 != 1:
        raise NotInflated(f"lz4 records: Version {flg >> 6} is unsupported")
    if bd & 0x8F:
        raise NotInflated("lz4 records: Reserved bits of the block descriptor must be 0")
    block_size_value = (bd >> 4) & 0x07
    if block_size_value < 4:
        raise NotInflated("lz4 records: Block size value must be between 4 and 7")
    max_block = 1 << (2 * block_size_value + 8)
    at = 7 + (8 if flg & _LZ4_CONTENT_SIZE else 0)  # magic, FLG, BD, [size], HC
    checksum = 4 if flg & _LZ4_BLOCK_CHECKSUM else 0
    while at + 4 <= end:
        (block,) = _LE_UINT32.unpack_from(data, at)
        at += 4
        if block == 0:  # the end mark
            at += 4 if flg & _LZ4_CONTENT_CHECKSUM else 0
            if at > end:
                break
            return at
        size = block & ~_LZ4_UNCOMPRESSED
        if size > max_block:
            raise NotInflated(f"lz4 records: Block size {size} exceeded max: {max_block}")
        at += size + checksum
    raise NotInflated("lz4 records end early")


def _unzstd(data: memoryview, out: memoryview) -> int:
    return int(cramjam.zstd.decompress_into(data, out))


INFLATERS: Final[dict[int, Inflater]] = {GZIP: _gunzip}
"""The codecs served, each one inflate function; snappy, LZ4 and zstd with cramjam."""
if HAVE_CRAMJAM:
    INFLATERS.update(
        {
            SNAPPY: _bounded("snappy", _unsnappy),
            LZ4: _bounded("lz4", _unlz4),
            ZSTD: _bounded("zstd", _unzstd),
        }
    )


def deflate(codec: int, records: bytes) -> bytes:
    """``records`` (a batch's, uncompressed) compressed by ``codec`` (a codec that
    inflated them: gzip always, the others with cramjam; NoCodec otherwise)."""
    if codec == GZIP:
        compressor = zlib.compressobj(wbits=GZIP_WBITS)
        return compressor.compress(records) + compressor.flush()
    if not HAVE_CRAMJAM or codec not in CODEC_NAMES:
        raise NoCodec(f"cannot compress with codec {codec}")
    if codec == SNAPPY:
        out = bytearray(XERIAL_HEADER)
        for at in range(0, len(records), XERIAL_BLOCK_BYTES):
            block = bytes(cramjam.snappy.compress_raw(records[at : at + XERIAL_BLOCK_BYTES]))
            out += _BLOCK_LENGTH.pack(len(block)) + block
        return bytes(out)
    if codec == LZ4:
        # Independent blocks: lz4's default links them, which Kafka's reader refuses.
        frame = cramjam.lz4.Compressor(content_checksum=False, block_linked=False)
        frame.compress(records)
        return bytes(frame.finish())
    return bytes(cramjam.zstd.compress(records))
