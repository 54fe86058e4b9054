"""The transaction APIs: InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn and TxnOffsetCommit, answered from the transaction coordinator.

Ground rules: the wire side of :mod:`.transactions` only. Each handler decodes what the
coordinator needs and builds the response of the request's version; the coordinator
decides (and validates before it changes anything). A fenced producer is told
PRODUCER_FENCED from the versions that know it (KIP-588), INVALID_PRODUCER_EPOCH before.
A request whose handling fails is answered UNKNOWN_SERVER_ERROR
(:meth:`TxnApi.error_response`) on a connection that serves on.
"""

from __future__ import annotations

from typing import Any, Final

from kio.schema.errors import ErrorCode

from .data_api import init_producer_id_response
from .limits import Limits
from .log import TopicPartition
from .protocol import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    INIT_PRODUCER_ID,
    TXN_APIS,
    TXN_OFFSET_COMMIT,
    ZERO,
    Handler,
    checked_offsets,
    make,
    ms,
    offset_commit_response,
    response_module,
    response_schema,
)
from .transactions import Transaction, TransactionCoordinator

__all__ = ["TXN_APIS", "TxnApi"]

PRODUCER_FENCED_SINCE: Final = {
    INIT_PRODUCER_ID: 4,
    ADD_PARTITIONS_TO_TXN: 2,
    ADD_OFFSETS_TO_TXN: 2,
    END_TXN: 2,
    TXN_OFFSET_COMMIT: 3,
}
"""The first version of each API answering PRODUCER_FENCED (KIP-588)."""


def fenced(api_key: int, version: int) -> ErrorCode:
    if version >= PRODUCER_FENCED_SINCE[api_key]:
        return ErrorCode.producer_fenced
    return ErrorCode.invalid_producer_epoch


class TxnApi:
    """The transaction APIs' handlers, over one coordinator.

    Args:
        transactions: The coordinator.
        limits: The broker's limits (``offset_metadata_max_bytes``).
        idempotent: The InitProducerId handler for producers without a transactional id.
    """

    __slots__ = ("idempotent", "limits", "transactions")

    def __init__(
        self, transactions: TransactionCoordinator, limits: Limits, idempotent: Handler
    ) -> None:
        self.transactions = transactions
        self.limits = limits
        self.idempotent = idempotent

    def handlers(self) -> dict[int, Handler]:
        """API key to handler, for the broker's dispatch (InitProducerId included: the
        idempotent case is handed to ``idempotent``)."""
        return {
            INIT_PRODUCER_ID: self.init_producer_id,
            ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn,
            END_TXN: self.end_txn,
            TXN_OFFSET_COMMIT: self.txn_offset_commit,
        }

    async def init_producer_id(self, request: Any, version: int) -> Any:
        if request.transactional_id is None:
            return await self.idempotent(request, version)
        error, producer_id, epoch = self.transactions.init_producer(
            request.transactional_id,
            round(ms(request.transaction_timeout) * 1000),
            getattr(request, "producer_id", -1),
            getattr(request, "producer_epoch", -1),
            fenced(INIT_PRODUCER_ID, version),
        )
        return init_producer_id_response(version, error, producer_id, epoch)

    def _check(
        self, api_key: int, version: int, transactional_id: str, producer_id: int, epoch: int
    ) -> Transaction | ErrorCode:
        return self.transactions.check(
            transactional_id, producer_id, epoch, fenced(api_key, version)
        )

    async def add_partitions_to_txn(self, request: Any, version: int) -> Any:
        wanted = [
            TopicPartition(topic.name, index)
            for topic in request.v3_and_below_topics
            for index in topic.partitions
        ]
        txn = self._check(
            ADD_PARTITIONS_TO_TXN,
            version,
            request.v3_and_below_transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
        )
        if isinstance(txn, ErrorCode):
            errors = dict.fromkeys(wanted, txn)
        else:
            errors = self.transactions.add_partitions(txn, wanted)
        return self._add_partitions_response(version, request, errors)

    @staticmethod
    def _add_partitions_response(
        version: int, request: Any, errors: dict[TopicPartition, ErrorCode]
    ) -> Any:
        mod = response_module(ADD_PARTITIONS_TO_TXN, version)
        by_topic: dict[str, dict[int, ErrorCode]] = {}
        for tp, error in errors.items():
            by_topic.setdefault(tp.topic, {})[tp.partition] = error
        return make(
            response_schema(ADD_PARTITIONS_TO_TXN, version),
            throttle_time=ZERO,
            results_by_topic_v3_and_below=tuple(
                make(
                    mod.AddPartitionsToTxnTopicResult,
                    name=name,
                    results_by_partition=tuple(
                        make(
                            mod.AddPartitionsToTxnPartitionResult,
                            partition_index=index,
                            partition_error_code=error,
                        )
                        for index, error in parts.items()
                    ),
                )
                for name, parts in by_topic.items()
            ),
        )

    async def add_offsets_to_txn(self, request: Any, version: int) -> Any:
        txn = self._check(
            ADD_OFFSETS_TO_TXN,
            version,
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
        )
        error = (
            txn
            if isinstance(txn, ErrorCode)
            else self.transactions.add_offsets(txn, request.group_id)
        )
        return make(
            response_schema(ADD_OFFSETS_TO_TXN, version), throttle_time=ZERO, error_code=error
        )

    async def end_txn(self, request: Any, version: int) -> Any:
        txn = self._check(
            END_TXN, version, request.transactional_id, request.producer_id, request.producer_epoch
        )
        error = txn if isinstance(txn, ErrorCode) else self.transactions.end(txn, request.committed)
        return make(response_schema(END_TXN, version), throttle_time=ZERO, error_code=error)

    async def txn_offset_commit(self, request: Any, version: int) -> Any:
        offsets, errors = checked_offsets(
            request, self.transactions.core.partitions, self.limits.offset_metadata_max_bytes
        )
        txn = self._check(
            TXN_OFFSET_COMMIT,
            version,
            request.transactional_id,
            request.producer_id,
            request.producer_epoch,
        )
        if isinstance(txn, ErrorCode):
            error = txn
        elif errors:
            error = ErrorCode.operation_not_attempted  # all or none, as AddPartitionsToTxn
        else:
            error = self.transactions.commit_offsets(txn, request.group_id, offsets)
        for key in offsets:
            errors[key] = error
        return offset_commit_response(TXN_OFFSET_COMMIT, version, request, errors)

    @staticmethod
    def error_response(
        api_key: int, version: int, request: Any, code: ErrorCode = ErrorCode.unknown_server_error
    ) -> Any:
        """``code`` answering ``request``, everywhere it has an error (None for an API not
        here), without asking the coordinator anything.

        UNKNOWN_SERVER_ERROR by default, the answer to a handler that failed; any other
        code is an injected fault (:mod:`.faults`), so static: it needs no coordinator.
        """
        error = code
        if api_key == INIT_PRODUCER_ID:
            return init_producer_id_response(version, error)
        if api_key in (ADD_OFFSETS_TO_TXN, END_TXN):
            return make(response_schema(api_key, version), throttle_time=ZERO, error_code=error)
        if api_key == ADD_PARTITIONS_TO_TXN:
            errors = {
                TopicPartition(topic.name, index): error
                for topic in request.v3_and_below_topics
                for index in topic.partitions
            }
            return TxnApi._add_partitions_response(version, request, errors)
        if api_key == TXN_OFFSET_COMMIT:
            keys = {
                (topic.name, part.partition_index): error
                for topic in request.topics
                for part in topic.partitions
            }
            return offset_commit_response(TXN_OFFSET_COMMIT, version, request, keys)
        return None
