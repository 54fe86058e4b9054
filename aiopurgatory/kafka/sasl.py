"""SASL authentication: the users, PLAIN (RFC 4616) and SCRAM (RFC 5802, RFC 7677).

Ground rules: no kio and no sockets, only the exchanges (:mod:`.sasl_api` carries their
tokens in SaslHandshake and SaslAuthenticate, and gates the connection). No password
is kept: each user has, per hash, a salt and the salted keys SCRAM defines (StoredKey,
ServerKey), what Kafka's SCRAM credentials in ZooKeeper or KRaft hold, and for PLAIN an
HMAC of the password under a key drawn when the table is made. PLAIN is not checked
against the SCRAM keys: deriving them costs 4,096 PBKDF2 rounds (milliseconds of the
event loop), which a peer could ask for once per connection, as often as it connects.
The messages of a failure are Kafka's own, word for word, so that an application's
error handling sees what it would see against Kafka.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = [
    "MECHANISMS",
    "SCRAM_ITERATIONS",
    "SaslError",
    "SaslSession",
    "SaslState",
    "SaslUsers",
    "ScramCredential",
    "parse_user",
]

PLAIN: Final = "PLAIN"
SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
MECHANISMS: Final = (PLAIN, SCRAM_SHA_256, SCRAM_SHA_512)
"""The mechanisms served, in the order SaslHandshake lists them by default."""
_HASHES: Final = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
SCRAM_ITERATIONS: Final = 4096
"""Kafka's minimum (and RFC 7677's recommendation): clients refuse fewer."""
NONCE_BYTES: Final = 24
SALT_BYTES: Final = 16
MAX_NAME_CHARS: Final = 255
MAX_PASSWORD_CHARS: Final = 1024

# Kafka's messages (SaslServerAuthenticator, PlainSaslServer, ScramSaslServer).
PLAIN_FAILED: Final = "Authentication failed: Invalid username or password"
PLAIN_AUTHZID: Final = (
    "Authentication failed: Client requested an authorization id that is different from username"
)
SCRAM_FAILED: Final = (
    "Authentication failed during authentication due to invalid credentials with SASL "
    "mechanism {mechanism}"
)


class SaslError(Exception):
    """An authentication that failed; the message is what the client is told."""


@dataclasses.dataclass(frozen=True, slots=True)
class ScramCredential:
    """What RFC 5802 has a server store for a user, per hash: never the password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def derive(
        cls, hash_name: str, password: str, salt: bytes, iterations: int = SCRAM_ITERATIONS
    ) -> ScramCredential:
        salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", hash_name)
        return cls(
            salt=salt,
            iterations=iterations,
            stored_key=hashlib.new(hash_name, client_key).digest(),
            server_key=hmac.digest(salted, b"Server Key", hash_name),
        )


def parse_user(text: str) -> tuple[str, str]:
    """``"NAME:PASSWORD"`` (``--sasl-user``) as (name, password); the password may hold
    colons, the name may not.

    Raises:
        ValueError: no colon, or an empty name.
    """
    name, colon, password = text.partition(":")
    if not colon or not name:
        raise ValueError(f"a SASL user is NAME:PASSWORD, got {text!r}")
    return name, password


