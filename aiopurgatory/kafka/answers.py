"""The error answers: what a request is answered with when it is not handled (an
injected fault) or its handler failed, for every API that has one.

Ground rules: an error answer changes nothing (no handler runs), and has exactly the
shape the API's handler answers with, at the request's version: a client cannot tell an
injected NOT_LEADER_OR_FOLLOWER from a real one. The shapes are not built here: each
handler module's ``error_response`` builds its own APIs' (:data:`ERROR_ANSWERS`), with
the response builders its handlers use, so that there is one builder per answer; this
module only asks them in turn (and builds Metadata's, the broker's own API, with
:func:`~.protocol.metadata_response`). It sits above every handler module and below
the broker; :mod:`.faults` (the rules that say *when* to answer so) needs none of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from .consumer_group_api import ConsumerGroupApi
from .data_api import DataApi
from .epoch_api import EpochApi
from .group_api import GroupApi
from .protocol import (
    CONSUMER_GROUP_HEARTBEAT,
    GROUP_APIS,
    INIT_PRODUCER_ID,
    METADATA,
    NO_TOPIC_ID,
    TXN_APIS,
    api_name,
    metadata_response,
)
from .txn_api import TxnApi

__all__ = ["ERROR_ANSWERS", "error_answer", "failure_answer"]

ERROR_ANSWERS: Final[tuple[Callable[[int, int, Any, ErrorCode], Any], ...]] = (
    DataApi.error_response,
    EpochApi.error_response,
    GroupApi.error_response,
    ConsumerGroupApi.error_response,
    TxnApi.error_response,
)
"""Where the error answers are built: each API module's ``error_response`` answers its
own APIs (None for the others), with the shapes its handlers answer with; Metadata's,
the broker's own API, is :func:`~.protocol.metadata_response`'s."""


def _metadata(
    version: int,
    request: Any,
    code: ErrorCode,
    brokers: Iterable[tuple[int, str, int]],
    topics: Iterable[str],
) -> Any:
    """Metadata's error answer: every topic asked (all: ``topics``) with ``code`` and no
    partitions (Metadata is the broker's own API: its answer's shape is
    :func:`~.protocol.metadata_response`)."""
    if request.topics is not None:
        # Each once; a topic asked by id (v12) is answered without its name.
        topics = dict.fromkeys(topic.name for topic in request.topics)
    return metadata_response(
        version, brokers, [(code, name, False, (), NO_TOPIC_ID) for name in topics]
    )


def error_answer(
    api_key: int,
    version: int,
    request: Any,
    code: ErrorCode,
    *,
    brokers: Iterable[tuple[int, str, int]] = (),
    topics: Iterable[str] = (),
) -> Any:
    """The answer to ``request`` (decoded, of ``version``) with ``code`` at every error
    it has, built without running the API's handler: nothing changes.

    Per partition for Produce, Fetch (its session-level code stays NONE), ListOffsets
    and OffsetForLeaderEpoch; per topic for Metadata (no partitions); the group and
    transaction APIs as their failing handlers answer. One source: each API module's
    ``error_response`` (:data:`ERROR_ANSWERS`), which the broker's dispatch also
    answers a failing group or transaction handler with (:func:`failure_answer`).

    Args:
        api_key: One of :data:`~.faults.INJECTABLE`.
        version: The request's version.
        request: The decoded request (a kio entity).
        code: The error.
        brokers: Metadata's brokers, (node id, host, port): a client keeps the brokers
            it is told of, so the answer lists the cluster's (the first is the
            controller).
        topics: Metadata's topics when the request asks for all of them.

    Raises:
        ClosingConnection: A Produce with acks=0, which reads no answer: Kafka closes
            the connection on its error instead.
        ValueError: An API not in :data:`~.faults.INJECTABLE`.
    """
    if api_key == METADATA:
        return _metadata(version, request, code, brokers, topics)
    for owner in ERROR_ANSWERS:
        answer = owner(api_key, version, request, code)
        if answer is not None:
            return answer
    raise ValueError(f"{api_name(api_key)} (API {api_key}) has no injected error answer")


def failure_answer(
    api_key: int,
    version: int,
    request: Any,
    error: ErrorCode = ErrorCode.unknown_server_error,
) -> Any:
    """``error`` answering ``request`` whose handler failed: for the group and
    transaction APIs (InitProducerId included), the answer a fault injecting ``error``
    gets (:func:`error_answer`, the one source), on a connection that serves on; None
    for the others, whose failing handler closes the connection (their answers carry
    data a client would take as true)."""
    if api_key in (*GROUP_APIS, CONSUMER_GROUP_HEARTBEAT, *TXN_APIS, INIT_PRODUCER_ID):
        return error_answer(api_key, version, request, error)
    return None
