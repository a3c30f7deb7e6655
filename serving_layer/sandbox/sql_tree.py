"""What a query calls and reads, from DuckDB's own parse of it (``json_serialize_sql``): every
function call and every table named, with the CTEs in scope where it is named. Walked without
recursion, so the depth of a query costs no stack."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final


def called_functions(tree: object) -> Iterator[tuple[str | None, bool]]:
    """Every function call in a ``json_serialize_sql`` tree: its name as written (None: a call
    whose name the tree does not give as text), and whether it is a table function (a
    ``TABLE_FUNCTION`` reference).

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
            yield (name if isinstance(name, str) else None), table
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
