"""reference/configuration.md: every ``BaseSettings`` class of the code, each field with its
environment variable, type, default, bounds and the comment written above it in the class (the
comments are the descriptions); then the variables the scripts read outside those classes."""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import re
import textwrap
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import AliasChoices, ByteSize, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from reference import markdown
from reference.environment import other_variables

ROOT: Final = Path(__file__).resolve().parent.parent
# The packages whose settings are the platform's (tests and benchmarks have their own knobs).
PACKAGES: Final = (
    "runtime", "lake", "ingest", "master_dataset", "speed_layer", "api", "infra", "alerts",
)  # fmt: skip
_SECTION: Final = re.compile(r"^--\s+(.+?)\s+-{3,}$")
# Comments for the tools, not the reader.
_PRAGMA: Final = re.compile(r"^(fmt|type|noqa|pragma)\b")
_BOUNDS: Final = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}


@dataclass(frozen=True)
class Comments:
    """A class body's comments by line (1-based, in the class's own source): whole-line ones
    and those after code."""

    whole: dict[int, str]
    trailing: dict[int, str]


@dataclass(frozen=True)
class Setting:
    variables: tuple[str, ...]
    kind: str
    default: str
    bounds: str
    meaning: str
    section: str


def settings_classes() -> list[type[BaseSettings]]:
    """Every ``BaseSettings`` subclass declared in :data:`PACKAGES`, in path order."""
    found: list[type[BaseSettings]] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            names = [
                node.name
                for node in tree.body
                if isinstance(node, ast.ClassDef)
                and any(isinstance(b, ast.Name) and b.id == "BaseSettings" for b in node.bases)
            ]
            if names:
                module = importlib.import_module(
                    ".".join(path.relative_to(ROOT).with_suffix("").parts)
                )
                found += [getattr(module, name) for name in names]
    return found


def _comments(source: str) -> Comments:
    whole: dict[int, str] = {}
    trailing: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            text = token.string.lstrip("#").strip()
            line = token.start[0]
            (whole if token.line.strip().startswith("#") else trailing)[line] = text
    return Comments(whole, trailing)


def _above(comments: Comments, line: int) -> tuple[list[str], int]:
    """The comment block that ends on the line above ``line``, and the line it starts on."""
    block: list[str] = []
    while line - 1 in comments.whole and not _SECTION.match(comments.whole[line - 1]):
        line -= 1
        block.insert(0, comments.whole[line])
    return block, line


def _env_names(name: str, info: FieldInfo, prefix: str) -> tuple[str, ...]:
    alias = info.validation_alias
    if isinstance(alias, str):
        return (alias,)
    if isinstance(alias, AliasChoices):
        names = tuple(c for c in alias.choices if isinstance(c, str) and c.isupper())
        if names:
            return names
    return (f"{prefix}{name}".upper(),)


def _kind(annotation: Any) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = re.sub(r"\b(?:typing|pathlib|pydantic(?:\.types)?|collections\.abc)\.", "", text)
    text = text.replace("NoneType", "None")
    if isinstance(annotation, type) and issubclass(annotation, BaseSettings):
        return f"the variables of {annotation.__name__}"
    if "dict[" in text:
        return "JSON object"
    if "list[" in text:
        return "JSON array"
    return text.replace("ByteSize", "bytes (e.g. 1GiB)").replace("SecretStr", "secret")


def _default(info: FieldInfo, factory_source: str | None) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        if info.default_factory in (dict, list):
            return markdown.code("{}" if info.default_factory is dict else "[]")
        return "computed: " + markdown.code((factory_source or "").removeprefix("lambda: "))
    value = info.default
    if value is None or value is PydanticUndefined or isinstance(value, SecretStr):
        return "unset"
    if _octal(info):
        return markdown.code(f"{value:03o}")
    return markdown.code(_value(value))


def _octal(info: FieldInfo) -> bool:
    """Whether users write the field in octal (a umask): ``json_schema_extra={"octal": True}``;
    its default and bounds are shown so."""
    extra = info.json_schema_extra
    return isinstance(extra, dict) and extra.get("octal") is True


def _value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, ByteSize):
        return value.human_readable(separator=" ")
    return str(value).replace(str(ROOT), "<project>")


