"""A view version's batch and speed rows over a snapshot, as the merge rule
(:mod:`serving_layer.merge_rule`) and the reach query read them: the five counts of
:data:`views.columns.MEASURES` as the version counts them, its ``where``, and the columns a
table written before they were added lacks (null): their SQL (:func:`side_rows_sql`, also the
SQL sandbox's), each built once per table version in the
:class:`~serving_layer.relations.RelationCache`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from lake.catalog import batch_table
from serving_layer.relations import RelationCache
from serving_layer.snapshots import LakeSnapshot, TableSnapshot
from views.columns import (
    ATTRIBUTION_MEASURES,
    DIMENSIONS,
    MEASURES,
    SKETCHES,
    USER_LISTS,
    USER_NUMBERS,
)
from views.definitions import Definition


def side_rows_sql(
    relation: str,
    *,
    columns: Collection[str],
    attribution: bool,
    speed: bool,
    where: str | None = None,
    keep: Sequence[str] = (),
) -> str:
    """SELECT of a batch or speed table's rows as the merge rule reads them: bucket_start, the
    dimensions, the five counts of :data:`views.columns.MEASURES` (and run_id for batch rows),
    one projection of the rows as stored.

    ``relation`` is a trusted relation name, ``columns`` the columns it has (a table written
    before the attribution counts has none of them), ``attribution`` whether the version
    attributes clicks (:attr:`views.definitions.Definition.attribution`), ``speed`` whether the
    rows are ``speed/ctr``'s, ``where`` the version's trusted predicate on the dimensions,
    ``keep`` more columns to select as they are (trusted names).
    Without attribution ``raw_clicks`` are the clicks and the other two are null. With it, a
    batch table has every count; ``speed/ctr``'s ``clicks`` are the click events, so its
    ``attributed_clicks`` are the clicks and its ``clicks`` the raw clicks (rows written before
    the speed job counted attribution count 0 of each).
    """

    def count(name: str, missing: str) -> str:
        return name if name in columns else missing

    if not attribution:
        counts = "clicks, clicks AS raw_clicks, NULL::BIGINT AS orphan_clicks, "
        counts += "NULL::BIGINT AS repeat_clicks"
    elif speed:

        def attributed(stored: str) -> str:
            return f"coalesce({count(stored, 'NULL')}, 0)::BIGINT"

        counts = (
            f"{attributed('attributed_clicks')} AS clicks, clicks AS raw_clicks, "
            f"{attributed('orphan_clicks')} AS orphan_clicks, "
            f"{attributed('repeat_clicks')} AS repeat_clicks"
        )
    else:
        counts = ", ".join(
            ["clicks", *(f"{count(m, 'NULL::BIGINT')} AS {m}" for m in ATTRIBUTION_MEASURES)]
        )
    run_id = "".join(f", {c}" for c in ([] if speed else ["run_id"]) + list(keep))
    narrow = f" WHERE {where}" if where else ""
    return (
        f"SELECT bucket_start, {', '.join(DIMENSIONS)}, impressions, {counts}{run_id} "
        f"FROM {relation}{narrow}"
    )


class VersionSides:
    """The sides of view versions, over ``relations``; thread-safe."""

    def __init__(self, relations: RelationCache) -> None:
        self.relations = relations

    def filtered(self, table: TableSnapshot, view: Definition) -> str:
        """``table``'s rows that ``view`` counts (its ``where``), as a relation name."""
        where = view.where
        if where is None:
            return self.relations.relation(table).name

        def create(base: str) -> str:
            filtered = f"{base}_{view_suffix(view.key)}"
            self.relations.create_table(
                filtered, f"SELECT * FROM {base} WHERE {where}", owner=table
            )
            return filtered

        return self.relations.derived(table, f"filtered:{view.key}", create)

    def columns(self, table: TableSnapshot) -> frozenset[str]:
        """The columns ``table``'s relation has (a table written before a column was added to
        its schema lacks it)."""

        def load(name: str) -> frozenset[str]:
            with self.relations.cursor() as cur:
                rows = cur.execute(
                    "SELECT column_name FROM duckdb_columns() WHERE table_name = $name",
                    {"name": name},
                ).fetchall()
            return frozenset(str(r[0]) for r in rows)

        return self.relations.derived(table, "columns", load)

    def batch(self, snapshot: LakeSnapshot, view: Definition) -> str:
        """``view``'s batch rows with the five counts of :data:`views.columns.MEASURES`: its
        table's relation, or a projection of it (a version without attribution)."""
        table = snapshot[batch_table(view)]
        name = self.relations.relation(table).name
        columns = self.columns(table)
        if view.attribution is not None and columns >= set(MEASURES):
            return name
        sql = side_rows_sql(
            name, columns=columns, attribution=view.attribution is not None, speed=False
        )
        return f"({sql})"

    def speed(self, table: TableSnapshot, view: Definition, *, per_key: bool = False) -> str:
        """``table``'s (speed/ctr's) rows that ``view`` counts (its ``where``), with the five
        counts of :data:`views.columns.MEASURES` as ``view`` counts them
        (:func:`side_rows_sql`): a relation name or a parenthesized SELECT.

        ``per_key``: one row per key (speed/ctr holds partial counts, several rows per key
        until the speed job rolls them up), for readers that match rows by key; the CTR query
        sums them anyway and reads the rows as stored (a filtered version's rows are copied
        once per table version)."""
        base = self.relations.relation(table).name
        rows = side_rows_sql(
            base,
            columns=self.columns(table),
            attribution=view.attribution is not None,
            speed=True,
            where=view.where,
        )
        if view.where is None and not per_key:
            return f"({rows})"

        def create(_: str) -> str:
            served = f"{base}_{'keyed_' if per_key else ''}{view_suffix(view.key)}"
            select = rows
            if per_key:
                key = ", ".join(["bucket_start", *DIMENSIONS])
                sums = ", ".join(f"sum({m})::BIGINT AS {m}" for m in MEASURES)
                select = f"SELECT {key}, {sums} FROM ({rows}) GROUP BY {key}"
            self.relations.create_table(served, select, owner=table)
            return served

        return self.relations.derived(
            table, f"{'keyed:' if per_key else ''}served:{view.key}", create
        )

    def reach(self, table: TableSnapshot, where: str | None) -> str:
        """``table``'s rows as :func:`serving_layer.ctr_sql.reach_sql` reads them: the key, the
        counts, :data:`views.columns.USER_LISTS`, :data:`views.columns.USER_NUMBERS` and
        :data:`views.columns.SKETCHES` (null
        where the table has not got them: written before reach was measured), narrowed by
        ``where`` (a version's trusted predicate)."""
        base = self.relations.relation(table).name
        columns = self.columns(table)
        types = {
            **dict.fromkeys(USER_LISTS, "VARCHAR[]"),
            **dict.fromkeys(USER_NUMBERS, "INTEGER[]"),
            **dict.fromkeys(SKETCHES, "BLOB"),
            "run_id": "VARCHAR",  # batch rows'
        }
        reach = ", ".join(
            name if name in columns else f"NULL::{kind} AS {name}" for name, kind in types.items()
        )
        narrow = f" WHERE {where}" if where else ""
        key = ", ".join(["bucket_start", *DIMENSIONS])
        return f"(SELECT {key}, impressions, clicks, {reach} FROM {base}{narrow})"


def view_suffix(key: str) -> str:
    """A view key as part of a DuckDB name: ``ctr@v2`` -> ``ctr_v2``."""
    return key.replace("@", "_")
