"""Who leads a partition, as the handlers ask it: the error a request gets when the
node it reached does not lead, or names another leader epoch.

Ground rules: a protocol and its single-node implementation, no state of their own.
A single-node broker leads every partition; a cluster (several nodes in one process)
answers for the node of the running connection.
"""

from __future__ import annotations

from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from .core import BrokerCore
from .log import TopicPartition

__all__ = ["Leadership", "SingleNode", "epoch_error"]


class Leadership(Protocol):
    def leader_error(self, tp: TopicPartition, current_epoch: int) -> ErrorCode:
        """NONE if the node of the running connection leads ``tp`` and ``current_epoch``
        (-1: unchecked) is its leader epoch; else NOT_LEADER_OR_FOLLOWER,
        LEADER_NOT_AVAILABLE, FENCED_LEADER_EPOCH (an older epoch) or
        UNKNOWN_LEADER_EPOCH (a newer one), as Kafka answers."""
        ...


def epoch_error(asked: int, current: int) -> ErrorCode:
    """Kafka's check of a request's ``current_leader_epoch`` against the leader's: -1
    skips it; an older one is fenced (the client's metadata is stale), a newer one
    unknown (this broker's is: the client retries)."""
    if asked == -1 or asked == current:
        return ErrorCode.none
    return ErrorCode.fenced_leader_epoch if asked < current else ErrorCode.unknown_leader_epoch


class SingleNode:
    """A single-node broker's leadership: it leads every partition it has."""

    __slots__ = ("core",)

    def __init__(self, core: BrokerCore[Any]) -> None:
        self.core = core

    def leader_error(self, tp: TopicPartition, current_epoch: int) -> ErrorCode:
        partition = self.core.partitions.get(tp)
        if partition is None:
            return ErrorCode.unknown_topic_or_partition
        return epoch_error(current_epoch, partition.epoch)
