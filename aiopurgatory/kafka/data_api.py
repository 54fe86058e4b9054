"""The data APIs: Produce, Fetch, ListOffsets and InitProducerId, answered from the
broker core (the log and its produce and fetch purgatories) and the producers' table.

Ground rules: a request is checked whole before anything is appended (a refused batch
leaves no trace, not even a sequence); what waits, waits in the core's purgatories
(acks=all in ``produce``, a fetch short of ``min_bytes`` in ``fetch``); a fetch's answer
takes its room in the shared byte budget without ever waiting while it holds any.
Each API's answer has one builder (:func:`produce_response`, :func:`fetch_response`,
:func:`list_offsets_response`, :func:`init_producer_id_response`), for the handlers
and for the error answers (:meth:`DataApi.error_response`, what an injected fault gets).
"""

from __future__ import annotations

import collections
import logging
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from kio.schema.errors import ErrorCode

from .connection import ByteBudget, ClosingConnection, current_connection
from .core import BrokerCore
from .leadership import Leadership, epoch_error
from .limits import FETCH_CACHE_ENTRY_BYTES, Limits
from .log import Partition, TopicPartition
from .producers import ProducerTable
from .protocol import (
    FETCH,
    INIT_PRODUCER_ID,
    LIST_OFFSETS,
    OFFSETS_TOPIC,
    PRODUCE,
    ZERO,
    Encoded,
    Handler,
    LruCache,
    encode_body,
    make,
    ms,
    response_module,
    response_schema,
)
from .records import (
    BATCH_BASE_OFFSET,
    BATCH_LEADER_EPOCH,
    ZSTD_FETCH_SINCE,
    BadBatch,
    IncomingBatch,
    InvalidRecord,
    StoredBatch,
    UnsupportedCompression,
    before_zstd,
    first_keyless,
    split_batches,
    timestamp_so_far,
)

if TYPE_CHECKING:
    from .transactions import TransactionCoordinator

__all__ = [
    "DataApi",
    "FetchRow",
    "OffsetRow",
    "fetch_response",
    "init_producer_id_response",
    "list_offsets_response",
    "produce_response",
]

log = logging.getLogger("aiopurgatory.kafka")

EARLIEST_TIMESTAMP: Final = -2
LATEST_TIMESTAMP: Final = -1
READ_COMMITTED: Final = 1


