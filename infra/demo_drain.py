"""`make demo-down`: wait until the streaming jobs have read every record the traffic generator
wrote, before they are stopped.

A job stopped by SIGTERM finishes its current micro-batch and exits; records written since that
batch was planned would stay unread (the archiver triggers every 10 s). So once the producer has
stopped, this compares each job's last committed offsets (its Structured Streaming checkpoint:
``commits/N`` done, ``offsets/N`` what it read) with the topic's verified end offsets.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from infra.kafka_settings import KafkaSettings
from infra.lake import LakeSettings
from infra.offsets import offsets_consumer, partition_offsets


def committed_offsets(checkpoint: Path, topic: str) -> dict[int, int]:
    """Next offset per partition of ``topic`` after the checkpoint's last committed batch."""
    commits = [int(p.name) for p in (checkpoint / "commits").glob("*") if p.name.isdigit()]
    if not commits:
        return {}
    # offsets/N: a version line, the batch metadata, then one JSON line per source.
    lines = (checkpoint / "offsets" / str(max(commits))).read_text().splitlines()[2:]
    for line in lines:
        offsets = json.loads(line) if line.strip().startswith("{") else {}
        if topic in offsets:
            return {int(partition): int(next_) for partition, next_ in offsets[topic].items()}
    return {}


def end_offsets(kafka: KafkaSettings) -> dict[int, int]:
    """Verified end (next offset to be written) of every partition of the event topic."""
    consumer = offsets_consumer(kafka)
    try:
        metadata = consumer.list_topics(kafka.topic, timeout=10)
        partitions = [(kafka.topic, p) for p in metadata.topics[kafka.topic].partitions]
        return {
            o.partition: o.latest for o in partition_offsets(kafka, partitions, consumer=consumer)
        }
    finally:
        consumer.close()


def behind(ends: dict[int, int], committed: dict[int, int]) -> int:
    """Records the job has yet to read."""
    return sum(max(0, end - committed.get(partition, 0)) for partition, end in ends.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="+", help="checkpoint names under CHECKPOINT_ROOT")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait at most")
    args = parser.parse_args()
    kafka, lake = KafkaSettings(), LakeSettings()
    try:
        ends = end_offsets(kafka)
    except Exception as exc:  # an unreachable broker: nothing to drain from
        print(f"demo: cannot read the end offsets of {kafka.topic} ({exc}); not waiting")
        return
    deadline = time.monotonic() + args.timeout
    pending = list(args.jobs)
    while pending:
        for job in list(pending):
            left = behind(ends, committed_offsets(Path(lake.checkpoint(job)), kafka.topic))
            if left == 0:
                print(f"demo: {job}: has read {kafka.topic} to its end")
                pending.remove(job)
            elif time.monotonic() > deadline:
                print(f"demo: {job}: still {left:,} records behind after {args.timeout:g} s")
                pending.remove(job)
        if pending:
            time.sleep(1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
