"""Settings are built once, at the entry points, and passed down: below them nothing reads the
environment and nothing builds a settings object of its own defaults. An environment read deep
down is a second, hidden configuration (a test's or a caller's settings quietly ignored); a
default built deep down is a component that runs on settings nobody gave it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Final

from tests.support import ROOT

# Where settings are built: the command line, Airflow's DAG files, the benchmarks, the docs
# build's reference pages (the app's OpenAPI document, built on defaults) and the tests; and
# any module run as a program (``python -m``: a __main__ module, or one with a
# ``if __name__ == "__main__":`` block, which may read its environment in that block and in its
# ``main`` function).
ENTRY_PACKAGES: Final = frozenset({"cli", "dags", "bench", "reference", "tests"})
SKIPPED: Final = frozenset({".venv", "run", "data", "node_modules", "spark-warehouse", ".git"})
# Environment access that is not configuration, each with its reason.
ALLOWED_ENVIRONMENT: Final = {
    # The JVM reads SPARK_LOCAL_IP from its environment only: set while PySpark starts it.
    ("runtime/spark.py", "_jvm_environment"),
    # The SQL sandbox's worker process drops the API token from its own environment at start.
    ("serving_layer/sandbox/worker.py", "confine"),
    # A child process (keytool) is given its parent's environment plus one password variable.
    ("infra/broker_auth.py", "ensure_tls"),
}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if SKIPPED & set(relative.parts) or relative.parts[0] in ENTRY_PACKAGES:
            continue
        if len(relative.parts) == 1 or path.name == "__main__.py":
            continue  # setup scripts at the root; programs
        yield relative.as_posix(), ast.parse(path.read_text(), filename=str(path))


class _Finder(ast.NodeVisitor):
    """Environment reads and default settings built outside a settings class and outside a
    program's ``__main__`` block."""

    def __init__(self, *, program: bool = False) -> None:
        self.found: list[tuple[int, str, str]] = []  # line, enclosing function, what
        self._function = "<module>"
        self._exempt = 0
        self._program = program

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        settings_class = any(_name(base).endswith("Settings") for base in node.bases)
        self._exempt += settings_class
        self.generic_visit(node)
        self._exempt -= settings_class

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self._function = self._function, node.name
        entry = self._program and node.name == "main" and outer == "<module>"
        self._exempt += entry
        self.generic_visit(node)
        self._exempt -= entry
        self._function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        main_block = "__main__" in ast.unparse(node.test) and "__name__" in ast.unparse(node.test)
        self._exempt += main_block
        self.generic_visit(node)
        self._exempt -= main_block

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if not self._exempt and _name(node) in ("os.environ", "os.environb", "os.getenv"):
            self.found.append((node.lineno, self._function, _name(node)))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        callee = _name(node.func)
        if (
            not self._exempt
            and callee.endswith("Settings")
            and callee[:1].isupper()
            and not node.args
            and not node.keywords
        ):
            self.found.append((node.lineno, self._function, f"{callee}()"))
        self.generic_visit(node)


def _is_program(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body
    )


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def test_below_the_entry_points_nothing_reads_the_environment_or_builds_default_settings() -> None:
    found = []
    for module, tree in _modules():
        finder = _Finder(program=_is_program(tree))
        finder.visit(tree)
        found += [
            f"{module}:{line} in {function}: {what}"
            for line, function, what in finder.found
            if (module, function) not in ALLOWED_ENVIRONMENT
        ]
    assert not found, "settings read below the entry points:\n" + "\n".join(found)


def test_the_rule_sees_what_it_forbids() -> None:
    source = (
        "import os\n"
        "class Job:\n"
        "    def __init__(self, settings=None):\n"
        "        self.settings = settings or JobSettings()\n"
        "        self.root = os.environ.get('LAKE_ROOT')\n"
        "class JobSettings(BaseSettings):\n"
        "    home: str = Field(default_factory=lambda: os.environ['HOME'])\n"
        "def main():\n"
        "    Job(JobSettings())\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
        "    print(os.environ)\n"
    )
    library = _Finder()
    library.visit(ast.parse(source))
    found = [(4, "__init__", "JobSettings()"), (5, "__init__", "os.environ")]
    assert library.found == [*found, (9, "main", "JobSettings()")]
    program = _Finder(program=_is_program(ast.parse(source)))
    program.visit(ast.parse(source))
    assert program.found == found
