"""The speed tables on real Delta tables written by delta-rs: appends exactly once per
micro-batch, roll-ups that keep every sum and never rewrite an earlier roll-up, the
pruning of covered buckets, closed hours merged to one file, a checkpointed log, and readers
(the serving layer, the SQL sandbox) that sum partial counts per key."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from lake.catalog import SPEED_CTR, SPEED_LATE
from lake.coverage.model import Coverage
from lake.retention import CHECKPOINT_INTERVAL
from lake.settings import LakeSettings
from serving_layer.relations import RelationCache
from serving_layer.sandbox.database import SANDBOX_VIEWS, open_sandbox
from serving_layer.snapshots import SnapshotSource
from speed_layer.rewrite import spark_rewrite
from speed_layer.tables import SpeedTable, _unions, sum_per_key
from speed_layer.tasks import closed_before
from views.columns import DIMENSIONS
from views.sketches import sketch, sketch_estimate, union_sketch

T = dt.datetime(2026, 11, 24, 9, 58, tzinfo=dt.UTC)
APP = "ctr-speed-test-query"


def minute(n: int) -> dt.datetime:
    return T + dt.timedelta(minutes=n)


def rows(*entries: tuple[int, str, int, int]) -> pa.Table:
    """(minute, ad, impressions, clicks) -> speed/ctr rows (other dimensions fixed)."""
    fixed = {d: "x" for d in DIMENSIONS}
    listed = [
        {**fixed, "bucket_start": minute(m), "ad_id": ad, "impressions": i, "clicks": c}
        for m, ad, i, c in entries
    ]
    return pa.Table.from_pylist([{**r, "updated_at": T} for r in listed], schema=SPEED_CTR.schema)


def table(lake: LakeSettings, spark: SparkSession | None = None) -> SpeedTable:
    """speed/ctr's table; with ``spark``, its rewrites (roll-ups, compaction) as Spark tasks."""
    rewrite = spark_rewrite(spark) if spark is not None else None
    return SpeedTable(
        SPEED_CTR.path(lake),
        lake.object_store,
        SPEED_CTR.schema,
        retention_hours=48,
        rewrite=rewrite,
    )


def totals(lake: LakeSettings) -> Counter[tuple[dt.datetime, str]]:
    counted: Counter[tuple[dt.datetime, str]] = Counter()
    for r in DeltaTable(SPEED_CTR.path(lake)).to_pyarrow_table().to_pylist():
        counted[(r["bucket_start"], r["ad_id"])] += r["impressions"] * 1000 + r["clicks"]
    return counted


def rows_per_key(lake: LakeSettings, bucket: dt.datetime) -> Counter[str]:
    data = DeltaTable(SPEED_CTR.path(lake)).to_pyarrow_table().to_pylist()
    return Counter(r["ad_id"] for r in data if r["bucket_start"] == bucket)


def test_a_micro_batch_is_appended_exactly_once(lake: LakeSettings) -> None:
    speed = table(lake)
    assert not speed.committed(APP, 0)
    assert speed.append(rows((0, "a", 1, 0)), app_id=APP, version=0)
    assert not speed.append(rows((0, "a", 1, 0)), app_id=APP, version=0)  # replayed
    assert speed.append(rows((0, "a", 2, 1)), app_id=APP, version=1)
    assert speed.committed(APP, 1)
    assert DeltaTable(SPEED_CTR.path(lake)).transaction_version(APP) == 1
    assert totals(lake) == {(minute(0), "a"): 3001}
    assert DeltaTable(SPEED_CTR.path(lake)).version() == 1  # two commits, the replay none


def paths(lake: LakeSettings) -> set[str]:
    return set(
        DeltaTable(SPEED_CTR.path(lake)).get_add_actions(flatten=True).column("path").to_pylist()
    )


def test_the_roll_up_sums_the_files_the_watermark_closed_and_keeps_every_sum(
    lake: LakeSettings,
    spark: SparkSession,
) -> None:
    speed = table(lake, spark)
    speed.append(rows((0, "a", 1, 0), (0, "b", 1, 1), (1, "a", 1, 0)), app_id=APP, version=0)
    speed.append(rows((0, "a", 2, 0), (1, "a", 1, 1)), app_id=APP, version=1)
    speed.append(rows((1, "b", 1, 0), (2, "a", 5, 0)), app_id=APP, version=2)
    batches = paths(lake)
    before = totals(lake)

    done = speed.roll_up(None, minute(2))  # minutes 0 and 1 are closed, 2 is open
    assert done is not None
    assert (done.rows_before, done.rows_after) == (5, 3)  # the first two batches' files
    assert totals(lake) == before
    assert rows_per_key(lake, minute(0)) == {"a": 1, "b": 1}
    # The third batch's file holds the open minute 2: left as the batch wrote it.
    assert rows_per_key(lake, minute(1)) == {"a": 1, "b": 1}
    assert len(paths(lake) & batches) == 1
    assert table(lake).rolled_up_before() == minute(2)  # a restarted job continues here

    rolled = paths(lake) - batches
    speed.append(rows((2, "a", 1, 0), (3, "a", 1, 0)), app_id=APP, version=3)
    files = paths(lake)
    done = speed.roll_up(minute(2), minute(3))
    assert done is not None
    assert done.rows_before == 2  # the third batch's file only
    assert paths(lake) == files  # one file: nothing to sum, nothing rewritten
    assert rolled <= paths(lake)  # the first roll-up's file is not rewritten
    assert table(lake).rolled_up_before() == minute(3)  # but where it reached is noted
    assert totals(lake) == before + Counter({(minute(2), "a"): 1000, (minute(3), "a"): 1000})
    assert speed.roll_up(minute(3), minute(3)) is None  # nothing closed since


def test_a_roll_up_never_rewrites_an_earlier_one(lake: LakeSettings, spark: SparkSession) -> None:
    """A micro-batch holds every open minute (here 3): each minute's roll-up takes the files
    that just closed, never the files earlier roll-ups wrote, so the rows rewritten per
    roll-up stay the same however long the job runs."""
    speed = table(lake, spark)
    rolled: set[str] = set()
    for n in range(3, 15):  # minute n's 2 batches hold minutes n-3..n; before n-3 are closed
        for k in range(2):
            batch = rows(*((m, "a", 1, 0) for m in range(n - 3, n + 1)))
            speed.append(batch, app_id=APP, version=2 * n + k)
        before = paths(lake)
        done = speed.roll_up(minute(n - 4) if n > 3 else None, minute(n - 3))
        assert done is not None
        # Minute n-4's two batches, closed since the last roll-up: summed per key.
        assert (done.rows_before, done.rows_after) == ((8, 4) if n >= 7 else (0, 0))
        assert rolled <= paths(lake)  # no earlier roll-up's file rewritten
        rolled |= paths(lake) - before
    assert len(rolled) == 8
    assert sum(totals(lake).values()) == 12 * 2 * 4 * 1000


def test_each_past_minutes_micro_batches_become_one_file_the_roll_up_then_takes(
    lake: LakeSettings,
    spark: SparkSession,
) -> None:
    """Three micro-batches a minute, each holding the open minutes n-2..n: after each minute
    its batches are one file, no compacted file is compacted again, and the sums stay."""
    speed = table(lake, spark)
    compacted: set[str] = set()
    for n in range(2, 8):
        for k in range(3):
            version = n * 3 + k
            speed.append(rows(*((m, "a", 1, 0) for m in range(n - 2, n + 1))), app_id=APP,
                         version=version)  # fmt: skip
        before, sums = paths(lake), totals(lake)
        # The minute being written (n) is left alone; minute n-1's three files become one.
        assert speed.compact_minutes(None) == (1 if n > 2 else 0)
        assert totals(lake) == sums
        assert compacted <= paths(lake)  # no earlier compaction's file rewritten
        compacted |= paths(lake) - before
        assert len(paths(lake)) == len(compacted) + 3  # a file per minute past, 3 batches of n
    assert speed.compact_minutes(None) == 0  # nothing new
    sums, before = totals(lake), paths(lake)
    done = speed.roll_up(None, minute(4))  # the files written in minutes 2 and 3
    assert done is not None
    assert done.rows_before == 3 + 3  # one compacted file each
    assert totals(lake) == sums
    rolled = paths(lake) - before
    speed.append(rows((7, "a", 1, 0), (8, "a", 1, 0)), app_id=APP, version=100)
    assert speed.compact_minutes(minute(4)) == 1  # minute 7's batches, from the roll-up's end
    assert rolled <= paths(lake)  # the roll-up's file is left alone
    assert sum(totals(lake).values()) == sum(sums.values()) + 2000