class SaslUsers:
    """The users a SASL listener accepts, and the mechanisms it enables.

    Args:
        users: Name to password. Each password is salted and derived at once (4096
            PBKDF2 iterations per hash, a few milliseconds a user) and then dropped.
        mechanisms: The mechanisms enabled, of :data:`MECHANISMS` (default all).
        max_users: At most this many users.

    Raises:
        ValueError: no user, too many, an empty or overlong name or password, a name
            with a comma or an equals sign the SCRAM encoding would have to escape
            (allowed) -- or an unknown or repeated mechanism, or none.
        TypeError: a name or password that is not a str.
    """

    __slots__ = ("_credentials", "_plain", "_plain_key", "mechanisms")

    def __init__(
        self,
        users: Mapping[str, str],
        mechanisms: Iterable[str] | None = None,
        *,
        max_users: int,
    ) -> None:
        chosen = tuple(MECHANISMS if mechanisms is None else mechanisms)
        if isinstance(mechanisms, str):
            raise TypeError(f"sasl_mechanisms is a sequence of names, got {mechanisms!r}")
        if not chosen:
            raise ValueError(
                "sasl_mechanisms is empty: enable at least one of " + ", ".join(MECHANISMS)
            )
        for mechanism in chosen:
            if mechanism not in MECHANISMS:
                raise ValueError(
                    f"unknown SASL mechanism {mechanism!r}: one of {', '.join(MECHANISMS)}"
                )
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"a SASL mechanism given twice: {chosen!r}")
        if not users:
            raise ValueError("SASL needs at least one user (sasl_users={'name': 'password'})")
        if len(users) > max_users:
            raise ValueError(f"at most {max_users} SASL users (max_sasl_users), got {len(users)}")
        self.mechanisms = chosen
        hashes = {_HASHES[m] for m in chosen if m in _HASHES}
        self._credentials: dict[tuple[str, str], ScramCredential] = {}
        self._plain_key = secrets.token_bytes(32)
        self._plain: dict[str, bytes] = {}
        for name, password in users.items():
            if not isinstance(name, str) or not isinstance(password, str):
                raise TypeError(f"SASL user names and passwords are str, got {name!r}")
            if not 1 <= len(name) <= MAX_NAME_CHARS or "\0" in name:
                raise ValueError(
                    f"SASL user name must be 1 to {MAX_NAME_CHARS} characters, no NUL: {name!r}"
                )
            if not 1 <= len(password) <= MAX_PASSWORD_CHARS or "\0" in password:
                raise ValueError(
                    f"SASL user {name!r}: the password must be 1 to {MAX_PASSWORD_CHARS} "
                    "characters, no NUL"
                )
            if PLAIN in chosen:
                self._plain[name] = self._plain_digest(password)
            for hash_name in hashes:
                salt = secrets.token_bytes(SALT_BYTES)
                self._credentials[(name, hash_name)] = ScramCredential.derive(
                    hash_name, password, salt
                )

    def __len__(self) -> int:
        return len(self._plain.keys() | {name for name, _ in self._credentials})

    def _plain_digest(self, password: str) -> bytes:
        return hmac.digest(self._plain_key, password.encode(), "sha256")

    def credential(self, name: str, hash_name: str) -> ScramCredential | None:
        return self._credentials.get((name, hash_name))

    def check_password(self, name: str, password: str) -> bool:
        """Whether ``password`` is ``name``'s (PLAIN): one HMAC, compared in constant
        time, and as long for a user that does not exist."""
        given = self._plain_digest(password)
        stored = self._plain.get(name)
        if stored is None:
            hmac.compare_digest(given, given)
            return False
        return hmac.compare_digest(given, stored)


class SaslState(enum.Enum):
    """Where a connection is in Kafka's SASL flow (SaslServerAuthenticator's states)."""

    HANDSHAKE = "handshake"
    """ApiVersions and SaslHandshake may come."""
    AUTHENTICATE = "authenticate"
    """The mechanism is chosen: SaslAuthenticate (or raw tokens, after a v0 handshake)."""
    COMPLETE = "complete"
    FAILED = "failed"


class _Plain:
    """RFC 4616: one message, ``[authzid] NUL authcid NUL passwd``, one empty answer."""

    __slots__ = ("users",)

    def __init__(self, users: SaslUsers) -> None:
        self.users = users

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        try:
            authzid, user, password = token.decode().split("\0")
        except ValueError:  # not UTF-8 (UnicodeDecodeError is one), not three fields
            raise SaslError("Invalid SASL/PLAIN response: expected 3 tokens") from None
        if not user:
            raise SaslError("Authentication failed: username not specified")
        if not password:
            raise SaslError("Authentication failed: password not specified")
        if authzid and authzid != user:
            raise SaslError(PLAIN_AUTHZID)
        if not self.users.check_password(user, password):
            raise SaslError(PLAIN_FAILED)
        return b"", user


def _attributes(text: str) -> list[tuple[str, str]]:
    """``"a=1,b=2"`` as [("a", "1"), ("b", "2")] (RFC 5802's attribute-value pairs)."""
    pairs = []
    for part in text.split(","):
        key, equals, value = part.partition("=")
        if len(key) != 1 or not equals:
            raise SaslError(f"Invalid SCRAM message: attribute {part[:32]!r}")
        pairs.append((key, value))
    return pairs


def _sasl_name(value: str) -> str:
    """RFC 5802's saslname: ``=2C`` is a comma, ``=3D`` an equals sign, nothing else."""
    if "=" in value.replace("=2C", "").replace("=3D", ""):
        raise SaslError("Invalid SCRAM message: a user name with a bare '='")
    return value.replace("=2C", ",").replace("=3D", "=")


