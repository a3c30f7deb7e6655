"""The house rules that keep the layout one-way and the command line light."""

from __future__ import annotations

import json
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


# One interpreter imports the command line once, then forks a child per command, which asks
# for its --help with its stdout on a file of its own and says which engines it has loaded: the
# same check as a fresh interpreter per command, without paying 12 interpreter starts.
_FORKED_HELP = """
import atexit, json, os, sys, tempfile
from cli.main import main
results = {}
for command in COMMANDS:
    out = tempfile.NamedTemporaryFile(mode="r", delete=False)
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(out.name, os.O_WRONLY), 1)
        sys.argv = ["ctr", *command, "--help"]
        # main() ends the process itself, once its exit handlers ran: this is the last.
        atexit.register(
            lambda: print("engines:", ",".join(sorted(e for e in ENGINES if e in sys.modules)))
        )
        main()
        os._exit(3)  # main() returned: not how the command ends
    _, status = os.waitpid(pid, 0)
    results[" ".join(command)] = [os.waitstatus_to_exitcode(status), out.read()]
    os.unlink(out.name)
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, list[object]]:
    """Each command's (exit status, stdout) of ``ctr … --help``, by command."""
    script = f"COMMANDS = {COMMANDS!r}\nENGINES = {ENGINES!r}\n{_FORKED_HELP}"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(["ctr", *c]))
def test_help_imports_no_engine(command: list[str], helps: dict[str, list[object]]) -> None:
    status, stdout = helps[" ".join(command)]
    assert status == 0, stdout
    assert isinstance(stdout, str)
    assert "Usage:" in stdout
    assert stdout.splitlines()[-1] == "engines: "


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
