"""reference/http-api.md: the HTTP API from the OpenAPI document the app itself serves
(``GET /openapi.json``): every operation with its parameters and answers, then every schema."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, Final

from reference import markdown

Json = Mapping[str, Any]


def kind(schema: Json) -> str:
    """A schema in a few words: ``string (date-time)``, ``integer ≥ 1``, ``[CtrRowBody]``…"""
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    for union in ("anyOf", "oneOf"):
        if union in schema:
            parts = [kind(s) for s in schema[union] if s.get("type") != "null"]
            nullable = any(s.get("type") == "null" for s in schema[union])
            return " or ".join(parts) + (" or null" if nullable else "")
    if "enum" in schema:
        return " or ".join(markdown.code(v) for v in schema["enum"])
    text = str(schema.get("type", "any"))
    if text == "array":
        text = f"array of {kind(schema.get('items', {}))}"
    elif text == "object" and "additionalProperties" in schema:
        text = f"object of {kind(schema['additionalProperties'] or {})}"
    if "format" in schema:
        text += f" ({schema['format']})"
    for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤")):
        if key in schema:
            text += f" {sign} {schema[key]}"
    return text


def _parameters(operation: Json) -> Iterator[str]:
    rows = []
    for parameter in operation.get("parameters", []):
        schema = parameter.get("schema", {})
        default = schema.get("default")
        rows.append([
            markdown.code(parameter["name"]),
            parameter["in"],
            kind(schema),
            "" if default is None else markdown.code(_json_text(default)),
            "yes" if parameter.get("required") else "",
            parameter.get("description", ""),
        ])  # fmt: skip
    if rows:
        header = ("parameter", "in", "type", "default", "required", "meaning")
        yield markdown.table(header, rows)


def _json_text(value: object) -> str:
    """A default as a client writes it: ``false``, not Python's ``False``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _body(operation: Json) -> Iterator[str]:
    body = operation.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            yield f"Request body ({markdown.code(media)}): {kind(content.get('schema', {}))}.\n"


def _responses(operation: Json, document: Json) -> Iterator[str]:
    rows = []
    for status, response in sorted(operation.get("responses", {}).items()):
        media = [
            f"{markdown.code(name)} {kind(content.get('schema', {}))}".strip()
            for name, content in response.get("content", {}).items()
        ]
        meaning = response.get("description", "")
        if meaning == _FASTAPI_DEFAULT:
            meaning = _answer(response, document)
        rows.append([markdown.code(status), meaning, "; ".join(media)])
    if rows:
        yield markdown.table(("status", "meaning", "body"), rows)


_FASTAPI_DEFAULT: Final = "Successful Response"


def _answer(response: Json, document: Json) -> str:
    """What a successful answer is, where the route says only FastAPI's "Successful
    Response": the first sentence of its body's schema's description (the model's docstring)."""
    schemas = document.get("components", {}).get("schemas", {})
    if not response.get("content"):
        return "done (no body)"
    for content in response.get("content", {}).values():
        reference = content.get("schema", {}).get("$ref")
        if reference:
            described = schemas.get(str(reference).rsplit("/", 1)[-1], {}).get("description")
            if described:
                return " ".join(str(described).split()).split(". ")[0].rstrip(".")
    return "the answer"


NEEDS_KEY: Final = "Needs a key: `Authorization: Bearer <key>`."
KEY_OPTIONAL: Final = (
    "A key is optional: anyone may call it; `Authorization: Bearer <key>` adds what the key "
    "may see."
)


def _auth(operation: Json) -> str:
    """What the page says of an operation's key: needed when the operation answers 401
    without one, else optional (a bearer scheme that does not refuse)."""
    return NEEDS_KEY if "401" in operation.get("responses", {}) else KEY_OPTIONAL


def operations(document: Json) -> Iterator[str]:
    """A section per operation, in the document's order."""
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            yield f"## `{method.upper()} {path}`"
            yield ""
            yield f"**{operation.get('summary', '')}**"
            yield ""
            if operation.get("description"):
                yield operation["description"].strip()
                yield ""
            if operation.get("security"):
                yield _auth(operation) + "\n"
            yield from _parameters(operation)
            yield from _body(operation)
            yield from _responses(operation, document)
            yield from _example(operation, document)
            yield ""


