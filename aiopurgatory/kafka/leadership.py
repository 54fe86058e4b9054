"""Which node answers for a partition: what the data APIs ask before serving one.

Ground rules: a protocol, so that the handlers (:mod:`.data_api`, :mod:`.epoch_api`)
know nothing of nodes; :class:`~.nodes.Nodes` answers it for a cluster, and for one
node too (it leads everything, only the epochs are checked).
"""

from __future__ import annotations

from typing import Protocol

from kio.schema.errors import ErrorCode

from .log import TopicPartition

__all__ = ["Leadership"]


class Leadership(Protocol):
    def leader_error(self, tp: TopicPartition, current_epoch: int) -> ErrorCode:
        """NONE if the running connection's node leads ``tp`` (an existing partition)
        and ``current_epoch`` (-1: unchecked) is its leader epoch; else
        NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH (an older epoch) or
        UNKNOWN_LEADER_EPOCH (a newer one), as Kafka answers."""

    def isr_size(self, tp: TopicPartition, replicas: int) -> int:
        """``tp``'s replicas in sync (``replicas`` where they are simulated)."""
