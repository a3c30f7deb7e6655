"""Small Delta tables for serving and API tests, written with delta-rs (no Spark), and a
query for the SQL sandbox's tests over them."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

import pyarrow as pa
from deltalake import write_deltalake

from lake.settings import LakeSettings
from lake.storage import delta_options
from serving_layer.snapshots import SCHEMAS
from tests.support.events import archived_row, wire_event
from tests.support.lakes import new_lake
from views import sketches
from views.columns import DIMENSIONS, SKETCHES, USER_LISTS, USER_NUMBERS

SPEED_ATTRIBUTION: Final = ("attributed_clicks", "orphan_clicks", "repeat_clicks")

T0 = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
# One regular expression over a 50 MB string: 8 s of one core here, and DuckDB checks for an
# interrupt only between row batches, so only the pool's kill stops it at the limit.
RUNAWAY_REGEX = "SELECT length(regexp_replace(repeat('x', 50000000), 'x', 'yy', 'g'))"


def minute(n: int) -> dt.datetime:
    """``n`` minutes after 10:00 on the test day."""
    return T0 + dt.timedelta(minutes=n)


# ctr_row's dimensions, by keyword, with their defaults, in the order of DIMENSIONS.
ROW_DIMENSIONS: Final = {
    "campaign": "cmp-1",
    "ad": "ad-1",
    "site": "site-1",
    "country": "US",
    "device": "mobile",
}


def ctr_row(at: dt.datetime, impressions: int, clicks: int, **dimensions: str) -> dict[str, object]:
    """A ctr view row; ``dimensions`` (keywords of :data:`ROW_DIMENSIONS`) replace defaults."""
    unknown = dimensions.keys() - ROW_DIMENSIONS.keys()
    if unknown:
        raise TypeError(f"ctr_row() got unknown dimension(s) {', '.join(sorted(unknown))}")
    values = {**ROW_DIMENSIONS, **dimensions}.values()
    return {
        "bucket_start": at,
        **dict(zip(DIMENSIONS, values, strict=True)),
        "impressions": impressions,
        "clicks": clicks,
    }


def write(
    lake: LakeSettings,
    table: str,
    rows: Sequence[dict[str, object]],
    *,
    schema: pa.Schema | None = None,
    **extra: object,
) -> None:
    """Append ``rows`` (plus constant columns ``extra``) to ``table`` in one commit, with the
    catalog's schema (or ``schema``: an older one)."""
    schema = schema or SCHEMAS[table]
    full = [{**row, **extra} for row in rows]
    data = pa.Table.from_pylist(full, schema=schema)
    partition_by = ["event_date"] if table == "master/events" else None
    location = lake.table(table)
    options = delta_options(location, lake.object_store)  # None for a local lake
    write_deltalake(
        location, data, mode="append", partition_by=partition_by, storage_options=options
    )


def write_batch(
    lake: LakeSettings,
    run_id: str,
    rows: Sequence[dict[str, object]],
    *,
    schema: pa.Schema | None = None,
) -> None:
    write(lake, "batch/ctr", rows, schema=schema, run_id=run_id)


def write_speed(
    lake: LakeSettings, rows: Sequence[dict[str, object]], *, schema: pa.Schema | None = None
) -> None:
    write(lake, "speed/ctr", rows, schema=schema, updated_at=T0)


def reached(
    row: dict[str, object],
    users: Iterable[str],
    clickers: Iterable[str] = (),
    *,
    lists: bool = True,
    numbers: Mapping[str, int] | None = None,
) -> dict[str, object]:
    """``row`` with who it reached, as the layers write it: ``users`` (with an impression) and
    ``clickers`` (with a click) as sorted distinct lists (the batch layer's; ``lists=False``
    for a speed row, which has none) and as sketches (``reach_sketch``, ``clicker_sketch``:
    both layers'). The lists hold the ids (:data:`views.columns.USER_LISTS`, as rows written
    before the user dictionary), or with ``numbers`` (a dictionary: id -> number) the users'
    numbers (:data:`views.columns.USER_NUMBERS`, as the batch layer writes them now)."""
    distinct, clicking = sorted(set(users)), sorted(set(clickers))
    out = {
        **row,
        "reach_sketch": sketches.sketch(distinct),
        "clicker_sketch": sketches.sketch(clicking),
    }
    if lists and numbers is None:
        out.update(zip(USER_LISTS, (distinct, clicking), strict=True))
    elif lists and numbers is not None:
        numbered = (sorted(numbers[u] for u in distinct), sorted(numbers[u] for u in clicking))
        out.update(zip(USER_NUMBERS, numbered, strict=True))
    return out


def pre_reach_schema(table: str) -> pa.Schema:
    """``table``'s schema as written before reach was measured: no user lists, no sketches."""
    reach = (*USER_LISTS, *SKETCHES, *USER_NUMBERS)
    return pa.schema([f for f in SCHEMAS[table] if f.name not in reach])


