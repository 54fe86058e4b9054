"""The Kafka fixtures from a wheel installed in a fresh virtual environment, used by a test
file outside any checkout: what a user gets from ``pip install '.[kafka]'``.

As in tests/packaging/test_demo_installed.py: the wheel is built from a copy of the checkout and
installed alone into a new venv; its dependencies (kio, the clients, pytest) come from
this test run's environment through a path entry after the venv's own site-packages,
which does not reach the editable install of the checkout there.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from ..support.wheels import env_with, install_wheel_in_fresh_venv

pytestmark = pytest.mark.slow

USER_TESTS = """
    import confluent_kafka
    import pytest

    import aiopurgatory


    def test_the_package_is_the_installed_one(site):
        assert aiopurgatory.__file__.startswith(site)


    def test_round_trip(kafka_bootstrap, kafka_broker):
        producer = confluent_kafka.Producer({"bootstrap.servers": kafka_bootstrap})
        producer.produce("installed", b"from a wheel")
        assert producer.flush(10) == 0
        assert kafka_broker.offsets("installed")[0].high_watermark == 1


    @pytest.mark.kafka_broker(partitions=2)
    def test_marker(kafka_broker):
        kafka_broker.create_topic("two", 2)
        assert kafka_broker.topics == {"two": 2}


    @pytest.mark.kafka_broker(nodes=3, replicas=3)
    def test_a_cluster_with_faults_on_demand(kafka_broker):
        assert len(kafka_broker.bootstrap.split(",")) == 3
        kafka_broker.create_topic("moving", 1)
        leader = kafka_broker.leader("moving")
        kafka_broker.stop_node(leader)
        assert kafka_broker.leader("moving") not in (leader, -1)
        assert kafka_broker.leader_epoch("moving") == 1
        kafka_broker.start_node(leader)
        kafka_broker.inject("Produce", "NOT_LEADER_OR_FOLLOWER", count=1)
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True}
        )
        producer.produce("moving", b"after a retry")
        assert producer.flush(10) == 0
        assert kafka_broker.offsets("moving")[0].high_watermark == 1
        assert any("injected Produce" in line for line in kafka_broker.fault_lines)
"""


def test_the_fixtures_from_a_wheel_outside_the_checkout(tmp_path: Path) -> None:
    python, site = install_wheel_in_fresh_venv(tmp_path)
    # Two plugins, two entry points: the Kafka fixtures are not the purgatory plugin's.
    (dist_info,) = site.glob("aiopurgatory-*.dist-info")
    entry_points = (dist_info / "entry_points.txt").read_text()
    assert "aiopurgatory = aiopurgatory.pytest_plugin\n" in entry_points
    assert "aiopurgatory_kafka = aiopurgatory.kafka.pytest_plugin\n" in entry_points

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "conftest.py").write_text(
        f"import pytest\n\n\n@pytest.fixture\ndef site():\n    return {str(site)!r}\n"
    )
    (elsewhere / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    env = env_with(PYTHONPATH=None, AIOPURGATORY_NO_EXTENSIONS=None)
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "4 passed" in done.stdout
