"""``make python-archive``: the packed Python environment a cluster's executors run
(:mod:`runtime.python_archive`), ``dist/ctr-lambda-python.tar.gz``.

A virtual environment made from the base interpreter of ``.venv`` holds the project's
dependencies at the versions of constraints.txt, less what no task imports
(:data:`LEFT_OUT`: pyspark, which every worker's Spark provides, the API's, the CLI's and
Airflow's); the project goes in as its wheel. Before packing, every module of the packages
whose code runs in tasks (:data:`TASK_PACKAGES`) is imported with that environment and the
pyspark.zip a worker puts first on its Python workers' path: a missing dependency fails the
build, not a job.

The archive is three gzip members, one stream to ``tar``: the manifest, the dependencies
(packed once per dependency set and cached: the slow part), and the project's wheel. A change
of code repacks only the last.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from infra.errors import InfraError
from runtime.python_archive import (
    DEFAULT_ARCHIVE,
    MANIFEST_NAME,
    Manifest,
    code_digest,
    package_files,
    read_manifest,
)

ROOT: Final = Path(__file__).resolve().parents[1]
# Distributions of pyproject.toml no task imports, and why they stay out.
LEFT_OUT: Final = {
    "pyspark": "every worker's Spark puts its pyspark.zip first on the Python workers' path",
    "delta-spark": "its Python API runs in the driver; it depends on pyspark",
    "apache-airflow": "the scheduler's and Airflow workers', which submit jobs",
    "apache-airflow-providers-apache-spark": "Airflow's",
    "psycopg2-binary": "Airflow's metadata database",
    "asyncpg": "Airflow's metadata database",
    "fastapi": "the API",
    "uvicorn": "the API",
    # duckdb itself stays: two lake modules import it at their top (lake.coverage.staleness,
    # lake.duckdb_delta), and its extensions only inside functions the tasks never call.
    "duckdb-extension-delta": "the serving layer's reader, loaded by path in the API",
    "duckdb-extension-httpfs": "the serving layer's reader of S3, loaded by path in the API",
    "typer": "the CLI",
    "rich": "the CLI",
}
# The packages whose code runs in Spark's tasks (and what they import).
TASK_PACKAGES: Final = (
    "runtime", "events", "views", "lake", "master_dataset", "batch_layer", "speed_layer",
)  # fmt: skip
# gzip's level. The dependencies (584 MiB unpacked) measured 219.6 MB in 17.6 s at level 1,
# 194.9 MB in 53.9 s at level 6: they are packed once per dependency set and fetched by every
# executor of every application, so the smaller wins.
_LEVEL: Final = 6
# Dependency environments unused for this long are removed when another is made.
_UNUSED_DAYS: Final = 14


class ArchiveBuildError(InfraError, RuntimeError):
    """The environment could not be made, imported or packed; the message says where."""


def default_env_cache(environ: Mapping[str, str]) -> Path:
    """``$XDG_CACHE_HOME/ctr-lambda/python-envs``, else under ``~/.cache`` (as the jar cache)."""
    return (
        Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ctr-lambda" / "python-envs"
    )


class PythonArchiveSettings(BaseSettings):
    """Where ``make python-archive`` makes the environment, and from which Python."""

    model_config = SettingsConfigDict(extra="ignore")

    # The base interpreter the packed environment is made from: its bin/python links there, so
    # every node of the cluster needs this interpreter at this path. Default: the one .venv
    # was made from.
    python: Path = Field(
        default_factory=lambda: Path(getattr(sys, "_base_executable", sys.executable)),
        validation_alias="CTR_ARCHIVE_PYTHON",
    )
    # Where the dependency environments are made and kept, one per dependency set (shared by
    # every checkout): $XDG_CACHE_HOME/ctr-lambda/python-envs, else ~/.cache/...
    cache: Path = Field(
        default_factory=lambda: default_env_cache(os.environ),
        validation_alias="CTR_PYTHON_ENV_CACHE",
    )


@dataclass(frozen=True)
class Built:
    """An archive at ``path`` of ``size`` bytes; ``seconds`` to build (0: up to date)."""

    path: Path
    size: int
    seconds: float
    manifest: Manifest


def requirements(pyproject: Path) -> list[str]:
    """The project's dependencies the executors need: pyproject.toml's less :data:`LEFT_OUT`."""
    declared = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [d for d in declared if _distribution(d) not in LEFT_OUT]


def _distribution(requirement: str) -> str:
    name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def dependency_key(root: Path, python: Path) -> str:
    """What the dependency environment depends on: the constraints, the requirements and the
    interpreter (12 hex digits)."""
    digest = hashlib.sha256()
    digest.update((root / "constraints.txt").read_bytes())
    digest.update("\n".join(requirements(root / "pyproject.toml")).encode())
    digest.update(f"{python} {_LEVEL}".encode())
    return digest.hexdigest()[:12]


def project_packages(root: Path) -> dict[str, Path]:
    """The project's top-level packages (pyproject.toml's find patterns), by name."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["packages"]["find"]["include"]
    names = sorted({p.rstrip("*") for p in patterns})
    return {name: root / name for name in names if (root / name / "__init__.py").is_file()}


