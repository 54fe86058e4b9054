"""The transaction coordinator: transactional ids, their producer ids and epochs, the
partitions and offsets of each open transaction, and the last stable offset (LSO).

Ground rules: Kafka's TransactionCoordinator (KIP-98) without the wire format (the
handlers, :mod:`.txn_api`, turn its answers into responses). A request is checked whole
before anything changes, and every refusal leaves the transaction as it was. Ending a
transaction is synchronous here: the commit or abort markers are appended to every
partition of the transaction before EndTxn is answered (Kafka writes them through
WriteTxnMarkers and answers CONCURRENT_TRANSACTIONS meanwhile), so the states
PrepareCommit and PrepareAbort are never seen. Appending a marker re-checks the fetches
watching its partition, so a read_committed fetch waiting for data completes as soon as
the LSO moves.

A transaction open longer than its timeout is a :class:`DelayedTxnTimeout` in the
``transaction`` purgatory: EndTxn completes it early; its expiry aborts the transaction
and bumps the producer's epoch, so the producer's next request is fenced (Kafka checks
for such transactions periodically; a delayed operation times each one exactly).

Bounded: transactional ids (``max_transactional_ids``; one without an open transaction
is forgotten ``transactional_id_expiration_ms`` after its last request, or sooner when
a new id needs its place, the least recently used first) and their
length (``max_transactional_id_chars``), the group ids a transaction names (the group
coordinator's bound, ``max_group_id_chars``), partitions and groups per transaction,
offsets pending per transaction, and the aborted-transaction index of each partition
(pruned as retention drops the log it describes).
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Final

from kio.schema.errors import ErrorCode

import aiopurgatory as ap
from aiopurgatory.timeouts import TimerHandle
from aiopurgatory.timer import Clock

from .core import BrokerCore
from .delayed import DelayedLogFetch
from .groups import GroupCoordinator
from .limits import Limits
from .log import Partition, TopicPartition
from .producers import ProducerTable
from .records import (
    BATCH_BASE_OFFSET,
    BATCH_LEADER_EPOCH,
    BATCH_PRODUCER_EPOCH,
    IncomingBatch,
    StoredBatch,
    control_batch,
)
from .views import TransactionInfo

__all__ = [
    "COORDINATOR_EPOCH",
    "DelayedCommittedFetch",
    "DelayedTxnTimeout",
    "Transaction",
    "TransactionCoordinator",
    "TxnState",
]

log = logging.getLogger("aiopurgatory.kafka")

COORDINATOR_EPOCH: Final = 0
"""The coordinator's epoch written in every marker: one coordinator, never moved."""
MAX_EPOCH: Final = 32766
"""Kafka's last usable producer epoch (Short.MaxValue - 1): past it, a new producer id."""

Offsets = dict[tuple[str, int], tuple[int, str]]


class TxnState(enum.Enum):
    """Kafka's transaction states, those that last (Prepare* pass synchronously)."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


@dataclasses.dataclass(slots=True, eq=False)
class Transaction:
    """A transactional id's producer and its current transaction."""

    transactional_id: str
    producer_id: int
    epoch: int
    timeout: float
    """Seconds: the transaction timeout InitProducerId asked for."""
    state: TxnState = TxnState.EMPTY
    partitions: set[TopicPartition] = dataclasses.field(default_factory=set)
    groups: set[str] = dataclasses.field(default_factory=set)
    first_offsets: dict[TopicPartition, int] = dataclasses.field(default_factory=dict)
    """Per partition written to in this transaction: the offset of its first batch."""
    pending: dict[str, Offsets] = dataclasses.field(default_factory=dict)
    """Per group: offsets sent in the transaction, stored at commit, dropped at abort."""
    timer: DelayedTxnTimeout | None = None
    expiry: TimerHandle | None = None


