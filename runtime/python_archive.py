"""The packed Python environment a cluster's executors run, shipped with each application the
way PySpark documents it ("Python Package Management", *Using Virtualenv*): a virtual
environment holding the project's wheel and its dependencies, as a ``.tar.gz`` that Spark
hands every executor (``spark.archives``) and unpacks in its working folder as
``./environment``; the executors' Python workers run ``./environment/bin/python``.
``make python-archive`` builds it (:mod:`infra.python_archive`).

Not in it: pyspark (~450 MB, almost all jars). Every worker's Spark puts its own Python
package first on its Python workers' path (``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's
zip: Spark's ``PythonUtils.sparkPythonPath``), so a worker needs Spark and a Python, not this
repository. As with venv-pack, the interpreter is not packed either: ``bin/python`` links to the
base interpreter the environment was made from, which every node must have at the same path
(:attr:`Manifest.interpreter`).

The archive's first member is its :class:`Manifest`, which says what code it holds (a digest
of the project's Python files): a driver refuses to ship an archive built from other code
than its own, whose tasks would run one version and the driver another.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import tarfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Final
from urllib.parse import urlparse

from runtime.errors import SetupError

# The folder each executor unpacks the archive into (the name after '#' in spark.archives).
ALIAS: Final = "environment"
EXECUTOR_PYTHON: Final = f"./{ALIAS}/bin/python"
MANIFEST_NAME: Final = "ctr-lambda-python.json"
PROJECT: Final = Path(__file__).resolve().parents[1]
DEFAULT_ARCHIVE: Final = PROJECT / "dist" / "ctr-lambda-python.tar.gz"
BUILD_COMMAND: Final = "make python-archive"


class PythonArchiveError(SetupError):
    """The packed environment a cluster job ships is missing or holds other code."""


@dataclass(frozen=True)
class Manifest:
    """What an archive holds: the project's top-level ``packages`` and the digest of their
    Python files (:func:`code_digest`), made with ``python`` (major.minor) whose base
    interpreter, which ``bin/python`` links to, is ``interpreter``; ``dependencies`` names the
    dependency set (constraints.txt, the requirements and the interpreter)."""

    packages: tuple[str, ...]
    code_digest: str
    python: str
    interpreter: str
    dependencies: str

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        fields = json.loads(data)
        return cls(
            packages=tuple(fields["packages"]),
            code_digest=str(fields["code_digest"]),
            python=str(fields["python"]),
            interpreter=str(fields["interpreter"]),
            dependencies=str(fields["dependencies"]),
        )


def code_digest(files: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 over ``(relative path, content)`` of every Python file, in path order: the
    same for a checkout, a wheel and an installed copy of the same code."""
    digest = hashlib.sha256()
    for name, content in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()


def package_files(locations: Mapping[str, Path]) -> list[tuple[str, bytes]]:
    """Every ``*.py`` file of the packages at ``locations`` ({name: folder}), as
    ``(name/relative/path.py, content)``; compiled caches left out."""
    files = []
    for name, folder in locations.items():
        for path in folder.rglob("*.py"):
            if "__pycache__" not in path.parts:
                relative = path.relative_to(folder).as_posix()
                files.append((f"{name}/{relative}", path.read_bytes()))
    return files


def installed_digest(packages: Iterable[str]) -> str:
    """:func:`code_digest` of the code this process imports for ``packages``."""
    locations = {}
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise PythonArchiveError(f"package {name!r} is not importable here")
        locations[name] = Path(next(iter(spec.submodule_search_locations)))
    return code_digest(package_files(locations))


def read_manifest(archive: Path) -> Manifest:
    """The manifest of ``archive`` (its first member: reading it decompresses a few KB)."""
    with tarfile.open(archive, "r:gz") as tar:
        first = tar.next()
        if first is None or first.name != MANIFEST_NAME:
            raise PythonArchiveError(
                f"{archive} is not a packed environment of ctr-lambda (no {MANIFEST_NAME} first):"
                f" rebuild it with `{BUILD_COMMAND}`"
            )
        member = tar.extractfile(first)
        assert member is not None
        return Manifest.from_json(member.read())


def is_cluster(master: str) -> bool:
    """Whether ``master`` starts executors in other processes than the driver's (anything but
    local[N]): they need the code shipped."""
    return not master.startswith("local")


def shipped_conf(archive: str, *, driver_python: str) -> dict[str, str]:
    """The Spark settings shipping the packed environment ``archive`` (a path, or a URL Spark
    fetches itself: hdfs://, s3a://, https://) to a cluster's executors, whose Python workers
    run its interpreter; the driver keeps ``driver_python`` (spark-submit starts it). An empty
    ``archive``: nothing is shipped (every node has the project installed).

    A local archive must exist and hold this process's code (:class:`PythonArchiveError`,
    naming the command that builds it)."""
    if not archive:
        return {}
    scheme = urlparse(archive).scheme
    if scheme in ("", "file"):
        path = Path(urlparse(archive).path if scheme else archive).resolve()
        _check_local(path)
        uri = path.as_uri()
    else:
        uri = archive
    return {
        "spark.archives": f"{uri}#{ALIAS}",
        "spark.pyspark.python": EXECUTOR_PYTHON,
        "spark.pyspark.driver.python": driver_python,
    }


def _check_local(path: Path) -> None:
    if not path.is_file():
        raise PythonArchiveError(
            f"SPARK_PYTHON_ARCHIVE: {path} does not exist: a job on a cluster ships the "
            f"project's Python environment to the executors; build it with `{BUILD_COMMAND}` "
            "(or name a built one; empty: the nodes have the project installed)"
        )
    manifest = _manifest(path, path.stat().st_mtime_ns)
    if installed_digest(manifest.packages) != manifest.code_digest:
        raise PythonArchiveError(
            f"SPARK_PYTHON_ARCHIVE: {path} holds other code than this driver's (changed since "
            f"it was built): the executors would run it; rebuild it with `{BUILD_COMMAND}`"
        )


@cache
def _manifest(path: Path, mtime_ns: int) -> Manifest:
    """The manifest of the archive at ``path`` as of ``mtime_ns`` (read once per build)."""
    del mtime_ns  # part of the cache key only
    return read_manifest(path)
