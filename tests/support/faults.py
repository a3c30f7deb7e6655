"""The fault tests' harness: how many times they repeat their faults (once in `make test`, more
in `make test-faults`: CTR_FAULT_ROUNDS), generated traffic in the background, a `ctr` job
SIGKILLed over and over, and the catch-up run after it."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ingest.producer import EventProducer
from ingest.send_loop import produce
from ingest.settings import ProducerSettings
from ingest.traffic import TrafficConfig, TrafficGenerator
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings

ROUNDS = int(os.environ.get("CTR_FAULT_ROUNDS", "1"))
if ROUNDS < 1:
    raise ValueError(f"CTR_FAULT_ROUNDS must be at least 1, got {ROUNDS}")

CTR = str(Path(sys.executable).with_name("ctr"))


def timeout(seconds_per_round: int) -> int:
    """A test's pytest timeout when each round of its faults may take ``seconds_per_round``."""
    return seconds_per_round * ROUNDS


def job_env(kafka_env: dict[str, str], lake: LakeSettings, **settings: str) -> dict[str, str]:
    """The environment of a `ctr` job on the test's topics (``kafka_env``) and ``lake``, with two
    shuffle partitions and the job's ``settings`` (ARCHIVER_TRIGGER_SECONDS="0.5", ...)."""
    return {
        **kafka_env,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "SPARK_SHUFFLE_PARTITIONS": "2",
        **settings,
    }


@contextlib.contextmanager
def traffic(topics: KafkaSettings, *, seed: int, malformed_fraction: float) -> Iterator[None]:
    """Generated events, ``malformed_fraction`` of them malformed, sent to the event topic at
    ~500 records/s from a thread while the block runs."""
    stop = threading.Event()

    def send() -> None:
        config = TrafficConfig(
            seed=seed, start_ms=int(time.time() * 1000), malformed_fraction=malformed_fraction
        )
        generator = TrafficGenerator(config)
        with EventProducer(topics, ProducerSettings(), validate_records=False) as producer:
            while not stop.is_set():
                produce(generator, producer, limit=100)
                producer.poll(0.2)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        yield
    finally:
        stop.set()
        sender.join(timeout=60)


def sigkill_repeatedly(
    command: str, env: dict[str, str], *, kills: int, seed: int, alive_s: tuple[float, float]
) -> None:
    """Start `ctr <command>`, SIGKILL it after a random time within ``alive_s`` seconds, and
    again, ``kills`` times. Fails if the job ends on its own.

    The job runs in its own process group: SIGKILL takes the Python driver and Spark's JVM down
    together, as a crash of the machine or container would."""
    rng = random.Random(seed)
    for _ in range(kills):
        with tempfile.TemporaryFile() as stderr:
            process = subprocess.Popen(
                [CTR, command],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
            try:
                # The job's time alive, as a wait on it: ending within it, it died on its own.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=rng.uniform(*alive_s))
                if process.poll() is not None:
                    stderr.seek(0)
                    tail = stderr.read().decode(errors="replace")[-4000:]
                    raise AssertionError(f"`ctr {command}` died on its own:\n{tail}")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def catch_up(command: str, env: dict[str, str]) -> None:
    """Run `ctr <command> --available-now` until it has processed the whole topic; fails with
    the end of its stderr if it exits with an error."""
    done = subprocess.run(
        [CTR, command, "--available-now"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
