"""Topic configs (the ones that change behaviour here) and the broker's read-only ones.

Ground rules: plain data, no kio. A topic's overrides are validated whole before any is
applied (:func:`check_topic_configs`); what is not overridden is the broker's default,
reported with the broker's actual value (not Kafka's built-in one where they differ).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from .groups import GroupCoordinator
from .limits import Limits
from .log import SEGMENT_BYTES, SEGMENT_MS

__all__ = [
    "BOOLEAN",
    "CLEANUP_POLICIES",
    "DOUBLE",
    "INT",
    "LIST",
    "LONG",
    "STRING",
    "TOPIC_CONFIGS",
    "ConfigError",
    "broker_configs",
    "check_topic_configs",
    "topic_defaults",
]

# Kafka's ConfigEntry types (DescribeConfigs v3+).
BOOLEAN: Final = 1
STRING: Final = 2
INT: Final = 3
LONG: Final = 5
DOUBLE: Final = 6
LIST: Final = 7

TOPIC_CONFIGS: Final = {
    "retention.bytes": LONG,
    "retention.ms": LONG,
    "cleanup.policy": LIST,
    "max.message.bytes": INT,
    "min.insync.replicas": INT,
    "segment.bytes": INT,
    "segment.ms": LONG,
    "min.cleanable.dirty.ratio": DOUBLE,
    "min.compaction.lag.ms": LONG,
    "max.compaction.lag.ms": LONG,
    "delete.retention.ms": LONG,
}
"""The topic configs served, with their types: each applied (``retention.ms`` by the
broker's periodic retention check, every ``retention_check_ms``, Kafka's
``log.retention.check.interval.ms``; the compaction ones by the cleaner,
:mod:`.cleaner`)."""

CLEANUP_POLICIES: Final = ("compact", "delete")
"""Kafka's ``cleanup.policy`` values: a list of one or both."""
SEGMENT_BYTES_MIN: Final = 14
"""Kafka's least ``segment.bytes`` (a batch's header fits)."""
MIN_CLEANABLE_DIRTY_RATIO: Final = 0.5
DELETE_RETENTION_MS: Final = 24 * 3600 * 1000

OFFSETS_TOPIC_PARTITIONS: Final = 50
"""Kafka's ``offsets.topic.num.partitions``: ``__consumer_offsets`` in Metadata."""
RETENTION_MS_DEFAULT: Final = 7 * 24 * 3600 * 1000
INT_MAX: Final = 2**31 - 1
LONG_MAX: Final = 2**63 - 1


class ConfigError(ValueError):
    """A refused config: Kafka's INVALID_CONFIG, with this message."""


def topic_defaults(limits: Limits, cleanup_policy: str = "delete") -> dict[str, str]:
    """The value each topic config has when not overridden: what the broker does
    (``cleanup_policy``: the broker's ``log.cleanup.policy``)."""
    return {
        "retention.bytes": str(limits.retain_bytes),
        "retention.ms": str(RETENTION_MS_DEFAULT),
        "cleanup.policy": cleanup_policy,
        # Kafka's default is 1048588; this broker takes any batch a request can carry.
        "max.message.bytes": str(limits.max_request_bytes),
        "min.insync.replicas": "1",
        "segment.bytes": str(SEGMENT_BYTES),
        "segment.ms": str(SEGMENT_MS),
        "min.cleanable.dirty.ratio": str(MIN_CLEANABLE_DIRTY_RATIO),
        "min.compaction.lag.ms": "0",
        "max.compaction.lag.ms": str(LONG_MAX),
        "delete.retention.ms": str(DELETE_RETENTION_MS),
    }


def cleanup_policy(value: str) -> tuple[str, ...]:
    """``cleanup.policy`` (or ``log.cleanup.policy``) read as Kafka reads a list: its
    items, each ``compact`` or ``delete``, in a canonical order. ConfigError else."""
    items = {item.strip() for item in value.split(",") if item.strip()}
    if not items or not items <= set(CLEANUP_POLICIES):
        raise ConfigError(
            f"Invalid value {value[:100]} for configuration cleanup.policy: "
            "the policies are 'compact' and 'delete'"
        )
    return tuple(p for p in CLEANUP_POLICIES if p in items)


