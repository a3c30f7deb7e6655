"""The house rules that keep the layout one-way and the command line light."""

from __future__ import annotations

import subprocess
import sys

import pytest

ENGINES = ("pyspark", "duckdb", "deltalake", "confluent_kafka", "fastapi", "airflow")
COMMANDS = [
    [],
    ["kafka"],
    ["kafka", "up"],
    ["produce"],
    ["replay"],
    ["archive"],
    ["batch"],
    ["backfill"],
    ["speed"],
    ["speed", "status"],
    ["serve"],
    ["sql"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(["ctr", *c]))
def test_help_imports_no_engine(command: list[str]) -> None:
    script = (
        "import sys\n"
        f"sys.argv = ['ctr', *{command!r}, '--help']\n"
        "from cli.main import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit:\n"
        "    assert exit.code in (0, None), exit.code\n"
        f"loaded = sorted(e for e in {ENGINES!r} if e in sys.modules)\n"
        "print('engines:', ','.join(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout
    assert done.stdout.splitlines()[-1] == "engines: "


# A module a newcomer reads in one sitting, a class that holds one concept.
MAX_FILE_LINES = 500
MAX_CLASS_LINES = 250
SKIPPED = {".venv", "tests", "run", "data", "node_modules", "spark-warehouse", ".git", "vendor"}


def test_no_module_over_500_lines_and_no_class_over_250() -> None:
    import ast

    from tests.support import ROOT

    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if SKIPPED & set(relative.parts):
            continue
        source = path.read_text()
        if source.count("\n") > MAX_FILE_LINES:
            found.append(f"{relative}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    found.append(f"{relative}: class {node.name}, {size} lines")
    assert not found, "\n".join(found)
