"""One set of first steps: docs/getting-started.md's commands, shown by the README (generated,
checked) and printed by `make demo` with the running demo's address (reference.first_steps)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reference import first_steps

PAGE = """# Getting started

```console
make demo
```

```sh
# the first query
curl -s 'http://127.0.0.1:8000/api/v1/ctr'
```

Text between.

```sh
# ad-hoc SQL
ctr sql "SELECT 1"
```
"""


def test_the_readme_shows_the_commands_of_getting_started() -> None:
    assert not first_steps.readme_stale(), "README.md's first steps: run `make reference`"
    readme = first_steps.README.read_text()
    for step in first_steps.steps():
        assert step.command in readme


def test_steps_are_the_sh_blocks_with_their_opening_comment() -> None:
    assert first_steps.steps(PAGE) == [
        first_steps.Step("the first query", "curl -s 'http://127.0.0.1:8000/api/v1/ctr'"),
        first_steps.Step("ad-hoc SQL", 'ctr sql "SELECT 1"'),
    ]


def test_a_block_without_its_comment_is_refused() -> None:
    with pytest.raises(first_steps.FirstStepsError, match="must open with"):
        first_steps.steps("```sh\nctr sql 'SELECT 1'\n```\n")


def test_the_demo_summary_numbers_the_steps_at_the_demos_address() -> None:
    text = first_steps.commands("http://127.0.0.1:9000", "  ", PAGE)
    assert text.splitlines() == [
        "  source run/demo/env",
        "",
        "  # 1. the first query",
        "  curl -s 'http://127.0.0.1:9000/api/v1/ctr'",
        "",
        "  # 2. ad-hoc SQL",
        '  ctr sql "SELECT 1"',
    ]


def test_the_readme_block_is_rewritten_between_its_markers_only() -> None:
    text = f"# title\n\n{first_steps.BEGIN}\nold\n{first_steps.END}\n\nafter\n"
    new = first_steps.readme(text, PAGE)
    assert new.startswith("# title\n\n")
    assert new.endswith("\n\nafter\n")
    assert "# 2. ad-hoc SQL" in new
    assert "old" not in new
    with pytest.raises(first_steps.FirstStepsError, match="no block"):
        first_steps.readme("# no markers\n", PAGE)


def test_make_demo_prints_them() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reference.first_steps", "--url", "http://127.0.0.1:8123"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "http://127.0.0.1:8123/api/v1/ctr" in done.stdout
    assert "http://127.0.0.1:8000" not in done.stdout
