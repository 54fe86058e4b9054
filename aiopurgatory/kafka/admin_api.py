"""The admin APIs: DescribeGroups, ListGroups, DeleteGroups, OffsetDelete,
DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, CreatePartitions, DeleteRecords
and DescribeCluster, answered from the core, the group coordinator and the topic configs.

Ground rules: each resource of a request (a group, a topic, a partition) is checked
whole before anything of it changes, and answered on its own, as Kafka answers them; a
resource whose handling fails anyway is answered UNKNOWN_SERVER_ERROR and the others
go on. Topic configs live here (:mod:`.configs` says which and what they do); the
tables they fill are bounded by the topics there may be.
"""

from __future__ import annotations

import collections
import functools
import logging
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any, Final

from kio.schema.errors import ErrorCode

from .cleaner import Cleaner
from .configs import (
    LIST,
    TOPIC_CONFIGS,
    ConfigError,
    TopicSettings,
    check_topic_configs,
    topic_defaults,
)
from .connection import current_connection
from .consumer_groups import ConsumerGroupCoordinator
from .core import BrokerCore
from .groups import GroupCoordinator
from .limits import Limits
from .log import TopicPartition
from .protocol import (
    ALTER_CONFIGS,
    CLUSTER_ID,
    CREATE_PARTITIONS,
    DELETE_GROUPS,
    DELETE_RECORDS,
    DESCRIBE_CLUSTER,
    DESCRIBE_CONFIGS,
    DESCRIBE_GROUPS,
    DUPLICATE_TOPIC,
    INCREMENTAL_ALTER_CONFIGS,
    LIST_GROUPS,
    NODE_ID,
    OFFSET_DELETE,
    ZERO,
    Handler,
    make,
    response_module,
    response_schema,
)
from .records import StoredBatch

__all__ = ["AdminApi"]

log = logging.getLogger("aiopurgatory.kafka")

# Kafka's ConfigResource types and config sources.
TOPIC: Final = 2
BROKER: Final = 4
DYNAMIC_TOPIC_CONFIG: Final = 1
STATIC_BROKER_CONFIG: Final = 4
DEFAULT_CONFIG: Final = 5
# IncrementalAlterConfigs operations.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
NO_OPERATIONS: Final = -(2**31)
"""Authorized operations not asked for, or not known (no ACLs here): Kafka's INT_MIN."""
BROKERS_ENDPOINT: Final = 1
BROKER_ID: Final = re.compile(r"[+-]?[0-9]{1,10}")
"""A broker resource's name as Kafka reads it (Java's ``Integer.parseInt``), within
INT32_MIN..INT32_MAX."""
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
DUPLICATE_RESOURCE: Final = "Duplicate resource."
"""Kafka's message for a resource listed twice in AlterConfigs or
IncrementalAlterConfigs."""