# speed/ctr as the speed job wrote it before it counted click attribution.
SPEED_SCHEMA_V1: Final = pa.schema(
    [f for f in SCHEMAS["speed/ctr"] if f.name not in SPEED_ATTRIBUTION]
)


def write_old_speed(lake: LakeSettings, rows: Sequence[dict[str, object]]) -> None:
    """Append ``rows`` to speed/ctr with the schema it had before the attribution counts (the
    table's schema, when this creates it)."""
    write(lake, "speed/ctr", rows, schema=SPEED_SCHEMA_V1, updated_at=T0)


def attributed_row(
    at: dt.datetime,
    impressions: int,
    clicks: int,
    raw_clicks: int,
    *,
    orphan_clicks: int = 0,
    repeat_clicks: int = 0,
    **dimensions: str,
) -> dict[str, object]:
    """A row of a version with click attribution (batch/ctr_v3); see :func:`ctr_row`."""
    return {
        **ctr_row(at, impressions, clicks, **dimensions),
        "raw_clicks": raw_clicks,
        "orphan_clicks": orphan_clicks,
        "repeat_clicks": repeat_clicks,
    }


def speed_row(
    at: dt.datetime,
    impressions: int,
    clicks: int,
    attributed_clicks: int,
    *,
    orphan_clicks: int = 0,
    repeat_clicks: int = 0,
    **dimensions: str,
) -> dict[str, object]:
    """A speed/ctr row with the attribution counts: ``clicks`` are the click events."""
    return {
        **ctr_row(at, impressions, clicks, **dimensions),
        "attributed_clicks": attributed_clicks,
        "orphan_clicks": orphan_clicks,
        "repeat_clicks": repeat_clicks,
    }


def cover(
    lake: LakeSettings,
    run_id: str,
    start: dt.datetime,
    end: dt.datetime,
    *,
    input_version: int = 1,
    view: str = "ctr",
) -> None:
    """A finished run of ``view`` (a version's key: ``ctr``, ``ctr@v3``) over [start, end)."""
    write(
        lake,
        "batch/coverage",
        [
            {
                "run_id": run_id,
                "view": view,
                "interval_start": start,
                "interval_end": end,
                "input_version": input_version,
                "rows_written": 0,
                "finished_at": end,
            }
        ],
    )


def write_arrivals(
    lake: LakeSettings, events_version: int, rows: Sequence[dict[str, object]]
) -> None:
    """Append ctr rows as one archiver commit's arrivals, readable from ``events_version``."""
    write(
        lake,
        "master/arrivals",
        rows,
        events_version=events_version,
        batch_id=events_version,
        archived_at=T0 + dt.timedelta(hours=6),
    )


def arrival_rows(row: dict[str, object], *, events_version: int) -> pa.Table:
    """One ctr row as an archiver commit's arrivals (as :func:`write_arrivals` writes them),
    for the archiver's own writer (``lake.arrivals.arrivals_table``)."""
    full = {
        **row,
        "events_version": events_version,
        "batch_id": events_version,
        "archived_at": T0 + dt.timedelta(hours=6),
    }
    return pa.Table.from_pylist([full], schema=SCHEMAS["master/arrivals"])


def write_status(lake: LakeSettings, **fields: object) -> None:
    status = {
        "updated_at": "2026-11-22T12:00:00Z",
        "batch_id": 7,
        "watermark": "2026-11-22T11:58:00Z",
        "offsets_behind": 42,
        "input_rows_per_second": 1000.0,
        "processed_rows_per_second": 1200.0,
        "batch_duration_ms": 850,
        **fields,
    }
    path = Path(lake.checkpoint_root) / "speed.status.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(status))


def event(n: int) -> dict[str, object]:
    """A master/events row at ``minute(n)`` (impression ``i<n>`` of user ``u1``, offset n)."""
    wire = wire_event(f"e{n}", "impression", minute(n), impression_id=f"i{n}", user_id="u1")
    return archived_row(wire, offset=n)


def build_sandbox_lake(root: Path) -> LakeSettings:
    """A lake with every table the SQL sandbox reads: batch, coverage, speed, two events,
    one rejected record."""
    lake = new_lake(root)
    write_batch(lake, "run-a", [ctr_row(minute(0), 10, 1), ctr_row(minute(1), 20, 2)])
    cover(lake, "run-a", minute(0), minute(1))
    write_speed(lake, [ctr_row(minute(0), 99, 9), ctr_row(minute(1), 30, 3)])
    write(lake, "master/events", [event(0), event(1)])
    write(lake, "master/rejected", [rejected(5)])
    return lake


def rejected(offset: int, reason: str = "record: not JSON") -> dict[str, object]:
    """A master/rejected row: an unreadable record at ``offset``."""
    return {
        "value": b"{",
        "key": None,
        "reason": reason,
        "kafka_topic": "ad-events",
        "kafka_partition": 0,
        "kafka_offset": offset,
        "kafka_timestamp": minute(0),
    }


def lake_digest(lake: LakeSettings) -> dict[str, str]:
    """Every file under the lake with the hash of its bytes."""
    root = Path(lake.lake_root)
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }
