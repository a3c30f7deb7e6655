"""The SQL sandbox's database: which statements may run, and a DuckDB that cannot write.

Read-only by construction, in two independent layers:

1. **The statement.** DuckDB's own parser decides: exactly one statement, of type SELECT, that
   ``json_serialize_sql`` (which serializes queries and nothing else) accepts, starting with a
   query keyword; or ``EXPLAIN`` followed directly by such a query (never ``EXPLAIN ANALYZE``,
   which runs the statement). Comments are skipped by DuckDB's tokenizer, so nested comments
   mean what DuckDB thinks they mean. Every function the serialized statement calls (in
   subqueries, CTEs, window clauses, lambdas, ``COLUMNS(…)``, operators DuckDB spells as
   functions) must be on an allow-list: the SQL library an analyst needs
   (:data:`ALLOWED_FUNCTIONS`, table functions :data:`ALLOWED_TABLE_FUNCTIONS`), not DuckDB's
   scans of Python objects by address, file readers, catalog, settings or ``query()``.
   Every table it names must be one of the views the key may read (:func:`view_names`) or
   a CTE of its own in scope: not DuckDB's catalog (``information_schema``, ``pg_catalog``,
   ``duckdb_tables``…), not a file path.
2. **The database.** A fresh in-memory DuckDB with external access off from its first moment and
   no allowed paths: it cannot open, create or write any file. The lake's tables reach it as
   Arrow datasets over one snapshot's Parquet files, which Arrow opens for reading only.
   Python replacement scans are off and the configuration is locked.

Files rewritten by delta-rs (``DELETE``, ``OPTIMIZE``: the platform's own clean-ups among them)
record Arrow's ``string_view`` and ``binary_view`` types, which Arrow's dataset scanner cannot
filter ("Function 'equal' has no kernel matching input types (string, string_view)", and no
``array_filter`` kernel for them). Those files (``view_files``: found from their footers when a
query first fails on one, and remembered by the worker) are read with their own types and no
filter pushed into Arrow (DuckDB filters their rows); the others keep DuckDB's filter pushdown.

The worker processes that run these databases add OS limits (see :mod:`serving_layer.sandbox.pool`).
"""

from __future__ import annotations

import difflib
import json
import re
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

import duckdb
import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from lake.catalog import (
    BATCH_COVERAGE,
    BATCH_DRIFT,
    MASTER_EVENTS,
    MASTER_REJECTED,
    SERVED,
    SERVED_BY_NAME,
    SPEED_CTR,
    batch_table,
)
from lake.coverage.log import runs_from_duckdb
from lake.coverage.staleness import stale_sql
from lake.registry import Registry
from lake.storage import arrow_filesystem, store_path
from serving_layer.json_values import jsonable
from serving_layer.merge_rule import merged_sql, side_rows_sql
from serving_layer.snapshots import TableSnapshot
from views import sketches
from views.access import Access, Scope
from views.columns import SKETCHES, USER_LISTS
from views.definitions import versions

SANDBOX_VIEWS: Final[Mapping[str, str]] = {t.sql_name: t.name for t in SERVED}
# Raw data: events with user ids, rejected payloads (an admin key's only).
RAW_VIEWS: Final = frozenset({MASTER_EVENTS.sql_name, MASTER_REJECTED.sql_name})
# Counted over every campaign, with no campaign to narrow them by (not an advertiser's).
UNSCOPED_VIEWS: Final = frozenset({BATCH_DRIFT.sql_name})
VERSION_VIEWS: Final = tuple(
    f"{name}_v{d.version}"
    for d in versions("ctr")
    for name in ("covered", "stale", "ctr", "speed", "arrivals")
)
VIEW_NAMES: Final = (*SANDBOX_VIEWS, "covered", "stale", "ctr", *VERSION_VIEWS)
_QUERY_KEYWORDS: Final = frozenset(
    {"SELECT", "WITH", "FROM", "VALUES", "TABLE", "DESCRIBE", "SHOW", "SUMMARIZE", "("}
)
_FIRST_WORD: Final = re.compile(r"\(|[A-Za-z_]+")
_ALLOWED: Final = (
    "the SQL endpoint is read-only and accepts one query (SELECT, WITH, FROM, VALUES, TABLE, "
    "DESCRIBE, SHOW, SUMMARIZE, or EXPLAIN of a query) over the views " + ", ".join(VIEW_NAMES)
)

