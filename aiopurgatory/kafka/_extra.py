"""What to say when the ``kafka`` extra (kio) is missing: one sentence, used everywhere.

Ground rules: imports nothing but :mod:`aiopurgatory._extra` (which imports nothing),
so that anything may import it without kio; the sentence is the one every extra says.
"""

from __future__ import annotations

from .._extra import extra_hint
from .._extra import missing_extra as _missing_extra

__all__ = ["KAFKA_EXTRA_HINT", "missing_extra"]

KAFKA_EXTRA_HINT = extra_hint("kafka", "the Kafka-protocol broker", "kio")


def missing_extra(exc: ImportError) -> ImportError:
    """An ImportError naming the extra to install, for ``raise ... from exc``."""
    error = _missing_extra(exc, "kafka", "the Kafka-protocol broker")
    if error is None:  # not kio or crc32c: still the hint the callers asked for
        error = ImportError(KAFKA_EXTRA_HINT)
        error.name = exc.name
    return error
