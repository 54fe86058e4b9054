"""Run the produce/fetch broker simulation and print what happened.

    python examples/broker/sim.py --duration 10

Follower 0 stalls for ``--stall-for`` seconds at ``--stall-at``, so produce
requests (acks=all) sent meanwhile time out; ``--trace DIR`` records every operation
to Parquet for ``aiopurgatory report DIR --out REPORT`` (the trace extra).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path

from aiopurgatory.kafka.simulator import SimulationConfig, run_simulation


async def simulate(config: SimulationConfig, trace: Path | None) -> None:
    if trace is None:
        print((await run_simulation(config)).format())
        return
    from aiopurgatory.trace import TraceRecorder

    # The recorder must read the purgatories' clock: the running loop's.
    with TraceRecorder(trace, clock=asyncio.get_running_loop().time) as recorder:
        report = await run_simulation(config, observer=recorder)
    print(report.format())
    print(f"trace:             {recorder.rows_written} operations in {trace}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Simulate a Kafka-like broker on aiopurgatory.")
    for field in dataclasses.fields(SimulationConfig):  # every setting is an option
        default = field.default
        option = "--" + field.name.replace("_", "-")
        parser.add_argument(option, type=type(default), default=default, help=f"default {default}")
    parser.add_argument("--trace", type=Path, metavar="DIR", help="write an operation trace here")
    args = parser.parse_args()
    try:
        names = (field.name for field in dataclasses.fields(SimulationConfig))
        config = SimulationConfig(**{name: getattr(args, name) for name in names})
    except ValueError as exc:
        parser.error(str(exc))
    asyncio.run(simulate(config, args.trace))


if __name__ == "__main__":
    main()
