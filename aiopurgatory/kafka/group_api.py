"""The group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit and OffsetFetch, answered from the group coordinator.

Ground rules: the wire side of :mod:`.groups` only. Each handler decodes what the
coordinator needs from a kio request and builds the response of the request's version;
the coordinator decides (and validates before it changes anything). A group API request
whose handling fails is answered UNKNOWN_SERVER_ERROR (:meth:`GroupApi.error_response`)
on a connection that serves on.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from .connection import current_connection
from .consumer_groups import ConsumerGroupCoordinator
from .core import BrokerCore
from .groups import GroupCoordinator
from .limits import Limits
from .protocol import (
    FIND_COORDINATOR,
    GROUP_APIS,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    SYNC_GROUP,
    ZERO,
    Handler,
    checked_offsets,
    make,
    ms,
    offset_commit_response,
    response_module,
    response_schema,
)
from .records import StoredBatch

__all__ = ["GROUP_APIS", "GroupApi", "OffsetFetchRow", "offset_fetch_response"]


class GroupApi:
    """The group APIs' handlers, over one coordinator.

    Args:
        groups: The coordinator.
        core: The log, for the partitions offsets may be committed to.
        limits: The broker's limits (``offset_metadata_max_bytes``).
        locate: A group's or transactional id's coordinator: (node, host, port).
        pending_offsets: A group's partitions with a transactional offset commit
            pending (TxnOffsetCommit in a transaction not yet ended), for OffsetFetch's
            ``require_stable``; none when not given.
        consumers: The coordinator of consumer-type groups (KIP-848), whose offset
            commits are checked against member epochs; none when not given.
    """

    __slots__ = ("consumers", "core", "groups", "limits", "locate", "pending_offsets")

    def __init__(
        self,
        groups: GroupCoordinator,
        core: BrokerCore[StoredBatch],
        limits: Limits,
        locate: Callable[[str], tuple[int, str, int]],
        pending_offsets: Callable[[str], Collection[tuple[str, int]]] | None = None,
        consumers: ConsumerGroupCoordinator | None = None,
    ) -> None:
        self.consumers = consumers
        self.groups = groups
        self.core = core
        self.limits = limits
        self.locate = locate
        self.pending_offsets = pending_offsets

    def handlers(self) -> dict[int, Handler]:
        """API key to handler, for the broker's dispatch."""
        return {
            FIND_COORDINATOR: self.find_coordinator,
            JOIN_GROUP: self.join_group,
            SYNC_GROUP: self.sync_group,
            HEARTBEAT: self.heartbeat,
            LEAVE_GROUP: self.leave_group,
            OFFSET_COMMIT: self.offset_commit,
            OFFSET_FETCH: self.offset_fetch,
        }

    async def find_coordinator(self, request: Any, version: int) -> Any:
        # 0: a group's coordinator, 1: a transactional id's; each key has one node.
        served = getattr(request, "key_type", 0) in (0, 1)

        def answer(key: str) -> dict[str, Any]:
            node, host, port = self.locate(key) if served else (-1, "", -1)
            ok = node >= 0
            return {
                "error_code": ErrorCode.none if ok else ErrorCode.coordinator_not_available,
                "error_message": None,
                "node_id": node if ok else -1,
                "host": host if ok else "",
                "port": port if ok else -1,
            }

        cls = response_schema(FIND_COORDINATOR, version)
        if version < 4:
            return make(cls, throttle_time=ZERO, **answer(request.key))
        # KIP-699 (v4+): a batch of keys, each answered on its own, in the order asked.
        mod = response_module(FIND_COORDINATOR, version)
        return make(
            cls,
            throttle_time=ZERO,
            coordinators=tuple(
                make(mod.Coordinator, key=key, **answer(key)) for key in request.coordinator_keys
            ),
        )

    async def join_group(self, request: Any, version: int) -> Any:
        session = ms(request.session_timeout)
        rebalance = getattr(request, "rebalance_timeout", None)
        result = await self.groups.join(
            request.group_id,
            request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            client_id=current_connection.get().client_id,
            session_timeout=session,
            # v0 has no rebalance timeout: Kafka used the session timeout. A negative one
            # is refused by the coordinator, a long one capped there.
            rebalance_timeout=ms(rebalance) if rebalance is not None else session,
            protocol_type=request.protocol_type,
            protocols=[(p.name, p.metadata) for p in request.protocols],
        )
        mod = response_module(JOIN_GROUP, version)
        return make(
            response_schema(JOIN_GROUP, version),
            throttle_time=ZERO,
            error_code=ErrorCode(result.error),
            generation_id=result.generation,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name or ("" if version < 7 else None),
            leader=result.leader,
            member_id=result.member_id,
            members=tuple(
                make(
                    mod.JoinGroupResponseMember,
                    member_id=member_id,
                    group_instance_id=instance,
                    metadata=metadata,
                )
                for member_id, instance, metadata in result.members
            ),
        )

    async def sync_group(self, request: Any, version: int) -> Any:
        result = await self.groups.sync(
            request.group_id,
            request.generation_id,
            request.member_id,
            {a.member_id: a.assignment for a in request.assignments},
            group_instance_id=getattr(request, "group_instance_id", None),
        )
        return make(
            response_schema(SYNC_GROUP, version),
            throttle_time=ZERO,
            error_code=ErrorCode(result.error),
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )

    async def heartbeat(self, request: Any, version: int) -> Any:
        error = self.groups.heartbeat(
            request.group_id,
            request.generation_id,
            request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
        )
        return make(
            response_schema(HEARTBEAT, version),
            throttle_time=ZERO,
            error_code=ErrorCode(error),
        )

    async def leave_group(self, request: Any, version: int) -> Any:
        cls = response_schema(LEAVE_GROUP, version)
        if version < 3:
            ((_, error),) = self.groups.leave(request.group_id, [request.member_id])
            return make(cls, throttle_time=ZERO, error_code=ErrorCode(error))
        # v3+: members named by member id, group instance id or both (an admin client
        # removes static members by instance id alone).
        members = [(m.member_id, m.group_instance_id) for m in request.members]
        results = self.groups.leave_members(request.group_id, members)
        mod = response_module(LEAVE_GROUP, version)
        return make(
            cls,
            throttle_time=ZERO,
            error_code=ErrorCode.none,
            members=tuple(
                make(
                    mod.MemberResponse,
                    member_id=member_id,
                    group_instance_id=instance,
                    error_code=ErrorCode(error),
                )
                for ((member_id, instance), error) in results
            ),
        )

    # -- OffsetCommit, OffsetFetch ------------------------------------------------------

    async def offset_commit(self, request: Any, version: int) -> Any:
        # v2-v4's retention_time is not honoured: a group's offsets are kept as Kafka
        # keeps them by default (offsets.retention.minutes once the group is empty),
        # which is what the clients' default of -1 asks for.
        offsets, errors = checked_offsets(
            request, self.core.partitions, self.limits.offset_metadata_max_bytes
        )
        if offsets or not errors:
            epoch = getattr(request, "generation_id_or_member_epoch", -1)
            if self.consumers is not None and self.consumers.owns(request.group_id):
                # A consumer-type group (KIP-848): the member's epoch is checked, then
                # the offsets kept where every group keeps them.
                checked = self.consumers.check_commit(request.group_id, request.member_id, epoch)
                if checked:
                    error = ErrorCode(checked)
                else:
                    error = ErrorCode(self.groups.commit_transactional(request.group_id, offsets))
            else:
                error = ErrorCode(
                    self.groups.commit(
                        request.group_id,
                        epoch,
                        request.member_id,
                        offsets,
                        group_instance_id=getattr(request, "group_instance_id", None),
                    )
                )
            for key in offsets:
                errors.setdefault(key, error)
        return offset_commit_response(OFFSET_COMMIT, version, request, errors)

    def _fetched(
        self, group_id: str, topics: Any, require_stable: bool
    ) -> list[tuple[str, list[OffsetFetchRow]]]:
        wanted = None
        if topics is not None:
            wanted = [(t.name, i) for t in topics for i in t.partition_indexes]
        committed = self.groups.committed(group_id, wanted)
        unstable: Collection[tuple[str, int]] = ()
        if require_stable and self.pending_offsets is not None:
            # KIP-447 (v7+): a partition with a transactional commit pending answers
            # UNSTABLE_OFFSET_COMMIT, which the consumer retries, until the transaction ends.
            unstable = self.pending_offsets(group_id)
        by_topic: dict[str, list[OffsetFetchRow]] = {}
        for (name, index), (offset, metadata) in committed.items():
            error = ErrorCode.none
            if (name, index) in unstable:
                offset, metadata, error = -1, "", ErrorCode.unstable_offset_commit
            by_topic.setdefault(name, []).append((index, offset, metadata, error))
        return list(by_topic.items())

    async def offset_fetch(self, request: Any, version: int) -> Any:
        stable = getattr(request, "require_stable", False)
        if version < 8:
            rows = self._fetched(request.group_id, request.topics, stable)
            return offset_fetch_response(version, ErrorCode.none, rows)
        # v8+: several groups at once (each answered once); v9 names the member, whose
        # epoch a consumer-type group checks (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID).
        answered = []
        for group in {g.group_id: g for g in request.groups}.values():
            error = ErrorCode.none
            member_id = getattr(group, "member_id", None)
            if member_id and self.consumers is not None and self.consumers.owns(group.group_id):
                error = ErrorCode(
                    self.consumers.check_commit(group.group_id, member_id, group.member_epoch)
                )
            rows = [] if error else self._fetched(group.group_id, group.topics, stable)
            answered.append((group.group_id, error, rows))
        return offset_fetch_groups_response(version, answered)

    @staticmethod
    def error_response(
        api_key: int, version: int, request: Any, code: ErrorCode = ErrorCode.unknown_server_error
    ) -> Any:
        """``code`` answering ``request``, everywhere it has an error (the group APIs; None
        for others), without asking the coordinator anything.

        UNKNOWN_SERVER_ERROR by default, the answer to a handler that failed; any other
        code is an injected fault (:mod:`.faults`), so static: it needs no coordinator.
        """
        if api_key not in GROUP_APIS:
            return None
        error = code
        cls = response_schema(api_key, version)
        mod = response_module(api_key, version)
        if api_key == JOIN_GROUP:
            return make(
                cls,
                throttle_time=ZERO,
                error_code=error,
                generation_id=-1,
                protocol_type=None,
                protocol_name="" if version < 7 else None,
                leader="",
                member_id=request.member_id,
                members=(),
            )
        if api_key == FIND_COORDINATOR and version >= 4:
            return make(
                cls,
                throttle_time=ZERO,
                coordinators=tuple(
                    make(
                        mod.Coordinator,
                        key=key,
                        node_id=-1,
                        host="",
                        port=-1,
                        error_code=error,
                        error_message=None,
                    )
                    for key in getattr(request, "coordinator_keys", None) or ()
                ),
            )
        if api_key in (SYNC_GROUP, HEARTBEAT, LEAVE_GROUP, FIND_COORDINATOR):
            return make(
                cls,
                throttle_time=ZERO,
                error_code=error,
                error_message=None,
                protocol_type=None,
                protocol_name=None,
                assignment=b"",
                members=(),
                node_id=-1,
                host="",
                port=-1,
            )
        if api_key == OFFSET_COMMIT:
            errors = {
                (topic.name, part.partition_index): error
                for topic in request.topics
                for part in topic.partitions
            }
            return offset_commit_response(OFFSET_COMMIT, version, request, errors)
        if api_key == OFFSET_FETCH and version >= 8:
            return offset_fetch_groups_response(
                version,
                [
                    (
                        g.group_id,
                        error,
                        [
                            (t.name, [(i, -1, "", error) for i in t.partition_indexes])
                            for t in g.topics or ()
                        ],
                    )
                    for g in request.groups
                ],
            )
        if api_key == OFFSET_FETCH:
            return offset_fetch_response(
                version,
                error,
                [
                    (topic.name, [(index, -1, "", error) for index in topic.partition_indexes])
                    for topic in request.topics or ()
                ],
            )
        return None


