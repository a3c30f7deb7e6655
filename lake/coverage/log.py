"""``batch/coverage``, read and written here only: which intervals finished batch runs made
exact, one row per run (:class:`~lake.coverage.model.CoverageRun`).

A run's row is appended only after its rows are committed to the view's table, so a covered
interval never points at rows that are not there. Jobs read the table with delta-rs, once per
run of a command (:func:`read_runs`); the serving layer and the SQL sandbox read the copy of it
in their DuckDB snapshot (:func:`runs_from_duckdb`), so a query's coverage and rows come from
the same versions.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from lake.catalog import BATCH_COVERAGE
from lake.coverage.model import CoverageRun, CoverageRuns
from lake.frames import commit_frame
from lake.settings import LakeSettings
from lake.storage import is_delta, open_delta
from runtime.times import utc

if TYPE_CHECKING:
    import duckdb

_COLUMNS: Final = BATCH_COVERAGE.schema.names


def record(lake: LakeSettings, run: CoverageRun) -> None:
    """Append ``run``'s row; writing the same run's row again (a retry) is a no-op."""
    row = pa.Table.from_pylist(
        [{name: getattr(run, name) for name in _COLUMNS}], BATCH_COVERAGE.schema
    )
    commit_frame(
        row,
        BATCH_COVERAGE.path(lake),
        lake.object_store,
        BATCH_COVERAGE.schema,
        txn=(f"coverage:{run.run_id}:v{run.input_version}", 0),
        properties=lake.retention(BATCH_COVERAGE.name),
    )


def read_runs(lake: LakeSettings) -> CoverageRuns:
    """Every run recorded now, read with delta-rs (no Spark); none before the first."""

    path = BATCH_COVERAGE.path(lake)
    if not is_delta(path, lake.object_store):
        return CoverageRuns(())
    table = open_delta(path, lake.object_store)
    return _runs(table.to_pyarrow_table(columns=list(_COLUMNS)).to_pylist())


def runs_from_duckdb(cursor: duckdb.DuckDBPyConnection, relation: str) -> CoverageRuns:
    """The runs of ``relation`` (a trusted name: ``batch/coverage`` in a DuckDB snapshot)."""
    result = cursor.execute(f"SELECT {', '.join(_COLUMNS)} FROM {relation}")
    return _runs(dict(zip(_COLUMNS, row, strict=True)) for row in result.fetchall())


def _runs(rows: Iterable[dict[str, Any]]) -> CoverageRuns:
    return CoverageRuns(
        CoverageRun(
            run_id=str(r["run_id"]),
            view=str(r["view"]),
            interval_start=utc(r["interval_start"]),
            interval_end=utc(r["interval_end"]),
            input_version=int(r["input_version"] if r["input_version"] is not None else -1),
            rows_written=int(r["rows_written"] or 0),
            finished_at=utc(r["finished_at"]) if r["finished_at"] is not None else None,
        )
        for r in rows
    )