class DelayedTxnTimeout(ap.DelayedOperation[None]):
    """A transaction's timeout: completed by its EndTxn, its expiry aborts it."""

    __slots__ = ("coordinator", "epoch", "txn")

    def __init__(self, coordinator: TransactionCoordinator, txn: Transaction) -> None:
        super().__init__(txn.timeout)
        self.coordinator = coordinator
        self.txn = txn
        self.epoch = txn.epoch

    def try_complete(self) -> bool:
        # Ended meanwhile (EndTxn, a new InitProducerId): nothing to time out.
        if self.txn.state is TxnState.ONGOING and self.txn.epoch == self.epoch:
            return False
        return self.force_complete()

    def on_complete(self) -> None:
        return None

    def on_expiration(self) -> None:
        self.coordinator._timed_out(self.txn, self.epoch)


class DelayedCommittedFetch(DelayedLogFetch[StoredBatch]):
    """A read_committed fetch: reads up to the last stable offset, not the HW."""

    __slots__ = ("coordinator",)

    def __init__(
        self,
        coordinator: TransactionCoordinator,
        offsets: Mapping[Partition[StoredBatch], int],
        *,
        min_bytes: int,
        max_wait: float,
        partition_max_bytes: Mapping[Partition[StoredBatch], int],
        max_bytes: int | None,
    ) -> None:
        super().__init__(
            offsets,
            min_bytes=min_bytes,
            max_wait=max_wait,
            follower=False,
            partition_max_bytes=partition_max_bytes,
            max_bytes=max_bytes,
        )
        self.coordinator = coordinator

    def limit(self, partition: Partition[StoredBatch]) -> int:
        return self.coordinator.lso(partition)


def _marker(producer_id: int, epoch: int, commit: bool, now: int) -> bytearray:
    return control_batch(
        producer_id, epoch, commit=commit, coordinator_epoch=COORDINATOR_EPOCH, timestamp=now
    )


def _placed(marker: bytearray, partition: Partition[StoredBatch], now: int) -> StoredBatch:
    """``marker`` as the next batch of ``partition``: its base offset the log end, its
    leader epoch the partition's (both outside the CRC)."""
    data = bytearray(marker)
    data[BATCH_BASE_OFFSET : BATCH_BASE_OFFSET + 8] = partition.leo.to_bytes(8, "big")
    data[BATCH_LEADER_EPOCH : BATCH_LEADER_EPOCH + 4] = partition.epoch.to_bytes(4, "big")
    so_far = max(partition.entries[-1].timestamp_so_far if partition.entries else -1, now)
    return StoredBatch(bytes(data), 1, now, so_far)


def base_offset(batch: StoredBatch) -> int:
    return int.from_bytes(batch.data[BATCH_BASE_OFFSET : BATCH_BASE_OFFSET + 8], "big", signed=True)


