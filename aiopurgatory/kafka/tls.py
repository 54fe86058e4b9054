"""TLS for the broker's listener: a server context from PEM files, and throwaway
certificates for tests.

Ground rules: no kio, and the standard library's :mod:`ssl` only; a test CA comes from
trustme (the ``kafka`` extra), never from certificates written by hand.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import ssl
from pathlib import Path
from typing import Any, Final, cast

__all__ = [
    "TLS_SHUTDOWN_TIMEOUT",
    "PausedUntilTls",
    "TlsFiles",
    "server_context",
    "start_tls",
    "throwaway_certificates",
]

TLS_SHUTDOWN_TIMEOUT: Final = 2.0
"""Seconds a closing TLS connection waits for the peer's close_notify."""

HANDSHAKE_GRACE: Final = 1.0
"""Seconds past its ``handshake_timeout`` a TLS handshake may take before
:func:`start_tls` gives up on the loop's own timeout."""

StrPath = str | os.PathLike[str]


def server_context(cert: StrPath, key: StrPath) -> ssl.SSLContext:
    """A server-side context with the certificate (chain) in ``cert`` and its private key
    in ``key``, both PEM: what ``--tls CERT KEY`` listens with.

    Raises:
        ValueError: a file is missing or unreadable, or the key does not match.
    """
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(
            f"cannot load the TLS certificate {cert!s} and key {key!s}: {exc}"
        ) from exc
    return context


class PausedUntilTls(asyncio.StreamReaderProtocol):
    """A TLS listener's connection, accepted in plain TCP for :func:`start_tls`.

    The peer's first bytes are its ClientHello, for the TLS layer, not for the stream:
    what arrives before the handshake starts is kept aside (and reading paused, so it
    is one read at most) for :func:`start_tls` to hand over. (Pausing at
    ``connection_made`` is not enough: uvloop starts reading after it.)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.early: bytearray | None = bytearray()
        """What was read before the handshake (None once it started: the stream's)."""
        self._raw: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = transport
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.early is None:  # decrypted, from the TLS layer
            super().data_received(data)
            return
        self.early += data
        if self._raw is not None:
            cast(asyncio.ReadTransport, self._raw).pause_reading()


def _hand_over(transport: asyncio.BaseTransport, early: bytearray) -> None:
    """Give the TLS layer now reading ``transport`` the bytes read before it was."""
    layer = cast(asyncio.BufferedProtocol, transport.get_protocol())
    view = memoryview(early)
    while view:
        buffer = memoryview(layer.get_buffer(len(view)))
        count = min(len(buffer), len(view))
        buffer[:count] = view[:count]
        layer.buffer_updated(count)
        view = view[count:]


async def start_tls(
    writer: asyncio.StreamWriter,
    context: ssl.SSLContext,
    *,
    handshake_timeout: float,
    shutdown_timeout: float,
) -> None:
    """The server side of a TLS handshake on a connection accepted in plain TCP (by
    :class:`PausedUntilTls`); its reader and ``writer`` then carry the decrypted stream.

    The listener accepts plain TCP and the handshake is done here, after the connection
    is counted against max_connections: Kafka counts a connection from its accept, so
    peers that connect and never finish a handshake cannot pile up beyond the limit.
    (``StreamWriter.start_tls`` takes no ``ssl_shutdown_timeout``, and loses what was
    read before it.)

    A peer that resets its connection before the handshake starts is let go at once:
    uvloop's ``start_tls`` on a transport already closed neither completes nor times
    out, so each such peer would hold a connection (and its place under
    max_connections) for ever. The handshake is bounded here as well, a little after
    the loop's own timeout, should a loop's ``start_tls`` miss the close another way
    (the reset arriving between this check and its first step).

    Raises:
        OSError: the handshake failed (ssl.SSLError), the peer went, or it took longer
            than ``handshake_timeout`` seconds (ConnectionAbortedError).
    """
    loop = asyncio.get_running_loop()
    raw = writer.transport
    if raw.is_closing():
        raise ConnectionResetError("closed before the TLS handshake")
    protocol = raw.get_protocol()
    handshake = asyncio.ensure_future(
        loop.start_tls(
            raw,
            protocol,
            context,
            server_side=True,
            ssl_handshake_timeout=handshake_timeout,
            ssl_shutdown_timeout=shutdown_timeout,
        )
    )
    if isinstance(protocol, PausedUntilTls):
        # loop.start_tls, on its first step, pauses reading, puts the TLS layer in, and
        # schedules its connection_made and the resumed reading: the bytes read before
        # go to the layer right after those, before anything else is read. (They are
        # the client's first flight, its ClientHello: it sends no more until answered.)
        def hand_over() -> None:
            early, protocol.early = protocol.early, None
            if early and raw.get_protocol() is not protocol:
                _hand_over(raw, early)

        loop.call_soon(loop.call_soon, hand_over)
    try:
        async with asyncio.timeout(handshake_timeout + HANDSHAKE_GRACE):
            transport = await handshake
    except TimeoutError:
        raw.abort()
        raise ConnectionAbortedError(
            f"TLS handshake not done in {handshake_timeout} seconds"
        ) from None
    if transport is None:  # the peer went during the handshake
        raise ConnectionResetError("closed during the TLS handshake")
    # What StreamWriter.start_tls does once the handshake is done: 3.11 and 3.12 hand
    # the protocol the writer (_replace_writer), 3.13 the new transport
    # (_replace_transport).
    writer._transport = transport  # type: ignore[attr-defined]
    replace_transport = getattr(protocol, "_replace_transport", None)
    if replace_transport is not None:
        replace_transport(transport)
    else:
        protocol._replace_writer(writer)  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True, slots=True)
class TlsFiles:
    """A throwaway CA and a certificate it signed, as PEM files."""

    ca_file: Path
    """The CA's certificate: what clients trust (``ssl_cafile``, ``ssl.ca.location``)."""
    cert_file: Path
    """The server's certificate chain."""
    key_file: Path
    """The server's private key."""

    def server_context(self) -> ssl.SSLContext:
        """A context for the broker (``ssl_context=``)."""
        return server_context(self.cert_file, self.key_file)

    def client_context(self) -> ssl.SSLContext:
        """A client context trusting the CA (aiokafka's ``ssl_context``)."""
        return ssl.create_default_context(cafile=str(self.ca_file))


def throwaway_certificates(
    directory: StrPath, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> TlsFiles:
    """A new CA and a certificate for ``hosts``, written into ``directory`` (``ca.pem``,
    ``server.pem``, ``server.key``).

    Raises:
        ImportError: trustme is not installed (it comes with the ``kafka`` extra).
        ValueError: no host.
    """
    if not hosts:
        raise ValueError("a certificate needs at least one host name or address")
    try:
        import trustme
    except ImportError as exc:
        raise ImportError(
            "throwaway certificates need trustme: pip install 'aiopurgatory[kafka]'"
        ) from exc
    folder = Path(directory)
    ca = trustme.CA()
    issued = ca.issue_cert(*hosts)
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    ca.cert_pem.write_to_path(str(files.ca_file))
    files.cert_file.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(files.key_file))
    return files
