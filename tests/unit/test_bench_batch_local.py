"""The batch benchmark's candidate dedup (bench/batch_local.py) keeps the job's first copy."""

from __future__ import annotations

import random

import pyarrow as pa

from bench.batch_local import first_per_id


def _events(rows: list[tuple[str, int, int, int]]) -> pa.Table:
    ids, ingest, partition, offset = zip(*rows, strict=True)
    return pa.table(
        {
            "event_id": pa.array(ids),
            "ingest_time": pa.array(ingest, pa.timestamp("us", tz="UTC")),
            "kafka_partition": pa.array(partition, pa.int32()),
            "kafka_offset": pa.array(offset, pa.int64()),
            "row": pa.array(range(len(rows))),
        }
    )


def test_the_first_archived_copy_is_kept_and_unique_events_untouched() -> None:
    events = _events(
        [
            ("evt-a", 5, 0, 10),  # a later copy of evt-a
            ("evt-b", 1, 0, 11),
            ("evt-a", 3, 1, 99),  # evt-a's first: lowest ingest time
            ("evt-c", 7, 2, 5),  # evt-c: same ingest time, lower partition wins
            ("evt-c", 7, 1, 6),
            ("evt-d", 2, 0, 8),  # evt-d: same time and partition, lower offset wins
            ("evt-d", 2, 0, 7),
        ]
    )
    kept = first_per_id(events).column("row").to_pylist()
    assert sorted(kept) == [1, 2, 4, 6]


def test_it_equals_a_sort_of_every_row_on_random_copies() -> None:
    rng = random.Random(7)
    rows = [
        (f"evt-{rng.randrange(300):03x}", rng.randrange(5), rng.randrange(3), n)
        for n in range(2_000)
    ]
    events = _events(rows)
    first: dict[str, tuple[int, int, int, int]] = {}
    for n, (event, ingest, partition, offset) in enumerate(rows):
        key = (ingest, partition, offset, n)
        if event not in first or key < first[event]:
            first[event] = key
    expected = sorted(key[3] for key in first.values())
    assert sorted(first_per_id(events).column("row").to_pylist()) == expected
    unique = _events([(f"evt-{n}", 1, 0, n) for n in range(50)])
    assert first_per_id(unique).num_rows == 50
