"""TLS for the broker's listener: a server context from PEM files, and throwaway
certificates for tests.

Ground rules: no kio, and the standard library's :mod:`ssl` only; a test CA comes from
trustme (the ``kafka`` extra), never from certificates written by hand.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from pathlib import Path

__all__ = ["TlsFiles", "server_context", "throwaway_certificates"]

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
