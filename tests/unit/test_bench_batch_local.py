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


def test_reach_rows_count_list_and_sketch_each_group() -> None:
    import datetime as dt

    from bench.batch_local import REACH_INPUT, reach_rows
    from views import sketches

    at = dt.datetime(2026, 11, 21, 10, 0, 5, tzinfo=dt.UTC)
    dims = {"campaign_id": "cmp-1", "ad_id": "ad-1", "site_id": "s", "country": "DE"}
    rows = [
        # (seconds after 10:00:05, type, device, user id, user number)
        (0, "impression", "mobile", "user-9", 9),
        (1, "impression", "mobile", "user-2", 2),
        (2, "impression", "mobile", "user-9", 9),
        (3, "click", "mobile", "user-2", 2),
        (4, "impression", "mobile", None, None),  # nobody
        (60, "impression", "mobile", "user-5", 5),  # the next minute
        (5, "click", "desktop", "user-7", 7),  # other dimensions: a click alone
    ]
    events = pa.Table.from_pylist(
        [
            {"event_time": at + dt.timedelta(seconds=s), "event_type": kind, **dims,
             "device_type": device, "user_id": user, "user_no": number}
            for s, kind, device, user, number in rows
        ],
        schema=REACH_INPUT,
    )  # fmt: skip
    found = {
        (r["bucket_start"].minute, r["device_type"]): r for r in reach_rows(events).to_pylist()
    }
    assert set(found) == {(0, "mobile"), (1, "mobile"), (0, "desktop")}
    first = found[(0, "mobile")]
    assert (first["impressions"], first["clicks"]) == (4, 1)
    assert (first["user_nos"], first["clicker_nos"]) == ([2, 9], [2])
    assert round(sketches.sketch_estimate(first["reach_sketch"])) == 2
    assert round(sketches.sketch_estimate(first["clicker_sketch"])) == 1
    alone = found[(0, "desktop")]
    assert (alone["impressions"], alone["clicks"], alone["user_nos"]) == (0, 1, [])
    assert round(sketches.sketch_estimate(alone["reach_sketch"])) == 0
    assert found[(1, "mobile")]["user_nos"] == [5]


def test_reach_rows_list_many_numbers_in_order() -> None:
    import datetime as dt

    from bench.batch_local import REACH_INPUT, reach_rows

    at = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
    numbers = random.Random(3).sample(range(100_000), 500)
    events = pa.Table.from_pylist(
        [
            {"event_time": at + dt.timedelta(seconds=n % 120), "event_type": "impression",
             "campaign_id": "c", "ad_id": "a", "site_id": f"s{n % 3}", "country": "DE",
             "device_type": "mobile", "user_id": f"user-{n}", "user_no": n}
            for n in numbers
        ],
        schema=REACH_INPUT,
    )  # fmt: skip
    rows = reach_rows(events).to_pylist()
    assert len(rows) == 6
    assert sum(len(r["user_nos"]) for r in rows) == 500
    for row in rows:
        assert row["user_nos"] == sorted(row["user_nos"])
        assert row["impressions"] == len(row["user_nos"])
