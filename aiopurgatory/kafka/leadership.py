"""Who leads a partition, as the handlers ask it: the error a request gets when the
node it reached does not lead, or names another leader epoch.

Ground rules: a protocol, so that the handlers (:mod:`.data_api`, :mod:`.epoch_api`)
know nothing of nodes. :class:`~.nodes.Nodes` answers it, for the node of the running
connection: on one node that node leads every partition, and only epochs are checked.
"""

from __future__ import annotations

from typing import Protocol

from kio.schema.errors import ErrorCode

from .log import TopicPartition

__all__ = ["Leadership", "epoch_error"]


class Leadership(Protocol):
    def leader_error(self, tp: TopicPartition, current_epoch: int) -> ErrorCode:
        """NONE if the node of the running connection leads ``tp`` and ``current_epoch``
        (-1: unchecked) is its leader epoch; else NOT_LEADER_OR_FOLLOWER,
        LEADER_NOT_AVAILABLE, FENCED_LEADER_EPOCH (an older epoch) or
        UNKNOWN_LEADER_EPOCH (a newer one), as Kafka answers."""
        ...

    def isr_size(self, tp: TopicPartition, replicas: int) -> int:
        """``tp``'s replicas in sync (``replicas``, where they are simulated)."""
        ...


def epoch_error(asked: int, current: int) -> ErrorCode:
    """Kafka's check of a request's ``current_leader_epoch`` against the leader's: -1
    skips it; an older one is fenced (the client's metadata is stale), a newer one
    unknown (this broker's is: the client retries)."""
    if asked == -1 or asked == current:
        return ErrorCode.none
    return ErrorCode.fenced_leader_epoch if asked < current else ErrorCode.unknown_leader_epoch
