"""Keys and channels: a key's canonical encoding, its shard channel, the hash tags.

A wake-up's payload is ``ORIGIN "|" TAG BODY``: ``ORIGIN`` a fanout's random hex id
or empty, ``TAG`` how ``BODY`` encodes the key (:func:`encode_key`). A key goes to
shard ``CRC-32(encoding) mod shards``, whose channel is ``<prefix>:{<n>}``.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable
from typing import Final

__all__ = [
    "MAX_SHARDS",
    "SEP",
    "channel_names",
    "decode_key",
    "encode_key",
    "hash_tag",
    "shard_of",
    "text",
]

SEP: Final = b"|"
"""Between a payload's origin and its encoded key."""
_TAG_STR: Final = b"s"
_TAG_BYTES: Final = b"b"
_TAG_INT: Final = b"i"
MAX_SHARDS: Final = 16384
"""Redis Cluster's hash slots: more shards could not spread."""


def encode_key(key: Hashable) -> bytes:
    """The canonical, process-independent encoding of a key (``str``, ``bytes``, ``int``).

    Raises ``TypeError`` for any other type: a tuple or an object has no encoding that
    every process is sure to decode into an equal key.
    """
    if isinstance(key, str):
        return _TAG_STR + key.encode("utf-8", "surrogatepass")
    if isinstance(key, bytes):
        return _TAG_BYTES + key
    if isinstance(key, int):  # bool too: True == 1 is the same purgatory key
        return _TAG_INT + b"%d" % key
    raise TypeError(
        f"a RedisFanout key must be a str, bytes or int (they have an encoding every"
        f" process decodes alike), got {type(key).__name__}: {key!r}"
    )


def decode_key(data: bytes) -> str | bytes | int:
    """The inverse of :func:`encode_key`; ``ValueError`` for anything else."""
    tag, body = data[:1], data[1:]
    if tag == _TAG_STR:
        return body.decode("utf-8", "surrogatepass")
    if tag == _TAG_BYTES:
        return body
    if tag == _TAG_INT:
        return int(body)
    raise ValueError(f"not an encoded key: {data[:40]!r}")


def channel_names(prefix: str, shards: int) -> list[str]:
    """The shard channels ``<prefix>:{0}`` ... ``<prefix>:{shards-1}`` (index = shard)."""
    return [f"{prefix}:{{{n}}}" for n in range(shards)]


def shard_of(encoded: bytes, shards: int) -> int:
    """The shard of a key encoded by :func:`encode_key`: CRC-32, stable everywhere."""
    return zlib.crc32(encoded) % shards


def hash_tag(channel: str) -> str | None:
    """The channel name's hash tag (its first non-empty ``{...}``), or None."""
    start = channel.find("{")
    end = channel.find("}", start + 1)
    if start < 0 or end <= start + 1:
        return None
    return channel[start : end + 1]


def text(value: object) -> str:
    """A channel name (or host) as Redis replied it, bytes or str, as a str."""
    return value.decode() if isinstance(value, bytes) else str(value)
