"""The docs' generated reference (``reference/``): every setting and script variable described,
every command, operation and table on its page, the pages under docs/reference/ what the code
says now, and the link checker that fails the build."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reference import api_page, cli_page, environment, pages, settings_page, tables_page
from reference.links import broken_links, main


def test_every_setting_has_a_description_from_its_comment() -> None:
    undescribed = [
        (cls.__name__, setting.variables)
        for cls in settings_page.settings_classes()
        for setting in settings_page.settings_of(cls)
        if not setting.meaning
    ]
    assert undescribed == []


def test_the_configuration_page_lists_every_field_of_every_settings_class() -> None:
    text = settings_page.render()
    classes = settings_page.settings_classes()
    assert {c.__name__ for c in classes} >= {"KafkaSettings", "ApiSettings", "LakeSettings"}
    for cls in classes:
        assert f"## {cls.__name__}" in text
        for setting in settings_page.settings_of(cls):
            assert f"`{setting.variables[0]}`" in text
    # A variable the scripts read, with its default and where: the demo's rate.
    assert "| `DEMO_RATE` | `200` | `infra/demo.sh`" in text


def test_each_settings_class_is_introduced_by_its_own_docstring_never_an_inherited_one() -> None:
    """inspect.getdoc inherits pydantic's 4,000-character BaseSettings docstring."""
    text = settings_page.render()
    assert "Base class for settings" not in text
    for cls in settings_page.settings_classes():
        assert cls.__dict__.get("__doc__"), f"{cls.__name__} has no docstring of its own"


def test_a_umask_is_shown_in_octal_as_users_write_it() -> None:
    (umask,) = [
        s
        for cls in settings_page.settings_classes()
        for s in settings_page.settings_of(cls)
        if s.variables[0] == "CTR_UMASK"
    ]
    assert (umask.kind, umask.default, umask.bounds) == ("octal int", "`077`", "≥ 000, ≤ 777")


def test_a_page_that_lists_the_sql_views_lists_them_all() -> None:
    """A list of five or more of the sandbox's views is the whole allow-list (the CLI's and the
    SQL route's said 7 where there are 34)."""
    from serving_layer.sandbox.database import VIEW_NAMES

    name = "|".join(sorted(VIEW_NAMES, key=len, reverse=True))
    runs = re.compile(rf"\b(?:{name})\b(?:(?:,| and| or) (?:{name})\b)+")
    for page in sorted(Path("docs/reference").glob("*.md")):
        for run in runs.finditer(page.read_text()):
            listed = set(re.findall(rf"\b(?:{name})\b", run.group()))
            if len(listed) >= 5:
                assert listed == set(VIEW_NAMES), (page.name, sorted(set(VIEW_NAMES) - listed))


def test_the_api_page_says_what_each_answer_is_in_json_not_python() -> None:
    text = api_page.render()
    assert "Successful Response" not in text, "FastAPI's default says nothing"
    assert "`False`" not in text
    assert "`True`" not in text
    assert "| `reach` | query | boolean | `false` |" in text


def test_every_column_of_every_table_has_a_meaning() -> None:
    from lake.column_meanings import meaning

    missing = [
        f"{table.name}.{field.name}"  # type: ignore[attr-defined]
        for table, _ in tables_page.tables()
        for field in table.schema  # type: ignore[attr-defined]
        if not meaning(table.name, field.name)  # type: ignore[attr-defined]
    ]
    assert not missing
    text = tables_page.render()
    assert "| column | type | nullable |" not in text, "every column read nullable"


def test_each_json_answer_has_an_example_of_its_shape() -> None:
    document = api_page.document()
    text = api_page.render()
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            answers = operation.get("responses", {})
            json_answer = any(
                "application/json" in answers.get(status, {}).get("content", {})
                for status in ("200", "201")
            )
            section = text.split(f"## `{method.upper()} {path}`", 1)[1].split("\n## ", 1)[0]
            assert ("Example answer" in section) == json_answer, (method, path)
    assert '"status": "ok"' in text  # /healthz's, from its schema's only value


def test_every_field_of_the_apis_own_answers_is_described() -> None:
    schemas = api_page.document()["components"]["schemas"]
    undescribed = [
        f"{name}.{field}"
        for name, schema in schemas.items()
        if name not in ("HTTPValidationError", "ValidationError")  # FastAPI's own
        for field, spec in schema.get("properties", {}).items()
        if not spec.get("description")
    ]
    assert not undescribed


