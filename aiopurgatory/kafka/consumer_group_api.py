"""The consumer group protocol's APIs (KIP-848): ConsumerGroupHeartbeat and
ConsumerGroupDescribe, answered from :class:`~.consumer_groups.ConsumerGroupCoordinator`.

Ground rules: the wire side of :mod:`.consumer_groups` only. On the wire topics are
named by id; the coordinator works with names: an owned partition of an id the broker
does not know (a topic deleted since) is dropped on the way in, an assigned one is
named by its topic's current id on the way out. A failing handler is answered
UNKNOWN_SERVER_ERROR (:meth:`ConsumerGroupApi.error_response`) on a connection that
serves on.
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from .assignors import TopicPartitions
from .connection import current_connection
from .consumer_groups import ConsumerGroupCoordinator, ConsumerMember
from .core import BrokerCore
from .protocol import (
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    ZERO,
    Handler,
    make,
    ms,
    response_module,
    response_schema,
)
from .records import StoredBatch

__all__ = ["ConsumerGroupApi"]

NO_OPERATIONS = -(2**31)
"""Kafka's "authorized operations not asked for"."""


class ConsumerGroupApi:
    """The handlers of ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69).

    Args:
        coordinator: The consumer-type groups' coordinator.
        core: The log (topic ids and names).
    """

    __slots__ = ("coordinator", "core")

    def __init__(self, coordinator: ConsumerGroupCoordinator, core: BrokerCore[StoredBatch]):
        self.coordinator = coordinator
        self.core = core

    def handlers(self) -> dict[int, Handler]:
        return {
            CONSUMER_GROUP_HEARTBEAT: self.heartbeat,
            CONSUMER_GROUP_DESCRIBE: self.describe,
        }

    def _topic_partitions(
        self, mod: Any, tps: TopicPartitions, names: bool = False
    ) -> tuple[Any, ...]:
        by_topic: dict[str, list[int]] = {}
        for topic, index in tps:
            by_topic.setdefault(topic, []).append(index)
        listed = []
        for topic in sorted(by_topic):
            topic_id = self.core.topic_ids.get(topic)
            if topic_id is None:
                continue  # deleted meanwhile: nothing to name it by
            extra = {"topic_name": topic} if names else {}
            listed.append(
                make(
                    mod.TopicPartitions,
                    topic_id=topic_id,
                    partitions=tuple(sorted(by_topic[topic])),
                    **extra,
                )
            )
        return tuple(listed)

    async def heartbeat(self, request: Any, version: int) -> Any:
        owned = None
        if request.topic_partitions is not None:
            names = self.core.topic_names
            owned = [
                (names[entry.topic_id], int(index))
                for entry in request.topic_partitions
                if entry.topic_id in names
                for index in entry.partitions
            ]
        timeout = ms(request.rebalance_timeout)
        state = current_connection.get()
        result = self.coordinator.heartbeat(
            request.group_id,
            request.member_id,
            int(request.member_epoch),
            instance_id=request.instance_id,
            rack_id=request.rack_id,
            rebalance_timeout=timeout if timeout > 0 else None,
            subscribed=request.subscribed_topic_names,
            assignor=request.server_assignor,
            owned=owned,
            client_id=state.client_id,
            version=version,
        )
        mod = response_module(CONSUMER_GROUP_HEARTBEAT, version)
        if result.error:
            return self.error_response(
                CONSUMER_GROUP_HEARTBEAT, version, request, ErrorCode(result.error), result.message
            )
        assignment = None
        if result.assignment is not None:
            assignment = make(
                mod.Assignment, topic_partitions=self._topic_partitions(mod, result.assignment)
            )
        return make(
            response_schema(CONSUMER_GROUP_HEARTBEAT, version),
            throttle_time=ZERO,
            error_code=ErrorCode.none,
            error_message=None,
            member_id=result.member_id,
            member_epoch=result.epoch,
            heartbeat_interval=datetime.timedelta(seconds=self.coordinator.heartbeat_interval),
            assignment=assignment,
        )

    def _member(self, mod: Any, member: ConsumerMember, target: TopicPartitions) -> Any:
        return make(
            mod.Member,
            member_id=member.member_id,
            instance_id=member.instance_id,
            rack_id=member.rack_id,
            member_epoch=member.epoch,
            client_id=member.client_id,
            client_host=member.client_host,
            subscribed_topic_names=member.subscribed,
            subscribed_topic_regex=None,
            assignment=make(
                mod.Assignment, topic_partitions=self._topic_partitions(mod, member.assigned, True)
            ),
            target_assignment=make(
                mod.Assignment, topic_partitions=self._topic_partitions(mod, target, True)
            ),
            member_type=1,
        )

    def _described(self, mod: Any, group_id: str) -> Any:
        entry = self.coordinator.groups.groups.get(group_id)
        base = {"group_id": group_id, "authorized_operations": NO_OPERATIONS}
        if entry is None or entry.kind != "consumer":
            message = f"Group {group_id} not found."
            if entry is not None:
                message = f"Group {group_id} is not a consumer group."
            return make(
                mod.DescribedGroup,
                error_code=ErrorCode.group_id_not_found,
                error_message=message,
                group_state="Dead",
                group_epoch=-1,
                assignment_epoch=-1,
                assignor_name="",
                members=(),
                **base,
            )
        group = self.coordinator.table.get(group_id)
        if group is None:
            return make(
                mod.DescribedGroup,
                error_code=ErrorCode.none,
                group_state="Empty",
                group_epoch=entry.generation,
                assignment_epoch=entry.generation,
                assignor_name="uniform",
                members=(),
                **base,
            )
        return make(
            mod.DescribedGroup,
            error_code=ErrorCode.none,
            group_state=group.state(),
            group_epoch=group.epoch,
            assignment_epoch=group.assignment_epoch,
            assignor_name=group.assignor,
            members=tuple(
                self._member(mod, m, group.target.get(m.member_id, frozenset()))
                for m in group.members.values()
            ),
            **base,
        )

    async def describe(self, request: Any, version: int) -> Any:
        mod = response_module(CONSUMER_GROUP_DESCRIBE, version)
        # Each group once, however often it is named.
        return make(
            response_schema(CONSUMER_GROUP_DESCRIBE, version),
            throttle_time=ZERO,
            groups=tuple(self._described(mod, g) for g in dict.fromkeys(request.group_ids)),
        )

    @staticmethod
    def error_response(
        api_key: int,
        version: int,
        request: Any,
        code: ErrorCode = ErrorCode.unknown_server_error,
        message: str | None = None,
    ) -> Any:
        """``code`` answering a ConsumerGroupHeartbeat (None for other APIs), as Kafka
        answers an error: no member id, epoch 0, no assignment."""
        if api_key != CONSUMER_GROUP_HEARTBEAT:
            return None  # ConsumerGroupDescribe is answered as the admin APIs are
        return make(
            response_schema(api_key, version),
            throttle_time=ZERO,
            error_code=code,
            error_message=message,
            member_id=None,
            member_epoch=0,
            heartbeat_interval=ZERO,
            assignment=None,
        )
