"""OffsetForLeaderEpoch: where a leader epoch ended in a partition's log.

Ground rules: answered from the partitions' epoch histories
(:meth:`~.log.Partition.end_offset_for`), after asking the leadership
(:class:`~.leadership.Leadership`) whether this node leads the partition at the epoch
the client believes current. A consumer asks it after a leader change, with the epoch of
the last batch it read, to learn whether the new leader's log diverged below its
position (KIP-320); a follower asks it to know where to truncate.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode

from .connection import ClosingConnection
from .core import BrokerCore
from .leadership import Leadership
from .log import TopicPartition
from .protocol import OFFSET_FOR_LEADER_EPOCH, ZERO, Handler, make, response_module

__all__ = ["EpochApi"]


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
        mod = response_module(OFFSET_FOR_LEADER_EPOCH, version)
        answers = []
        for topic in topics:
            parts = []
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
                parts.append(
                    make(
                        mod.EpochEndOffset,
                        error_code=error,
                        partition=part.partition,
                        leader_epoch=found[0],
                        end_offset=found[1],
                    )
                )
            answers.append(
                make(mod.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(parts))
            )
        return make(mod.OffsetForLeaderEpochResponse, throttle_time=ZERO, topics=tuple(answers))
