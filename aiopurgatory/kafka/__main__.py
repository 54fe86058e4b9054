"""``python -m aiopurgatory.kafka --host H --port P``: see :mod:`aiopurgatory.kafka.cli`."""

from aiopurgatory.kafka.cli import main

if __name__ == "__main__":
    main()