@dataclasses.dataclass(frozen=True, slots=True)
class TopicSettings:
    """What a topic's configs make the broker do."""

    retain_bytes: int | None
    max_message_bytes: int | None
    retain_ms: int | None
    """``retention.ms``: batches whose max timestamp is older go (None: forever, -1)."""
    values: dict[str, str]
    """The overrides as stored and described: normalised (``" 1"`` is ``"1"``), so a
    value padded to a request's size is not what the broker keeps."""
    min_insync: int = 1
    """``min.insync.replicas``: an acks=all produce is refused NOT_ENOUGH_REPLICAS while
    the ISR is smaller."""
    policy: tuple[str, ...] | None = None
    """``cleanup.policy`` where set (None: the broker's ``log.cleanup.policy``)."""
    segment_bytes: int = SEGMENT_BYTES
    segment_ms: int = SEGMENT_MS
    min_dirty_ratio: float = MIN_CLEANABLE_DIRTY_RATIO
    min_lag_ms: int = 0
    max_lag_ms: int = LONG_MAX
    delete_retention_ms: int = DELETE_RETENTION_MS


def _integer(name: str, value: str, low: int, high: int) -> int:
    # The message quotes at most 100 characters of what the client sent.
    try:
        number = int(value.strip())
    except ValueError:
        raise ConfigError(f"Invalid value {value[:100]} for configuration {name}") from None
    if not low <= number <= high:
        raise ConfigError(f"Invalid value {value[:100]} for configuration {name}: out of range")
    return number


def check_topic_configs(overrides: Mapping[str, str | None], limits: Limits) -> TopicSettings:
    """Validate a topic's overrides (name to value; None: the default) and what they do.

    Raises:
        ConfigError: An unknown name, a malformed or out-of-range value, or a cleanup
            policy other than ``delete`` (no compaction here).
    """
    for name, value in overrides.items():
        if name not in TOPIC_CONFIGS:
            raise ConfigError(f"Unknown topic config name: {name[:100]}")
        if value is None:
            raise ConfigError(f"Null value not supported for topic config {name}")
    retain_bytes: int | None = limits.retain_bytes
    max_message_bytes: int | None = None
    values: dict[str, str] = {}
    if (value := overrides.get("retention.bytes")) is not None:
        number = _integer("retention.bytes", value, -1, LONG_MAX)
        # -1 is Kafka's "no size limit": the broker-wide total limit still holds.
        retain_bytes = None if number == -1 else number
        values["retention.bytes"] = str(number)
    retain_ms: int | None = RETENTION_MS_DEFAULT
    if (value := overrides.get("retention.ms")) is not None:
        number = _integer("retention.ms", value, -1, LONG_MAX)
        retain_ms = None if number == -1 else number
        values["retention.ms"] = str(number)
    policy: tuple[str, ...] | None = None
    if (value := overrides.get("cleanup.policy")) is not None:
        policy = cleanup_policy(value)
        values["cleanup.policy"] = ",".join(policy)
    if (value := overrides.get("max.message.bytes")) is not None:
        max_message_bytes = _integer("max.message.bytes", value, 0, INT_MAX)
        values["max.message.bytes"] = str(max_message_bytes)
    min_insync = 1
    if (value := overrides.get("min.insync.replicas")) is not None:
        min_insync = _integer("min.insync.replicas", value, 1, INT_MAX)
        values["min.insync.replicas"] = str(min_insync)
    longs = {}
    for name, low, default in (
        ("segment.ms", 1, SEGMENT_MS),
        ("min.compaction.lag.ms", 0, 0),
        ("max.compaction.lag.ms", 1, LONG_MAX),
        ("delete.retention.ms", 0, DELETE_RETENTION_MS),
    ):
        longs[name] = default
        if (value := overrides.get(name)) is not None:
            longs[name] = _integer(name, value, low, LONG_MAX)
            values[name] = str(longs[name])
    segment_bytes = SEGMENT_BYTES
    if (value := overrides.get("segment.bytes")) is not None:
        segment_bytes = _integer("segment.bytes", value, SEGMENT_BYTES_MIN, INT_MAX)
        values["segment.bytes"] = str(segment_bytes)
    ratio = MIN_CLEANABLE_DIRTY_RATIO
    if (value := overrides.get("min.cleanable.dirty.ratio")) is not None:
        ratio = _ratio(value)
        values["min.cleanable.dirty.ratio"] = str(ratio)
    if longs["min.compaction.lag.ms"] > longs["max.compaction.lag.ms"]:
        raise ConfigError(
            "conflict topic config setting max.compaction.lag.ms "
            f"({longs['max.compaction.lag.ms']}) < min.compaction.lag.ms "
            f"({longs['min.compaction.lag.ms']})"
        )
    return TopicSettings(
        retain_bytes,
        max_message_bytes,
        retain_ms,
        values,
        min_insync,
        policy,
        segment_bytes,
        longs["segment.ms"],
        ratio,
        longs["min.compaction.lag.ms"],
        longs["max.compaction.lag.ms"],
        longs["delete.retention.ms"],
    )


