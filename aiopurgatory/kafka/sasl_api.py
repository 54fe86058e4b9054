"""The SASL APIs: SaslHandshake (17) and SaslAuthenticate (36), and the gate that keeps
a SASL listener's connections to them until they authenticate.

Ground rules: Kafka's flow (its SaslServerAuthenticator) as clients see it. Before
authentication a connection is served ApiVersions, SaslHandshake and SaslAuthenticate
only, its frames are bounded by ``sasl_max_receive_bytes``, and anything else closes it
unanswered. A handshake naming a mechanism not enabled is answered
UNSUPPORTED_SASL_MECHANISM (with those enabled), a failed authentication
SASL_AUTHENTICATION_FAILED (with Kafka's message), a SASL request out of order
ILLEGAL_SASL_STATE; then the connection closes. After a v0 handshake the client sends
its tokens bare, each in a size prefix, and is answered so (Kafka's flow before
KIP-152); from v1 they come in SaslAuthenticate. A listener without SASL, or a
connection authenticated already, answers both APIs ILLEGAL_SASL_STATE and serves on.
The exchanges themselves are :mod:`.sasl`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from .connection import ClosingConnection, current_connection
from .protocol import (
    API_VERSIONS,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    Handler,
    make,
    response_schema,
)
from .sasl import SaslError, SaslSession, SaslState, SaslUsers

__all__ = ["SaslApi", "SaslGate"]

log = logging.getLogger("aiopurgatory.kafka")

FAILED_AUTHENTICATION_DELAY: Final = 0.1
"""Seconds between the answer to a failed SASL request and the close: Kafka's
``connection.failed.authentication.delay.ms`` (100), which also slows a password
guesser down."""
BEFORE_AUTHENTICATION: Final = frozenset((API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE))
"""What a connection to a SASL listener is served before it authenticates."""


def _close_after_answer(reason: str) -> None:
    state = current_connection.get()
    state.closing = reason
    state.close_delay = FAILED_AUTHENTICATION_DELAY


class SaslGate:
    """One connection's SASL state, asked by the serve loop about every frame until the
    peer has authenticated (a :class:`~.connection.Gate`)."""

    __slots__ = ("max_bytes", "raw", "session")

    def __init__(self, users: SaslUsers, max_bytes: int) -> None:
        self.session = SaslSession(users)
        self.max_bytes = max_bytes
        self.raw = False
        """A v0 handshake chose the mechanism: the tokens come bare, size-prefixed."""

    @property
    def open(self) -> bool:
        return self.session.state is SaslState.COMPLETE

    def frame_bounds(self) -> tuple[int, int]:
        # A bare token has no request header: PLAIN's can be shorter than one.
        return (0 if self.raw else 8), self.max_bytes

    async def admit(
        self, frame: bytes, dispatch: Callable[[bytes], Awaitable[bytes | None]]
    ) -> bytes | None:
        if self.raw:
            try:
                answer = self.session.step(frame)
            except SaslError as exc:
                # Nowhere to put an error in the bare flow: Kafka closes, and so do we.
                raise ClosingConnection(f"SASL authentication failed: {exc}") from None
            if self.open:
                log.info("SASL %s: %r authenticated", self.session.mechanism, self.session.user)
            return len(answer).to_bytes(4, "big") + answer
        api_key = int.from_bytes(frame[:2], "big", signed=True)
        if api_key not in BEFORE_AUTHENTICATION:
            raise ClosingConnection(f"API key {api_key} before SASL authentication")
        return await dispatch(frame)


class SaslApi:
    """The handlers of SaslHandshake and SaslAuthenticate, and the gates of a SASL
    listener's connections (none without ``users``)."""

    __slots__ = ("max_bytes", "users")

    def __init__(self, users: SaslUsers | None, max_bytes: int) -> None:
        self.users = users
        self.max_bytes = max_bytes

    def handlers(self) -> dict[int, Handler]:
        return {SASL_HANDSHAKE: self.sasl_handshake, SASL_AUTHENTICATE: self.sasl_authenticate}

    def gate(self) -> SaslGate | None:
        """A new connection's gate (None: not a SASL listener)."""
        return None if self.users is None else SaslGate(self.users, self.max_bytes)

    @staticmethod
    def _gate() -> SaslGate | None:
        gate = current_connection.get().gate
        return gate if isinstance(gate, SaslGate) else None

    @staticmethod
    def _close_unless_open(gate: SaslGate | None, reason: str) -> None:
        # A connection still authenticating is closed after the answer; one that has
        # authenticated (or a listener without SASL) is only told, as Kafka's KafkaApis
        # tells it, and serves on.
        if gate is not None and not gate.open:
            _close_after_answer(reason)

    async def sasl_handshake(self, request: Any, version: int) -> Any:
        enabled = () if self.users is None else self.users.mechanisms
        gate = self._gate()
        if gate is None or gate.session.state is not SaslState.HANDSHAKE:
            self._close_unless_open(gate, "SaslHandshake out of order")
            error = ErrorCode.illegal_sasl_state
        elif not gate.session.handshake(request.mechanism):
            _close_after_answer(f"unsupported SASL mechanism {request.mechanism!r}")
            error = ErrorCode.unsupported_sasl_mechanism
        else:
            gate.raw = version == 0
            error = ErrorCode.none
        return make(response_schema(SASL_HANDSHAKE, version), error_code=error, mechanisms=enabled)

    async def sasl_authenticate(self, request: Any, version: int) -> Any:
        schema = response_schema(SASL_AUTHENTICATE, version)
        gate = self._gate()
        if gate is None or gate.session.state is not SaslState.AUTHENTICATE or gate.raw:
            self._close_unless_open(gate, "SaslAuthenticate out of order")
            message = "Unexpected SaslAuthenticate: " + (
                "this listener has no SASL"
                if gate is None
                else "authenticated already"
                if gate.open
                else "no SaslHandshake (v1 or later) chose a mechanism"
            )
            return make(
                schema,
                error_code=ErrorCode.illegal_sasl_state,
                error_message=message,
                auth_bytes=b"",
            )
        try:
            answer = gate.session.step(request.auth_bytes)
        except SaslError as exc:
            log.info("SASL %s failed: %s", gate.session.mechanism, exc)
            _close_after_answer(f"SASL authentication failed: {exc}")
            return make(
                schema,
                error_code=ErrorCode.sasl_authentication_failed,
                error_message=str(exc),
                auth_bytes=b"",
            )
        if gate.open:
            log.info("SASL %s: %r authenticated", gate.session.mechanism, gate.session.user)
        return make(schema, error_code=ErrorCode.none, error_message=None, auth_bytes=answer)
