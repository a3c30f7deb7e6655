"""Which of an advertiser scope's ids the lake has seen recently: the check behind
``ctr keys create --scope advertiser``, so a key is not made for a campaign that does not exist
(a typo, or an id with a stray space) and silently sees nothing.

Bounded whatever the lake's size: only the files of the views (``speed/ctr`` and every version
of ``batch/ctr``) with minutes in the last ``days`` days and whose ``campaign_id`` range (the
Delta log's file statistics) can hold one of the ids are read, and of them two columns, with
the ids as a filter DuckDB checks against each row group's statistics first.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from lake.catalog import SPEED_CTR, Table, batch_table
from lake.settings import LakeSettings
from lake.storage import duckdb_object_store, is_delta, open_delta
from runtime.object_store import ObjectStoreSettings
from views.definitions import versions

RECENT_DAYS: Final = 30


@dataclass(frozen=True)
class Unseen:
    """The ids of a scope not seen in the lake's views in the last ``days`` days."""

    campaigns: tuple[str, ...]
    ads: tuple[str, ...]
    days: int

    def __bool__(self) -> bool:
        return bool(self.campaigns or self.ads)


def unseen_ids(
    lake: LakeSettings,
    campaigns: Sequence[str],
    ads: Sequence[str] = (),
    *,
    days: int = RECENT_DAYS,
    now: dt.datetime | None = None,
) -> Unseen:
    """The ids of ``campaigns`` and ``ads`` (ads of those campaigns) that no row of the views
    has had in the ``days`` days before ``now``."""
    since = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(days=days)
    files = [
        path
        for table in _view_tables()
        for path in _candidate_files(table.path(lake), lake.object_store, campaigns, since)
    ]
    seen: set[tuple[str, str]] = set()
    if files and campaigns:
        con = duckdb.connect(
            config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
        )
        try:
            if lake.on_object_store:
                duckdb_object_store(con, lake.object_store)
            rows = con.execute(
                "SELECT DISTINCT campaign_id, ad_id FROM read_parquet($files, "
                "union_by_name = true) WHERE campaign_id IN (SELECT unnest($campaigns)) "
                "AND bucket_start >= $since",
                {"files": files, "campaigns": list(campaigns), "since": since},
            ).fetchall()
        finally:
            con.close()
        seen = {(str(c), str(a)) for c, a in rows}
    seen_campaigns = {c for c, _ in seen}
    seen_ads = {a for _, a in seen}
    return Unseen(
        tuple(c for c in campaigns if c not in seen_campaigns),
        tuple(a for a in ads if a not in seen_ads),
        days,
    )


def _view_tables() -> Iterable[Table]:
    yield SPEED_CTR
    for view in versions("ctr"):
        yield batch_table(view)


def _candidate_files(
    path: str, store: ObjectStoreSettings, campaigns: Sequence[str], since: dt.datetime
) -> list[str]:
    """The files of the table at ``path`` that may hold a row of ``campaigns`` from ``since``
    on, by the file statistics of its Delta log (a file without them is a candidate)."""
    if not campaigns or not is_delta(path, store):
        return []
    table = open_delta(path, store)
    actions = pa.table(table.get_add_actions(flatten=True))
    columns = set(actions.column_names)
    conditions = []
    if "max.bucket_start" in columns:
        newest = actions["max.bucket_start"]
        conditions.append(pc.greater_equal(newest, pa.scalar(since, newest.type)))
    if {"min.campaign_id", "max.campaign_id"} <= columns:
        low = actions["min.campaign_id"].cast(pa.string())
        high = actions["max.campaign_id"].cast(pa.string())
        conditions.append(pc.less_equal(low, max(campaigns)))
        # Statistics of long strings are truncated: compare a short prefix of the smallest id.
        conditions.append(pc.greater_equal(high, min(campaigns)[:16]))
    chosen = actions["path"].to_pylist()
    if conditions:
        keep = conditions[0]
        for condition in conditions[1:]:
            keep = pc.and_kleene(keep, condition)
        # Null (no statistics): a candidate.
        chosen = actions.filter(pc.fill_null(keep, True))["path"].to_pylist()
    uris = {uri.rsplit("/", 1)[-1]: uri for uri in table.file_uris()}
    return [uris[name] for p in chosen if (name := p.rsplit("/", 1)[-1]) in uris]
