"""The sandbox's Arrow datasets read every file in the table's logical types, whatever Arrow
types its writer recorded, and DuckDB's filters push down into them (issue 66)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from lake.catalog import BATCH_COVERAGE
from runtime.object_store import ObjectStoreSettings
from serving_layer.sandbox.arrow_files import dataset, logical_schema, table_rows
from serving_layer.snapshots import TableSnapshot

T0 = dt.datetime(2026, 11, 22, 10, tzinfo=dt.UTC)
STORE = ObjectStoreSettings()
RECORDED = {
    "plain": (pa.string(), pa.binary()),
    "view": (pa.string_view(), pa.binary_view()),
    "large": (pa.large_string(), pa.large_binary()),
}


def _covered(run_id: str, hours: int) -> dict[str, object]:
    start = T0 + dt.timedelta(hours=hours)
    return {
        "run_id": run_id,
        "view": "ctr",
        "interval_start": start,
        "interval_end": start + dt.timedelta(hours=1),
        "input_version": hours,
        "rows_written": 1,
        "finished_at": start,
    }


def coverage(tmp_path: Path, recorded: str) -> TableSnapshot:
    """batch/coverage as one file of two row groups (an hour each), its strings as a writer
    that records ``recorded`` types writes them; its log's schema says ``string``."""
    schema = BATCH_COVERAGE.schema
    string = RECORDED[recorded][0]
    written = pa.schema([f.with_type(string) if f.type == pa.string() else f for f in schema])
    rows = pa.Table.from_pylist([_covered("run-a", 0), _covered("run-b", 1)], schema=schema)
    path = tmp_path / f"{recorded}.parquet"
    pq.write_table(rows.cast(written), path, row_group_size=1)
    assert pq.read_schema(path).field("run_id").type == string
    return TableSnapshot(BATCH_COVERAGE.name, str(tmp_path), 1, (str(path),), (), schema)


@pytest.mark.parametrize("recorded", RECORDED)
def test_every_recorded_type_reads_and_filters_in_the_logical_types(
    tmp_path: Path, recorded: str
) -> None:
    con = duckdb.connect()
    table_rows(con, coverage(tmp_path, recorded), STORE).create_view("coverage")
    types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE coverage)").fetchall())
    assert types["run_id"] == types["view"] == "VARCHAR"
    # Constants DuckDB hands to Arrow's scanner, and a bound it pushes while the query runs.
    for sql in (
        "SELECT run_id FROM coverage WHERE run_id = 'run-b'",
        "SELECT run_id FROM coverage WHERE run_id IN ('run-b', 'x') AND run_id >= 'run-b'",
        "SELECT run_id FROM coverage WHERE run_id LIKE '%-b' AND view = 'ctr'",
        "SELECT run_id FROM coverage WHERE input_version = (SELECT max(input_version) FROM "
        "coverage)",
        "SELECT c.run_id FROM coverage c JOIN (SELECT 'run-b' AS run_id) k USING (run_id)",
        "SELECT run_id FROM coverage ORDER BY interval_start DESC LIMIT 1",
    ):
        assert con.execute(sql).fetchall() == [("run-b",)], sql


def test_the_logical_schema_is_the_plain_types() -> None:
    viewed = pa.schema(
        [
            ("run_id", pa.string_view()),
            ("view", pa.large_string()),
            ("users", pa.large_list(pa.string_view())),
            ("sketch", pa.binary_view()),
        ]
    )
    table = TableSnapshot(BATCH_COVERAGE.name, "/nowhere", 1, (), (), viewed)
    schema = logical_schema(table)
    assert [str(t) for t in schema.types][:4] == [
        "string",
        "string",
        "list<item: string>",
        "binary",
    ]
    # The catalog's columns the log lacks, in their own types.
    assert schema.names[4:] == BATCH_COVERAGE.schema.names[2:]


def test_time_statistics_still_skip_row_groups_of_a_view_typed_file(tmp_path: Path) -> None:
    table = coverage(tmp_path, "view")
    rows = dataset(table, logical_schema(table), STORE)
    [fragment] = rows.get_fragments()
    assert isinstance(fragment, ds.ParquetFileFragment)
    kind = BATCH_COVERAGE.schema.field("interval_start").type
    later = ds.field("interval_start") >= pa.scalar(T0 + dt.timedelta(minutes=30), kind)
    kept = fragment.split_by_row_group(later)
    assert [group.id for part in kept for group in part.row_groups] == [1]
    assert rows.to_table(filter=later).column("run_id").to_pylist() == ["run-b"]