def build(
    settings: PythonArchiveSettings, *, root: Path = ROOT, out: Path = DEFAULT_ARCHIVE
) -> Built:
    """The archive at ``out`` for the checkout ``root``: rebuilt when its code or dependencies
    changed, else left as it is."""
    started = time.monotonic()
    packages = project_packages(root)
    digest = code_digest(package_files(packages))
    deps = dependency_key(root, settings.python)
    if out.is_file():
        current = read_manifest(out)
        if current.code_digest == digest and current.dependencies == deps:
            return Built(out, out.stat().st_size, 0.0, current)
    part = _dependencies(settings, root, deps)
    with tempfile.TemporaryDirectory(prefix="ctr-wheel-") as scratch:
        wheel = _wheel(root, packages, Path(scratch))
        _check_wheel(wheel, packages, digest)
        _check_imports(part.parent / "env", wheel)
        manifest = Manifest(
            packages=tuple(packages),
            code_digest=digest,
            python=f"{sys.version_info.major}.{sys.version_info.minor}",
            interpreter=str(settings.python),
            dependencies=deps,
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, out.parent / wheel.name)
        partial = out.with_name(out.name + ".partial")
        with partial.open("wb") as stream:
            _member(stream, [(MANIFEST_NAME, manifest.to_json())], end=False)
            with part.open("rb") as cached:
                shutil.copyfileobj(cached, stream)
            _member(stream, _wheel_files(wheel, _site_packages(part.parent / "env")), end=True)
        partial.replace(out)
    return Built(out, out.stat().st_size, time.monotonic() - started, manifest)


def _dependencies(settings: PythonArchiveSettings, root: Path, key: str) -> Path:
    """The cached gzip member of the dependency environment ``key`` (made when missing)."""
    home = settings.cache / f"env-{key}"
    part = home / "dependencies.tar.gz"
    if part.is_file():
        part.touch()  # in use: not pruned
        return part
    _prune(settings.cache)
    shutil.rmtree(home, ignore_errors=True)
    env = home / "env"
    _run([str(settings.python), "-m", "venv", "--without-pip", str(env)], "make the venv")
    pip = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install"]
    pip += ["--quiet", "--disable-pip-version-check", "-c", str(root / "constraints.txt")]
    _run([*pip, *requirements(root / "pyproject.toml")], "install the dependencies")
    partial = part.with_name(part.name + ".partial")
    with partial.open("wb") as stream:
        _member(stream, _tree(env), end=False)
    partial.replace(part)
    return part


def _prune(cache: Path) -> None:
    """Remove the dependency environments no build used for :data:`_UNUSED_DAYS` (other
    checkouts' share the cache: each touches its own at every build)."""
    oldest = time.time() - _UNUSED_DAYS * 86400
    for part in cache.glob("env-*/dependencies.tar.gz"):
        if part.stat().st_mtime < oldest:
            shutil.rmtree(part.parent, ignore_errors=True)


