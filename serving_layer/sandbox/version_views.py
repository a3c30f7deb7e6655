"""The sandbox's merged views per version of ``ctr``, over its tables' views: the covered
intervals, the stale arrivals and the merge rule of each version, and the published version's
as ``covered``, ``stale`` and ``ctr``."""

from __future__ import annotations

import duckdb

from lake.catalog import SPEED_CTR, batch_table
from lake.coverage.log import runs_from_duckdb
from lake.coverage.staleness import stale_sql
from lake.registry import Registry
from serving_layer.merge_rule import merged_sql
from serving_layer.sides import side_rows_sql
from views.columns import SKETCHES
from views.definitions import versions


def create_version_views(con: duckdb.DuckDBPyConnection) -> None:
    """Per version N of ``ctr``: ``covered_vN``, ``stale_vN`` and ``ctr_vN`` (its merge rule,
    speed and late rows through its definition); ``covered``, ``stale`` and ``ctr`` are those
    of the version the snapshot's registry publishes."""
    result = con.execute("SELECT * FROM registry")
    columns = [c[0] for c in result.description]
    registry = Registry.from_rows(dict(zip(columns, r, strict=True)) for r in result.fetchall())
    published = registry.published("ctr")
    runs = runs_from_duckdb(con, "coverage")
    for view in versions("ctr"):
        n = view.version
        con.from_arrow(runs.of(view.key).to_arrow()).create(f"covered_v{n}")
        where = f" WHERE {view.where}" if view.where else ""
        attribution = view.attribution is not None
        speed = side_rows_sql(
            "ctr_speed",
            columns=SPEED_CTR.schema.names,
            attribution=attribution,
            speed=True,
            where=view.where,
            keep=("updated_at", *SKETCHES),
        )
        con.execute(f"CREATE VIEW speed_v{n} AS {speed}")
        con.execute(f"CREATE VIEW arrivals_v{n} AS SELECT * FROM arrivals{where}")
        table = batch_table(view)
        batch = side_rows_sql(
            table.sql_name,
            columns=table.schema.names,
            attribution=attribution,
            speed=False,
            keep=SKETCHES,
        )
        con.execute(
            f"CREATE VIEW stale_v{n} AS "
            + stale_sql(
                arrivals=f"arrivals_v{n}",
                coverage="coverage",
                batch=table.sql_name,
                view=view.key,
                attribution=view.attribution,
            )
        )
        con.execute(
            f"CREATE VIEW ctr_v{n} AS "
            + merged_sql(
                batch=f"({batch})",
                speed=f"speed_v{n}",
                covered=f"covered_v{n}",
                stale=f"stale_v{n}",
                sketched=True,
            )
        )
    for name in ("covered", "stale", "ctr"):
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_v{published.version}")
