"""Faults a test injects into the broker: an error answering an API some number of
times, a delay before an API's answers, and a log of what was done and what followed.

Ground rules: :class:`Faults` is pure data, bounded (at most ``max_fault_rules`` rules
pending, :class:`~.limits.Limits`), asked by the broker's dispatch on every request, so
both of its questions (:meth:`Faults.take`, :meth:`Faults.delay_for`) cost one test of
an empty dict while nothing is injected. An injected error is answered
without running the API's handler: the request changes nothing, as a Kafka broker
refusing a request it is not the leader or coordinator for changes nothing, so a
client's retry is the request's first effect. The answers are not built here but by
:func:`~.answers.error_answer` (each handler module's own ``error_response``): this
module says *when* to answer so, and imports no handler, so that it (and
:mod:`.nodes`, which logs here) sits below all of them. :class:`FaultLog` says what a
test did and what followed, in the log and, given an observer, as trace rows.
"""

from __future__ import annotations

import collections
import difflib
import logging
import math
import re
import time
from collections.abc import Callable
from typing import Final

from kio.schema.errors import ErrorCode

import aiopurgatory as ap

from .limits import Limits
from .protocol import (
    CONSUMER_GROUP_HEARTBEAT,
    FETCH,
    GROUP_APIS,
    INIT_PRODUCER_ID,
    LIST_OFFSETS,
    METADATA,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    SERVED,
    TXN_APIS,
    api_key_named,
    api_name,
)

__all__ = [
    "FAULTS_PURGATORY",
    "INJECTABLE",
    "OFFSET_FOR_LEADER_EPOCH",
    "FaultEvent",
    "FaultLog",
    "Faults",
    "api_key_of",
    "error_code_of",
]

log = logging.getLogger("aiopurgatory.kafka")

INJECTABLE: Final = frozenset(
    {
        PRODUCE,
        FETCH,
        LIST_OFFSETS,
        METADATA,
        INIT_PRODUCER_ID,
        OFFSET_FOR_LEADER_EPOCH,
        *GROUP_APIS,
        CONSUMER_GROUP_HEARTBEAT,
        *TXN_APIS,
    }
)
"""The APIs :meth:`Faults.inject` takes: those whose every answer carries an error code
a client acts on (retries, rediscovers the leader or the coordinator). ApiVersions, the
SASL and admin APIs are refused: an error there tests nothing a client recovers from."""

FAULTS_PURGATORY: Final = "faults"
"""The purgatory name of :class:`FaultLog`'s trace rows."""

_EVENT: Final = re.compile(r"[a-z][a-z0-9_]{0,63}")


def api_key_of(api: int | str) -> int:
    """The key of ``api``: its key, or its name in any case, with or without
    underscores ("Produce", "find_coordinator"); one the broker serves.

    Raises:
        ValueError: Neither a key nor a name of an API the broker serves.
    """
    if isinstance(api, bool) or not isinstance(api, int | str):
        raise ValueError(f"an API is its key or its name, got {api!r}")
    key = api_key_named(api) if isinstance(api, str) else api
    if key is None:
        raise ValueError(f"no Kafka API is called {api!r}")
    if key not in SERVED:
        raise ValueError(f"{api_name(key)} (API {key}) is not served by this broker")
    return key


def error_code_of(error: ErrorCode | int | str) -> ErrorCode:
    """``error`` as an :class:`ErrorCode`: one, its number, or its name in any case
    ("NOT_LEADER_OR_FOLLOWER", "not_leader_or_follower"); never NONE, which is no fault.

    Raises:
        ValueError: No Kafka error code, or NONE.
    """
    if isinstance(error, bool) or not isinstance(error, int | str):
        raise ValueError(f"an error is an ErrorCode, its number or its name, got {error!r}")
    try:
        code = ErrorCode[error.lower()] if isinstance(error, str) else ErrorCode(error)
    except (KeyError, ValueError):
        message = f"no Kafka error code is {error!r}"
        nearest = _nearest_error_names(error) if isinstance(error, str) else []
        if nearest:
            message += "; did you mean " + " or ".join(map(repr, nearest)) + "?"
        raise ValueError(message) from None
    if code is ErrorCode.none:
        raise ValueError("NONE is no error to inject")
    return code


def _nearest_error_names(name: str) -> list[str]:
    """Up to three error names near ``name`` (Kafka's spelling, upper case): those it
    is a part of ("NOT_LEADER" of NOT_LEADER_OR_FOLLOWER), else the closest (difflib),
    so that a misremembered name is answered with the one meant."""
    wanted = name.upper().replace("-", "_").replace(" ", "_")
    names = [code.name.upper() for code in ErrorCode if code is not ErrorCode.none]
    containing = [known for known in names if wanted and wanted in known]
    if containing:
        return sorted(containing, key=len)[:3]
    return difflib.get_close_matches(wanted, names, n=3, cutoff=0.6)


