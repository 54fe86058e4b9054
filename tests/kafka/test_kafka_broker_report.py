"""``aiopurgatory report`` on a trace of the Kafka-protocol broker (aiopurgatory.kafka)
recorded under a short real workload: aiokafka producing with acks=all and consuming in a
group, so that each of the broker's four purgatories holds operations."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..support.kafka_broker import start_traced_broker
from ..support.servers import stop_server
from ..support.spark_fixtures import PANDAS_WARNINGS, spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["spark"]

PURGATORIES = {"produce", "fetch", "join", "heartbeat"}

pytestmark = PANDAS_WARNINGS


async def workload(address: str) -> int:
    """acks=all produces (DelayedProduce), a group consumer (DelayedJoin, a session per
    member: DelayedHeartbeat) reading them in long polls (DelayedFetch)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic, group = f"t-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=address, acks="all")
    await producer.start()
    try:
        sends = [await producer.send(topic, str(i).encode()) for i in range(200)]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=address,
        group_id=group,
        auto_offset_reset="earliest",
        heartbeat_interval_ms=200,
    )
    await consumer.start()
    seen = 0
    try:
        async with asyncio.timeout(20):
            while seen < 200:
                batches = await consumer.getmany(timeout_ms=200)
                seen += sum(len(records) for records in batches.values())
            # A few heartbeats and parked fetches on the now empty partitions.
            started = time.monotonic()
            while time.monotonic() - started < 1.0:
                await consumer.getmany(timeout_ms=200)
            await consumer.commit()
    finally:
        await consumer.stop()
    return seen


@pytest.mark.spark
@pytest.mark.slow
def test_report_shows_the_four_purgatories(
    spark: SparkSession, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("aiokafka")
    pd = pytest.importorskip("pandas")
    from aiopurgatory.cli import main

    trace, out = tmp_path / "trace", tmp_path / "report"
    process, address = start_traced_broker(trace)
    try:
        assert asyncio.run(workload(address)) == 200
    finally:
        assert stop_server(process) == 0  # SIGTERM: the trace is flushed and closed
    assert main(["report", str(trace), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"report: {out / 'report.md'}\n"

    summary = pd.read_csv(out / "summary.csv")
    assert set(summary["purgatory"]) == PURGATORIES
    per_purgatory = summary.groupby("purgatory")["operations"].sum()
    assert (per_purgatory > 0).all(), per_purgatory
    assert summary["early_expiries"].sum() == 0
    report = (out / "report.md").read_text()
    for name in PURGATORIES:
        assert name in report
    print("operations per purgatory:", per_purgatory.to_dict())
