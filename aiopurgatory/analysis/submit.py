"""The job as a file for ``spark-submit``: the command line's ``report`` under its session.

::

    spark-submit --master spark://HOST:7077 \\
        "$(python -c 'import aiopurgatory.analysis.submit as m; print(m.__file__)')" \\
        report TRACE_DIR --out DIR

The driver needs aiopurgatory importable (installed, or on ``PYTHONPATH``); the
executors need nothing of it. The session takes its master and settings from
spark-submit. It runs :func:`aiopurgatory.analysis.command.main`, the ``report``
command that ``aiopurgatory report`` runs too (same arguments, same one-line errors),
not the whole command line: the command line is above this package, and this file
imports nothing of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

# spark-submit puts this file's directory first on sys.path: its modules must not
# shadow top-level ones (a module of this directory is imported as aiopurgatory.analysis.*).
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != _HERE]

from aiopurgatory.analysis.command import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