# The SQL library an analyst needs, by kind (names as DuckDB 1.5.5's duckdb_functions() has
# them, lower case; operators as json_serialize_sql spells them). What is not here is refused
# before a worker sees it: scans of Python or Arrow objects by address (pandas_scan segfaults),
# file readers and globs, query() and query_table(), catalog, settings, variables, sequences,
# sleep, logging, json_serialize_sql and friends.
_FUNCTION_NAMES: Final = {
    "aggregates": """
any_value approx_count_distinct approx_quantile approx_top_k arbitrary arg_max arg_max_null
arg_min arg_min_null argmax argmin array_agg avg bit_and bit_or bit_xor bool_and bool_or corr
count count_if count_star countif covar_pop covar_samp entropy favg first fsum geomean
geometric_mean group_concat histogram histogram_exact kahan_sum kurtosis kurtosis_pop last list
listagg mad max max_by mean median min min_by mode product quantile quantile_cont quantile_disc
regr_avgx regr_avgy regr_count regr_intercept regr_r2 regr_slope regr_sxx regr_sxy regr_syy
reservoir_quantile sem skewness stddev stddev_pop stddev_samp string_agg sum sumkahan var_pop
var_samp variance wavg weighted_avg
""",
    "windows": """
cume_dist dense_rank fill first_value lag last_value lead nth_value ntile percent_rank rank
rank_dense row_number
""",
    "operators": """
!__postfix !~~ !~~* % & && * ** + - ->> / // <-> << <=> <@ >> @ @> ^ ^@ | || ~ ~~ ~~* ~~~
""",
    "math": """
abs acos acosh add asin asinh atan atan2 atanh bit_count cbrt ceil ceiling cos cosh cot degrees
divide even exp factorial fdiv floor fmod gamma gcd greatest greatest_common_divisor isfinite
isinf isnan lcm least least_common_multiple lgamma ln log log10 log2 mod multiply nextafter pi
pow power radians random round round_even roundbankers sign signbit sin sinh sqrt subtract tan
tanh trunc xor
""",
    "text": """
ascii bar base64 bin bit_length char_length character_length chr concat concat_ws contains
damerau_levenshtein decode editdist3 encode ends_with format format_bytes from_base64
from_binary from_hex hamming hex ilike_escape instr jaccard jaro_similarity
jaro_winkler_similarity lcase left left_grapheme length length_grapheme levenshtein like_escape
lower lpad ltrim md5 md5_number mismatches nfc_normalize not_ilike_escape not_like_escape
octet_length ord position prefix printf regexp_escape regexp_extract regexp_extract_all
regexp_full_match regexp_matches regexp_replace regexp_split_to_array repeat replace reverse
right right_grapheme rpad rtrim sha1 sha256 split split_part starts_with str_split
str_split_regex string_split string_split_regex string_to_array strip_accents strlen strpos
substr substring substring_grapheme suffix to_base64 to_binary to_hex translate trim ucase
unbin unhex unicode upper url_decode url_encode
""",
    "time": """
age century current_date current_localtime current_localtimestamp date_add date_diff date_part
date_sub date_trunc datediff datepart datesub datetrunc day dayname dayofmonth dayofweek
dayofyear days_in_month decade epoch epoch_ms epoch_ns epoch_us era get_current_time
get_current_timestamp hour isodow isoyear julian last_day make_date make_time make_timestamp
make_timestamp_ms make_timestamp_ns make_timestamptz microsecond millennium millisecond minute
month monthname nanosecond normalized_interval now quarter second strftime strptime time_bucket
timezone timezone_hour timezone_minute to_centuries to_days to_decades to_hours to_microseconds
to_millennia to_milliseconds to_minutes to_months to_quarters to_seconds to_timestamp to_weeks
to_years today transaction_timestamp try_strptime week weekday weekofyear year yearweek
""",
    "lists": """
aggregate apply array_aggr array_aggregate array_append array_apply array_cat array_concat
array_contains array_cosine_similarity array_distance array_distinct array_dot_product
array_extract array_filter array_grade_up array_has array_has_all array_has_any array_indexof
array_intersect array_length array_pop_back array_pop_front array_position array_prepend
array_push_back array_push_front array_reduce array_resize array_reverse array_reverse_sort
array_select array_slice array_sort array_to_string array_transform array_unique array_value
array_where array_zip cardinality filter flatten generate_series grade_up len list_aggr
list_aggregate list_any_value list_append list_apply list_approx_count_distinct list_avg
list_bool_and list_bool_or list_cat list_concat list_contains list_cosine_similarity list_count
list_distance list_distinct list_dot_product list_element list_entropy list_extract list_filter
list_first list_grade_up list_has list_has_all list_has_any list_histogram list_indexof
list_intersect list_kurtosis list_last list_mad list_max list_median list_min list_mode
list_pack list_position list_prepend list_product list_reduce list_resize list_reverse
list_reverse_sort list_select list_skewness list_slice list_sort list_stddev_pop
list_stddev_samp list_string_agg list_sum list_transform list_unique list_value list_var_pop
list_var_samp list_where list_zip range reduce unnest
""",
    "structs": """
element_at map map_concat map_contains map_contains_entry map_contains_value map_entries
map_extract map_extract_value map_from_entries map_keys map_values row struct_concat
struct_contains struct_extract struct_extract_at struct_has struct_insert struct_keys
struct_pack struct_position struct_update struct_values
""",
    "json": """
array_to_json from_json from_json_strict json json_array json_array_length json_contains
json_exists json_extract json_extract_path json_extract_path_text json_extract_string
json_group_array json_group_object json_keys json_merge_patch json_object json_quote
json_structure json_transform json_transform_strict json_type json_valid json_value row_to_json
to_json
""",
    "sketches": "sketch_union sketch_estimate",  # views.sketches.register
    "other": """
enum_code enum_first enum_last enum_range enum_range_boundary gen_random_uuid hash nullif
typeof union_extract union_tag union_value uuid uuid_extract_timestamp uuid_extract_version
uuidv4 uuidv7
""",
}
FUNCTION_GROUPS: Final[Mapping[str, frozenset[str]]] = {
    kind: frozenset(names.split()) for kind, names in _FUNCTION_NAMES.items()
}
ALLOWED_FUNCTIONS: Final[frozenset[str]] = frozenset().union(*FUNCTION_GROUPS.values())
ALLOWED_TABLE_FUNCTIONS: Final = frozenset({"generate_series", "range", "unnest"})
FUNCTIONS_HINT: Final = (
    "the allowed functions: GET /api/v1/sql/functions, or ALLOWED_FUNCTIONS in "
    "serving_layer/sandbox/database.py"
)
# Table functions that read files: the refusal says why there is no way around it.
_FILE_READERS: Final = re.compile(r"read_|parquet_|sniff_csv$|glob$")