def _ratio(value: str) -> float:
    name = "min.cleanable.dirty.ratio"
    try:
        number = float(value.strip())
    except ValueError:
        raise ConfigError(f"Invalid value {value[:100]} for configuration {name}") from None
    if not 0.0 <= number <= 1.0:  # NaN too
        raise ConfigError(f"Invalid value {value[:100]} for configuration {name}: out of range")
    return number


def broker_configs(
    limits: Limits,
    groups: GroupCoordinator,
    *,
    cleanup: str = "delete",
    node: int,
    partitions: int,
    replicas: int,
    listener: str,
) -> dict[str, tuple[str, int]]:
    """The configs of the broker ``node`` (its id, its ``listener``) under Kafka's names:
    (value, type) each, the values the broker actually runs with (read-only: the
    options are the command's)."""

    def ms(seconds: float) -> str:
        return str(round(seconds * 1000))

    return {
        "broker.id": (str(node), INT),
        "num.partitions": (str(partitions), INT),
        "default.replication.factor": (str(replicas), INT),
        "auto.create.topics.enable": ("true", BOOLEAN),
        "delete.topic.enable": ("true", BOOLEAN),
        "group.initial.rebalance.delay.ms": (ms(groups.initial_rebalance_delay), INT),
        "group.min.session.timeout.ms": (ms(groups.min_session_timeout), INT),
        "group.max.session.timeout.ms": (ms(groups.max_session_timeout), INT),
        "group.max.size": (str(limits.max_members), INT),
        "offsets.retention.minutes": (str(limits.offsets_retention_minutes), INT),
        "offset.metadata.max.bytes": (str(limits.offset_metadata_max_bytes), INT),
        "offsets.topic.num.partitions": (str(OFFSETS_TOPIC_PARTITIONS), INT),
        "offsets.topic.replication.factor": (str(replicas), INT),
        "log.retention.bytes": (str(limits.retain_bytes), LONG),
        "log.retention.ms": (str(RETENTION_MS_DEFAULT), LONG),
        "log.retention.check.interval.ms": (str(limits.retention_check_ms), LONG),
        "log.cleanup.policy": (cleanup, LIST),
        "log.segment.bytes": (str(SEGMENT_BYTES), INT),
        "log.roll.ms": (str(SEGMENT_MS), LONG),
        "log.cleaner.min.cleanable.ratio": (str(MIN_CLEANABLE_DIRTY_RATIO), DOUBLE),
        "log.cleaner.delete.retention.ms": (str(DELETE_RETENTION_MS), LONG),
        "log.cleaner.backoff.ms": (str(limits.log_cleaner_backoff_ms), LONG),
        "message.max.bytes": (str(limits.max_request_bytes), INT),
        "min.insync.replicas": ("1", INT),
        "socket.request.max.bytes": (str(limits.max_request_bytes), INT),
        "queued.max.request.bytes": (str(limits.max_inflight_bytes), LONG),
        "max.connections": (str(limits.max_connections), INT),
        "connections.max.idle.ms": (ms(limits.idle_seconds), LONG),
        "advertised.listeners": (listener, STRING),
    }
