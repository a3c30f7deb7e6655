"""What a test host is made of (infra.hosts): which folders it hides, which it keeps and in
what order the mount script does it, what its processes' environment holds, and why a machine
cannot make hosts."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from infra import hosts
from infra.hosts import HOME, SPARK_HOME, STAGE, Bind, Layout, Machine

MACHINE = Machine(
    checkout=Path("/work/ctr-lambda"),
    home=Path("/root"),
    python=Path("/root/.pyenv/versions/3.11.7/bin/python3.11"),
    venv_python=Path("/work/ctr-lambda/.venv/bin/python"),
    spark_home=Path("/work/ctr-lambda/.venv/lib/python3.11/site-packages/pyspark"),
    jar_cache=Path("/root/.cache/ctr-lambda/jars"),
    environ={"PATH": "/usr/bin:/bin", "JAVA_HOME": "/usr/lib/jvm/java-17"},
)
DISK = Path("/tmp/pytest-of-root/pytest-7/hosts0/a")
S3_JARS = Path("/root/.cache/ctr-lambda/jars/s3-0123456789ab")


def test_a_host_has_its_own_tmp_and_home_and_the_checkout_read_only() -> None:
    layout = Layout(MACHINE, DISK)
    assert layout.hidden() == [Path(p) for p in ("/dev/shm", "/home", "/tmp", "/var/tmp")]
    assert layout.binds() == [
        Bind(DISK / "home", HOME, read_only=False),
        Bind(MACHINE.checkout, MACHINE.checkout, read_only=True),
    ]


def test_a_bare_host_hides_the_checkout_and_the_home_and_keeps_spark_and_python() -> None:
    layout = Layout(MACHINE, DISK, bare=True, keep=(S3_JARS, Path("/usr/share/java")))
    hidden = ["/dev/shm", "/home", "/opt", "/root", "/tmp", "/var/tmp", "/work/ctr-lambda"]
    assert layout.hidden() == [Path(p) for p in hidden]
    assert layout.binds() == [
        Bind(DISK / "home", HOME, read_only=False),
        Bind(MACHINE.spark_home, SPARK_HOME, read_only=True),
        Bind(Path("/root/.pyenv/versions/3.11.7"), Path("/root/.pyenv/versions/3.11.7"), True),
        Bind(S3_JARS, S3_JARS, read_only=True),
        # /usr/share/java is not hidden: nothing to keep.
    ]


def test_a_folder_inside_a_hidden_one_is_not_hidden_again() -> None:
    machine = Machine(**{**MACHINE.__dict__, "checkout": Path("/home/runner/work/ctr-lambda")})
    layout = Layout(machine, DISK, bare=True)
    assert Path("/home/runner/work/ctr-lambda") not in layout.hidden()
    assert Path("/home") in layout.hidden()
    # ... and the checkout of a host that keeps it comes back read-only inside the new /home.
    kept = Layout(machine, DISK).binds()[1]
    assert kept == Bind(machine.checkout, machine.checkout, read_only=True)


def test_the_test_folders_outside_tmp_are_hidden_too() -> None:
    machine = Machine(**{**MACHINE.__dict__, "hidden": (Path("/scratch/pytest"),)})
    assert Path("/scratch/pytest") in Layout(machine, DISK).hidden()


def test_no_host_hides_the_root_folder() -> None:
    machine = Machine(**{**MACHINE.__dict__, "home": Path("/")})
    with pytest.raises(hosts.HostError, match="root folder"):
        Layout(machine, DISK, bare=True).hidden()


def test_the_script_binds_what_it_keeps_before_it_hides_anything() -> None:
    lines = Layout(MACHINE, DISK, bare=True, keep=(S3_JARS,)).script().splitlines()
    assert lines[:2] == ["set -eu", f"mount -t tmpfs -o mode=0755 ctr-stage {STAGE}"]
    binds = [i for i, line in enumerate(lines) if line.startswith("mount --bind")]
    hides = [i for i, line in enumerate(lines) if line.startswith("mount -t tmpfs -o mode=")]
    moves = [i for i, line in enumerate(lines) if line.startswith("mount --move")]
    assert len(binds) == len(moves) == 4
    assert max(binds) < min(hides[1:])
    assert max(hides) < min(moves)
    assert f"mount --bind {DISK / 'home'} {STAGE}/0" in lines
    assert f"mount --move {STAGE}/1 {SPARK_HOME}" in lines
    # Spark, Python and the jars are read-only; the home is not.
    assert f"mount -o remount,bind,ro {STAGE}/0" not in lines
    assert all(f"mount -o remount,bind,ro {STAGE}/{n}" in lines for n in (1, 2, 3))
    assert "mount -t tmpfs -o mode=1777 ctr-host /tmp" in lines
    assert lines[-2:] == [f"umount {STAGE}", "echo ready"]


def test_a_host_process_gets_the_host_s_home_and_only_what_it_is_given() -> None:
    layout = Layout(MACHINE, DISK, address="127.0.0.7")
    env = layout.environ({"LAKE_ROOT": "s3://lake", "TMPDIR": "/tmp/x"})
    assert env == {
        "PATH": "/usr/bin:/bin",
        "JAVA_HOME": "/usr/lib/jvm/java-17",
        "HOME": "/home/ctr",
        "TMPDIR": "/tmp/x",
        "SPARK_LOCAL_IP": "127.0.0.7",
        "CTR_JAR_CACHE": "/root/.cache/ctr-lambda/jars",
        "LAKE_ROOT": "s3://lake",
    }
    assert "CTR_JAR_CACHE" not in Layout(MACHINE, DISK, bare=True).environ()


def test_the_machine_passes_only_its_path_java_and_locale() -> None:
    environ = {"PATH": "/bin", "LANG": "C.UTF-8", "LAKE_ROOT": "/tmp/lake", "HOME": "/root"}
    machine = Machine.of(environ, jar_cache=Path("/jars"))
    assert machine.environ == {"PATH": "/bin", "LANG": "C.UTF-8"}


def test_hosts_are_unavailable_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "need root" in (hosts.unavailable() or "")


def test_hosts_are_unavailable_without_unshare(monkeypatch: pytest.MonkeyPatch) -> None:
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "unshare" else which(tool))
    assert hosts.unavailable() == "unshare (util-linux) not installed"