_SAMPLE_TIME: Final = "2026-11-30T10:00:00Z"
_MAX_DEPTH: Final = 6


def _example(operation: Json, document: Json) -> Iterator[str]:
    """The successful JSON answer's shape, as an example: each field with a value of its type
    (the schema's own example or default where it has one, its first allowed value, a sample
    time), one element per array, from the document's schemas."""
    for status in ("200", "201"):
        content = operation.get("responses", {}).get(status, {}).get("content", {})
        schema = content.get("application/json", {}).get("schema")
        if schema:
            value = _sample(schema, document, 0)
            yield f"Example answer ({markdown.code(status)}, its shape; values illustrative):\n"
            yield "```json\n" + json.dumps(value, indent=2, ensure_ascii=False) + "\n```\n"
            return


def _sample(schema: Json, document: Json, depth: int) -> object:  # noqa: PLR0911 - a kind each
    if depth > _MAX_DEPTH:
        return None
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return _sample(document["components"]["schemas"][name], document, depth + 1)
    for key in ("example", "default"):
        if schema.get(key) is not None:
            return schema[key]
    if schema.get("examples"):
        return schema["examples"][0]
    for union in ("anyOf", "oneOf"):
        if union in schema:
            options = [s for s in schema[union] if s.get("type") != "null"]
            return _sample(options[0], document, depth + 1) if options else None
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind_ = schema.get("type")
    if kind_ == "object":
        if "properties" in schema:
            return {
                field: _sample(spec, document, depth + 1)
                for field, spec in schema["properties"].items()
            }
        extra = schema.get("additionalProperties")
        return {"key": _sample(extra, document, depth + 1)} if isinstance(extra, dict) else {}
    if kind_ == "array":
        return [_sample(schema.get("items", {}), document, depth + 1)]
    return _scalar(schema)


def _scalar(schema: Json) -> object:
    kind_ = schema.get("type")
    if kind_ == "string":
        return _SAMPLE_TIME if schema.get("format") == "date-time" else "string"
    if kind_ == "integer":
        return int(schema.get("minimum", 0))
    if kind_ == "number":
        return float(schema.get("minimum", 0.0))
    if kind_ == "boolean":
        return False
    return None


def schemas(document: Json) -> Iterator[str]:
    """A section per schema of the document's components."""
    yield "## Schemas"
    yield ""
    for name, schema in sorted(document.get("components", {}).get("schemas", {}).items()):
        yield f"### {name}"
        yield ""
        if schema.get("description"):
            yield " ".join(str(schema["description"]).split())
            yield ""
        required = set(schema.get("required", []))
        rows = [
            [markdown.code(field), kind(spec), "yes" if field in required else "",
             spec.get("description", "")]
            for field, spec in schema.get("properties", {}).items()
        ]  # fmt: skip
        if rows:
            yield markdown.table(("field", "type", "required", "meaning"), rows)
        yield ""


def document() -> Json:
    """The OpenAPI document of the app as ``ctr serve`` builds it (no lake is opened)."""
    from pydantic import SecretStr

    from alerts.settings import AlertSettings
    from api.main import create_app
    from api.settings import ApiSettings
    from lake.settings import LakeSettings
    from runtime.kafka_settings import KafkaSettings

    settings = ApiSettings(token=SecretStr("reference-page-token"))
    return create_app(
        settings, LakeSettings(), KafkaSettings(), alert_settings=AlertSettings()
    ).openapi()


def render() -> str:
    """The HTTP API page."""
    spec = document()
    info = spec["info"]
    intro = (
        f"{info.get('summary', '')} OpenAPI {spec['openapi']}, version {info['version']}. "
        "A running server serves the same document at `/openapi.json` and an interactive "
        "page at `/docs`. How to query, with examples: [Querying](../guides/querying.md); "
        "keys and what each role may read: [Keys and scopes](../guides/access.md)."
    )
    return markdown.page(
        "HTTP API",
        "the OpenAPI document of `api/main.py`",
        intro,
        [*operations(spec), *schemas(spec)],
    )