class DataApi:
    """The data APIs' handlers, over one core.

    Args:
        core: The log and its purgatories.
        producers: The idempotent producers' ids and sequences.
        limits: The broker's limits.
        budget: The in-flight bytes shared by every connection.
        transactions: The transaction coordinator: transactional batches, the last
            stable offset and the aborted transactions of read_committed fetches.
        leadership: Which node leads each partition (None: this one, always, and
            only leader epochs are checked).
        replicas: The replicas of a partition where they are simulated (one node).
    """

    __slots__ = (
        "_empty_answers",
        "budget",
        "compacted",
        "core",
        "leadership",
        "limits",
        "producers",
        "replicas",
        "transactions",
    )

    def __init__(
        self,
        core: BrokerCore[StoredBatch],
        producers: ProducerTable,
        limits: Limits,
        budget: ByteBudget,
        transactions: TransactionCoordinator | None = None,
        leadership: Leadership | None = None,
        replicas: int = 1,
        compacted: Callable[[str], bool] | None = None,
    ) -> None:
        self.core = core
        self.compacted = compacted
        """Whether a topic is compacted (its records need a key); None: none is."""
        self.leadership = leadership
        self.replicas = replicas
        self.producers = producers
        self.limits = limits
        self.budget = budget
        self.transactions = transactions
        self._empty_answers: LruCache[tuple[Any, ...], Encoded] = LruCache(
            limits.fetch_cache_entries
        )
        """Empty Fetch answers, encoded, keyed by what they hold (``_fetch_response``)."""

    def handlers(self) -> dict[int, Handler]:
        """API key to handler, for the broker's dispatch."""
        return {
            PRODUCE: self.produce,
            FETCH: self.fetch,
            LIST_OFFSETS: self.list_offsets,
            INIT_PRODUCER_ID: self.init_producer_id,
        }

    # -- Produce ------------------------------------------------------------------------

    async def produce(self, request: Any, version: int) -> Any:
        acks = request.acks
        topics = request.topic_data
        # The whole request is checked before anything changes (Kafka's parser refuses a
        # null array before the request is handled): a request refused halfway must not
        # leave the sequences of batches it never appended, or the producer's retry of
        # such a batch would be acknowledged as a duplicate and never stored.
        if topics is None or any(topic.partition_data is None for topic in topics):
            raise ClosingConnection("produce request with a null array")
        listed = collections.Counter(
            TopicPartition(topic.name, data.index)
            for topic in topics
            for data in topic.partition_data
        )
        results: dict[TopicPartition, tuple[ErrorCode, int]] = {}
        messages: dict[TopicPartition, str] = {}
        """Why a partition's batches were refused, where Kafka says it (INVALID_RECORD)."""
        record_errors: dict[TopicPartition, int] = {}
        """The index of the record refused, where Kafka names it (a keyless record)."""
        plans: dict[TopicPartition, list[tuple[IncomingBatch, StoredBatch, int]]] = {}
        """Per partition, the batches to append: each as sent, as stored, its offset."""
        covers: dict[TopicPartition, int] = {}
        """The log end offset each partition's HW must reach for acks=all: past the
        batches appended, or past the originals of retried ones."""
        order: list[TopicPartition] = []
        for topic in topics:
            for data in topic.partition_data:
                tp = TopicPartition(topic.name, data.index)
                if tp in results:
                    continue  # answered once
                order.append(tp)
                if listed[tp] > 1:
                    results[tp] = (ErrorCode.invalid_request, -1)  # listed twice: neither taken
                elif (refused := self._leader_error(tp, -1, acks)) is not ErrorCode.none:
                    results[tp] = (refused, -1)
                elif acks in (0, 1, -1):
                    results[tp] = self._produce_partition(
                        tp, data.records, plans, covers, messages, version, record_errors
                    )
                else:
                    results[tp] = (ErrorCode.invalid_required_acks, -1)
        # Validated. An open transaction holds its partitions' LSO back from its first
        # batch's offset: recorded before the append, which wakes the fetches waiting on
        # those partitions (a read_committed one must find the LSO already held).
        if self.transactions is not None:
            for tp, plan in plans.items():
                for batch, _, base in plan:
                    if batch.transactional:
                        self.transactions.appended(tp, batch, base)
        appends = {tp: [stored for _, stored, _ in plan] for tp, plan in plans.items() if plan}
        if appends:
            self.core.append(appends)
        # Then the sequences of exactly what was appended.
        for tp, plan in plans.items():
            for batch, _, base in plan:
                self.producers.remember(tp, batch, base)
        if acks == 0:
            return None
        if acks == -1 and covers:
            timeout = min(max(ms(request.timeout), 0.0), self.limits.max_wait_seconds)
            required = {self.core.partitions[tp]: end for tp, end in covers.items()}
            outcome = await self.core.acknowledge(required, timeout)
            for tp, error in outcome.items():
                if error:  # REQUEST_TIMED_OUT, or UNKNOWN_TOPIC_OR_PARTITION if deleted
                    results[tp] = (ErrorCode(int(error)), results[tp][1])
                elif self._isr_short(tp):
                    # Replicated, but the ISR shrank below min.insync.replicas while it
                    # waited (the HW moved because it shrank): Kafka's DelayedProduce
                    # answers so; the records stay, at the offset answered.
                    results[tp] = (ErrorCode.not_enough_replicas_after_append, results[tp][1])
        return self._produce_response(version, order, results, messages, record_errors)

    def _produce_partition(
        self,
        tp: TopicPartition,
        records: bytes | None,
        plans: dict[TopicPartition, list[tuple[IncomingBatch, StoredBatch, int]]],
        covers: dict[TopicPartition, int],
        messages: dict[TopicPartition, str],
        version: int,
        record_errors: dict[TopicPartition, int],
    ) -> tuple[ErrorCode, int]:
        """Check the partition's batches and plan their append (the caller appends once
        the whole request is checked): (error, base offset); why, in ``messages``, for a
        batch Kafka's log validator refuses."""
        partition = self.core.partitions.get(tp)
        if tp.topic == OFFSETS_TOPIC:
            return ErrorCode.invalid_topic_exception, -1  # Kafka: internal, not appendable
        if partition is None:
            return ErrorCode.unknown_topic_or_partition, -1
        if self.core.over_retention():
            # Full, and nothing replicated enough to drop: the producer retries later.
            return ErrorCode.kafka_storage_error, -1
        try:
            batches = split_batches(records or b"", self.limits.max_request_bytes, version)
        except InvalidRecord as exc:
            log.info("refusing a batch for %s: %s", tp, exc)
            messages[tp] = f"{exc} in topic partition {tp}"
            return ErrorCode.invalid_record, -1
        except UnsupportedCompression as exc:
            log.info("refusing a batch for %s: %s", tp, exc)
            messages[tp] = str(exc)
            return ErrorCode.unsupported_compression_type, -1
        except BadBatch as exc:
            log.info("refusing a batch for %s: %s", tp, exc)
            return ErrorCode.corrupt_message, -1
        if self.compacted is not None and self.compacted(tp.topic):
            for batch in batches:
                index = first_keyless(bytes(batch.data), self.limits.max_request_bytes)
                if index is not None:
                    # Kafka's LogValidator, with the record's index in record_errors.
                    messages[tp] = (
                        "Compacted topic cannot accept message without key in topic"
                        f" partition {tp}."
                    )
                    record_errors[tp] = index
                    return ErrorCode.invalid_record, -1
        limit = self.core.max_message_bytes.get(tp.topic)  # the topic's max.message.bytes
        if limit is not None and any(len(batch.data) > limit for batch in batches):
            return ErrorCode.message_too_large, -1
        # Check every batch before changing anything: a refused batch leaves no trace.
        originals: list[int | None] = []
        expected: dict[int, int] = {}  # producer id -> last sequence, within this request
        for batch in batches:
            if batch.transactional:
                # Only to a partition its open transaction added, at its current epoch.
                if self.transactions is None:
                    return ErrorCode.invalid_txn_state, -1
                error = self.transactions.produce_error(tp, batch)
                if error is not ErrorCode.none:
                    return error, -1
            error, original = self.producers.sequence_error(
                tp, batch, expected.get(batch.producer_id)
            )
            if error is not ErrorCode.none:
                return error, -1
            originals.append(original)
            if batch.producer_id >= 0:
                expected[batch.producer_id] = batch.base_sequence + batch.count - 1
        plan: list[tuple[IncomingBatch, StoredBatch, int]] = []
        next_offset = partition.leo
        # The newest batch is never dropped: it carries the partition's running maximum.
        so_far = partition.entries[-1].timestamp_so_far if partition.entries else -1
        first_base: int | None = None
        end = 0
        for batch, original in zip(batches, originals, strict=True):
            if original is not None:
                # A retry: answered with the original's offset, appended nothing; its
                # acks=all still waits until the original is replicated.
                first_base = original if first_base is None else first_base
                end = max(end, original + batch.count)
                continue
            # Offsets are the broker's to assign: the producer sent 0.
            struct.pack_into(">q", batch.data, BATCH_BASE_OFFSET, next_offset)
            struct.pack_into(">i", batch.data, BATCH_LEADER_EPOCH, partition.epoch)
            so_far = max(so_far, batch.max_timestamp)
            stored = StoredBatch(bytes(batch.data), batch.count, batch.max_timestamp, so_far)
            plan.append((batch, stored, next_offset))
            first_base = next_offset if first_base is None else first_base
            next_offset += batch.count
            end = next_offset
        plans[tp] = plan
        covers[tp] = end
        assert first_base is not None
        return ErrorCode.none, first_base

    def _produce_response(
        self,
        version: int,
        order: Iterable[TopicPartition],
        results: Mapping[TopicPartition, tuple[ErrorCode, int]],
        messages: Mapping[TopicPartition, str],
        record_errors: Mapping[TopicPartition, int],
    ) -> Any:
        partitions = self.core.partitions
        rows = []
        for tp in order:
            error, base = results[tp]
            partition = partitions.get(tp)
            rows.append((tp, error, base, partition.log_start if partition else -1))
        return produce_response(version, rows, messages, record_errors)

    # -- Fetch --------------------------------------------------------------------------

    async def fetch(self, request: Any, version: int) -> Any:
        errors: dict[TopicPartition, ErrorCode] = {}
        offsets: dict[TopicPartition, int] = {}
        limits: dict[TopicPartition, int] = {}
        order: list[TopicPartition] = []
        named = 0
        for topic in request.topics:
            for part in topic.partitions:
                named += 1
                tp = TopicPartition(topic.topic, part.partition)
                if tp in offsets or tp in errors:
                    continue
                order.append(tp)
                partition = self.core.partitions.get(tp)
                if partition is None:
                    errors[tp] = ErrorCode.unknown_topic_or_partition
                elif (
                    # One node, no epoch asked (most consumers' fetches): nothing to check.
                    (current := getattr(part, "current_leader_epoch", -1)) != -1
                    or self.leadership is not None
                ) and (error := self._leader_error(tp, current)) is not ErrorCode.none:
                    errors[tp] = error
                elif not partition.in_range(part.fetch_offset):
                    errors[tp] = ErrorCode.offset_out_of_range
                else:
                    offsets[tp] = part.fetch_offset
                    limits[tp] = max(part.partition_max_bytes, 0)
        read: dict[TopicPartition, list[StoredBatch]] = {}
        committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
        if offsets:
            max_wait = min(max(ms(request.max_wait), 0.0), self.limits.max_wait_seconds)
            max_bytes = min(
                getattr(request, "max_bytes", None) or self.limits.max_fetch_bytes,
                self.limits.max_fetch_bytes,
            )
            # An error answers the whole fetch at once (min_bytes 0), as Kafka does. So
            # does padding: a partition named twice, or forgotten partitions without a
            # fetch session (none is served), which no client sends. A parked fetch
            # keeps its decoded request, charged to the budget as its frame: padded, it
            # would hold the budget (or, uncharged, memory) for names it does not watch.
            padded = named > len(order) or bool(getattr(request, "forgotten_topics_data", ()))
            min_bytes = 0 if errors or padded else max(request.min_bytes, 0)
            if committed and self.transactions is not None:
                # Up to the last stable offset: a commit or abort moving it re-checks
                # the fetch, as its markers are appended to the partitions watched.
                read = await self.transactions.committed_fetch(
                    offsets,
                    min_bytes=min_bytes,
                    max_wait=max_wait,
                    partition_max_bytes=limits,
                    max_bytes=max(max_bytes, 0),
                )
            else:
                read = await self.core.fetch(
                    offsets,
                    min_bytes=min_bytes,
                    max_wait=max_wait,
                    partition_max_bytes=limits,
                    max_bytes=max(max_bytes, 0),
                )
            # The answer's bytes count against the in-flight budget until it is sent.
            size = 0
            for batches in read.values():
                for batch in batches:
                    size += batch.size
            await self._reserve_answer(size)
        return self._fetch_response(version, order, errors, offsets, read, committed)

    def _leader_error(self, tp: TopicPartition, current_epoch: int, acks: int = 1) -> ErrorCode:
        """What the node asked answers for an existing partition it may not lead: NONE
        if it leads it at ``current_epoch`` (-1: any); for acks=all, NOT_ENOUGH_REPLICAS
        while the ISR is smaller than the topic's ``min.insync.replicas``."""
        partition = self.core.partitions.get(tp)
        if partition is None:
            return ErrorCode.none
        leadership = self.leadership
        if leadership is None:
            # One node leads every partition: only the epoch is checked, and the ISR is
            # the simulated replicas.
            error = epoch_error(current_epoch, partition.epoch)
        else:
            error = leadership.leader_error(tp, current_epoch)
        if error is ErrorCode.none and acks == -1 and self._isr_short(tp):
            return ErrorCode.not_enough_replicas
        return error

    def _isr_short(self, tp: TopicPartition) -> bool:
        """Whether fewer replicas of ``tp`` are in sync than its topic's
        ``min.insync.replicas`` (on one node: its simulated replicas, all in sync)."""
        required = self.core.min_insync.get(tp.topic, 1)
        if required <= 1:
            return False
        leadership = self.leadership
        in_sync = self.replicas if leadership is None else leadership.isr_size(tp, self.replicas)
        return required > in_sync

    async def _reserve_answer(self, size: int) -> None:
        """Hold ``size`` bytes of the in-flight budget for this connection's answer.

        Charged before the answer is built (the connection charges it again, if
        bigger, before writing it). The request's frame was given back once decoded
        (``KafkaBroker._dispatch``), but a connection holding any bytes must never wait
        for more: four fetches each holding a quarter of the budget, each waiting for a
        few bytes more, would wait for one another forever, and with them every
        connection queued behind. So what the connection holds pays first; what goes
        beyond is taken at once if it fits. Otherwise the connection
        gives back everything it holds and then waits, among the answers, which go
        before new requests, for its whole answer: a connection that waits holds
        nothing, so no waiter blocks another's release, and the wait is bounded
        (``budget_wait_seconds``, then the connection is closed).
        """
        state = current_connection.get()
        if size <= state.held or self.budget.try_acquire(size - state.held, answer=True):
            state.held = max(state.held, size)
            return
        self.budget.release(state.held)
        state.held = 0
        await self.budget.acquire(size, self.limits.budget_wait_seconds, answer=True)
        state.held = size

    def _fetch_response(
        self,
        version: int,
        order: Iterable[TopicPartition],
        errors: Mapping[TopicPartition, ErrorCode],
        offsets: Mapping[TopicPartition, int],
        read: Mapping[TopicPartition, list[StoredBatch]],
        committed: bool = False,
    ) -> Any:
        """The answer: a kio entity, or, when no partition has records, its encoding
        (:class:`~.protocol.Encoded`), kept in a bounded cache keyed by everything it
        holds, so a consumer long-polling an idle partition is answered without
        building or encoding anything."""
        rows: list[tuple[TopicPartition, ErrorCode, int, int, int]] = []
        """Each partition's (error, high watermark, last stable offset, log start)."""
        batches_of: dict[TopicPartition, list[StoredBatch]] = {}
        for tp in order:
            partition = self.core.partitions.get(tp)
            error = errors.get(tp, ErrorCode.none)
            if error is ErrorCode.none and partition is not None and self.leadership is not None:
                error = self._leader_error(tp, -1)  # the leader moved while it waited
            if error is ErrorCode.none and (
                partition is None or not partition.in_range(offsets[tp])
            ):
                # Deleted, or passed by retention, while the fetch waited.
                error = (
                    ErrorCode.unknown_topic_or_partition
                    if partition is None
                    else ErrorCode.offset_out_of_range
                )
            batches = read.get(tp) if error is ErrorCode.none else None
            if batches and version < ZSTD_FETCH_SINCE:
                # KIP-110: an older consumer cannot read zstd; where a zstd batch comes
                # first, the partition is answered UNSUPPORTED_COMPRESSION_TYPE and
                # nothing else, as Kafka answers it.
                batches = before_zstd(batches)
                if not batches:
                    error = ErrorCode.unsupported_compression_type
            if partition is None or error is ErrorCode.unsupported_compression_type:
                rows.append((tp, error, -1, -1, -1))
            else:
                rows.append((tp, error, partition.hw, self._lso(partition), partition.log_start))
            if batches:
                batches_of[tp] = batches
        if batches_of:
            return self._fetch_entity(version, rows, batches_of, offsets, committed)
        # Empty: a pure function of the version and the rows (the throttle, session id
        # and preferred replica are constants), so a cached encoding is never stale.
        key = (version, tuple(rows))
        encoded = self._empty_answers.get(key)
        if encoded is None:
            encoded = encode_body(self._fetch_entity(version, rows, {}, offsets, committed))
            if len(encoded.body) <= FETCH_CACHE_ENTRY_BYTES:
                self._empty_answers.put(key, encoded)
        return encoded

    def _fetch_entity(
        self,
        version: int,
        rows: Iterable[tuple[TopicPartition, ErrorCode, int, int, int]],
        batches_of: Mapping[TopicPartition, list[StoredBatch]],
        offsets: Mapping[TopicPartition, int],
        committed: bool,
    ) -> Any:
        txns = self.transactions
        answers: list[FetchRow] = []
        for tp, error, hw, lso, log_start in rows:
            batches = batches_of.get(tp, [])
            aborted = None
            if committed and txns is not None and batches:
                # The aborted transactions the consumer must drop in what it reads.
                last = batches[-1]
                end = int.from_bytes(last.data[BATCH_BASE_OFFSET : BATCH_BASE_OFFSET + 8], "big")
                aborted = txns.aborted_in(tp, offsets[tp], end + last.count)
            records = b"".join(batch.data for batch in batches)
            answers.append((tp, error, hw, lso, log_start, aborted, records))
        return fetch_response(version, answers)

    def _lso(self, partition: Partition[StoredBatch] | None) -> int:
        if partition is None:
            return -1
        if self.transactions is None:
            return partition.hw
        return self.transactions.lso(partition)

    # -- ListOffsets, InitProducerId ----------------------------------------------------

    def _offset_for(
        self, partition: Partition[StoredBatch], timestamp: int, committed: bool = False
    ) -> tuple[int, int]:
        """(timestamp, offset) answering a ListOffsets query on ``partition``.

        By timestamp, as Kafka answers it: the first batch (up to the high watermark)
        whose max timestamp is at or after the one asked for, and that timestamp; by
        bisection over the batches' running maximum, so a long log costs no more than a
        short one. (Kafka then walks that batch to its first record at or after the
        time; a batch stays opaque here, so the answer is the batch's base offset.) A
        batch dropped by retention that was stamped later than those after it still
        counts in their running maximum: the answer may then be an earlier offset than
        a scan would give, never a later one (a consumer re-reads, it skips nothing).
        """
        if timestamp == EARLIEST_TIMESTAMP:
            return -1, partition.log_start
        if timestamp == LATEST_TIMESTAMP or timestamp < 0:
            # read_committed: the last stable offset (open transactions not yet read).
            return -1, self._lso(partition) if committed else partition.hw
        found = partition.first_at_least(timestamp, key=timestamp_so_far)
        if found is None or found[0] >= partition.hw:
            return -1, -1
        offset, batch = found
        return batch.max_timestamp, offset

    async def list_offsets(self, request: Any, version: int) -> Any:
        topics = request.topics
        if topics is None or any(topic.partitions is None for topic in topics):
            raise ClosingConnection("list offsets request with a null array")
        # A partition named more than once is refused (INVALID_REQUEST) and answered
        # once, by topic in the order first listed, as Kafka's ReplicaManager answers
        # it (one answer per partition): one request cannot make the broker look the
        # same log up a thousand times, nor answer it a thousand times.
        named = collections.Counter(
            TopicPartition(topic.name, part.partition_index)
            for topic in topics
            for part in topic.partitions
        )
        committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
        answers: dict[str, list[OffsetRow]] = {}
        answered: set[TopicPartition] = set()
        for topic in topics:
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                if tp in answered:
                    continue
                answered.add(tp)
                partition = self.core.partitions.get(tp)
                if named[tp] > 1:
                    error, found = ErrorCode.invalid_request, (-1, -1)
                elif partition is None:
                    error, found = ErrorCode.unknown_topic_or_partition, (-1, -1)
                elif (
                    error := self._leader_error(tp, getattr(part, "current_leader_epoch", -1))
                ) is not ErrorCode.none:
                    found = (-1, -1)
                else:
                    error, found = (
                        ErrorCode.none,
                        self._offset_for(partition, part.timestamp, committed),
                    )
                epoch = -1 if partition is None else partition.epoch
                answers.setdefault(topic.name, []).append(
                    (part.partition_index, error, found[0], found[1], epoch)
                )
        return list_offsets_response(version, answers.items())

    async def init_producer_id(self, request: Any, version: int) -> Any:
        if request.transactional_id is not None:
            # Transactions are not served: Kafka's answer to a broker without them.
            return init_producer_id_response(
                version, ErrorCode.transactional_id_authorization_failed
            )
        previous = getattr(request, "producer_id", -1)
        if self.producers.handed_out(previous):
            # KIP-360: a producer bumping its own epoch keeps its id (an id never handed
            # out gets a new one, as any first InitProducerId).
            epoch = (getattr(request, "producer_epoch", -1) + 1) & 0x7FFF
            return init_producer_id_response(version, ErrorCode.none, previous, epoch)
        producer_id = self.producers.new_id()
        return init_producer_id_response(version, ErrorCode.none, producer_id, 0)

    # -- error answers ------------------------------------------------------------------

    @staticmethod
    def error_response(
        api_key: int, version: int, request: Any, code: ErrorCode = ErrorCode.unknown_server_error
    ) -> Any:
        """``code`` answering ``request`` (Produce, Fetch or ListOffsets; None for other
        APIs) at every partition it names, without touching the log: the handlers'
        answer with nothing found. Fetch's session-level code stays NONE (KIP-227: a
        partition's error goes with its partition, as Kafka answers a partition it does
        not lead); a partition named twice in a Produce, a Fetch or a ListOffsets is
        answered once, as the handlers answer it.

        Raises:
            ClosingConnection: A Produce with acks=0, which reads no answer: Kafka
                closes the connection on its error instead (the producer notices, then
                refreshes its metadata).
        """
        if api_key == PRODUCE:
            if request.acks == 0:
                raise ClosingConnection(f"{code.name.upper()} injected into an acks=0 produce")
            listed = _listed(request.topic_data, "name", "partition_data", "index")
            return produce_response(version, [(tp, code, -1, -1) for tp in listed])
        if api_key == FETCH:
            listed = _listed(request.topics, "topic", "partitions", "partition")
            return fetch_response(version, [(tp, code, -1, -1, -1, None, b"") for tp in listed])
        if api_key == LIST_OFFSETS:
            by_topic: dict[str, list[OffsetRow]] = {}
            for tp in _listed(request.topics, "name", "partitions", "partition_index"):
                by_topic.setdefault(tp.topic, []).append((tp.partition, code, -1, -1, -1))
            return list_offsets_response(version, by_topic.items())
        return None