OffsetFetchRow = tuple[int, int, str, ErrorCode]
"""An OffsetFetch partition: index, committed offset, metadata, error."""


def offset_fetch_response(
    version: int, error: ErrorCode, topics: Iterable[tuple[str, Iterable[OffsetFetchRow]]]
) -> Any:
    """OffsetFetch's answer: the group-level ``error``, each topic's partitions'
    :data:`OffsetFetchRow`."""
    mod = response_module(OFFSET_FETCH, version)
    return make(
        response_schema(OFFSET_FETCH, version),
        throttle_time=ZERO,
        error_code=error,
        topics=tuple(
            make(
                mod.OffsetFetchResponseTopic,
                name=name,
                partitions=tuple(
                    make(
                        mod.OffsetFetchResponsePartition,
                        partition_index=index,
                        committed_offset=offset,
                        committed_leader_epoch=-1,
                        metadata=metadata,
                        error_code=partition_error,
                    )
                    for index, offset, metadata, partition_error in parts
                ),
            )
            for name, parts in topics
        ),
    )


def offset_fetch_groups_response(
    version: int,
    groups: Iterable[tuple[str, ErrorCode, Iterable[tuple[str, Iterable[OffsetFetchRow]]]]],
) -> Any:
    """OffsetFetch's answer from v8 (KIP-709): each group's id, error and topics'
    :data:`OffsetFetchRow`."""
    mod = response_module(OFFSET_FETCH, version)
    return make(
        response_schema(OFFSET_FETCH, version),
        throttle_time=ZERO,
        groups=tuple(
            make(
                mod.OffsetFetchResponseGroup,
                group_id=group_id,
                error_code=error,
                topics=tuple(
                    make(
                        mod.OffsetFetchResponseTopics,
                        name=name,
                        partitions=tuple(
                            make(
                                mod.OffsetFetchResponsePartitions,
                                partition_index=index,
                                committed_offset=offset,
                                committed_leader_epoch=-1,
                                metadata=metadata,
                                error_code=partition_error,
                            )
                            for index, offset, metadata, partition_error in parts
                        ),
                    )
                    for name, parts in topics
                ),
            )
            for group_id, error, topics in groups
        ),
    )
