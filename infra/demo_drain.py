"""`make demo-down`: wait until the streaming jobs have read every record the traffic generator
wrote, before they are stopped.

A job stopped by SIGTERM finishes its current micro-batch and exits; records written since that
batch was planned would stay unread (the archiver triggers every 10 s). So once the producer has
stopped, this compares each job's last committed offsets (its Structured Streaming checkpoint:
``commits/N`` done, ``offsets/N`` what it read) with the topic's verified end offsets.
"""

from __future__ import annotations

import argparse
import sys
import time

from lake.checkpoints import Checkpoint
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from runtime.offsets import topic_offsets


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
        ends = {o.partition: o.latest for o in topic_offsets(kafka, kafka.topic)}
    except Exception as exc:  # an unreachable broker: nothing to drain from
        print(f"demo: cannot read the end offsets of {kafka.topic} ({exc}); not waiting")
        return
    deadline = time.monotonic() + args.timeout
    pending = list(args.jobs)
    while pending:
        for job in list(pending):
            checkpoint = Checkpoint(lake.checkpoint(job), lake.object_store)
            left = behind(ends, checkpoint.committed_offsets(kafka.topic))
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