# -- the answers' shapes: one builder per API, for the handlers and the error answers ----

FetchRow = tuple[TopicPartition, ErrorCode, int, int, int, Iterable[tuple[int, int]] | None, bytes]
"""A fetched partition: error, high watermark, last stable offset, log start offset,
the aborted transactions in its records ((producer id, first offset); None when not
read_committed), its records."""
OffsetRow = tuple[int, ErrorCode, int, int, int]
"""A ListOffsets partition: index, error, timestamp, offset, leader epoch."""


def _listed(
    topics: Iterable[Any] | None, name: str, parts: str, index: str
) -> list[TopicPartition]:
    """A request's partitions, each once, in the order first listed (``name``, ``parts``
    and ``index`` are its topic's name, partitions and partition index fields)."""
    listed: dict[TopicPartition, None] = {}
    for topic in topics or ():
        topic_name = getattr(topic, name)
        for part in getattr(topic, parts) or ():
            listed.setdefault(TopicPartition(topic_name, getattr(part, index)))
    return list(listed)


def produce_response(
    version: int,
    rows: Iterable[tuple[TopicPartition, ErrorCode, int, int]],
    messages: Mapping[TopicPartition, str] | None = None,
    record_errors: Mapping[TopicPartition, int] | None = None,
) -> Any:
    """Produce's answer: each partition's (error, base offset, log start offset), by
    topic in the order first listed; a partition's error message from ``messages``
    and the index of the record refused from ``record_errors`` (versions 8 and later
    carry them)."""
    mod = response_module(PRODUCE, version)
    by_topic: dict[str, list[Any]] = {}
    for tp, error, base, log_start in rows:
        by_topic.setdefault(tp.topic, []).append(
            make(
                mod.PartitionProduceResponse,
                index=tp.partition,
                error_code=error,
                base_offset=base,
                log_append_time=None,
                log_start_offset=log_start,
                record_errors=_record_errors(mod, tp, messages, record_errors),
                error_message=messages.get(tp) if messages else None,
            )
        )
    return make(
        response_schema(PRODUCE, version),
        responses=tuple(
            make(mod.TopicProduceResponse, name=name, partition_responses=tuple(parts))
            for name, parts in by_topic.items()
        ),
        throttle_time=ZERO,
    )