class _Scram:
    """RFC 5802 with RFC 7677's hashes, server side, without channel binding (as Kafka).

    client-first (``n,,n=user,r=cnonce``) -> server-first (``r=cnonce+snonce,s=salt,
    i=4096``) -> client-final (``c=biws,r=nonce,p=proof``): the proof checked against
    the StoredKey -> server-final (``v=ServerSignature``), which the client checks.
    """

    __slots__ = (
        "_client_first_bare",
        "_credential",
        "_gs2_header",
        "_nonce",
        "_server_first",
        "_user",
        "hash_name",
        "mechanism",
        "users",
    )

    def __init__(self, users: SaslUsers, mechanism: str) -> None:
        self.users = users
        self.mechanism = mechanism
        self.hash_name = _HASHES[mechanism]
        self._credential: ScramCredential | None = None
        self._user = ""
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""

    def step(self, token: bytes) -> tuple[bytes, str | None]:
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise SaslError("Invalid SCRAM message: not UTF-8") from None
        if self._credential is None:
            return self._first(text), None
        return self._final(text), self._user

    def _first(self, text: str) -> bytes:
        flag, _, rest = text.partition(",")
        authzid, comma, bare = rest.partition(",")
        if flag not in ("n", "y") or not comma:
            # "p=...": channel binding, which Kafka does not offer either.
            raise SaslError(f"Invalid SCRAM client first message (channel binding {flag[:8]!r})")
        pairs = _attributes(bare)
        if len(pairs) < 2 or pairs[0][0] != "n" or pairs[1][0] != "r" or not pairs[1][1]:
            raise SaslError("Invalid SCRAM client first message: n=user,r=nonce expected")
        user = _sasl_name(pairs[0][1])
        if authzid and authzid != f"a={pairs[0][1]}":
            raise SaslError(
                "Authentication failed: Client requested an authorization id "
                "that is different from username"
            )
        credential = self.users.credential(user, self.hash_name)
        if credential is None:
            raise SaslError(SCRAM_FAILED.format(mechanism=self.mechanism))
        self._credential = credential
        self._user = user
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._nonce = pairs[1][1] + secrets.token_urlsafe(NONCE_BYTES)
        salt = base64.b64encode(credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        return self._server_first.encode()

    def _final(self, text: str) -> bytes:
        credential = self._credential
        assert credential is not None
        without_proof, separator, proof_text = text.rpartition(",p=")
        if not separator:
            raise SaslError("Invalid SCRAM client final message: no proof")
        pairs = dict(_attributes(without_proof))
        expected_binding = base64.b64encode(self._gs2_header.encode()).decode()
        if pairs.get("c") != expected_binding:
            raise SaslError("Invalid SCRAM client final message: channel binding mismatch")
        if not hmac.compare_digest(pairs.get("r", "").encode(), self._nonce.encode()):
            raise SaslError("Invalid SCRAM client final message: nonce mismatch")
        try:
            proof = base64.b64decode(proof_text, validate=True)
        except binascii.Error:
            raise SaslError("Invalid SCRAM client final message: proof not base64") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.digest(credential.stored_key, auth_message, self.hash_name)
        if len(proof) != len(signature):
            raise SaslError(SCRAM_FAILED.format(mechanism=self.mechanism))
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        stored_key = hashlib.new(self.hash_name, client_key).digest()
        if not hmac.compare_digest(stored_key, credential.stored_key):
            raise SaslError(SCRAM_FAILED.format(mechanism=self.mechanism))
        server_signature = hmac.digest(credential.server_key, auth_message, self.hash_name)
        return b"v=" + base64.b64encode(server_signature)


class SaslSession:
    """One connection's SASL exchange: which mechanism, how far, who authenticated.

    :meth:`handshake` chooses the mechanism, :meth:`step` takes each client token and
    gives the server's answer; a failure (:class:`SaslError`) leaves the session
    FAILED and the connection is to be closed, as Kafka closes it.
    """

    __slots__ = ("_exchange", "mechanism", "state", "user", "users")

    def __init__(self, users: SaslUsers) -> None:
        self.users = users
        self.state = SaslState.HANDSHAKE
        self.mechanism: str | None = None
        self.user: str | None = None
        """The authenticated user's name, once COMPLETE."""
        self._exchange: _Plain | _Scram | None = None

    def handshake(self, mechanism: str) -> bool:
        """Choose ``mechanism``: False (and FAILED) when it is not enabled."""
        if self.state is not SaslState.HANDSHAKE:
            raise SaslError("Unexpected SaslHandshake: the mechanism is chosen already")
        if mechanism not in self.users.mechanisms:
            self.state = SaslState.FAILED
            return False
        self.mechanism = mechanism
        self._exchange = _Plain(self.users) if mechanism == PLAIN else _Scram(self.users, mechanism)
        self.state = SaslState.AUTHENTICATE
        return True

    def step(self, token: bytes) -> bytes:
        """The answer to the client's ``token``; COMPLETE after the last one.

        Raises:
            SaslError: the credentials or the message are wrong (then FAILED).
        """
        if self.state is not SaslState.AUTHENTICATE or self._exchange is None:
            raise SaslError(f"Unexpected SASL token in state {self.state.value}")
        try:
            answer, user = self._exchange.step(token)
        except SaslError:
            self.state = SaslState.FAILED
            self._exchange = None
            raise
        if user is not None:
            self.user = user
            self.state = SaslState.COMPLETE
            self._exchange = None  # the nonce and keys are not kept past the exchange
        return answer