def _node_of(node: int | None) -> int | None:
    if node is not None and (isinstance(node, bool) or not isinstance(node, int) or node < 0):
        raise ValueError(f"a node is a node id >= 0, or None for every node, got {node!r}")
    return node


class _Injected:
    """An error still to answer ``remaining`` requests with, on ``node`` (None: any)."""

    __slots__ = ("error", "node", "remaining")

    def __init__(self, node: int | None, error: ErrorCode, remaining: int) -> None:
        self.node = node
        self.error = error
        self.remaining = remaining


class Faults:
    """Errors and delays a test injects, asked by the broker's dispatch per request.

    An error rule answers the next ``count`` requests of its API (on its node, or on
    any) with its error; rules of one API are taken in the order injected. A delay
    holds every answer of its API (or of every API) on its node (or on every node) that
    long before it is sent. Each pending error rule and each delay is one rule, at most
    ``max_rules`` together: the table a test fills is bounded as any a client fills.

    Args:
        max_rules: Rules pending at most (``Limits.max_fault_rules``).

    Raises:
        ValueError: ``max_rules`` below 1.
    """

    __slots__ = ("_delays", "_errors", "_rules", "max_rules")

    def __init__(self, max_rules: int = Limits().max_fault_rules) -> None:
        if isinstance(max_rules, bool) or not isinstance(max_rules, int) or max_rules < 1:
            raise ValueError(f"max_rules must be an int >= 1, got {max_rules!r}")
        self.max_rules = max_rules
        self._errors: dict[int, list[_Injected]] = {}
        """API key to its error rules, in the order injected; no empty list."""
        self._rules = 0
        """Error rules pending, over every API."""
        self._delays: dict[tuple[int | None, int | None], float] = {}
        """(API key or None, node or None) to seconds; no zero."""

    def __len__(self) -> int:
        """Rules pending: error rules and delays."""
        return self._rules + len(self._delays)

    def __repr__(self) -> str:
        return f"<Faults errors={self._rules} delays={len(self._delays)} max={self.max_rules}>"

    def _check_room(self) -> None:
        if len(self) >= self.max_rules:
            raise ValueError(
                f"{self.max_rules} fault rules are pending already (max_fault_rules):"
                " clear() them, or let them be taken, first"
            )

    def inject(
        self,
        api: int | str,
        error: ErrorCode | int | str,
        count: int = 1,
        node: int | None = None,
    ) -> None:
        """Answer the next ``count`` requests of ``api`` on ``node`` (None: any node)
        with ``error``, without handling them.

        Args:
            api: The API's key or name ("Produce", "FindCoordinator"), one of
                :data:`INJECTABLE` the broker serves.
            error: An :class:`ErrorCode`, its number or its name, not NONE.
            count: How many requests, >= 1.
            node: The node whose requests are answered so; None for every node.

        Raises:
            ValueError: Any argument out of its range (nothing changed), or
                ``max_rules`` pending already.
        """
        key = api_key_of(api)
        if key not in INJECTABLE:
            raise ValueError(
                f"{api_name(key)} (API {key}) takes no injected error: only "
                + ", ".join(sorted(api_name(k) for k in INJECTABLE))
            )
        code = error_code_of(error)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be an int >= 1, got {count!r}")
        node = _node_of(node)
        rules = self._errors.get(key)
        if rules and rules[-1].node == node and rules[-1].error is code:
            rules[-1].remaining += count  # the same rule again: one rule, more requests
            return
        self._check_room()
        self._errors.setdefault(key, []).append(_Injected(node, code, count))
        self._rules += 1

    def take(self, api_key: int, node: int | None) -> ErrorCode | None:
        """The error to answer this request of ``api_key`` on ``node`` with, if a rule
        has one (its count goes down by one); None to handle it as usual."""
        if not self._errors:
            return None
        rules = self._errors.get(api_key)
        if rules is None:
            return None
        for i, rule in enumerate(rules):
            if rule.node is None or rule.node == node:
                rule.remaining -= 1
                if rule.remaining == 0:
                    del rules[i]
                    self._rules -= 1
                    if not rules:
                        del self._errors[api_key]
                return rule.error
        return None

    def pending(self) -> list[tuple[int, int | None, ErrorCode, int]]:
        """The error rules pending: (API key, node or None, error, requests left), in
        the order they are taken for each API."""
        return [
            (key, rule.node, rule.error, rule.remaining)
            for key, rules in self._errors.items()
            for rule in rules
        ]

    def delay(self, ms: float, *, api: int | str | None = None, node: int | None = None) -> None:
        """Hold the answers of ``api`` (None: every API) on ``node`` (None: every node)
        ``ms`` milliseconds before they are sent; 0 removes that delay.

        The most specific delay applies (:meth:`delay_for`): one for the API on the node,
        then for the API, then for the node, then for everything.

        Raises:
            ValueError: ``ms`` negative or not finite, an API not served, a bad node, or
                ``max_rules`` pending already (nothing changed).
        """
        if isinstance(ms, bool) or not isinstance(ms, int | float) or not 0 <= ms < math.inf:
            raise ValueError(f"a delay is a finite number of ms >= 0, got {ms!r}")
        key = (None if api is None else api_key_of(api), _node_of(node))
        if ms == 0:
            self._delays.pop(key, None)
            return
        if key not in self._delays:
            self._check_room()
        self._delays[key] = ms / 1000

    def delay_for(self, api_key: int, node: int | None) -> float:
        """Seconds to hold the answer to a request of ``api_key`` on ``node`` (0: none)."""
        delays = self._delays
        if not delays:
            return 0.0
        for key in ((api_key, node), (api_key, None), (None, node), (None, None)):
            seconds = delays.get(key)
            if seconds is not None:
                return seconds
        return 0.0

    def clear(self) -> None:
        """Drop every error rule and delay."""
        self._errors.clear()
        self._rules = 0
        self._delays.clear()


