"""OffsetForLeaderEpoch: where a leader epoch ended in a partition's log.

Ground rules: answered from the partitions' epoch histories
(:meth:`~.log.Partition.end_offset_for`), after asking the leadership
(:class:`~.leadership.Leadership`) whether this node leads the partition at the epoch
the client believes current. A consumer asks it after a leader change, with the epoch of
the last batch it read, to learn whether the new leader's log diverged below its
position (KIP-320); a follower asks it to know where to truncate. The answer has one
builder (:func:`offset_for_leader_epoch_response`), for the handler and for the error
answer (:meth:`EpochApi.error_response`, what an injected fault gets).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from .connection import ClosingConnection
from .core import BrokerCore
from .leadership import Leadership
from .log import TopicPartition
from .protocol import (
    OFFSET_FOR_LEADER_EPOCH,
    ZERO,
    Handler,
    make,
    response_module,
    response_schema,
)

__all__ = ["EpochApi", "EpochRow", "offset_for_leader_epoch_response"]


class EpochApi:
    """The OffsetForLeaderEpoch handler over ``core``'s partitions."""

    __slots__ = ("core", "leadership")

    def __init__(self, core: BrokerCore[Any], leadership: Leadership) -> None:
        self.core = core
        self.leadership = leadership

    def handlers(self) -> dict[int, Handler]:
        """API key to handler, for the broker's dispatch."""
        return {OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch}

    async def offset_for_leader_epoch(self, request: Any, version: int) -> Any:
        topics = request.topics
        if topics is None or any(topic.partitions is None for topic in topics):
            raise ClosingConnection("offset for leader epoch request with a null array")
        answers: list[tuple[str, list[EpochRow]]] = []
        for topic in topics:
            parts: list[EpochRow] = []
            for part in topic.partitions:
                tp = TopicPartition(topic.topic, part.partition)
                partition = self.core.partitions.get(tp)
                found = (-1, -1)
                if partition is None:
                    error = ErrorCode.unknown_topic_or_partition
                else:
                    error = self.leadership.leader_error(tp, part.current_leader_epoch)
                    if error is ErrorCode.none:
                        found = partition.end_offset_for(part.leader_epoch)
                parts.append((part.partition, error, found[0], found[1]))
            answers.append((topic.topic, parts))
        return offset_for_leader_epoch_response(version, answers)

    @staticmethod
    def error_response(
        api_key: int, version: int, request: Any, code: ErrorCode = ErrorCode.unknown_server_error
    ) -> Any:
        """``code`` answering ``request`` (OffsetForLeaderEpoch; None for other APIs) at
        every partition it names, with no epoch and no end offset."""
        if api_key != OFFSET_FOR_LEADER_EPOCH:
            return None
        return offset_for_leader_epoch_response(
            version,
            [
                (topic.topic, [(part.partition, code, -1, -1) for part in topic.partitions or ()])
                for topic in request.topics or ()
            ],
        )


EpochRow = tuple[int, ErrorCode, int, int]
"""An OffsetForLeaderEpoch partition: index, error, leader epoch, end offset."""


def offset_for_leader_epoch_response(
    version: int, topics: Iterable[tuple[str, Iterable[EpochRow]]]
) -> Any:
    """OffsetForLeaderEpoch's answer: each topic as asked, each partition's
    :data:`EpochRow`."""
    mod = response_module(OFFSET_FOR_LEADER_EPOCH, version)
    return make(
        response_schema(OFFSET_FOR_LEADER_EPOCH, version),
        throttle_time=ZERO,
        topics=tuple(
            make(
                mod.OffsetForLeaderTopicResult,
                topic=name,
                partitions=tuple(
                    make(
                        mod.EpochEndOffset,
                        error_code=error,
                        partition=index,
                        leader_epoch=epoch,
                        end_offset=end,
                    )
                    for index, error, epoch, end in parts
                ),
            )
            for name, parts in topics
        ),
    )
