"""Idempotent producers: the ids handed out and each producer's recent sequences.

Ground rules: Kafka's idempotence check, without the wire format (the handlers turn its
answers into responses). Ids are a counter, as Kafka's, which never runs out: what is
kept per id is bounded instead, states (one per producer id and partition written to)
by ``max_producer_states``, the least recently written forgotten first, as Kafka
forgets an expired producer. Transactions (a transactional id's epochs) are
:mod:`.transactions`, built on its ids.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Final

from kio.schema.errors import ErrorCode

from .log import TopicPartition
from .records import IncomingBatch

__all__ = ["FIRST_PRODUCER_ID", "PRODUCER_SEQUENCES_KEPT", "ProducerState", "ProducerTable"]

PRODUCER_SEQUENCES_KEPT: Final = 5
"""Batches per producer and partition whose retries are recognised (Kafka keeps 5)."""
FIRST_PRODUCER_ID: Final = 1000
"""InitProducerId hands out ids from here up, one after the other: the ids handed out
are ``FIRST_PRODUCER_ID <= id < next_producer_id``."""


@dataclasses.dataclass(slots=True)
class ProducerState:
    """An idempotent producer's recent batches on one partition (Kafka's producer state)."""

    epoch: int
    last_sequence: int
    recent: collections.deque[tuple[int, int, int]]
    """(first sequence, last sequence, base offset) of its last batches."""


class ProducerTable:
    """Producer ids handed out, and the states of the producers that wrote."""

    __slots__ = ("max_producer_states", "next_producer_id", "states")

    def __init__(self, *, max_producer_states: int) -> None:
        self.max_producer_states = max_producer_states
        self.next_producer_id = FIRST_PRODUCER_ID
        self.states: collections.OrderedDict[tuple[TopicPartition, int], ProducerState] = (
            collections.OrderedDict()
        )
        """Per (partition, producer id), least recently written first (the next to go)."""

    def __len__(self) -> int:
        return len(self.states)

    def handed_out(self, producer_id: int) -> bool:
        return FIRST_PRODUCER_ID <= producer_id < self.next_producer_id

    def new_id(self) -> int:
        """A new producer id. Never refused: an id costs nothing until its producer
        writes (then its states are bounded), and a cap on ids handed out over the
        broker's life would refuse every new producer once reached, until a restart
        (Kafka's ids, 64 bits, never run out)."""
        producer_id = self.next_producer_id
        self.next_producer_id += 1
        return producer_id

    def sequence_error(
        self, tp: TopicPartition, batch: IncomingBatch, pending_last: int | None = None
    ) -> tuple[ErrorCode, int | None]:
        """Kafka's idempotence check: (error, base offset of the original if a retry).
        ``pending_last``: the producer's last sequence in earlier batches of this request."""
        if batch.producer_id < 0:
            return ErrorCode.none, None
        if not self.handed_out(batch.producer_id):
            # Never handed out: ids in batches are the client's to choose, so state is
            # kept only for ids InitProducerId gave (and then bounded like any state).
            return ErrorCode.unknown_producer_id, None
        state = self.states.get((tp, batch.producer_id))
        last = batch.base_sequence + batch.count - 1
        if pending_last is not None:
            if batch.base_sequence != (pending_last + 1) & 0x7FFFFFFF:
                return ErrorCode.out_of_order_sequence_number, None
            return ErrorCode.none, None
        if state is None:
            if batch.base_sequence != 0:
                # No state for a producer that has written before (forgotten beyond
                # max_producer_states): Kafka's answer for an expired producer state,
                # which the clients recover from by bumping their epoch.
                return ErrorCode.unknown_producer_id, None
            return ErrorCode.none, None
        if batch.producer_epoch > state.epoch:
            if batch.base_sequence != 0:
                return ErrorCode.out_of_order_sequence_number, None
            return ErrorCode.none, None
        if batch.producer_epoch < state.epoch:
            return ErrorCode.invalid_producer_epoch, None
        for first, end, base in state.recent:
            if (first, end) == (batch.base_sequence, last):
                return ErrorCode.none, base  # a retry of a batch already appended
        if batch.base_sequence != (state.last_sequence + 1) & 0x7FFFFFFF:
            return ErrorCode.out_of_order_sequence_number, None
        return ErrorCode.none, None

    def remember(self, tp: TopicPartition, batch: IncomingBatch, base: int) -> None:
        """Record ``batch``, appended at offset ``base``, as its producer's latest."""
        if batch.producer_id < 0:
            return
        key = (tp, batch.producer_id)
        state = self.states.get(key)
        if state is None or batch.producer_epoch != state.epoch:
            state = ProducerState(
                batch.producer_epoch, -1, collections.deque(maxlen=PRODUCER_SEQUENCES_KEPT)
            )
            self.states[key] = state
        self.states.move_to_end(key)
        while len(self.states) > self.max_producer_states:
            self.states.popitem(last=False)  # the least recently written
        state.last_sequence = batch.base_sequence + batch.count - 1
        state.recent.append((batch.base_sequence, state.last_sequence, base))

    def truncate(self, tp: TopicPartition, offset: int) -> None:
        """``tp``'s log was truncated at ``offset`` (a new leader): its producers forget
        the batches from there on, so a retry of one is appended again rather than
        acknowledged at an offset that now holds nothing (or another batch).

        The last sequence becomes the one before the first batch forgotten (sequences
        are consecutive within an epoch), so the retry is in order; a state whose
        every batch since its epoch's sequence 0 went is dropped, as if it never wrote
        (the retry, from sequence 0, starts it again). O(states), on a leader change."""
        for key in [key for key in self.states if key[0] == tp]:
            state = self.states[key]
            recent = state.recent
            first_dropped: int | None = None
            while recent and recent[-1][2] >= offset:
                first_dropped = recent.pop()[0]
            if first_dropped is None:
                continue
            if first_dropped == 0:
                del self.states[key]
            else:
                state.last_sequence = (first_dropped - 1) & 0x7FFFFFFF

    def forget_topic(self, topic: str) -> None:
        """Drop the states of a deleted topic's partitions."""
        for key in [key for key in self.states if key[0].topic == topic]:
            del self.states[key]
