"""`make demo-down` (infra/demo-down.sh): it stops only the process groups the demo started,
recognised by the run id in their environment, never a pid that has since become someone
else's. (The whole demo is too slow for `make test`; these run the real script on stand-ins.)"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.waiting import wait_until

RUN_ID = "20261123T100000Z-1"


def demo_down(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "infra" / "demo-down.sh")],
        # No broker there: the drain step finds none (a demo running on this machine must
        # not make it wait for the stand-ins).
        env={**os.environ, "RUN_DIR": str(run_dir), "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started stand-ins, each in its own session; reaped as they exit, killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, 9)
        process.wait(timeout=10)


def start(spawn: list[subprocess.Popen[bytes]], script: str, marker: str | None) -> int:
    env = {**os.environ}
    env.pop("CTR_DEMO_RUN", None)
    if marker is not None:
        env["CTR_DEMO_RUN"] = marker
    process = subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)
    spawn.append(process)
    threading.Thread(target=process.wait, daemon=True).start()  # no zombie left to wait for
    return process.pid


def record(run_dir: Path, **pids: int) -> None:
    demo = run_dir / "demo"
    demo.mkdir(parents=True, exist_ok=True)
    (demo / "run-id").write_text(RUN_ID + "\n")
    for name, pid in pids.items():
        (demo / f"{name.replace('_', '-')}.pid").write_text(f"{pid}\n")


def test_nothing_recorded_is_nothing_to_stop(tmp_path: Path) -> None:
    done = demo_down(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("demo: nothing to stop")


@pytest.mark.parametrize("run_recorded", [True, False])
def test_a_cluster_demo_that_failed_early_still_stops_its_services(
    tmp_path: Path, spawn: list[subprocess.Popen[bytes]], run_recorded: bool
) -> None:
    """The cluster profile starts the S3 server, Spark and PostgreSQL before the run's own
    processes (and before its run id, when they fail): those are stopped all the same."""
    spark = tmp_path / "demo" / "spark"
    spark.mkdir(parents=True)
    if run_recorded:
        record(tmp_path)
    master = start(spawn, "exec sleep 300", None)
    worker = start(spawn, "exec sleep 300", None)
    (spark / "master.pid").write_text(f"{master}\n")
    (spark / "worker.pid").write_text(f"{worker}\n")
    done = demo_down(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "demo: spark: stopped" in done.stdout
    assert "nothing else to stop" in done.stdout
    wait_until(
        lambda: not (alive(master) or alive(worker)), timeout_s=60, what="spark's processes ended"
    )
    assert not alive(master)
    assert not alive(worker)


def test_a_pid_without_this_runs_marker_is_left_alone(
    tmp_path: Path, spawn: list[subprocess.Popen[bytes]]
) -> None:
    stranger = start(spawn, "sleep 60", marker=None)
    other_run = start(spawn, "sleep 60", marker="20261122T000000Z-9")  # an earlier demo's
    record(tmp_path, producer=stranger, api=other_run)

    done = demo_down(tmp_path)

    assert done.returncode == 0, done.stderr
    assert alive(stranger)
    assert alive(other_run)
    assert f"producer: pid {stranger} is not a process of this demo" in done.stdout
    assert f"api: pid {other_run} is not a process of this demo" in done.stdout
    assert not (tmp_path / "demo" / "producer.pid").exists()
    assert not (tmp_path / "demo" / "run-id").exists()


def test_its_own_process_groups_are_stopped_children_included(
    tmp_path: Path, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # A leader that exits on SIGTERM but leaves a child in its group (like a driver and its JVM).
    archiver = start(spawn, "sleep 60 & wait", marker=RUN_ID)
    batch_loop = start(spawn, "trap 'exit 0' TERM; sleep 60 & wait", marker=RUN_ID)
    stranger = start(spawn, "sleep 60", marker=None)
    record(tmp_path, archiver=archiver, batch_loop=batch_loop)

    def both_started_their_child() -> dict[int, list[int]] | None:
        groups = {pid: [int(p) for p in _members(pid)] for pid in (archiver, batch_loop)}
        return groups if all(len(members) == 2 for members in groups.values()) else None

    groups = wait_until(both_started_their_child, timeout_s=60, what="both started their child")
    assert all(len(members) == 2 for members in groups.values()), groups

    done = demo_down(tmp_path)

    assert done.returncode == 0, done.stderr
    assert f"archiver: stopping (pid {archiver})" in done.stdout
    assert f"batch-loop: stopping (pid {batch_loop})" in done.stdout
    assert [pid for members in groups.values() for pid in members if alive(pid)] == []
    assert alive(stranger)
    assert not list((tmp_path / "demo").glob("*.pid"))


def test_a_process_of_this_run_outside_every_recorded_group_is_stopped(
    tmp_path: Path, spawn: list[subprocess.Popen[bytes]]
) -> None:
    # Like an Airflow task (a session of its own) still running when Airflow stopped.
    api = start(spawn, "sleep 60", marker=RUN_ID)
    orphan = start(spawn, "sleep 60", marker=RUN_ID)
    earlier = start(spawn, "sleep 60", marker="20261122T000000Z-9")
    record(tmp_path, api=api)

    done = demo_down(tmp_path)

    assert done.returncode == 0, done.stderr
    assert f"stopping 1 leftover process(es) of this run ({orphan})" in done.stdout
    assert not alive(orphan)
    assert alive(earlier)


def _members(pgid: int) -> list[str]:
    listing = subprocess.run(
        ["ps", "-eo", "pid=,pgid="], capture_output=True, text=True, check=True
    ).stdout
    return [
        pid for pid, group in (line.split() for line in listing.splitlines()) if group == str(pgid)
    ]


def test_drain_compares_the_last_committed_offsets_with_the_topic_end(tmp_path: Path) -> None:
    from infra.demo_drain import behind
    from lake.checkpoints import Checkpoint
    from runtime.object_store import ObjectStoreSettings

    checkpoint = tmp_path / "archiver"
    local = Checkpoint(str(checkpoint), ObjectStoreSettings(lake_root=""))
    assert local.committed_offsets("ad-events") == {}  # not started yet: nothing read
    for batch, offsets in ((4, {"0": 10, "1": 7}), (5, {"0": 12, "1": 9})):
        (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
        (checkpoint / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0}\n' + json.dumps({"ad-events": offsets})
        )
    (checkpoint / "commits").mkdir()
    (checkpoint / "commits" / "4").write_text("v1\n{}")  # batch 5 planned, not committed

    committed = local.committed_offsets("ad-events")

    assert committed == {0: 10, 1: 7}
    assert behind({0: 12, 1: 9, 2: 3}, committed) == 2 + 2 + 3
    assert behind({0: 10, 1: 7}, committed) == 0
