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

__all__ = [
    "BOOLEAN",
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
LIST: Final = 7

TOPIC_CONFIGS: Final = {
    "retention.bytes": LONG,
    "retention.ms": LONG,
    "cleanup.policy": LIST,
    "max.message.bytes": INT,
    "min.insync.replicas": INT,
}
"""The topic configs served, with their types: each applied (``retention.ms`` by the
broker's periodic retention check, every ``retention_check_ms``, Kafka's
``log.retention.check.interval.ms``)."""

OFFSETS_TOPIC_PARTITIONS: Final = 50
"""Kafka's ``offsets.topic.num.partitions``: ``__consumer_offsets`` in Metadata."""
RETENTION_MS_DEFAULT: Final = 7 * 24 * 3600 * 1000
INT_MAX: Final = 2**31 - 1
LONG_MAX: Final = 2**63 - 1


class ConfigError(ValueError):
    """A refused config: Kafka's INVALID_CONFIG, with this message."""


def topic_defaults(limits: Limits) -> dict[str, str]:
    """The value each topic config has when not overridden: what the broker does."""
    return {
        "retention.bytes": str(limits.retain_bytes),
        "retention.ms": str(RETENTION_MS_DEFAULT),
        "cleanup.policy": "delete",
        # Kafka's default is 1048588; this broker takes any batch a request can carry.
        "max.message.bytes": str(limits.max_request_bytes),
        "min.insync.replicas": "1",
    }


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
    if (value := overrides.get("cleanup.policy")) is not None:
        policies = [item.strip() for item in value.split(",") if item.strip()]
        if policies != ["delete"]:
            raise ConfigError(
                f"Invalid value {value[:100]} for configuration cleanup.policy: "
                "only 'delete' is served (no log compaction in this broker)"
            )
        values["cleanup.policy"] = "delete"
    if (value := overrides.get("max.message.bytes")) is not None:
        max_message_bytes = _integer("max.message.bytes", value, 0, INT_MAX)
        values["max.message.bytes"] = str(max_message_bytes)
    min_insync = 1
    if (value := overrides.get("min.insync.replicas")) is not None:
        min_insync = _integer("min.insync.replicas", value, 1, INT_MAX)
        values["min.insync.replicas"] = str(min_insync)
    return TopicSettings(retain_bytes, max_message_bytes, retain_ms, values, min_insync)


def broker_configs(
    limits: Limits,
    groups: GroupCoordinator,
    *,
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
        "log.cleanup.policy": ("delete", LIST),
        "message.max.bytes": (str(limits.max_request_bytes), INT),
        "min.insync.replicas": ("1", INT),
        "socket.request.max.bytes": (str(limits.max_request_bytes), INT),
        "queued.max.request.bytes": (str(limits.max_inflight_bytes), LONG),
        "max.connections": (str(limits.max_connections), INT),
        "connections.max.idle.ms": (ms(limits.idle_seconds), LONG),
        "advertised.listeners": (listener, STRING),
    }
