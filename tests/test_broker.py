"""The embedded broker's life cycle and `ctr kafka` against real Tansu processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.broker import BrokerError, BrokerSettings, EmbeddedBroker, free_port
from infra.kafka_settings import KafkaSettings
from infra.topics import KafkaUnavailableError, wait_for_cluster

CTR = str(Path(sys.executable).with_name("ctr"))


def test_start_is_idempotent_and_stop_ends_the_process(tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    broker = EmbeddedBroker(kafka, BrokerSettings(run_dir=tmp_path))
    first = broker.start()
    try:
        assert first.started_by_us
        assert first.pid is not None
        assert broker.settings.pid_file.read_text().strip() == str(first.pid)
        again = broker.start()
        assert again.pid == first.pid  # no second broker
        assert wait_for_cluster(kafka, timeout_s=5).brokers
    finally:
        assert broker.stop() is True
    assert not broker.settings.pid_file.exists()
    assert (
        not Path(f"/proc/{first.pid}").exists()
        or b"tansu" not in Path(f"/proc/{first.pid}/cmdline").read_bytes()
    )
    with pytest.raises(KafkaUnavailableError, match="no Kafka broker answered"):
        wait_for_cluster(kafka, timeout_s=1)
    assert broker.stop() is False  # nothing left to stop


def test_a_stale_pid_file_is_not_trusted(tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    settings = BrokerSettings(run_dir=tmp_path)
    settings.pid_file.parent.mkdir(parents=True)
    settings.pid_file.write_text(f"{os.getpid()}\n")  # alive, but not a broker
    broker = EmbeddedBroker(kafka, settings)
    assert broker.state().running is False
    assert broker.stop() is False  # and it must not kill the test process


def test_the_embedded_broker_refuses_a_remote_address() -> None:
    with pytest.raises(BrokerError, match="not a single loopback address"):
        EmbeddedBroker(KafkaSettings(bootstrap_servers="kafka-1:9092"), BrokerSettings())


def test_a_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    settings = BrokerSettings(run_dir=tmp_path, tansu_bin=tmp_path / "nope")
    with pytest.raises(BrokerError, match="binary is missing"):
        EmbeddedBroker(kafka, settings).start()


def test_kafka_up_status_down_commands(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    env.update(KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}", RUN_DIR=str(tmp_path))

    def ctr(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CTR, "kafka", *args], env=env, capture_output=True, text=True, timeout=90, check=False
        )

    up = ctr("up")
    try:
        assert up.returncode == 0, up.stderr
        assert "Tansu running" in up.stderr
        assert "topic ad-events: created (6 partitions)" in up.stderr
        assert "topic ad-events-dlq: created (1 partitions)" in up.stderr
        again = ctr("up")
        assert "topic ad-events: exists (6 partitions)" in again.stderr
        status = ctr("status")
        assert status.returncode == 0, status.stderr
        assert "ad-events" in status.stdout
        assert "earliest" in status.stdout
        assert status.stdout.count("ad-events ") + status.stdout.count("ad-events-dlq") >= 7
    finally:
        down = ctr("down")
    assert down.returncode == 0
    assert "stopped" in down.stderr
    assert ctr("down").stderr.strip() == "broker: was not running"
    failed = ctr("status")
    assert failed.returncode == 1
    assert "no Kafka broker answered" in failed.stderr


def test_kafka_down_with_a_remote_cluster_stops_nothing(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": "kafka-1.example:9092",
        "RUN_DIR": str(tmp_path),
    }
    env["KAFKA_START_TIMEOUT_S"] = "1"
    done = subprocess.run(
        [CTR, "kafka", "down"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert "is not local; nothing to stop" in done.stderr
    assert not (tmp_path / "kafka").exists()
