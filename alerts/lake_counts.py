"""The evaluator's counts from the lake: the published view's merged rows (batch where covered,
else speed; the serving layer's own merge rule, :meth:`SnapshotReader.merged_relation`) summed
over a window per combination of the rules' dimensions, in DuckDB, one query per window."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from alerts.evaluate import Counts, Window
from serving_layer.reader import SnapshotReader
from serving_layer.snapshots import LakeSnapshot
from views.columns import DIMENSIONS
from views.definitions import Definition


class LakeCounts:
    """Counts of ``snapshot`` (one snapshot per evaluation: every window reads the same lake)."""

    def __init__(self, reader: SnapshotReader, snapshot: LakeSnapshot | None = None) -> None:
        self.reader = reader
        self.snapshot = snapshot or reader.snapshot()
        self.view: Definition = reader.definition(self.snapshot)
        self._merged = reader.merged_relation(self.snapshot, self.view)

    def counts(self, window: Window, dimensions: Sequence[str]) -> Mapping[tuple[str, ...], Counts]:
        unknown = set(dimensions) - set(DIMENSIONS)
        if unknown:
            raise ValueError(f"'dimensions' must be among {DIMENSIONS}, got {sorted(unknown)}")
        keys = ", ".join(dimensions)
        group = f"GROUP BY {keys}" if dimensions else ""
        select = f"{keys}, " if dimensions else ""
        sql = (
            f"SELECT {select}sum(impressions)::BIGINT, sum(clicks)::BIGINT, "
            "sum(raw_clicks)::BIGINT, sum(orphan_clicks)::BIGINT, count(orphan_clicks), "
            "count(*), bool_and(source = 'batch') "
            f"FROM ({self._merged}) m WHERE bucket_start >= $start AND bucket_start < $end {group}"
        )
        _, rows = self.reader.fetch_all(sql, {"start": window[0], "end": window[1]})
        width = len(dimensions)
        found: dict[tuple[str, ...], Counts] = {}
        for row in rows:
            impressions, clicks, raw, orphans, with_orphans, total, exact = row[width:]
            found[tuple(str(v) for v in row[:width])] = Counts(
                impressions=int(impressions or 0),
                clicks=int(clicks or 0),
                raw_clicks=int(raw or 0),
                orphan_clicks=int(orphans or 0) if with_orphans == total else None,
                exact=bool(exact),
            )
        return found

    def speed_behind(self, end: dt.datetime, max_lag: dt.timedelta) -> str | None:
        """The speed job's last report (its status, in the snapshot) says it is catching up
        on a backlog: it had read events up to a moment more than ``max_lag`` before the
        report, and not past ``end``. A job that reported nothing, or does not say how far it
        read, is taken at its counts. (A job caught up and then idle, no traffic at all, is
        not behind: a window of no events is what an outage alert must see.)"""
        status = self.snapshot.status
        newest = status.newest_event if status else None
        if status is None or newest is None or newest >= end:
            return None
        lag = status.updated_at - newest
        if lag <= max_lag:
            return None
        return (
            f"the speed layer is catching up: at {status.updated_at:%H:%M:%S} UTC it had read "
            f"events up to {newest:%H:%M:%S}, {_minutes(lag)} behind"
            + (f", {status.offsets_behind:,} records to go" if status.offsets_behind else "")
        )


def _minutes(lag: dt.timedelta) -> str:
    seconds = lag.total_seconds()
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
