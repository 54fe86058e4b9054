"""Read-only snapshots of the broker's state, for tests' assertions.

Ground rules: plain frozen data copied out of the broker at the moment asked; holding
one keeps nothing alive and changes nothing. No kio.
"""

from __future__ import annotations

from dataclasses import dataclass

from .log import TopicPartition

__all__ = ["GroupInfo", "PartitionOffsets", "TransactionInfo"]


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """One partition's offsets."""

    topic: str
    partition: int
    log_start: int
    """The first offset still in the log (retention moves it up)."""
    high_watermark: int
    """What consumers can read up to: every replica has it."""
    log_end: int
    """The offset the next record gets."""

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group as the coordinator holds it."""

    group_id: str
    state: str
    """Kafka's names: ``Empty``, ``PreparingRebalance``, ``CompletingRebalance``,
    ``Stable``."""
    generation: int
    protocol_type: str | None
    protocol: str | None
    """The assignor chosen for this generation (``range``, say)."""
    leader: str
    members: tuple[str, ...]
    """Member ids."""
    committed: dict[TopicPartition, int]
    """Committed offsets."""


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    """A snapshot of one transactional id, for assertions."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    """Kafka's name: Empty, Ongoing, CompleteCommit or CompleteAbort."""
    partitions: frozenset[TopicPartition]
    """The partitions the open transaction added."""
    groups: frozenset[str]
    """The groups whose offsets it holds (AddOffsetsToTxn)."""
    pending_offsets: dict[str, dict[TopicPartition, int]]
    """Per group: the offsets sent in the open transaction, stored only at commit."""
    timeout_ms: int
