"""``python -m aiopurgatory``: the command line (see :mod:`aiopurgatory.cli`)."""

import sys

from aiopurgatory.cli import main

sys.exit(main())