TruncatedBy = Literal["max_rows", "max_bytes"]
_T = TypeVar("_T")


class SqlRefusedError(ValueError):
    """The statement is not a single read-only query (or calls a function not allowed)."""


class FunctionRefusedError(SqlRefusedError):
    """The query calls ``function``, which is not on the allow-list."""

    def __init__(self, message: str, function: str) -> None:
        super().__init__(message)
        self.function = function


class SqlError(RuntimeError):
    """The query failed: a syntax error, an unknown table, a denied file, a resource limit, …"""


@dataclass(frozen=True)
class SqlResult:
    """A query's answer; ``rows`` hold JSON-ready values (:func:`jsonable`)."""

    columns: list[str]
    types: list[str]
    rows: list[list[object]]
    truncated_by: TruncatedBy | None
    elapsed_s: float

    @property
    def truncated(self) -> bool:
        return self.truncated_by is not None


class TableRefusedError(SqlRefusedError):
    """The query reads ``table``, which is not one of the views the key may query."""

    def __init__(self, message: str, table: str) -> None:
        super().__init__(message)
        self.table = table


def check_read_only(sql: str, access: Access | None = None) -> str:
    """The statement to run for ``sql``, or :class:`SqlRefusedError` saying why not: it must
    be one read-only query that calls allowed functions only and reads only the views
    ``access`` may query (:func:`view_names`; None: an admin's) and its own CTEs.

    Raises :class:`SqlError` when DuckDB cannot parse it.
    """
    if not sql.strip():
        raise SqlRefusedError("the query is empty")
    parser = duckdb.connect(config={"enable_external_access": False})
    try:
        statements = _statements(parser, sql)
        if len(statements) != 1:
            raise SqlRefusedError(f"one statement per query, got {len(statements)}")
        tokens = duckdb.tokenize(sql)
        if statements[0].type == duckdb.StatementType.EXPLAIN and len(tokens) > 1:
            option = _word(sql, tokens, 1)
            if option in ("ANALYZE", "ANALYSE", "("):
                raise SqlRefusedError(
                    "EXPLAIN ANALYZE (and EXPLAIN with options) is not allowed: it runs the "
                    "statement; EXPLAIN <query> shows the plan"
                )
            inner = sql[tokens[1][0] :]
            _require_query(parser, inner, access)
            return f"EXPLAIN {inner}"
        _require_query(parser, sql, access)
        return sql
    finally:
        parser.close()