class TransactionCoordinator:
    """Transactional ids and their transactions; the ``transaction`` purgatory.

    Args:
        core: The log the markers go to (its fetch purgatory learns of LSO moves).
        producers: Where producer ids come from.
        groups: Where a committed transaction's offsets are stored.
        limits: The broker's limits (the ``transaction*`` ones).
        clock: The transaction purgatory's clock (timeouts, transactional id expiry).
        wall: Epoch seconds for the markers' timestamps.
        observer: The purgatory's observer.
    """

    def __init__(
        self,
        core: BrokerCore[StoredBatch],
        producers: ProducerTable,
        groups: GroupCoordinator,
        limits: Limits,
        *,
        clock: Clock | None = None,
        wall: Callable[[], float] = time.time,
        observer: ap.OperationObserver | None = None,
    ) -> None:
        self.core = core
        self.wall = wall
        """Epoch seconds for the markers' timestamps: the broker clock's, which a test
        may move forward with the deadlines on ``clock``."""
        self.producers = producers
        self.groups = groups
        self.limits = limits
        self.transactions: dict[str, Transaction] = {}
        self.idle: dict[str, Transaction] = {}
        """The transactions without one open (not Ongoing), least recently used first:
        a new transactional id takes the place of the first when the table is full."""
        self.by_producer: dict[int, Transaction] = {}
        self.open_firsts: dict[TopicPartition, dict[int, int]] = {}
        """Per partition: producer id to the first offset of its open transaction there."""
        self.aborted: dict[TopicPartition, list[tuple[int, int, int]]] = {}
        """Per partition, in marker order: (marker offset, producer id, first offset) of
        each aborted transaction that wrote there, for read_committed fetches."""
        self.purgatory = ap.Purgatory("transaction", clock=clock, observer=observer)

    def close(self) -> None:
        for txn in self.transactions.values():
            if txn.expiry is not None:
                txn.expiry.cancel()
        self.purgatory.close()

    # -- the transactional ids ---------------------------------------------------------

    def _touch(self, txn: Transaction) -> None:
        """A request from ``txn``'s producer: its id's expiry starts again, if idle, and
        it is the most recently used."""
        if txn.expiry is not None:
            txn.expiry.cancel()
            txn.expiry = None
        self.idle.pop(txn.transactional_id, None)
        if txn.state is not TxnState.ONGOING:
            self.idle[txn.transactional_id] = txn
            if not self.purgatory.closed:
                txn.expiry = self.purgatory.call_later(
                    self.limits.transactional_id_expiration_ms / 1000, self._expire, txn
                )

    def _expire(self, txn: Transaction) -> None:
        txn.expiry = None
        if self.transactions.get(txn.transactional_id) is txn and txn.state is not (
            TxnState.ONGOING
        ):
            self._forget(txn)

    def _forget(self, txn: Transaction) -> None:
        """Drop an idle transactional id, its producer id with it (that producer's next
        request is answered INVALID_PRODUCER_ID_MAPPING, as after Kafka's expiration)."""
        if txn.expiry is not None:
            txn.expiry.cancel()
            txn.expiry = None
        del self.transactions[txn.transactional_id]
        self.idle.pop(txn.transactional_id, None)
        if self.by_producer.get(txn.producer_id) is txn:
            del self.by_producer[txn.producer_id]

    def _make_room(self) -> bool:
        """Room for one more transactional id: when the table is full, the least
        recently used idle one is forgotten (as its expiry would, only sooner), so idle
        ids never lock new producers out. An id with a transaction open is never
        dropped: False when all of them have one."""
        if len(self.transactions) < self.limits.max_transactional_ids:
            return True
        if not self.idle:
            return False
        oldest = next(iter(self.idle.values()))
        log.info(
            "transactional id %r forgotten to make room for a new one (max_transactional_ids)",
            oldest.transactional_id,
        )
        self._forget(oldest)
        return True

    def _valid_id(self, transactional_id: str) -> bool:
        """Not empty (Kafka answers an empty one INVALID_REQUEST) nor longer than
        ``max_transactional_id_chars`` (answered the same: an id is kept as long as its
        producer, so its length is bounded; Kafka has no bound)."""
        return 0 < len(transactional_id) <= self.limits.max_transactional_id_chars

    def check(
        self, transactional_id: str, producer_id: int, epoch: int, fenced: ErrorCode
    ) -> Transaction | ErrorCode:
        """The transaction of a request that names its producer, or the error answering
        it: an unknown id or another producer id, INVALID_PRODUCER_ID_MAPPING; an older
        epoch, ``fenced`` (PRODUCER_FENCED or INVALID_PRODUCER_EPOCH by version); an
        empty id or one too long, INVALID_REQUEST (as Kafka answers an empty one)."""
        if not self._valid_id(transactional_id):
            return ErrorCode.invalid_request
        txn = self.transactions.get(transactional_id)
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if epoch != txn.epoch:
            return fenced
        return txn

    def init_producer(
        self,
        transactional_id: str,
        timeout_ms: int,
        producer_id: int,
        epoch: int,
        fenced: ErrorCode,
    ) -> tuple[ErrorCode, int, int]:
        """InitProducerId with a transactional id: (error, producer id, epoch).

        The first one gets a new producer id at epoch 0; each later one bumps the
        epoch, which fences the producers holding an older one, after aborting the
        transaction the old epoch left open. A producer naming its own id and epoch
        (KIP-360, InitProducerId v3+) bumps it the same way; naming another is fenced.
        """
        if not self._valid_id(transactional_id):
            return ErrorCode.invalid_request, -1, -1  # Kafka's answer to an empty id
        if not 0 < timeout_ms <= self.limits.transaction_max_timeout_ms:
            return ErrorCode.invalid_transaction_timeout, -1, -1
        txn = self.transactions.get(transactional_id)
        if (
            txn is not None
            and producer_id >= 0
            and (producer_id, epoch)
            != (
                txn.producer_id,
                txn.epoch,
            )
        ):
            # An older producer asking to bump: a newer one has the id already.
            return fenced, -1, -1
        if txn is None:
            if producer_id >= 0:
                return ErrorCode.invalid_producer_id_mapping, -1, -1
            if not self._make_room():
                return ErrorCode.coordinator_not_available, -1, -1
            new_id = self.producers.new_id()
            txn = Transaction(transactional_id, new_id, 0, timeout_ms / 1000)
            self.transactions[transactional_id] = txn
            self.by_producer[new_id] = txn
        else:
            if txn.state is TxnState.ONGOING:
                self._end(txn, commit=False)
            if txn.epoch >= MAX_EPOCH:
                # Epochs exhausted: a new producer id.
                del self.by_producer[txn.producer_id]
                txn.producer_id, txn.epoch = self.producers.new_id(), 0
                self.by_producer[txn.producer_id] = txn
            else:
                txn.epoch += 1
            txn.timeout = timeout_ms / 1000
            txn.state = TxnState.EMPTY
        self._touch(txn)
        return ErrorCode.none, txn.producer_id, txn.epoch

    # -- adding to the transaction ------------------------------------------------------

    def _begin(self, txn: Transaction) -> None:
        """The first partition or group added: the transaction is open, its timer runs."""
        if txn.state is TxnState.ONGOING:
            return
        txn.state = TxnState.ONGOING
        txn.partitions.clear()
        txn.groups.clear()
        txn.first_offsets.clear()
        txn.pending.clear()
        self._touch(txn)  # an open transaction does not expire
        txn.timer = DelayedTxnTimeout(self, txn)
        self.purgatory.try_complete_else_watch(txn.timer, [("txn", txn.transactional_id)])

    def add_partitions(
        self, txn: Transaction, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, ErrorCode]:
        """AddPartitionsToTxn: all added, or none (errors per partition, as Kafka:
        the unknown ones refused, the others OPERATION_NOT_ATTEMPTED)."""
        wanted = list(dict.fromkeys(partitions))
        if not wanted:
            return {}  # nothing to add: no transaction begins
        errors = {
            tp: ErrorCode.unknown_topic_or_partition
            for tp in wanted
            if tp not in self.core.partitions
        }
        if not errors:
            current = txn.partitions if txn.state is TxnState.ONGOING else set()
            groups = len(txn.groups) if txn.state is TxnState.ONGOING else 0
            new = sum(tp not in current for tp in wanted)
            if len(current) + groups + new > self.limits.max_transaction_partitions:
                return dict.fromkeys(wanted, ErrorCode.invalid_request)
            self._begin(txn)
            txn.partitions.update(wanted)
            self._touch(txn)
            return dict.fromkeys(wanted, ErrorCode.none)
        return {tp: errors.get(tp, ErrorCode.operation_not_attempted) for tp in wanted}

    def add_offsets(self, txn: Transaction, group_id: str) -> ErrorCode:
        """AddOffsetsToTxn: the group's offsets will be part of the transaction. A group
        id the group coordinator would refuse is refused here (INVALID_GROUP_ID): the
        transaction would keep it, and its commit make the group."""
        if not self.groups.valid_group_id(group_id):
            return ErrorCode.invalid_group_id
        current = txn.state is TxnState.ONGOING
        if not current or group_id not in txn.groups:
            used = len(txn.partitions) + len(txn.groups) if current else 0
            if used + 1 > self.limits.max_transaction_partitions:
                return ErrorCode.invalid_request
        self._begin(txn)
        txn.groups.add(group_id)
        return ErrorCode.none

    def commit_offsets(
        self, txn: Transaction, group_id: str, offsets: Mapping[tuple[str, int], tuple[int, str]]
    ) -> ErrorCode:
        """TxnOffsetCommit: held pending until the transaction ends (checked by the
        caller per partition first). INVALID_TXN_STATE unless the group was added;
        INVALID_GROUP_ID for a group id the group coordinator would refuse."""
        if not self.groups.valid_group_id(group_id):
            return ErrorCode.invalid_group_id
        if txn.state is not TxnState.ONGOING or group_id not in txn.groups:
            return ErrorCode.invalid_txn_state
        pending = txn.pending.get(group_id, {})
        held = sum(len(group) for group in txn.pending.values())
        if held + sum(key not in pending for key in offsets) > self.limits.max_transaction_offsets:
            return ErrorCode.invalid_request
        txn.pending.setdefault(group_id, {}).update(offsets)
        return ErrorCode.none

    # -- Produce -----------------------------------------------------------------------

    def produce_error(self, tp: TopicPartition, batch: IncomingBatch) -> ErrorCode:
        """A transactional batch's check: from the producer's current epoch, to a
        partition its open transaction added (else INVALID_TXN_STATE, as Kafka's
        partition verification answers, KIP-890)."""
        txn = self.by_producer.get(batch.producer_id)
        if txn is None:
            return ErrorCode.invalid_producer_id_mapping
        if batch.producer_epoch != txn.epoch:
            return ErrorCode.invalid_producer_epoch
        if txn.state is not TxnState.ONGOING or tp not in txn.partitions:
            return ErrorCode.invalid_txn_state
        return ErrorCode.none

    def appended(self, tp: TopicPartition, batch: IncomingBatch, base: int) -> None:
        """A transactional batch is appended at ``base`` (called just before the append,
        which wakes waiting fetches): the first of its transaction there holds the
        partition's LSO back."""
        txn = self.by_producer.get(batch.producer_id)
        if txn is None or tp in txn.first_offsets:
            return
        txn.first_offsets[tp] = base
        self.open_firsts.setdefault(tp, {})[txn.producer_id] = base

    # -- EndTxn -------------------------------------------------------------------------

    def end(self, txn: Transaction, commit: bool) -> ErrorCode:
        """EndTxn: the markers written, offsets stored (commit) or dropped (abort).

        Ending an ended transaction the same way again is a retry (NONE); the other
        way, or with nothing begun, INVALID_TXN_STATE, as Kafka answers.
        """
        if txn.state is not TxnState.ONGOING:
            done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            return ErrorCode.none if txn.state is done else ErrorCode.invalid_txn_state
        self._end(txn, commit)
        self._touch(txn)
        return ErrorCode.none

    def _end(self, txn: Transaction, commit: bool) -> None:
        """Write the markers of ``txn`` (at its current epoch) and close it."""
        now = int(self.wall() * 1000)
        marker = _marker(txn.producer_id, txn.epoch, commit, now)
        # The LSO moves before the markers are appended: the append re-checks the
        # fetches watching each partition, read_committed ones included.
        for tp in txn.first_offsets:
            opened = self.open_firsts.get(tp)
            if opened is not None:
                opened.pop(txn.producer_id, None)
                if not opened:
                    del self.open_firsts[tp]
        appends: dict[TopicPartition, list[StoredBatch]] = {}
        for tp in sorted(txn.partitions):
            partition = self.core.partitions.get(tp)
            if partition is None:
                continue  # deleted meanwhile: nothing to mark
            appends[tp] = [_placed(marker, partition, now)]
            if not commit and tp in txn.first_offsets:
                entries = self.aborted.setdefault(tp, [])
                entries.append((partition.leo, txn.producer_id, txn.first_offsets[tp]))
                self._prune(tp, partition)
        if appends:
            self.core.append(appends)
        if commit:
            for group_id, offsets in txn.pending.items():
                error = self.groups.commit_transactional(group_id, offsets)
                if error:
                    log.warning(
                        "transaction %r: offsets of group %r not stored (%s)",
                        txn.transactional_id,
                        group_id,
                        error.name,
                    )
        txn.state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
        txn.partitions.clear()
        txn.groups.clear()
        txn.first_offsets.clear()
        txn.pending.clear()
        timer, txn.timer = txn.timer, None
        if timer is not None:
            timer.force_complete()

    def truncate(self, tp: TopicPartition, offset: int) -> None:
        """``tp``'s log was truncated at ``offset`` (a new leader; call after
        :meth:`BrokerCore.change_leader`): what is remembered by offset follows.

        An open transaction whose batches there all went no longer holds the LSO back
        (its producer's retry records its first offset again). An aborted transaction
        whose marker went: forgotten if its batches went too; else its abort marker is
        written again at the log end, as Kafka's coordinator writes the markers to the
        new leader, so read_committed consumers still skip its batches. (A lost commit
        marker is not rewritten: those batches read as committed, which they are.)"""
        changed = False
        opened = self.open_firsts.get(tp)
        if opened:
            for producer_id, first in list(opened.items()):
                if first >= offset:
                    changed = True
                    del opened[producer_id]
                    txn = self.by_producer.get(producer_id)
                    if txn is not None:
                        txn.first_offsets.pop(tp, None)
            if not opened:
                del self.open_firsts[tp]
        entries = self.aborted.get(tp)
        if entries:
            at = bisect.bisect_left(entries, (offset,))
            lost = entries[at:]
            del entries[at:]
            partition = self.core.partitions.get(tp)
            now = int(self.wall() * 1000)
            for _, producer_id, first in lost:
                changed = True
                if first >= offset or partition is None:
                    continue
                # The marker's producer epoch: its transaction's, read from the first batch.
                batch = partition.read(first, partition.leo, 0)[0]
                epoch = int.from_bytes(
                    batch.data[BATCH_PRODUCER_EPOCH : BATCH_PRODUCER_EPOCH + 2], "big", signed=True
                )
                marker = _placed(_marker(producer_id, epoch, False, now), partition, now)
                entries.append((partition.leo, producer_id, first))
                self.core.append({tp: [marker]})
            if not entries:
                del self.aborted[tp]
        if changed:
            self.core.fetch_purgatory.check_and_complete(tp)  # the LSO may have moved

    def _timed_out(self, txn: Transaction, epoch: int) -> None:
        """The transaction outlived its timeout: aborted, and its producer fenced."""
        if txn.state is not TxnState.ONGOING or txn.epoch != epoch:
            return
        if self.transactions.get(txn.transactional_id) is not txn:
            return
        log.info("transaction %r timed out: aborting it", txn.transactional_id)
        txn.timer = None  # expiring now
        # Kafka bumps the epoch first and writes the markers with it: the producer's
        # next request, at the old epoch, is fenced.
        if txn.epoch < MAX_EPOCH:
            txn.epoch += 1
        self._end(txn, commit=False)
        self._touch(txn)

    # -- read_committed -----------------------------------------------------------------

    def lso(self, partition: Partition[StoredBatch]) -> int:
        """The last stable offset: the first offset of the earliest open transaction on
        the partition, else the high watermark; never below the log start (retention or
        DeleteRecords may pass an open transaction's first offset: Kafka's UnifiedLog
        then takes the log start as the first unstable offset)."""
        opened = self.open_firsts.get(partition.tp)
        if not opened:
            return partition.hw
        return min(partition.hw, max(min(opened.values()), partition.log_start))

    def aborted_in(self, tp: TopicPartition, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping the
        offsets ``[start, end)``: those whose marker is at or after ``start`` and whose
        first batch is before ``end``."""
        entries = self.aborted.get(tp)
        if not entries or end <= start:
            return []
        at = bisect.bisect_left(entries, (start,))
        return [(pid, first) for _, pid, first in entries[at:] if first < end]

    def aborted_ranges(
        self, tp: TopicPartition, start: int, end: int
    ) -> list[tuple[int, int, int]]:
        """(producer id, first offset, marker offset) of the aborted transactions
        overlapping ``[start, end)`` (marker at or after ``start``, first batch before
        ``end``): what the cleaner removes (each of the producer's batches from its
        first offset to its marker), one begun below the log start included."""
        entries = self.aborted.get(tp)
        if not entries or end <= start:
            return []
        at = bisect.bisect_left(entries, (start,))
        return [(pid, first, marker) for marker, pid, first in entries[at:] if first < end]

    def cleaned_aborts(self, tp: TopicPartition, markers: Collection[int]) -> None:
        """The cleaner found no batch left of the aborted transactions whose markers
        are at ``markers``: their entries go (Kafka's cleaner writes the cleaned
        segment's transaction index without them), as a read_committed fetch needs them
        no more; their markers go later (:mod:`.cleaner`). O(entries)."""
        entries = self.aborted.get(tp)
        if not entries:
            return
        gone = set(markers)
        entries[:] = [entry for entry in entries if entry[0] not in gone]
        if not entries:
            del self.aborted[tp]

    def _prune(self, tp: TopicPartition, partition: Partition[StoredBatch]) -> None:
        """Forget aborted transactions whose markers retention dropped: no fetch can
        start before the log start, so none needs them (the index stays proportional
        to the log)."""
        entries = self.aborted.get(tp)
        if entries:
            keep = bisect.bisect_left(entries, (partition.log_start,))
            del entries[:keep]

    def committed_fetch(
        self,
        offsets: Mapping[TopicPartition, int],
        *,
        min_bytes: int,
        max_wait: float,
        partition_max_bytes: Mapping[TopicPartition, int],
        max_bytes: int | None,
    ) -> DelayedCommittedFetch:
        """A read_committed fetch, registered in the core's fetch purgatory (watching
        its partitions, as every fetch: markers are appended there too)."""
        partitions = self.core.partitions
        resolved = {partitions[tp]: offset for tp, offset in offsets.items()}
        for tp in offsets:
            self._prune(tp, self.core.partitions[tp])
        op = DelayedCommittedFetch(
            self,
            resolved,
            min_bytes=min_bytes,
            max_wait=max_wait,
            partition_max_bytes={partitions[tp]: n for tp, n in partition_max_bytes.items()},
            max_bytes=max_bytes,
        )
        return self.core.fetch_purgatory.try_complete_else_watch(op, tuple(offsets))

    def forget_topic(self, topic: str) -> None:
        """A deleted topic leaves the transactions and the indexes."""
        for tp in [tp for tp in self.open_firsts if tp.topic == topic]:
            del self.open_firsts[tp]
        for tp in [tp for tp in self.aborted if tp.topic == topic]:
            del self.aborted[tp]
        for txn in self.transactions.values():
            txn.partitions = {tp for tp in txn.partitions if tp.topic != topic}
            for tp in [tp for tp in txn.first_offsets if tp.topic == topic]:
                del txn.first_offsets[tp]

    def pending_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """The partitions whose offsets for ``group_id`` an open transaction holds
        pending (TxnOffsetCommit, not yet committed or aborted): Kafka's group's
        pending transactional offset commits, for OffsetFetch's ``require_stable``.
        O(transactional ids), at most ``max_transactional_ids``."""
        keys: set[tuple[str, int]] = set()
        for txn in self.transactions.values():
            offsets = txn.pending.get(group_id)
            if offsets:
                keys.update(offsets)
        return keys

    def info(self, transactional_id: str) -> TransactionInfo:
        txn = self.transactions[transactional_id]
        return TransactionInfo(
            transactional_id=txn.transactional_id,
            producer_id=txn.producer_id,
            producer_epoch=txn.epoch,
            state=txn.state.value,
            partitions=frozenset(txn.partitions),
            groups=frozenset(txn.groups),
            pending_offsets={
                group: {TopicPartition(*key): offset for key, (offset, _) in offsets.items()}
                for group, offsets in txn.pending.items()
            },
            timeout_ms=round(txn.timeout * 1000),
        )
