"""The code shipped to a cluster's executors (runtime.python_archive, infra.python_archive):
what a job on a cluster adds to its settings, when it refuses to start, what the archive holds
and how its parts make one tar stream."""

from __future__ import annotations

import dataclasses
import subprocess
import tarfile
from pathlib import Path

import pytest

from infra import python_archive as builder
from runtime.python_archive import (
    MANIFEST_NAME,
    Manifest,
    PythonArchiveError,
    code_digest,
    package_files,
    read_manifest,
    shipped_conf,
)
from runtime.spark import shipped
from runtime.spark_settings import SparkSettings
from tests.support import ROOT
from tests.support.python_archives import manifest_archive, manifest_of_this_checkout


def test_local_mode_ships_nothing_and_a_cluster_ships_the_archive(tmp_path: Path) -> None:
    archive = manifest_archive(tmp_path / "env.tar.gz", manifest_of_this_checkout())
    settings = SparkSettings(python_archive=str(archive))
    settings = settings.model_copy(update={"python": "/venv/bin/python"})
    assert shipped(settings, "local[2]") == {}
    expected = {
        "spark.archives": f"file://{archive}#environment",
        "spark.pyspark.python": "./environment/bin/python",
        "spark.pyspark.driver.python": "/venv/bin/python",
    }
    for master in ("spark://10.0.0.5:7077", "yarn", "k8s://https://k8s:6443"):
        assert shipped(settings, master) == expected


def test_a_cluster_job_without_the_archive_says_how_to_build_it(tmp_path: Path) -> None:
    settings = SparkSettings(python_archive=str(tmp_path / "missing.tar.gz"))
    with pytest.raises(
        PythonArchiveError, match=r"missing\.tar\.gz does not exist.*make python-archive"
    ):
        shipped(settings, "spark://10.0.0.5:7077")


def test_an_archive_of_other_code_is_refused(tmp_path: Path) -> None:
    stale = dataclasses.replace(manifest_of_this_checkout(), code_digest="0" * 64)
    archive = manifest_archive(tmp_path / "env.tar.gz", stale)
    with pytest.raises(PythonArchiveError, match=r"other code than this driver.s.*make python-a"):
        shipped_conf(str(archive), driver_python="python3")


def test_not_an_archive_of_ours_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "env.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("bin"))
    with pytest.raises(PythonArchiveError, match="not a packed environment of ctr-lambda"):
        shipped_conf(str(path), driver_python="python3")


def test_an_archive_the_cluster_fetches_is_passed_as_it_is() -> None:
    conf = shipped_conf("s3a://artifacts/ctr-lambda-python.tar.gz", driver_python="python3")
    assert conf["spark.archives"] == "s3a://artifacts/ctr-lambda-python.tar.gz#environment"


def test_no_archive_ships_nothing() -> None:
    assert shipped(SparkSettings(python_archive=""), "spark://10.0.0.5:7077") == {}


def test_the_digest_follows_every_python_file_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "job.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "__pycache__" / "job.cpython-311.py").write_text("cache")
    (tmp_path / "pkg" / "notes.txt").write_text("not code")
    files = package_files({"pkg": tmp_path / "pkg"})
    assert sorted(name for name, _ in files) == ["pkg/__init__.py", "pkg/sub/job.py"]
    assert code_digest(files) == code_digest(reversed(files))
    assert code_digest(files) != code_digest([("pkg/sub/job.py", b"x = 2\n"), files[0]])
    assert code_digest(files) != code_digest([("pkg/job.py", b"x = 1\n"), files[0]])


def test_the_executors_get_the_dependencies_but_pyspark_the_api_s_and_airflow_s() -> None:
    wanted = {builder._distribution(r) for r in builder.requirements(ROOT / "pyproject.toml")}
    assert {"pyarrow", "pandas", "deltalake", "msgspec", "pydantic-settings"} <= wanted
    assert {"cryptography", "duckdb"} <= wanted  # imported at the top of views and lake modules
    assert not wanted & {"pyspark", "delta-spark", "apache-airflow", "fastapi", "typer"}
    assert not wanted & {"duckdb-extension-delta", "duckdb-extension-httpfs"}
    assert builder._distribution("duckdb-extension-delta==1.5.5") == "duckdb-extension-delta"
    assert builder._distribution("Pydantic_Settings>=2; python_version>'3'") == "pydantic-settings"


def test_the_archive_holds_every_package_of_the_wheel() -> None:
    assert set(builder.project_packages(ROOT)) >= {"runtime", "lake", "views", "speed_layer"}
    assert "tests" not in builder.project_packages(ROOT)


def test_gzip_members_make_one_tar_stream_with_the_manifest_first(tmp_path: Path) -> None:
    manifest = manifest_of_this_checkout()
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "env" / "bin" / "python").symlink_to("/usr/bin/python3.11")
    archive = tmp_path / "env.tar.gz"
    with archive.open("wb") as out:
        builder._member(out, [(MANIFEST_NAME, manifest.to_json())], end=False)
        builder._member(out, builder._tree(tmp_path / "env"), end=False)
        builder._member(out, [("lib/site-packages/job.py", b"x = 1\n")], end=True)
    assert read_manifest(archive) == manifest
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    # What Hadoop's FileUtil.unTar runs for spark.archives: gzip -dc | tar -xf -.
    subprocess.run(f"gzip -dc {archive} | tar -xf - -C {unpacked}", shell=True, check=True)
    assert (unpacked / "bin" / "python").readlink() == Path("/usr/bin/python3.11")
    assert (unpacked / "pyvenv.cfg").read_text() == "home = /usr/bin\n"
    assert (unpacked / "lib" / "site-packages" / "job.py").read_text() == "x = 1\n"
    assert Manifest.from_json((unpacked / MANIFEST_NAME).read_bytes()) == manifest
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names[0] == MANIFEST_NAME
    assert "lib/site-packages/job.py" in names