class AdminApi:
    """The admin APIs' handlers.

    Args:
        core: The log (partitions, retention, max message bytes).
        groups: The group coordinator.
        limits: The broker's limits.
        brokers: The nodes up, as clients are told of them: (node id, host, port).
        add_partitions: Grow a topic to a number of partitions (the broker starts the
            new partitions' followers).
        broker_configs: A node's configs, name to (value, type), as DescribeConfigs
            reports them (read-only), given its id.
        cleaner: The log cleaner (compacted topics' configs).
        consumers: The consumer-type groups' coordinator (KIP-848): their states as
            ListGroups lists them.
    """

    __slots__ = (
        "add_partitions",
        "broker_configs",
        "brokers",
        "cleaner",
        "consumers",
        "core",
        "groups",
        "limits",
        "overrides",
    )

    def __init__(
        self,
        core: BrokerCore[StoredBatch],
        groups: GroupCoordinator,
        limits: Limits,
        brokers: Callable[[], list[tuple[int, str, int]]],
        add_partitions: Callable[[str, int], None],
        broker_configs: Callable[[int], Mapping[str, tuple[str, int]]],
        cleaner: Cleaner,
        consumers: ConsumerGroupCoordinator | None = None,
    ) -> None:
        self.core = core
        self.consumers = consumers
        self.cleaner = cleaner
        self.groups = groups
        self.limits = limits
        self.brokers = brokers
        self.add_partitions = add_partitions
        self.broker_configs = broker_configs
        self.overrides: dict[str, dict[str, str]] = {}
        """Topic to its configs set by AlterConfigs (existing topics only: bounded)."""

    def handlers(self) -> dict[int, Handler]:
        """API key to handler, for the broker's dispatch."""
        return {
            DESCRIBE_GROUPS: self.describe_groups,
            LIST_GROUPS: self.list_groups,
            DELETE_GROUPS: self.delete_groups,
            OFFSET_DELETE: self.offset_delete,
            DESCRIBE_CONFIGS: self.describe_configs,
            ALTER_CONFIGS: self.alter_configs,
            INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            CREATE_PARTITIONS: self.create_partitions,
            DELETE_RECORDS: self.delete_records,
            DESCRIBE_CLUSTER: self.describe_cluster,
        }

    def forget_topic(self, topic: str) -> None:
        """``topic`` was deleted: its configs go with it (a new one starts afresh)."""
        self.overrides.pop(topic, None)

    @staticmethod
    def _guarded(what: str, fn: Callable[[], ErrorCode]) -> ErrorCode:
        # A bug answers one resource UNKNOWN_SERVER_ERROR; the request's others go on.
        try:
            return fn()
        except Exception:
            log.exception("admin API failed on %s", what)
            return ErrorCode.unknown_server_error

    # -- DescribeGroups, ListGroups -----------------------------------------------------

    async def describe_groups(self, request: Any, version: int) -> Any:
        mod = response_module(DESCRIBE_GROUPS, version)
        described = []
        # Each group once, however often it is named (as Kafka answers): a small request
        # naming a big group thousands of times must not buy an answer that many times
        # its size.
        for group_id in dict.fromkeys(request.groups):
            try:
                described.append(self._describe_group(mod, group_id))
            except Exception:
                log.exception("DescribeGroups failed on %s", group_id)
                described.append(
                    make(
                        mod.DescribedGroup,
                        error_code=ErrorCode.unknown_server_error,
                        group_id=group_id,
                        group_state="",
                        protocol_type="",
                        protocol_data="",
                        members=(),
                        authorized_operations=NO_OPERATIONS,
                    )
                )
        return make(
            response_schema(DESCRIBE_GROUPS, version), throttle_time=ZERO, groups=tuple(described)
        )

    def _describe_group(self, mod: Any, group_id: str) -> Any:
        group = self.groups.groups.get(group_id)
        if group is None or group.kind != "classic":
            # Kafka (up to v5) describes an unknown group as Dead, without an error, and
            # so a consumer-type one (KIP-848), which only v6 refuses ("not a classic
            # group"): ConsumerGroupDescribe describes those.
            return make(
                mod.DescribedGroup,
                error_code=ErrorCode.none,
                group_id=group_id,
                group_state="Dead",
                protocol_type="",
                protocol_data="",
                members=(),
                authorized_operations=NO_OPERATIONS,
            )
        stable = group.state.value in ("Stable", "CompletingRebalance")
        protocol = group.protocol_name if stable else None
        members = tuple(
            make(
                mod.DescribedGroupMember,
                member_id=member.member_id,
                group_instance_id=member.group_instance_id,
                client_id=member.client_id,
                client_host="",
                # Kafka sends the metadata and assignment only once they are chosen.
                member_metadata=member.metadata(protocol) if protocol else b"",
                member_assignment=member.assignment if group.state.value == "Stable" else b"",
            )
            for member in group.members.values()
        )
        return make(
            mod.DescribedGroup,
            error_code=ErrorCode.none,
            group_id=group_id,
            group_state=group.state.value,
            protocol_type=group.protocol_type or "",
            protocol_data=protocol or "",
            members=members,
            authorized_operations=NO_OPERATIONS,
        )

    async def list_groups(self, request: Any, version: int) -> Any:
        mod = response_module(LIST_GROUPS, version)
        states = {s.lower() for s in getattr(request, "states_filter", None) or ()}
        types = {t.lower() for t in getattr(request, "types_filter", None) or ()}
        listed = []
        for group in self.groups.groups.values():
            state = group.state.value
            if group.kind == "consumer" and self.consumers is not None:
                state = self.consumers.state_of(group.group_id)  # KIP-848's states
            if states and state.lower() not in states:
                continue
            if types and group.kind not in types:
                continue
            listed.append(
                make(
                    mod.ListedGroup,
                    group_id=group.group_id,
                    protocol_type=group.protocol_type or "",
                    group_state=state,
                    group_type=group.kind,
                )
            )
        return make(
            response_schema(LIST_GROUPS, version),
            throttle_time=ZERO,
            error_code=ErrorCode.none,
            groups=tuple(listed),
        )

    # -- DeleteGroups, OffsetDelete -----------------------------------------------------

    def _delete_group(self, group_id: str) -> ErrorCode:
        if not group_id:
            return ErrorCode.invalid_group_id
        if group_id not in self.groups.groups:
            return ErrorCode.group_id_not_found
        if not self.groups.delete_group(group_id):
            return ErrorCode.non_empty_group
        return ErrorCode.none

    async def delete_groups(self, request: Any, version: int) -> Any:
        mod = response_module(DELETE_GROUPS, version)
        results = []
        for group_id in dict.fromkeys(request.groups_names):  # each answered once
            error = self._guarded(group_id, functools.partial(self._delete_group, group_id))
            results.append(make(mod.DeletableGroupResult, group_id=group_id, error_code=error))
        return make(
            response_schema(DELETE_GROUPS, version), throttle_time=ZERO, results=tuple(results)
        )

    def _subscribed(self, group_id: str) -> set[str] | None:
        """The topics the group's members subscribe to (None: all of them, the
        subscriptions unreadable); an empty set for a group without members."""
        group = self.groups.groups[group_id]
        topics: set[str] = set()
        for member in group.members.values():
            for name, metadata in member.protocols:
                if group.protocol_name not in (None, name):
                    continue
                parsed = subscription_topics(metadata)
                if parsed is None:
                    return None
                topics.update(parsed)
        return topics

    async def offset_delete(self, request: Any, version: int) -> Any:
        mod = response_module(OFFSET_DELETE, version)
        group_id = request.group_id
        group = self.groups.groups.get(group_id)
        top = ErrorCode.none
        if not group_id:
            top = ErrorCode.invalid_group_id
        elif group is None:
            top = ErrorCode.group_id_not_found
        elif group.members and group.protocol_type != "consumer":
            # Kafka reads only the consumer protocol's subscriptions.
            top = ErrorCode.non_empty_group
        topics: list[Any] = []
        if top is ErrorCode.none:
            try:
                topics = self._offset_delete(mod, group_id, request.topics)
            except Exception:
                # Before anything changed (the offsets go last): nothing half-done.
                log.exception("OffsetDelete failed on %s", group_id)
                top, topics = ErrorCode.unknown_server_error, []
        return make(
            response_schema(OFFSET_DELETE, version),
            error_code=top,
            throttle_time=ZERO,
            topics=tuple(topics),
        )

    def _offset_delete(self, mod: Any, group_id: str, request_topics: Any) -> list[Any]:
        """Drop the offsets of the topics no member subscribes to; the answer's topics."""
        subscribed = self._subscribed(group_id)
        deleted: list[tuple[str, int]] = []
        topics = []
        for topic in request_topics:
            taken = subscribed is None or topic.name in subscribed
            error = ErrorCode.group_subscribed_to_topic if taken else ErrorCode.none
            if not taken:
                deleted.extend((topic.name, p.partition_index) for p in topic.partitions)
            topics.append(
                make(
                    mod.OffsetDeleteResponseTopic,
                    name=topic.name,
                    partitions=tuple(
                        make(
                            mod.OffsetDeleteResponsePartition,
                            partition_index=p.partition_index,
                            error_code=error,
                        )
                        for p in topic.partitions
                    ),
                )
            )
        self.groups.delete_offsets(group_id, deleted)
        return topics

    # -- DescribeConfigs ----------------------------------------------------------------

    def _topic_entries(self, topic: str) -> list[tuple[str, str, int, bool, int]]:
        """(name, value, source, read-only, type) of each topic config."""
        overrides = self.overrides.get(topic, {})
        return [
            (
                name,
                overrides.get(name, default),
                DYNAMIC_TOPIC_CONFIG if name in overrides else DEFAULT_CONFIG,
                False,
                TOPIC_CONFIGS[name],
            )
            for name, default in self._defaults().items()
        ]

    def _broker_entries(self, node: int) -> list[tuple[str, str, int, bool, int]]:
        return [
            (name, value, STATIC_BROKER_CONFIG, True, kind)
            for name, (value, kind) in self.broker_configs(node).items()
        ]

    def _describe(self, resource: Any) -> tuple[ErrorCode, str | None, list[Any]]:
        kind, name = resource.resource_type, resource.resource_name
        if kind == TOPIC:
            if name not in self.core.topics:
                return ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist", []
            entries = self._topic_entries(name)
        elif kind == BROKER:
            if name == "":
                return ErrorCode.none, None, []  # no cluster-wide dynamic defaults here
            # A broker describes itself only (Kafka's ConfigHelper): a client sends each
            # broker resource to its broker, the node of this connection.
            node = current_connection.get().node
            if not BROKER_ID.fullmatch(name) or not INT32_MIN <= int(name) <= INT32_MAX:
                return (
                    ErrorCode.invalid_request,
                    f"Broker id must be an integer, but it is: {name}",
                    [],
                )
            if int(name) != node:
                message = (
                    f"Unexpected broker id, expected {node} or empty string, but received {name}"
                )
                return ErrorCode.invalid_request, message, []
            entries = self._broker_entries(node)
        else:
            return ErrorCode.invalid_request, f"resource type {kind} is not served", []
        keys = resource.configuration_keys
        if keys:  # Kafka lists every config for null and for an empty list alike
            wanted = set(keys)
            entries = [entry for entry in entries if entry[0] in wanted]
        return ErrorCode.none, None, entries

    async def describe_configs(self, request: Any, version: int) -> Any:
        mod = response_module(DESCRIBE_CONFIGS, version)
        synonyms = getattr(request, "include_synonyms", False)
        results = []
        described: set[tuple[int, str, frozenset[str] | None]] = set()
        for resource in request.resources:
            # A resource is described once however often it is listed with the same
            # keys. Kafka describes each listing again: an answer a few hundred bytes
            # long for each resource of 8 bytes, which a request of 16 MiB would make
            # a 600 MB answer of. No client lists one twice (Kafka's admin client and
            # librdkafka key them by resource).
            keys = resource.configuration_keys
            listing = (
                resource.resource_type,
                resource.resource_name,
                frozenset(keys) if keys else None,
            )
            if listing in described:
                continue
            described.add(listing)
            try:
                error, message, entries = self._describe(resource)
            except Exception:
                log.exception("DescribeConfigs failed on %s", resource.resource_name)
                error, message, entries = ErrorCode.unknown_server_error, None, []
            configs = tuple(
                make(
                    mod.DescribeConfigsResourceResult,
                    name=name,
                    value=value,
                    read_only=read_only,
                    config_source=source,
                    is_sensitive=False,
                    synonyms=(
                        make(mod.DescribeConfigsSynonym, name=name, value=value, source=source),
                    )
                    if synonyms
                    else (),
                    config_type=kind,
                    documentation=None,
                )
                for name, value, source, read_only, kind in entries
            )
            results.append(
                make(
                    mod.DescribeConfigsResult,
                    error_code=error,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=configs,
                )
            )
        return make(
            response_schema(DESCRIBE_CONFIGS, version), throttle_time=ZERO, results=tuple(results)
        )

    # -- AlterConfigs, IncrementalAlterConfigs ------------------------------------------

    def _alter(
        self,
        resource: Any,
        validate_only: bool,
        change: Callable[[dict[str, str]], dict[str, str]],
    ) -> tuple[ErrorCode, str | None]:
        """Check a resource's new overrides (``change`` maps the current ones to them,
        raising ConfigError or ValueError) and apply them unless ``validate_only``."""
        kind, name = resource.resource_type, resource.resource_name
        if kind == BROKER:
            # Every broker config here is static: Kafka's answer for those.
            names = ", ".join(sorted(c.name for c in resource.configs))
            return ErrorCode.invalid_request, f"Cannot update these configs dynamically: {names}"
        if kind != TOPIC:
            return ErrorCode.invalid_request, f"resource type {kind} is not served"
        if name not in self.core.topics:
            return ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist"
        if len({c.name for c in resource.configs}) != len(resource.configs):
            return ErrorCode.invalid_request, "Error due to duplicate config keys"
        try:
            new = change(dict(self.overrides.get(name, {})))
            settings = check_topic_configs(new, self.limits)
        except ConfigError as exc:
            return ErrorCode.invalid_config, str(exc)
        except ValueError as exc:
            return ErrorCode.invalid_request, str(exc)
        if not validate_only:
            self.apply(name, settings)
        return ErrorCode.none, None

    def _defaults(self) -> dict[str, str]:
        return topic_defaults(self.limits, ",".join(self.cleaner.policy))

    def apply(self, topic: str, settings: TopicSettings) -> None:
        """Make ``topic`` (an existing one) do what ``settings`` say, and report them."""
        self.cleaner.configure(topic, settings)
        policy = self.cleaner.policy_of(topic)
        # Compaction alone: no retention by size or time (the total bound still holds).
        deletes = "delete" in policy
        self.core.set_retain_bytes(topic, settings.retain_bytes if deletes else None)
        self.core.topic_retain_ms[topic] = settings.retain_ms if deletes else None
        if settings.max_message_bytes is None:
            self.core.max_message_bytes.pop(topic, None)
        else:
            self.core.max_message_bytes[topic] = settings.max_message_bytes
        if settings.min_insync == 1:
            self.core.min_insync.pop(topic, None)
        else:
            self.core.min_insync[topic] = settings.min_insync
        if settings.values:
            self.overrides[topic] = settings.values
        else:
            self.overrides.pop(topic, None)

    def _alter_all(
        self, request: Any, version: int, api_key: int, change: Callable[[Any], Callable[..., Any]]
    ) -> Any:
        mod = response_module(api_key, version)
        listed = collections.Counter((r.resource_type, r.resource_name) for r in request.resources)
        # Kafka's controller answers a resource listed twice once, INVALID_REQUEST, before
        # the others, and changes it from neither listing.
        responses = [
            make(
                mod.AlterConfigsResourceResponse,
                error_code=ErrorCode.invalid_request,
                error_message=DUPLICATE_RESOURCE,
                resource_type=kind,
                resource_name=name,
            )
            for (kind, name), count in listed.items()
            if count > 1
        ]
        for resource in request.resources:
            if listed[(resource.resource_type, resource.resource_name)] > 1:
                continue
            message: str | None
            try:
                error, message = self._alter(resource, request.validate_only, change(resource))
            except Exception:
                log.exception("altering configs failed on %s", resource.resource_name)
                error, message = ErrorCode.unknown_server_error, None
            responses.append(
                make(
                    mod.AlterConfigsResourceResponse,
                    error_code=error,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                )
            )
        return make(
            response_schema(api_key, version), throttle_time=ZERO, responses=tuple(responses)
        )

    async def alter_configs(self, request: Any, version: int) -> Any:
        def change(resource: Any) -> Callable[[dict[str, str]], dict[str, str]]:
            def replace(current: dict[str, str]) -> dict[str, str]:
                # AlterConfigs sets the whole set: what it leaves out is the default.
                new = {}
                for config in resource.configs:
                    if config.value is None:
                        raise ValueError(f"Null value not supported for {config.name}")
                    new[config.name] = config.value
                return new

            return replace

        return self._alter_all(request, version, ALTER_CONFIGS, change)

    async def incremental_alter_configs(self, request: Any, version: int) -> Any:
        defaults = self._defaults()

        def change(resource: Any) -> Callable[[dict[str, str]], dict[str, str]]:
            def update(current: dict[str, str]) -> dict[str, str]:
                for config in resource.configs:
                    name, op, value = config.name, config.config_operation, config.value
                    if name not in TOPIC_CONFIGS:
                        raise ConfigError(f"Unknown topic config name: {name[:100]}")
                    if op == DELETE:
                        current.pop(name, None)
                    elif op == SET:
                        if value is None:
                            raise ValueError(f"Null value not supported for {name}")
                        current[name] = value
                    elif op in (APPEND, SUBTRACT):
                        if TOPIC_CONFIGS[name] != LIST:
                            raise ConfigError(f"Config value append is not allowed for {name}")
                        items = [i for i in current.get(name, defaults[name]).split(",") if i]
                        given = [i.strip() for i in (value or "").split(",") if i.strip()]
                        if op == APPEND:
                            items += [i for i in given if i not in items]
                        else:
                            items = [i for i in items if i not in given]
                        current[name] = ",".join(items)
                    else:
                        raise ValueError(f"Unknown config operation {op} for {name}")
                return current

            return update

        return self._alter_all(request, version, INCREMENTAL_ALTER_CONFIGS, change)

    # -- CreatePartitions, DeleteRecords ------------------------------------------------

    def _create_partitions(self, topic: Any, validate_only: bool) -> tuple[ErrorCode, str | None]:
        name, count = topic.name, topic.count
        current = self.core.topics.get(name)
        if current is None:
            return ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist."
        if count < current:
            message = (
                f"Topic currently has {current} partitions, which is higher than the "
                f"requested {count}."
            )
            return ErrorCode.invalid_partitions, message
        if count == current:
            return ErrorCode.invalid_partitions, f"Topic already has {current} partitions."
        if count > self.limits.max_partitions:
            message = f"at most {self.limits.max_partitions} partitions per topic (max_partitions)"
            return ErrorCode.invalid_partitions, message
        assignments = topic.assignments
        if assignments is not None and (
            len(assignments) != count - current
            or len(self.brokers()) > 1
            or any(set(a.broker_ids) != {NODE_ID} for a in assignments)
        ):
            message = f"one assignment per new partition, on broker {NODE_ID} (one node only)"
            return ErrorCode.invalid_replica_assignment, message
        if not validate_only:
            try:
                self.add_partitions(name, count)
            except ValueError as exc:  # more replicas than a node may hold
                return ErrorCode.policy_violation, str(exc)
        return ErrorCode.none, None

    async def create_partitions(self, request: Any, version: int) -> Any:
        mod = response_module(CREATE_PARTITIONS, version)
        listed = collections.Counter(topic.name for topic in request.topics)
        # Kafka's controller answers a topic listed twice once, INVALID_REQUEST, before
        # the others, and grows it from neither listing.
        results = [
            make(
                mod.CreatePartitionsTopicResult,
                name=name,
                error_code=ErrorCode.invalid_request,
                error_message=DUPLICATE_TOPIC,
            )
            for name, count in listed.items()
            if count > 1
        ]
        for topic in request.topics:
            if listed[topic.name] > 1:
                continue
            message: str | None
            try:
                error, message = self._create_partitions(topic, request.validate_only)
            except Exception:
                log.exception("CreatePartitions failed on %s", topic.name)
                error, message = ErrorCode.unknown_server_error, None
            results.append(
                make(
                    mod.CreatePartitionsTopicResult,
                    name=topic.name,
                    error_code=error,
                    error_message=message,
                )
            )
        return make(
            response_schema(CREATE_PARTITIONS, version), throttle_time=ZERO, results=tuple(results)
        )

    def _delete_records(self, tp: TopicPartition, offset: int) -> tuple[ErrorCode, int]:
        partition = self.core.partitions.get(tp)
        if partition is None:
            return ErrorCode.unknown_topic_or_partition, -1
        target = partition.hw if offset == -1 else offset
        if not 0 <= target <= partition.hw:
            return ErrorCode.offset_out_of_range, -1
        # Kafka waits for the followers to move their log start too; here they share the
        # leader's log, so the new low watermark is at once everyone's.
        return ErrorCode.none, self.core.delete_records(tp, target)

    async def delete_records(self, request: Any, version: int) -> Any:
        mod = response_module(DELETE_RECORDS, version)
        # Kafka reads the partitions into a map: a partition listed twice is answered
        # once, its last offset taken, and a topic listed twice is one topic.
        offsets: dict[str, dict[int, int]] = {}
        for topic in request.topics:
            asked = offsets.setdefault(topic.name, {})
            for p in topic.partitions:
                asked[p.partition_index] = p.offset
        topics = []
        for name, asked in offsets.items():
            partitions = []
            for index, offset in asked.items():
                tp = TopicPartition(name, index)
                try:
                    error, low = self._delete_records(tp, offset)
                except Exception:
                    log.exception("DeleteRecords failed on %s", tp)
                    error, low = ErrorCode.unknown_server_error, -1
                partitions.append(
                    make(
                        mod.DeleteRecordsPartitionResult,
                        partition_index=index,
                        low_watermark=low,
                        error_code=error,
                    )
                )
            topics.append(
                make(mod.DeleteRecordsTopicResult, name=name, partitions=tuple(partitions))
            )
        return make(
            response_schema(DELETE_RECORDS, version), throttle_time=ZERO, topics=tuple(topics)
        )

    # -- DescribeCluster ----------------------------------------------------------------

    async def describe_cluster(self, request: Any, version: int) -> Any:
        mod = response_module(DESCRIBE_CLUSTER, version)
        endpoint = getattr(request, "endpoint_type", BROKERS_ENDPOINT)
        error, message = ErrorCode.none, None
        brokers: tuple[Any, ...] = ()
        if endpoint != BROKERS_ENDPOINT:
            # A broker answers for brokers only; controllers are asked directly (KIP-919).
            error, message = ErrorCode.unsupported_endpoint_type, "brokers only"
        else:
            brokers = tuple(
                make(mod.DescribeClusterBroker, broker_id=node, host=host, port=port, rack=None)
                for node, host, port in self.brokers()
            )
        return make(
            response_schema(DESCRIBE_CLUSTER, version),
            throttle_time=ZERO,
            error_code=error,
            error_message=message,
            endpoint_type=endpoint,
            cluster_id=CLUSTER_ID,
            controller_id=brokers[0].broker_id if brokers else -1,
            brokers=brokers,
            cluster_authorized_operations=NO_OPERATIONS,
        )


def subscription_topics(metadata: bytes) -> list[str] | None:
    """The topics of a consumer's subscription (Kafka's ConsumerProtocolSubscription:
    version, then an array of topic names); None when it cannot be read."""
    try:
        (count,) = struct.unpack_from(">i", metadata, 2)
        position, topics = 6, []
        for _ in range(count):
            (size,) = struct.unpack_from(">h", metadata, position)
            position += 2
            if size < 0 or position + size > len(metadata):
                return None
            topics.append(metadata[position : position + size].decode())
            position += size
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