def _require_query(
    parser: duckdb.DuckDBPyConnection, sql: str, access: Access | None = None
) -> None:
    statements = _statements(parser, sql)
    tokens = duckdb.tokenize(sql)
    keyword = _word(sql, tokens, 0) if tokens else ""
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        kind = statements[0].type.name if len(statements) == 1 else f"{len(statements)}"
        raise SqlRefusedError(f"{keyword or kind} statements are not allowed: {_ALLOWED}")
    # PRAGMA parses as a SELECT of a pragma function; json_serialize_sql takes real queries only.
    serialized = parser.execute("SELECT json_serialize_sql($1::VARCHAR)", [sql]).fetchone()
    if keyword not in _QUERY_KEYWORDS or serialized is None:
        raise SqlRefusedError(f"{keyword} statements are not allowed: {_ALLOWED}")
    try:
        # json, not orjson: constants may serialize as Infinity, NaN or integers past 64 bits.
        tree = json.loads(serialized[0])
    except RecursionError:
        # Python's recursion limit: about 400 nested expressions (DuckDB's own limit is 1,000).
        raise SqlRefusedError("the query nests too deeply to be checked") from None
    if not isinstance(tree, dict) or tree.get("error", True):
        raise SqlRefusedError(f"{keyword} statements are not allowed: {_ALLOWED}")
    for name, table in called_functions(tree):
        _require_allowed(name, table=table)
    readable = frozenset(view_names(access))
    for ref in table_references(tree):
        _require_readable(ref, readable, access)


def called_functions(tree: object) -> Iterator[tuple[str, bool]]:
    """Every function call in a ``json_serialize_sql`` tree: its name as written, and whether
    it is a table function (a ``TABLE_FUNCTION`` reference).

    Any node with a ``function_name`` is a call (scalar, aggregate, window, macro, operator);
    walked without recursion, so the depth of the query costs no stack. A qualifier
    (``main.abs``, or ``x.abs()``: a method call on column ``x``) does not matter: users can
    create no function, and every allowed name exists in DuckDB's ``main`` schema only."""
    stack: list[tuple[object, bool]] = [(tree, False)]
    while stack:
        node, table = stack.pop()
        if isinstance(node, list):
            stack.extend((child, False) for child in node)
            continue
        if not isinstance(node, dict):
            continue
        name = node.get("function_name")
        if name is not None or node.get("class") in ("FUNCTION", "WINDOW") or table:
            if not isinstance(name, str):
                raise SqlRefusedError("the query has a function call the check cannot read")
            yield name, table
        is_ref = node.get("type") == "TABLE_FUNCTION"
        stack.extend((value, is_ref and key == "function") for key, value in node.items())