def _record_errors(
    mod: Any,
    tp: TopicPartition,
    messages: Mapping[TopicPartition, str] | None,
    record_errors: Mapping[TopicPartition, int] | None,
) -> tuple[Any, ...]:
    """The record a partition's answer names (Produce v8+), with Kafka's words."""
    schema = getattr(mod, "BatchIndexAndErrorMessage", None)
    if schema is None or not record_errors or tp not in record_errors:
        return ()
    message = messages.get(tp) if messages else None
    return (make(schema, batch_index=record_errors[tp], batch_index_error_message=message),)


def fetch_response(version: int, rows: Iterable[FetchRow]) -> Any:
    """Fetch's answer: each partition's row (:data:`FetchRow`), by topic in the order
    first listed; the session-level error NONE."""
    mod = response_module(FETCH, version)
    by_topic: dict[str, list[Any]] = {}
    for tp, error, hw, lso, log_start, aborted, records in rows:
        by_topic.setdefault(tp.topic, []).append(
            make(
                mod.PartitionData,
                partition_index=tp.partition,
                error_code=error,
                high_watermark=hw,
                last_stable_offset=lso,
                log_start_offset=log_start,
                aborted_transactions=None
                if aborted is None
                else tuple(
                    make(mod.AbortedTransaction, producer_id=pid, first_offset=first)
                    for pid, first in aborted
                ),
                preferred_read_replica=-1,
                records=records,
            )
        )
    return make(
        response_schema(FETCH, version),
        throttle_time=ZERO,
        error_code=ErrorCode.none,
        session_id=0,  # fetch sessions declined (KIP-227): every fetch is a full one
        responses=tuple(
            make(mod.FetchableTopicResponse, topic=name, partitions=tuple(parts))
            for name, parts in by_topic.items()
        ),
    )


def list_offsets_response(version: int, topics: Iterable[tuple[str, Iterable[OffsetRow]]]) -> Any:
    """ListOffsets' answer: each topic as asked, each partition's :data:`OffsetRow`."""
    mod = response_module(LIST_OFFSETS, version)
    return make(
        response_schema(LIST_OFFSETS, version),
        throttle_time=ZERO,
        topics=tuple(
            make(
                mod.ListOffsetsTopicResponse,
                name=name,
                partitions=tuple(
                    make(
                        mod.ListOffsetsPartitionResponse,
                        partition_index=index,
                        error_code=error,
                        timestamp=timestamp,
                        offset=offset,
                        leader_epoch=epoch,
                    )
                    for index, error, timestamp, offset, epoch in parts
                ),
            )
            for name, parts in topics
        ),
    )


def init_producer_id_response(
    version: int, error: ErrorCode, producer_id: int = -1, epoch: int = -1
) -> Any:
    """InitProducerId's answer (an idempotent producer's here, a transactional one's in
    :mod:`.txn_api`)."""
    return make(
        response_schema(INIT_PRODUCER_ID, version),
        throttle_time=ZERO,
        error_code=error,
        producer_id=producer_id,
        producer_epoch=epoch,
    )