def test_covered_buckets_are_deleted(lake: LakeSettings) -> None:
    speed = table(lake)
    speed.append(rows((0, "a", 1, 0), (1, "a", 1, 0), (3, "a", 1, 0)), app_id=APP, version=0)
    assert speed.delete_covered(Coverage(())) == 0
    assert speed.delete_covered(Coverage([(minute(0), minute(2))])) == 2
    assert set(totals(lake)) == {(minute(3), "a")}


def test_closed_hours_are_merged_to_one_file_each(lake: LakeSettings, spark: SparkSession) -> None:
    speed = table(lake, spark)
    for n in range(5):  # minutes 0..4 cross the hour at 10:00; a roll-up per minute
        speed.append(rows((n, "a", 1, 0), (n, "b", 0, 1)), app_id=APP, version=n)
        speed.roll_up(minute(n) if n else None, minute(n + 1))
    before = totals(lake)
    hour = dt.datetime(2026, 11, 24, 9, tzinfo=dt.UTC)
    assert speed.merge_closed_hours(minute(1)) == 0  # 09:00-10:00 is not rolled up yet
    assert speed.merge_closed_hours(hour + dt.timedelta(hours=2)) == 2
    assert totals(lake) == before
    files = pa.table(DeltaTable(SPEED_CTR.path(lake)).get_add_actions(flatten=True)).to_pylist()
    spans = sorted((f["min.bucket_start"], f["max.bucket_start"]) for f in files)
    assert spans == [(minute(0), minute(1)), (minute(2), minute(4))]  # one file per hour
    assert speed.merge_closed_hours(hour + dt.timedelta(hours=2)) == 0  # merged once
    assert table(lake).rolled_up_before() == minute(5)  # a merge does not move the roll-ups


def test_the_log_is_checkpointed_and_kept_for_the_retention(lake: LakeSettings) -> None:
    speed = table(lake)
    for n in range(CHECKPOINT_INTERVAL + 1):
        speed.append(rows((0, "a", 1, 0)), app_id=APP, version=n)
    log = Path(SPEED_CTR.path(lake)) / "_delta_log"
    assert len(list(log.glob("*.checkpoint.parquet"))) == 1  # every CHECKPOINT_INTERVAL commits
    assert (log / "_last_checkpoint").exists()
    configuration = DeltaTable(SPEED_CTR.path(lake)).metadata().configuration
    assert configuration["delta.logRetentionDuration"] == "interval 2880 minutes"  # 48 h
    assert configuration["delta.enableExpiredLogCleanup"] == "true"


def test_reset_empties_the_table_and_keeps_its_history(lake: LakeSettings) -> None:
    speed = table(lake)
    speed.append(rows((0, "a", 1, 0)), app_id=APP, version=0)
    speed.reset()
    assert DeltaTable(SPEED_CTR.path(lake)).to_pyarrow_table().num_rows == 0
    assert DeltaTable(SPEED_CTR.path(lake), version=0).to_pyarrow_table().num_rows == 1


def served(lake: LakeSettings, *queries: Callable[[str], str]) -> list[list[tuple[Any, ...]]]:
    """The rows of each query over speed/ctr as the serving layer loads it (``base``: its
    relation's name)."""
    snapshot = SnapshotSource(lake, tables=("speed/ctr",), refresh_s=0).current()
    cache = RelationCache(lake.object_store)
    try:
        base = cache.relation(snapshot["speed/ctr"]).name
        with cache.cursor() as cur:
            return [cur.execute(query(base)).fetchall() for query in queries]
    finally:
        cache.close()