@dataclass(frozen=True)
class TableReference:
    """A table a query names: ``schema`` and ``catalog`` as written (empty: none), and whether
    a CTE of the query by that name is in scope (``cte``)."""

    name: str
    schema: str = ""
    catalog: str = ""
    cte: bool = False

    @property
    def written(self) -> str:
        return ".".join(part for part in (self.catalog, self.schema, self.name) if part)


_PATH_LIKE: Final = re.compile(r"[/\\.*?:]")
# SHOW TABLES and SHOW ALL TABLES (DESCRIBE with no table): the database's own views only.
_TABLE_LISTINGS: Final = frozenset({'"tables"', "__show_tables_expanded"})


def table_references(tree: object) -> Iterator[TableReference]:
    """Every table a ``json_serialize_sql`` tree reads by name, with the CTEs in scope where
    it is named: a WITH clause's names are seen by its query and, in order, by the CTEs
    written after each (DuckDB resolves a name used before its CTE in the catalog); a
    recursive CTE sees itself. ``SHOW <name>`` (no query) is a reference to ``<name>``."""
    stack: list[tuple[object, frozenset[str]]] = [(tree, frozenset())]
    while stack:
        node, scope = stack.pop()
        if isinstance(node, list):
            stack.extend((child, scope) for child in node)
            continue
        if not isinstance(node, dict):
            continue
        kind = node.get("type")
        if kind == "BASE_TABLE":
            name = str(node.get("table_name", ""))
            yield TableReference(
                name,
                str(node.get("schema_name") or ""),
                str(node.get("catalog_name") or ""),
                cte=name.lower() in scope,
            )
        elif kind == "SHOW_REF" and node.get("query") is None:
            name = str(node.get("table_name", ""))
            if name not in _TABLE_LISTINGS:
                yield TableReference(name.strip('"'), str(node.get("schema_name") or ""))
        elif kind == "RECURSIVE_CTE_NODE":
            scope = scope | {str(node.get("cte_name", "")).lower()}
        ctes = node.get("cte_map")
        if isinstance(ctes, dict) and ctes.get("map"):
            seen = set(scope)
            for entry in ctes["map"]:
                stack.append((entry.get("value"), frozenset(seen)))
                seen.add(str(entry.get("key", "")).lower())
            scope = frozenset(seen)
        stack.extend((value, scope) for key, value in node.items() if key != "cte_map")


def view_names(access: Access | None = None) -> tuple[str, ...]:
    """The views a query of ``access`` (None: an admin's) may read: its tables of
    :func:`sandbox_views`, the merged views and their versions."""
    return (*sandbox_views(access), "covered", "stale", "ctr", *VERSION_VIEWS)


