"""A class-data-sharing archive for the local Spark driver JVM, kept between runs.

A local report spends about as long loading and verifying Spark's classes as it does
reading a 1M-row trace: the JVM starts, then the first query loads thousands of
Catalyst, Parquet and code-generation classes. The JVM's application class-data
sharing (CDS, JDK 13+) keeps those classes, parsed and verified, in a memory-mapped
archive: the first run that finds no archive writes one when its JVM exits
(``-XX:ArchiveClassesAtExit``), and later runs map it (``-XX:SharedArchiveFile``).

Ground rules:

* The archive is an optimisation only. A JVM that cannot use it (another Java, other
  jars, a damaged file) runs as if it were absent (``-Xshare:auto``, the default), and
  the JVM's warnings about it go to stderr, which the command line sends to
  ``spark.log``.
* One archive per Java binary, PySpark installation and JVM options: the name is a
  digest of them, so an upgrade starts a new archive instead of loading a stale one.
* A run writes its archive under a private name and renames it into place once its JVM
  has exited, so a reader never maps a half-written file and concurrent first runs do
  not clash (the last rename wins; both files are equivalent).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Final

__all__ = ["CLASS_CACHE_ENV", "ClassArchive", "default_class_cache"]

CLASS_CACHE_ENV: Final = "AIOPURGATORY_SPARK_CLASS_CACHE"
"""Directory for the archive; ``off`` disables it. Default: ``$XDG_CACHE_HOME/aiopurgatory``
(``~/.cache/aiopurgatory``)."""

_LOG_OPTIONS: Final = "-Xlog:disable -Xlog:all=warning:stderr -Xlog:cds*=error:stderr"
"""The JVM prints unified-logging warnings (an archive it cannot use, classes it will
not archive) on stdout by default; stdout is the report's output, stderr is the log."""


def default_class_cache() -> Path | None:
    """The archive directory the command line uses (see :data:`CLASS_CACHE_ENV`)."""
    configured = os.environ.get(CLASS_CACHE_ENV, "").strip()
    if configured.lower() == "off":
        return None
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "aiopurgatory")


class ClassArchive:
    """One JVM start's use of the archive in ``directory``: map it, or write it at exit.

    Invariant: :attr:`path` is only ever created by renaming a complete archive onto it.
    """

    __slots__ = ("_dump", "path")

    def __init__(self, directory: Path, java: str, java_options: str) -> None:
        import pyspark

        java_binary = Path(java).resolve()
        stat = java_binary.stat()
        identity = "\0".join(
            [
                str(java_binary),
                str(stat.st_size),
                str(stat.st_mtime_ns),
                str(Path(pyspark.__file__).resolve().parent),
                pyspark.__version__,
                java_options,
            ]
        )
        digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
        self.path: Final = directory / f"spark-classes-{digest}.jsa"
        self._dump: Path | None = None

    @property
    def dumping(self) -> bool:
        """True when this run writes the archive (its JVM must exit before :meth:`finish`)."""
        return self._dump is not None

    def java_options(self) -> str:
        """The JVM flags for this run; empty when the archive cannot be used here."""
        if any(c.isspace() or c in "\"'\\" for c in str(self.path)):
            return ""  # Spark splits extraJavaOptions on spaces and quotes
        if self.path.is_file():
            return f"-XX:SharedArchiveFile={self.path} {_LOG_OPTIONS}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return ""  # a read-only home: run without the archive
        self._dump = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        return f"-XX:ArchiveClassesAtExit={self._dump} {_LOG_OPTIONS}"

    def finish(self) -> None:
        """After the JVM exited: move the archive it wrote into place (if it wrote one)."""
        if self._dump is None:
            return
        dump, self._dump = self._dump, None
        try:
            if dump.stat().st_size > 0:
                dump.replace(self.path)
        except OSError:
            pass  # nothing was written (a JVM without CDS): the next run tries again
        finally:
            dump.unlink(missing_ok=True)