def test_the_serving_layer_sums_partial_counts_per_key(lake: LakeSettings) -> None:
    """The CTR query sums speed rows; the per-key relation (row-level readers: version diffs)
    has one row per key; the SQL sandbox's ctr_speed too."""
    speed = table(lake)
    speed.append(rows((0, "a", 1, 0), (0, "b", 1, 0)), app_id=APP, version=0)
    speed.append(rows((0, "a", 2, 1)), app_id=APP, version=1)
    keyed, stored = served(
        lake,
        lambda base: (
            f"SELECT ad_id, impressions, clicks FROM ({SPEED_CTR.rows_sql(base)}) ORDER BY ad_id"
        ),
        lambda base: f"SELECT count(*) FROM {base}",
    )
    assert keyed == [("a", 3, 1), ("b", 1, 0)]
    assert stored == [(3,)]


def test_a_table_written_before_the_attribution_measures_gets_them(
    lake: LakeSettings, spark: SparkSession
) -> None:
    """speed/ctr as the job wrote it before version 3: appends add the columns, older rows read
    null (not measured) through delta-rs and the serving layer, roll-ups keep them."""
    old_schema = pa.schema([f for f in SPEED_CTR.schema if not f.name.endswith("_clicks")])
    write_deltalake(SPEED_CTR.path(lake), rows((0, "a", 2, 1)).select(old_schema.names))
    new = rows((0, "a", 1, 1), (1, "a", 1, 0))
    for name in ("attributed_clicks", "orphan_clicks", "repeat_clicks"):
        new = new.set_column(new.schema.get_field_index(name), name, pa.array([1, 0], pa.int64()))
    speed = table(lake, spark)
    assert speed.append(new, app_id=APP, version=0)
    stored = DeltaTable(SPEED_CTR.path(lake)).to_pyarrow_table()
    assert set(stored.column_names) == set(SPEED_CTR.schema.names)
    found = sorted(
        (r["bucket_start"], r["impressions"], r["attributed_clicks"], r["repeat_clicks"])
        for r in stored.to_pylist()
    )
    assert found == [(minute(0), 1, 1, 1), (minute(0), 2, None, None), (minute(1), 1, 0, 0)]

    [keyed] = served(
        lake,
        lambda base: (
            "SELECT bucket_start, impressions, clicks, attributed_clicks, orphan_clicks "
            f"FROM ({SPEED_CTR.rows_sql(base)}) ORDER BY bucket_start"
        ),
    )
    assert [row[1:] for row in keyed] == [(3, 2, 1, 1), (1, 0, 0, 0)]

    speed.roll_up(None, minute(2))
    summed = DeltaTable(SPEED_CTR.path(lake)).to_pyarrow_table()
    assert sorted((r["impressions"], r["attributed_clicks"]) for r in summed.to_pylist()) == [
        (1, 0),
        (3, 1),
    ]
    assert speed.append(rows((1, "a", 1, 0)), app_id=APP, version=1)  # opened again: as is


def test_sum_per_key_is_the_readers_rule() -> None:
    summed = sum_per_key(rows((0, "a", 1, 0), (0, "a", 2, 1), (1, "a", 1, 1)))
    found = sorted((r["bucket_start"], r["impressions"], r["clicks"]) for r in summed.to_pylist())
    assert found == [(minute(0), 3, 1), (minute(1), 1, 1)]


def test_the_sketches_of_a_key_are_unioned_and_a_lone_one_kept_as_it_is() -> None:
    """A key's rows' sketches become their union; one sketch stays byte for byte; a key whose
    rows all have none stays null (not measured)."""
    a, b, c = sketch(["u1", "u2"]), sketch(["u2", "u3"]), sketch(["u9"])
    lists = pa.array(
        [[a, None, b], [None], [c], [None, c, None], [], [b, a]], pa.list_(pa.binary())
    )
    merged = _unions(pa.chunked_array([lists[:2], lists[2:]])).to_pylist()
    assert merged == [union_sketch([a, b]), None, c, c, None, union_sketch([b, a])]
    assert sketch_estimate(merged[0]) == pytest.approx(3)
    assert _unions(pa.array([[None], [None]], pa.list_(pa.binary()))).to_pylist() == [None, None]
    assert _unions(pa.array([], pa.list_(pa.binary()))).to_pylist() == []