def _wheel(root: Path, packages: dict[str, Path], into: Path) -> Path:
    """The project's wheel, built in ``into`` from a copy of its packages (setuptools builds in
    the source tree, where a stale build/ would add files the checkout no longer has)."""
    source = into / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, source / name)
    for name, folder in packages.items():
        shutil.copytree(folder, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    command += ["--disable-pip-version-check", "--wheel-dir", str(into), str(source)]
    _run(command, "build the project's wheel")
    [wheel] = into.glob("*.whl")
    return wheel


def _check_wheel(wheel: Path, packages: dict[str, Path], digest: str) -> None:
    """The wheel holds exactly the checkout's Python files (else the digest lies)."""
    with zipfile.ZipFile(wheel) as archive:
        files = [
            (name, archive.read(name))
            for name in archive.namelist()
            if name.endswith(".py") and name.split("/", 1)[0] in packages
        ]
    if code_digest(files) != digest:
        ours = {name for name, _ in package_files(packages)}
        missing = sorted(ours - {name for name, _ in files})
        raise ArchiveBuildError(
            f"the wheel {wheel.name} does not hold the checkout's Python files "
            f"(missing: {', '.join(missing[:10]) or 'none; contents differ'}): "
            "is a folder without __init__.py?"
        )


def _check_imports(env: Path, wheel: Path) -> None:
    """Every module of :data:`TASK_PACKAGES` imports in ``env`` with the project's wheel and a
    worker's pyspark.zip and py4j zip first on the path, as Spark's Python workers have it."""
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    path = [str(lib / "pyspark.zip"), *map(str, lib.glob("py4j-*-src.zip")), str(wheel)]
    script = (
        "import importlib, pkgutil\n"
        f"for name in {list(TASK_PACKAGES)!r}:\n"
        "    package = importlib.import_module(name)\n"
        "    for module in pkgutil.walk_packages(package.__path__, name + '.'):\n"
        "        importlib.import_module(module.name)\n"
    )
    with tempfile.TemporaryDirectory() as elsewhere:  # not the checkout: nothing from it
        _run(
            [str(env / "bin" / "python"), "-P", "-c", script],
            "import the task packages with the packed environment",
            env={"PYTHONPATH": os.pathsep.join(path), "PATH": "/usr/bin:/bin"},
            cwd=elsewhere,
        )


def _site_packages(env: Path) -> str:
    [site] = env.glob("lib/python*/site-packages")
    return site.relative_to(env).as_posix()


def _tree(folder: Path) -> Iterable[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    """Every file, link and folder under ``folder``, named relative to it, as tar entries."""
    for path in sorted(folder.rglob("*")):
        info = tarfile.TarInfo(path.relative_to(folder).as_posix())
        stat = path.lstat()
        info.mode, info.mtime = stat.st_mode & 0o7777, int(stat.st_mtime)
        if path.is_symlink():
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            yield info, None
        elif path.is_dir():
            info.type = tarfile.DIRTYPE
            yield info, None
        else:
            info.size = stat.st_size
            with path.open("rb") as content:
                yield info, content


def _wheel_files(wheel: Path, site: str) -> Iterable[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    """The wheel's files as installed under ``site`` (a pure wheel: purelib only)."""
    with zipfile.ZipFile(wheel) as archive:
        for entry in archive.infolist():
            if entry.is_dir():
                continue
            info = tarfile.TarInfo(f"{site}/{entry.filename}")
            info.size, info.mode, info.mtime = entry.file_size, 0o644, int(time.time())
            with archive.open(entry) as content:
                yield info, content


def _member(
    stream: IO[bytes],
    entries: Iterable[tuple[str, bytes]] | Iterable[tuple[tarfile.TarInfo, IO[bytes] | None]],
    *,
    end: bool,
) -> None:
    """One gzip member of tar entries on ``stream``; the tar's end marker only if ``end``
    (members concatenate into one tar stream: gzip reads them as one)."""
    with gzip.GzipFile(fileobj=stream, mode="wb", compresslevel=_LEVEL, mtime=0) as zipped:
        tar = tarfile.TarFile(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT)
        for entry, content in entries:
            if isinstance(entry, str):
                assert isinstance(content, bytes)
                info = tarfile.TarInfo(entry)
                info.size, info.mode, info.mtime = len(content), 0o644, int(time.time())
                tar.addfile(info, io.BytesIO(content))
            else:
                assert not isinstance(content, bytes)
                entry.uid = entry.gid = 0
                entry.uname = entry.gname = ""
                tar.addfile(entry, content)
        if end:
            tar.close()  # the end marker; without it the next member's entries follow on


def _run(
    command: list[str], what: str, *, env: dict[str, str] | None = None, cwd: str | None = None
) -> None:
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, env=env, cwd=cwd, timeout=1800
    )
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()[-3000:]
        raise ArchiveBuildError(f"python-archive: could not {what}: {output}")


def main() -> int:
    try:
        built = build(PythonArchiveSettings())
    except InfraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    size = f"{built.size / 2**20:,.0f} MiB"
    if built.seconds:
        print(f"python-archive: {built.path} ({size}) built in {built.seconds:.0f} s")
    else:
        print(f"python-archive: {built.path} ({size}) is up to date")
    print(
        f"  every worker needs Python at {built.manifest.interpreter} (its bin/python links there)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