def _require_readable(ref: TableReference, readable: frozenset[str], access: Access | None) -> None:
    if ref.schema or ref.catalog:
        raise TableRefusedError(
            f"the table {ref.written} is not allowed: a query reads the views by their names "
            f"alone ({', '.join(sorted(readable))}), or its own CTEs",
            ref.written,
        )
    name = ref.name.lower()
    if ref.cte or name in readable:
        return
    if name in SANDBOX_VIEWS and access is not None:
        raise TableRefusedError(
            f"the table {ref.name} is not readable with an {access.role} key "
            f"({access.name!r}); ask an admin for a key with access to it",
            ref.name,
        )
    files = " (the sandbox reads no files)" if _PATH_LIKE.search(ref.name) else ""
    close = difflib.get_close_matches(name, sorted(readable), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise TableRefusedError(
        f"the table {ref.name} is not allowed{files}{hint}: a query reads the views "
        + ", ".join(sorted(readable))
        + " and its own CTEs (SHOW TABLES lists the views)",
        ref.name,
    )


def _require_allowed(name: str, *, table: bool) -> None:
    # DuckDB folds ASCII case only; every allowed name is ASCII.
    key = name.lower() if name.isascii() else name
    if table:
        if key in ALLOWED_TABLE_FUNCTIONS:
            return
        why = (
            " (the sandbox reads no files: file system operations are disabled)"
            if _FILE_READERS.match(key)
            else ""
        )
        raise FunctionRefusedError(
            f"the table function {name}() is not allowed{why}; the allowed table functions: "
            + ", ".join(sorted(ALLOWED_TABLE_FUNCTIONS)),
            name,
        )
    if key not in ALLOWED_FUNCTIONS:
        raise FunctionRefusedError(f"the function {name}() is not allowed; {FUNCTIONS_HINT}", name)


def _statements(parser: duckdb.DuckDBPyConnection, sql: str) -> list[duckdb.Statement]:
    try:
        return parser.extract_statements(sql)
    except duckdb.Error as exc:
        raise SqlError(_clean(exc)) from None


def _word(sql: str, tokens: Sequence[tuple[int, object]], index: int) -> str:
    match = _FIRST_WORD.match(sql, tokens[index][0])
    return match.group(0).upper() if match else sql[tokens[index][0] : tokens[index][0] + 20]


def sandbox_views(access: Access | None = None) -> Mapping[str, str]:
    """The tables ``access`` may query (SQL name -> table name; None: an admin's): an admin
    every one of :data:`SANDBOX_VIEWS`, an analyst all but the raw ones, an advertiser neither
    the raw ones nor those counted over every campaign."""
    if access is None or access.raw_tables:
        return SANDBOX_VIEWS
    hidden = RAW_VIEWS if access.sees_everything else RAW_VIEWS | UNSCOPED_VIEWS
    return {view: name for view, name in SANDBOX_VIEWS.items() if view not in hidden}


def hidden_views(access: Access | None = None) -> frozenset[str]:
    """The tables of :data:`SANDBOX_VIEWS` that ``access`` may not query."""
    return frozenset(SANDBOX_VIEWS) - set(sandbox_views(access))


def open_sandbox(
    tables: Mapping[str, TableSnapshot],
    *,
    memory_limit_bytes: int,
    threads: int = 1,
    access: Access | None = None,
    view_files: Collection[str] = frozenset(),
) -> duckdb.DuckDBPyConnection:
    """A fresh database that can touch no file, with ``tables`` (one per entry of
    :func:`sandbox_views` of ``access``, by view name) as read-only views plus ``covered`` (the
    merged covered intervals), ``stale`` (arrivals no batch run has counted yet) and ``ctr``
    (the merged view), and the same per version.

    For an advertiser every table with a ``campaign_id`` holds the scope's rows only, and
    coverage no row counts, before any view is made of them: the database holds no other row,
    so no query, function or view of it can reach one. Tables ``access`` may not query are not
    in the database at all."""
    allowed = sandbox_views(access)
    missing = set(allowed) - set(tables)
    if missing:
        raise ValueError(f"'tables' lacks the views {sorted(missing)}")
    scope = access.scope if access is not None else None
    con = duckdb.connect(
        config={
            "enable_external_access": False,
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
            "threads": threads,
            "memory_limit": f"{max(memory_limit_bytes // 2**20, 16)}MB",
            "temp_directory": "",
        }
    )
    try:
        con.execute("SET TimeZone = 'UTC'")
        users_hidden = access is not None and not access.raw_tables
        # User-level data is an admin's: below admin, sketches are sealed (they hold every
        # user's hash in their small modes) and can only be unioned and estimated.
        seal = sketches.SketchSeal() if users_hidden else None
        sketches.register(con, seal)
        for view, name in allowed.items():
            rows = _rows(con, tables[view], view_files)
            table = SERVED_BY_NAME[name]
            if seal is not None:
                rows = _without_users(rows, seal)
            if scope is not None:
                if "campaign_id" in table.schema.names:
                    rows = rows.filter(_in_scope(scope))
                if table is BATCH_COVERAGE:  # rows written: a count over every campaign
                    rows = rows.project(
                        ", ".join(
                            "NULL::BIGINT AS rows_written" if c == "rows_written" else c
                            for c in table.schema.names
                        )
                    )
            if table.summed_by:  # partial counts (speed/ctr): one row per key
                rows = rows.aggregate(table.summed_select(), ", ".join(table.summed_by))
            rows.create_view(view)
        _create_version_views(con)
        con.execute("SET python_enable_replacements = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con


def _without_users(
    rows: duckdb.DuckDBPyRelation, seal: sketches.SketchSeal
) -> duckdb.DuckDBPyRelation:
    """``rows`` without user ids (the lists: raw data, an admin's) and with sealed sketches."""
    if not (set(USER_LISTS) | set(SKETCHES)) & set(rows.columns):
        return rows
    return rows.project(
        ", ".join(
            f"{seal.function}({c}) AS {c}" if c in SKETCHES else c
            for c in rows.columns
            if c not in USER_LISTS
        )
    )


def _in_scope(scope: Scope) -> duckdb.Expression:
    """The rows of ``scope`` as a DuckDB expression (its ids constants, never SQL text)."""
    condition = duckdb.ColumnExpression("campaign_id").isin(
        *(duckdb.ConstantExpression(c) for c in scope.campaigns)
    )
    if scope.ads:
        condition = condition & duckdb.ColumnExpression("ad_id").isin(
            *(duckdb.ConstantExpression(a) for a in scope.ads)
        )
    return condition


def _create_version_views(con: duckdb.DuckDBPyConnection) -> None:
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


def _rows(
    con: duckdb.DuckDBPyConnection, table: TableSnapshot, view_files: Collection[str]
) -> duckdb.DuckDBPyRelation:
    """The table's files as Arrow datasets (partition values from the paths, as Delta writes
    them), or an empty table of its schema; columns of the catalog's schema that the table
    lacks (written before they were added) are null. The files of ``view_files`` are read
    with Arrow's view types, behind a LIMIT that no filter is pushed through."""
    schema = table.schema
    for column in SERVED_BY_NAME[table.name].schema:
        if column.name not in schema.names:
            schema = schema.append(column)
    if not table.files:
        return con.from_arrow(schema.empty_table())
    plain = [f for f in table.files if f not in view_files]
    viewed = [f for f in table.files if f in view_files]
    parts = []
    if plain:
        parts.append(con.from_arrow(_dataset(table, plain, schema)))
    if viewed:
        typed = view_typed(schema, keep=table.partition_columns)
        # DuckDB pushes no filter through a LIMIT: Arrow only projects these files' columns.
        parts.append(con.from_arrow(_dataset(table, viewed, typed)).limit(_NO_LIMIT))
    # UNION ALL: the same columns in the same order.
    return parts[0] if len(parts) == 1 else parts[0].union(parts[1])


# More rows than any table holds: a LIMIT that limits nothing, a barrier to filter pushdown.
_NO_LIMIT: Final = 2**63 - 1
# The error a filter on a view-typed column gets from Arrow's scanner.
VIEW_TYPE_ERROR: Final = re.compile(r"has no kernel matching input types \([^)]*_view")


def _dataset(table: TableSnapshot, files: Sequence[str], schema: pa.Schema) -> ds.Dataset:
    filesystem, root = arrow_filesystem(table.path)
    partitioning = None
    if table.partition_columns:
        partitioning = ds.partitioning(
            pa.schema([table.schema.field(c) for c in table.partition_columns]), flavor="hive"
        )
    return ds.dataset(
        [store_path(f) for f in files],
        schema=schema,
        format="parquet",
        filesystem=filesystem,
        partitioning=partitioning,
        partition_base_dir=root,
    )


def tables_read(statement: str, tables: Mapping[str, _T]) -> list[_T]:
    """The tables of ``tables`` (by view name) a checked ``statement`` can read: those it
    names, and every one but the raw tables when it names a merged view (``ctr``, ``stale``,
    ``ctr_v3``, …, made of all the others)."""
    query = statement.removeprefix("EXPLAIN ")
    parser = duckdb.connect(config={"enable_external_access": False})
    try:
        row = parser.execute("SELECT json_serialize_sql($1::VARCHAR)", [query]).fetchone()
    finally:
        parser.close()
    assert row is not None
    named = {r.name.lower() for r in table_references(json.loads(row[0])) if not r.cte}
    merged = bool(named - set(SANDBOX_VIEWS))
    return [
        table
        for view, table in tables.items()
        if view in named or (merged and view not in RAW_VIEWS)
    ]


def view_typed_files(tables: Iterable[TableSnapshot], known: Mapping[str, bool]) -> dict[str, bool]:
    """Whether each file of ``tables`` not in ``known`` records a view type (its footer, read
    with Arrow): the files :func:`open_sandbox` must read without filter pushdown."""
    found: dict[str, bool] = {}
    for table in tables:
        unknown = [f for f in table.files if f not in known and f not in found]
        if not unknown:
            continue
        filesystem, _ = arrow_filesystem(table.path)
        for path in unknown:
            physical = pq.read_schema(store_path(path), filesystem=filesystem)
            found[path] = any(_has_view(f.type) for f in physical)
    return found


def view_typed(schema: pa.Schema, *, keep: Sequence[str] = ()) -> pa.Schema:
    """``schema`` with its strings and binaries (nested ones too) as Arrow's view types, but for
    the columns in ``keep`` (partition values, typed from the paths)."""
    return pa.schema(
        [f if f.name in keep else f.with_type(_view_type(f.type)) for f in schema],
        metadata=schema.metadata,
    )


def _view_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pa.string_view()
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pa.binary_view()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(kind.value_field.with_type(_view_type(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_view_type(f.type)) for f in kind])
    return kind


def _has_view(kind: pa.DataType) -> bool:
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _has_view(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_has_view(f.type) for f in kind)
    return False


def execute(
    con: duckdb.DuckDBPyConnection,
    statement: str,
    *,
    max_rows: int,
    max_bytes: int,
    timeout_s: float,
) -> SqlResult:
    """Run a checked ``statement``; rows stop at ``max_rows`` rows or ``max_bytes`` of JSON.

    A timer interrupts DuckDB at ``timeout_s`` (it notices between row batches; the worker
    pool's kill is the hard limit)."""
    started = time.perf_counter()
    timer = threading.Timer(timeout_s, con.interrupt)
    timer.start()
    try:
        cursor = con.execute(statement)
        if cursor.description is None:  # pragma: no cover - every query has one
            raise SqlError("the statement returned no result")
        columns = [d[0] for d in cursor.description]
        types = [str(d[1]) for d in cursor.description]
        rows: list[list[object]] = []
        size = 2  # the enclosing brackets
        truncated_by: TruncatedBy | None = None
        while truncated_by is None and (batch := cursor.fetchmany(1024)):
            for record in batch:
                if len(rows) == max_rows:
                    truncated_by = "max_rows"
                    break
                row = [jsonable(v) for v in record]
                size += len(orjson.dumps(row)) + 1
                if size > max_bytes:
                    truncated_by = "max_bytes"
                    break
                rows.append(row)
    except duckdb.InterruptException:
        raise SqlError(f"the query was stopped at the time limit of {timeout_s:g} s") from None
    except duckdb.Error as exc:
        raise SqlError(_clean(exc)) from None
    finally:
        timer.cancel()
    return SqlResult(columns, types, rows, truncated_by, time.perf_counter() - started)


def _clean(exc: duckdb.Error) -> str:
    # DuckDB messages start with their kind ("Catalog Error: …"), which is what a user needs.
    return str(exc).strip()