# -- the log -------------------------------------------------------------------------------


class FaultEvent(ap.DelayedOperation[None]):
    """A trace row's operation for one logged fault or effect: made, completed and told
    to the observer at once, so a recording of the purgatories shows, on their clock,
    when each fault was injected and what followed. Its kind is the event's name."""

    __slots__ = ("_event",)

    def __init__(self, event: str) -> None:
        super().__init__(None)
        self._event = event

    @property
    def kind(self) -> str:
        return self._event

    def try_complete(self) -> bool:
        return self.force_complete()

    def on_complete(self) -> None:
        return None


class FaultLog:
    """What a test did to the broker and what followed, for whoever reads the run.

    :meth:`record` logs each at WARNING on the logger ``aiopurgatory.kafka`` (a fault
    is seldom what a run is about to do, so it stands out among the INFO lines), keeps
    the last ``keep`` lines in :attr:`lines`, and, given an observer (a
    :class:`~aiopurgatory.trace.TraceRecorder`, a metrics collector), hands it one row
    per line: purgatory :data:`FAULTS_PURGATORY`, kind the event's name, completed when
    made.

    Args:
        observer: Told of each record, as a purgatory tells it of a finished operation.
        clock: The observer's clock (the purgatories' clock: the loop's by default).
        keep: Lines kept, >= 1.

    Raises:
        ValueError: ``keep`` below 1.
    """

    __slots__ = ("clock", "lines", "observer")

    def __init__(
        self,
        observer: ap.OperationObserver | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        keep: int = 1000,
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        self.observer = observer
        self.clock = clock
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        """The latest lines logged, oldest first ("fault: stop_node node=1")."""

    def record(self, event: str, detail: str = "", *, effect: bool = False) -> None:
        """Log ``event`` (with ``detail``): a fault a test injected ("fault: stop_node
        node=1"), or with ``effect`` one that followed ("effect: leader_change t-0 1 -> 2
        epoch 3").

        Raises:
            ValueError: ``event`` not a lower-case name of up to 64 characters
                (``[a-z][a-z0-9_]*``: it becomes a trace kind and a metrics label), or a
                ``detail`` that is not a string.
        """
        if not isinstance(event, str) or not _EVENT.fullmatch(event):
            raise ValueError(f"an event is a lower-case name of up to 64 characters, got {event!r}")
        if not isinstance(detail, str):
            raise ValueError(f"a detail is a string, got {detail!r}")
        line = f"{'effect' if effect else 'fault'}: {event} {detail}".rstrip()
        log.warning("%s", line)
        self.lines.append(line)
        observer = self.observer
        if observer is None:
            return
        now = self.clock()
        op = FaultEvent(event)
        op.created = now
        op.force_complete()
        try:
            observer.operation_finished(FAULTS_PURGATORY, op, ap.Outcome.COMPLETED, now)
        except Exception:
            # The fault stands: a failing recorder must not undo or stop the test's step.
            log.exception("the observer of the fault log raised")
