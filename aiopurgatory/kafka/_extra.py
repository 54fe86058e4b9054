"""What to say when the ``kafka`` extra (kio) is missing: one sentence, used everywhere.

Ground rules: imports nothing, so that anything may import it without kio.
"""

from __future__ import annotations

__all__ = ["KAFKA_EXTRA_HINT", "missing_extra"]

KAFKA_EXTRA_HINT = (
    "the Kafka-protocol broker needs the 'kafka' extra (kio): pip install 'aiopurgatory[kafka]'"
)


def missing_extra(exc: ImportError) -> ImportError:
    """An ImportError naming the extra to install, for ``raise ... from exc``."""
    error = ImportError(KAFKA_EXTRA_HINT)
    error.name = exc.name
    return error