@pytest.mark.parametrize(
    ("watermark", "first_open"),
    [("10:05:00", "10:05:00"), ("10:05:59.999", "10:05:00"), ("10:06:00.001", "10:06:00")],
)
def test_buckets_close_where_the_watermark_reaches_their_end(
    watermark: str, first_open: str
) -> None:
    day = "2026-11-24T"
    mark = dt.datetime.fromisoformat(f"{day}{watermark}+00:00")
    assert closed_before(int(mark.timestamp() * 1000)) == dt.datetime.fromisoformat(
        f"{day}{first_open}+00:00"
    )


def test_the_sql_sandbox_shows_one_row_per_key(lake: LakeSettings) -> None:
    speed = table(lake)
    speed.append(rows((0, "a", 1, 0), (0, "b", 1, 0)), app_id=APP, version=0)
    speed.append(rows((0, "a", 2, 1)), app_id=APP, version=1)
    snapshot = SnapshotSource(lake, refresh_s=0).current()
    con = open_sandbox(
        {view: snapshot[name] for view, name in SANDBOX_VIEWS.items()},
        lake.object_store,
        memory_limit_bytes=2**28,
    )
    try:
        found = con.execute(
            "SELECT ad_id, impressions, clicks FROM ctr_speed ORDER BY ad_id"
        ).fetchall()
        merged = con.execute("SELECT ad_id, impressions FROM ctr ORDER BY ad_id").fetchall()
    finally:
        con.close()
    assert found == [("a", 3, 1), ("b", 1, 0)]
    assert merged == [("a", 3), ("b", 1)]


def test_the_speed_job_prunes_what_the_published_version_covers(lake: LakeSettings) -> None:
    # A new lake publishes version 3 (lake.registry.start_new_lake): its coverage rows are keyed
    # ctr@v3, and the speed job must prune by them, or speed/ctr grows without bound.
    from lake.catalog import BATCH_COVERAGE
    from lake.registry import record
    from speed_layer.job import SpeedBatchWriter
    from speed_layer.settings import SpeedSettings

    writer = SpeedBatchWriter(lake, lake.checkpoint("speed"), SpeedSettings())
    writer.ctr.append(rows((0, "a", 5, 1), (1, "a", 3, 0), (3, "b", 2, 0)), app_id=APP, version=0)
    coverage = [
        {"run_id": "r", "view": view, "interval_start": start, "interval_end": end,
         "input_version": 0, "rows_written": 1, "finished_at": T}
        for view, start, end in [("ctr", minute(3), minute(4)), ("ctr@v3", minute(0), minute(2))]
    ]  # fmt: skip
    write_deltalake(
        BATCH_COVERAGE.path(lake), pa.Table.from_pylist(coverage, schema=BATCH_COVERAGE.schema)
    )
    record(lake, "ctr", 3, "published", "test")
    late = [
        {"bucket_start": minute(m), "impressions": 1, "clicks": 0, "batch_id": b, "recorded_at": T}
        for b, m in enumerate([0, 1, 3, 3])
    ]
    for b, row in enumerate(late):  # a file per batch with late events
        writer.late.append(
            pa.Table.from_pylist([row], schema=SPEED_LATE.schema), app_id=APP, version=b
        )
    writer._maintenance()
    # v3 covers minutes 0-1: pruned; minute 3 is only v1's (not published): kept.
    assert sorted(totals(lake)) == [(minute(3), "b")]
    # speed/late likewise, and what is left in one file.
    kept = DeltaTable(SPEED_LATE.path(lake))
    assert sorted(kept.to_pyarrow_table().column("batch_id").to_pylist()) == [2, 3]
    assert len(kept.file_uris()) == 1
