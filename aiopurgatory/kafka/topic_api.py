"""The broker's own APIs: ApiVersions, Metadata, CreateTopics and DeleteTopics.

Ground rules: as every handler object, a request is checked whole before anything
changes, and the answer is Kafka's, error codes and messages included. A topic is
created, auto-created (Metadata) and deleted only through :class:`~.topics.Topics`,
which tells every table keyed by topic; the configs a CreateTopics sets are applied
by the admin APIs' ``apply`` (handed in), the one owner of a topic's configs.

Metadata lists every node that is not stopped (a client keeps the brokers it is told
of), and each partition's leader, leader epoch, replicas, ISR and offline replicas; on
one node the simulated followers are no nodes, so node 0 is all of them.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable
from typing import Any

from kio.schema.errors import ErrorCode

from .configs import ConfigError, TopicSettings, check_topic_configs
from .core import BrokerCore
from .limits import Limits
from .log import TopicPartition
from .protocol import (
    API_VERSIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    DUPLICATE_TOPIC,
    METADATA,
    NO_TOPIC_ID,
    NODE_ID,
    OFFSETS_TOPIC,
    OFFSETS_TOPIC_ID,
    OFFSETS_TOPIC_PARTITIONS,
    SERVED,
    ZERO,
    Handler,
    make,
    metadata_response,
    response_module,
    response_schema,
)
from .records import StoredBatch
from .topics import Topics, legal_topic_name
from .topology import Topology

__all__ = ["TopicApi", "api_versions_response"]


def api_versions_response(version: int, unsupported: bool = False) -> Any:
    """ApiVersions' answer: every API served, with its versions; UNSUPPORTED_VERSION
    for a client newer than the broker (KIP-511: it is answered at version 0 and
    retries with a version listed)."""
    mod = response_module(API_VERSIONS, version)
    keys = tuple(
        make(mod.ApiVersion, api_key=key, min_version=low, max_version=high)
        for key, (low, high) in sorted(SERVED.items())
    )
    return make(
        response_schema(API_VERSIONS, version),
        error_code=ErrorCode.unsupported_version if unsupported else ErrorCode.none,
        api_keys=keys,
        throttle_time=ZERO,
    )


class TopicApi:
    """The handlers of ApiVersions, Metadata, CreateTopics and DeleteTopics.

    Args:
        topics: The topics' lifecycle (create, auto-create, delete).
        core: The log (the topics and their partitions' epochs).
        topology: The nodes' states and the partitions' placements.
        limits: The broker's limits.
        brokers: (node, host, port) of each node not stopped, as clients are told.
        apply_configs: Applies a new topic's configs (the admin APIs' ``apply``).
    """

    __slots__ = ("apply_configs", "brokers", "core", "limits", "topics", "topology")

    def __init__(
        self,
        topics: Topics,
        core: BrokerCore[StoredBatch],
        topology: Topology,
        limits: Limits,
        brokers: Callable[[], list[tuple[int, str, int]]],
        apply_configs: Callable[[str, TopicSettings], None],
    ) -> None:
        self.topics = topics
        self.core = core
        self.topology = topology
        self.limits = limits
        self.brokers = brokers
        self.apply_configs = apply_configs

    def handlers(self) -> dict[int, Handler]:
        """API key to handler, for the broker's dispatch."""
        return {
            API_VERSIONS: self.api_versions,
            METADATA: self.metadata,
            CREATE_TOPICS: self.create_topics,
            DELETE_TOPICS: self.delete_topics,
        }

    # -- ApiVersions, Metadata ----------------------------------------------------------

    async def api_versions(self, request: Any, version: int) -> Any:
        return api_versions_response(version)

    def _partition_metadata(self, mod: Any, topic: str, index: int) -> Any:
        """A partition as Metadata lists it: its leader, epoch, replicas and ISR (one
        node: node 0 for every one, the simulated followers not being nodes)."""
        tp = TopicPartition(topic, index)
        placement = self.topology.placements.get(tp)
        if topic == OFFSETS_TOPIC:
            leader = self.topology.partition_leader(index) if self.topology.nodes > 1 else NODE_ID
            replicas: tuple[int, ...] = (leader,)
            isr: tuple[int, ...] = replicas
            epoch = 0
        elif placement is None:
            leader, replicas, isr = NODE_ID, (NODE_ID,), (NODE_ID,)
            epoch = self.core.partitions[tp].epoch
        else:
            leader, replicas = placement.leader, placement.replicas
            isr = tuple(node for node in replicas if node in placement.isr)
            epoch = self.core.partitions[tp].epoch
        offline = tuple(node for node in replicas if not self.topology.up(node))
        return make(
            mod.MetadataResponsePartition,
            error_code=ErrorCode.none if leader >= 0 else ErrorCode.leader_not_available,
            partition_index=index,
            leader_id=leader,
            leader_epoch=epoch,
            replica_nodes=replicas,
            isr_nodes=isr,
            offline_replicas=offline,
        )

    async def metadata(self, request: Any, version: int) -> Any:
        mod = response_module(METADATA, version)
        # (name, id asked) per topic: a v12 client may ask for a topic by its id alone.
        asked: list[tuple[str | None, uuid.UUID | None]]
        if request.topics is None:
            # Kafka lists its internal topics too; clients hide them unless asked.
            asked = [(name, None) for name in (*self.core.topics, OFFSETS_TOPIC)]
        else:
            # Each topic once, however often it is named (Kafka reads the names into a
            # set): a request naming a big topic thousands of times would otherwise
            # build an answer thousands of times its size.
            asked = list(
                dict.fromkeys(
                    (topic.name, None if topic.name is not None else topic.topic_id)
                    for topic in request.topics
                )
            )
        # Kafka creates a topic a client asks for, unless the client says not to (v4+).
        create = getattr(request, "allow_auto_topic_creation", True)
        topics: list[tuple[ErrorCode, str | None, bool, tuple[Any, ...], uuid.UUID]] = []
        for name, topic_id in asked:
            if name is None:
                # By id: its name if it exists (Kafka's v12 lookup), never created.
                name = self.core.topic_names.get(topic_id) if topic_id is not None else None
                if name is None:
                    error = ErrorCode.unknown_topic_id
                    if version < 12:
                        error = ErrorCode.invalid_request  # by id from v12 only
                    topics.append((error, None, False, (), topic_id or NO_TOPIC_ID))
                    continue
            internal = name == OFFSETS_TOPIC
            error = ErrorCode.none if internal else self.topics.ensure(name, create)
            count = self.core.topics.get(name, 0) if error is ErrorCode.none else 0
            count = OFFSETS_TOPIC_PARTITIONS if internal else count
            partitions = tuple(self._partition_metadata(mod, name, i) for i in range(count))
            found = OFFSETS_TOPIC_ID if internal else self.core.topic_ids.get(name, NO_TOPIC_ID)
            topics.append((error, name, internal, partitions, found))
        brokers = [broker for broker in self.brokers() if self.topology.up(broker[0])]
        return metadata_response(version, brokers, topics)

    # -- CreateTopics, DeleteTopics -----------------------------------------------------

    def _create_error(self, topic: Any, validate_only: bool) -> tuple[ErrorCode, str | None]:
        name = topic.name
        replicas = self.topics.replicas
        partitions = (
            self.topics.default_partitions if topic.num_partitions == -1 else topic.num_partitions
        )
        if not legal_topic_name(name):
            return ErrorCode.invalid_topic_exception, f"invalid topic name {name!r}"
        if name in self.core.topics or name == OFFSETS_TOPIC:
            return ErrorCode.topic_already_exists, f"topic {name!r} already exists"
        if not 1 <= partitions <= self.limits.max_partitions:
            message = f"partitions must be between 1 and {self.limits.max_partitions}"
            return ErrorCode.invalid_partitions, message
        factor = topic.replication_factor
        nodes = self.topology.nodes
        if nodes > 1:
            live = len(self.topology.live_nodes())
            if factor > live:
                message = f"Replication factor: {factor} larger than available brokers: {live}."
                return ErrorCode.invalid_replication_factor, message
            if factor == 0 or factor < -1 or topic.assignments:
                message = f"the replication factor is 1 to {nodes} or -1 (no assignments)"
                return ErrorCode.invalid_replication_factor, message
        elif factor > replicas:
            # Kafka's answer when the factor exceeds the brokers there are (one node here,
            # unless followers are simulated).
            message = f"Replication factor: {factor} larger than available brokers: {replicas}."
            return ErrorCode.invalid_replication_factor, message
        elif factor not in (-1, replicas) or topic.assignments:
            # Every partition has the broker's replicas (simulated followers included).
            message = f"the replication factor is {replicas} (--replicas) or -1"
            return ErrorCode.invalid_replication_factor, message
        if len(self.core.topics) >= self.limits.max_topics:
            return ErrorCode.policy_violation, f"at most {self.limits.max_topics} topics"
        configs = {config.name: config.value for config in topic.configs}
        if len(configs) != len(topic.configs):
            return ErrorCode.invalid_request, "Error due to duplicate config keys"
        try:
            settings = check_topic_configs(configs, self.limits)
        except ConfigError as exc:
            return ErrorCode.invalid_config, str(exc)
        if not validate_only:
            try:
                self.topics.create(name, partitions, None if factor == -1 else factor)
            except ValueError as exc:  # more replicas than a node may hold
                return ErrorCode.policy_violation, str(exc)
            self.apply_configs(name, settings)
        return ErrorCode.none, None

    async def create_topics(self, request: Any, version: int) -> Any:
        mod = response_module(CREATE_TOPICS, version)
        listed = collections.Counter(topic.name for topic in request.topics)
        results = []
        for topic in request.topics:
            if listed[topic.name] > 1:
                continue  # answered below, once, and created from neither entry
            error, message = self._create_error(topic, request.validate_only)
            ok = error is ErrorCode.none
            results.append(
                make(
                    mod.CreatableTopicResult,
                    name=topic.name,
                    error_code=error,
                    error_message=message,
                    num_partitions=self.core.topics.get(topic.name, -1) if ok else -1,
                    replication_factor=self.topics.factor(topic.name) if ok else -1,
                    configs=(),
                )
            )
        # Kafka's controller answers a name listed twice once, after the others, and
        # creates it from neither entry (which of them was meant cannot be known).
        results.extend(
            make(
                mod.CreatableTopicResult,
                name=name,
                error_code=ErrorCode.invalid_request,
                error_message=DUPLICATE_TOPIC,
                num_partitions=-1,
                replication_factor=-1,
                configs=(),
            )
            for name, count in listed.items()
            if count > 1
        )
        return make(
            response_schema(CREATE_TOPICS, version), throttle_time=ZERO, topics=tuple(results)
        )

    async def delete_topics(self, request: Any, version: int) -> Any:
        mod = response_module(DELETE_TOPICS, version)
        listed = collections.Counter(request.topic_names)
        # Kafka's controller answers a name listed twice once, first, and deletes
        # nothing for it (error messages from v5).
        results = [
            make(
                mod.DeletableTopicResult,
                name=name,
                error_code=ErrorCode.invalid_request,
                error_message=DUPLICATE_TOPIC,
            )
            for name, count in listed.items()
            if count > 1
        ]
        for name in request.topic_names:
            if listed[name] > 1:
                continue
            deleted = self.topics.delete(name)
            results.append(
                make(
                    mod.DeletableTopicResult,
                    name=name,
                    error_code=ErrorCode.none if deleted else ErrorCode.unknown_topic_or_partition,
                    error_message=None,
                )
            )
        return make(
            response_schema(DELETE_TOPICS, version),
            throttle_time=ZERO,
            responses=tuple(results),
        )