def _bounds(info: FieldInfo) -> str:
    found: list[str] = []
    for item in info.metadata:
        for attribute, sign in _BOUNDS.items():
            bound = getattr(item, attribute, None)
            if bound is not None:
                found.append(f"{sign} {bound:03o}" if _octal(info) else f"{sign} {bound}")
        pattern = getattr(item, "pattern", None)
        if pattern:
            found.append("matches " + markdown.code(pattern))
    return ", ".join(found)


def _factories(classdef: ast.ClassDef, source: str) -> dict[str, str]:
    """Each field's ``default_factory=`` as written (what a computed default computes)."""
    found: dict[str, str] = {}
    for node in classdef.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if isinstance(node.value, ast.Call):
            for keyword in node.value.keywords:
                if keyword.arg == "default_factory":
                    found[node.target.id] = ast.get_source_segment(source, keyword.value) or ""
    return found


def settings_of(cls: type[BaseSettings]) -> Iterator[Setting]:
    """``cls``'s fields in their order, each described by the comment block right above it and
    the comment after it on its own lines."""
    source = textwrap.dedent(inspect.getsource(cls))
    classdef = ast.parse(source).body[0]
    assert isinstance(classdef, ast.ClassDef)
    comments = _comments(source)
    factories = _factories(classdef, source)
    prefix = str(cls.model_config.get("env_prefix") or "")
    fields = cls.model_fields
    section = ""
    for node in classdef.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        block, start = _above(comments, node.lineno)
        header = comments.whole.get(start - 1, "")
        if _SECTION.match(header):
            section = _SECTION.match(header).group(1)  # type: ignore[union-attr]
        end = node.end_lineno or node.lineno
        after = [
            comments.trailing[n]
            for n in range(node.lineno, end + 1)
            if n in comments.trailing and not _PRAGMA.match(comments.trailing[n])
        ]
        info = fields[name]
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseSettings):
            continue  # a nested settings object: its own section says its variables
        octal = _octal(info)
        yield Setting(
            variables=_env_names(name, info, prefix),
            kind="octal int" if octal else _kind(info.annotation),
            default=_default(info, factories.get(name)),
            bounds=_bounds(info),
            meaning=" ".join([*block, *after]).strip(),
            section=section,
        )


def _class_section(cls: type[BaseSettings]) -> Iterator[str]:
    module = cls.__module__.replace(".", "/") + ".py"
    yield f"## {cls.__name__}"
    yield ""
    # The class's own docstring only: inspect.getdoc would inherit pydantic's BaseSettings one.
    yield f"`{module}`. " + " ".join(inspect.cleandoc(cls.__dict__.get("__doc__") or "").split())
    yield ""
    section: str | None = None
    rows: list[list[object]] = []
    for setting in settings_of(cls):
        if setting.section != section and rows:
            yield markdown.table(("variable", "type", "default", "bounds", "meaning"), rows)
            rows = []
        if setting.section != section and setting.section:
            yield f"**{setting.section}**\n"
        section = setting.section
        variables = " or ".join(markdown.code(v) for v in setting.variables)
        rows.append([variables, setting.kind, setting.default, setting.bounds, setting.meaning])
    if rows:
        yield markdown.table(("variable", "type", "default", "bounds", "meaning"), rows)


def render() -> str:
    """The configuration page."""
    classes = settings_classes()
    body: list[str] = []
    for cls in classes:
        body += [*_class_section(cls), ""]
    declared = {v.upper() for cls in classes for s in settings_of(cls) for v in s.variables}
    body += list(other_variables(ROOT, declared))
    intro = (
        "Every component reads its settings from environment variables, one settings object "
        "per component, validated when it starts: a bad value stops it with a message naming "
        f"the variable. Below: the {len(classes)} settings classes, then the variables the "
        "scripts (`make demo`, `make soak`, the Airflow and S3 helpers) read themselves. "
        "Variable names are case-insensitive; how to point each default at real "
        "infrastructure: [Deployment](../guides/deployment.md)."
    )
    return markdown.page(
        "Configuration", "the `BaseSettings` classes and the scripts' variables", intro, body
    )