def test_a_comment_above_a_field_is_its_description(tmp_path: Path) -> None:
    from api.settings import ApiSettings

    described = {s.variables[0]: s.meaning for s in settings_page.settings_of(ApiSettings)}
    assert described["API_MAX_BODY_BYTES"].startswith("Request bodies larger than this get a 413")


def test_the_cli_page_has_every_command_and_option() -> None:
    text = cli_page.render()
    for command in ("ctr produce", "ctr kafka up", "ctr batch", "ctr backfill", "ctr sql",
                    "ctr views publish", "ctr keys create"):  # fmt: skip
        assert f"`{command}`" in text
    assert "`--from <str>`" in text


def test_the_api_page_has_every_operation_of_the_openapi_document() -> None:
    document = api_page.document()
    text = api_page.render()
    for path, methods in document["paths"].items():
        for method in methods:
            assert f"## `{method.upper()} {path}`" in text
    assert "### CtrResponse" in text


def test_the_tables_page_has_every_table_with_its_columns() -> None:
    text = tables_page.render()
    for table, _comment in tables_page.tables():
        assert f"## `{table.name}`" in text  # type: ignore[attr-defined]
    assert "| `event_id` | string | the event's id: the key of the exact dedup" in text


def _site(root: Path, pages: dict[str, str]) -> Path:
    for name, html in pages.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(html)
    return root


def test_the_link_checker_finds_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    site = _site(
        tmp_path,
        {
            "index.html": '<a href="guide/">ok</a><a href="guide/#setup">ok</a>'
            '<a href="guide/#nowhere">bad anchor</a><a href="gone.html">bad page</a>'
            '<a href="https://example.org/x">external</a><img src="img.png">',
            "guide/index.html": '<h2 id="setup">Setup</h2><a href="../index.html">back</a>',
            "img.png": "png",
        },
    )
    found = {(b.page, b.link, b.why) for b in broken_links(site)}
    assert found == {
        ("index.html", "guide/#nowhere", "no such anchor on the page"),
        ("index.html", "gone.html", "no such file in the site"),
    }
    assert main([str(site)]) == 1


def test_a_site_without_broken_links_passes_and_no_site_is_an_error(tmp_path: Path) -> None:
    site = _site(tmp_path / "site", {"index.html": '<a href="#top" id="top">top</a>'})
    assert main([str(site)]) == 0
    assert main([str(tmp_path / "missing")]) == 2


def test_every_variable_the_scripts_read_has_a_doc_comment() -> None:
    declared = {
        variable.upper()
        for cls in settings_page.settings_classes()
        for setting in settings_page.settings_of(cls)
        for variable in setting.variables
    }
    scanned = environment.scan(settings_page.ROOT)
    assert {"DEMO_RATE", "SOAK_MINUTES", "AIRFLOW_SPARK_SLOTS"} <= scanned.keys()
    undocumented = [n for n, v in sorted(scanned.items()) if n not in declared and not v.meaning]
    assert undocumented == []


def test_a_doc_comment_is_read_above_or_beside_a_line_that_reads_the_variable() -> None:
    lines = [
        "# an ordinary comment is not a doc",
        'A="${A_VAR:-1}"',
        "#: Events per second.",
        "#: At most 1,000.",
        'B="${B_VAR:-2}"',
        'C="${C_VAR:-3}"  #: Beside it.',
    ]
    assert environment._doc_for(lines, 1) == ""
    assert environment._doc_for(lines, 4) == "Events per second. At most 1,000."
    assert environment._doc_for(lines, 5) == "Beside it."


def test_the_reference_pages_under_docs_are_what_the_code_says() -> None:
    assert pages.stale() == [], "out of date with the code: run `make reference`"


def test_a_stale_reference_page_fails_the_docs_build(tmp_path: Path) -> None:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.exceptions import Abort

    from reference import mkdocs_hooks

    pages.write(tmp_path)
    config = MkDocsConfig()
    config.load_dict({"site_name": "t", "docs_dir": str(tmp_path)})
    mkdocs_hooks.on_pre_build(config)  # up to date: the build goes on
    (tmp_path / "reference" / "sql.md").write_text("# SQL allow-list\n\nedited by hand\n")
    with pytest.raises(Abort, match=r"docs/reference/sql\.md: out of date"):
        mkdocs_hooks.on_pre_build(config)


def test_the_readmes_links_reach_files_of_the_repository() -> None:
    readme = settings_page.ROOT / "README.md"
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme.read_text())
    assert any(link.startswith("docs/reference/") for link in links)
    missing = [
        link for link in links if "://" not in link and not (settings_page.ROOT / link).exists()
    ]
    assert missing == []
