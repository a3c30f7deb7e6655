"""docs/getting-started.md runs: every ``sh`` block of the page, as written, in its order, in
bash, against a real lake (events archived with Spark), a real API server and the test's
broker, with the environment ``source run/demo/env`` gives (``PATH``, ``API_TOKEN``,
``LAKE_ROOT``, the Kafka login). Only the demo's address is replaced by the test server's."""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest
from pydantic import SecretStr

from api.settings import ApiSettings
from lake.settings import LakeSettings
from reference import first_steps
from tests.support.api_server import running_api
from tests.support.events import archive, event
from tests.support.lake_writer import speed_row, write_speed
from tests.support.lakes import new_lake

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"
DEMO_URL = "http://127.0.0.1:8000"
TOKEN = "getting-started-token-0123456789"
_ASSIGNMENTS = re.compile(r"(?:[A-Z_]+=\$\(date [^()]*\)\s*)+")
_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks() -> list[str]:
    """The page's ``sh`` blocks (``console`` ones, like ``make demo``, are not run: the test's
    lake, server and broker stand in for the demo)."""
    return _BLOCK.findall(PAGE.read_text())


def _history(lake: LakeSettings, spark: SparkSession, now: dt.datetime) -> None:
    """Three hours of traffic, ending an hour ago: an impression every minute in one of three
    countries, a click on every fifth; archived, and counted by the speed layer (as the demo's
    running speed job has them before any batch run)."""
    start = now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=4)
    rows, counted = [], []
    for n in range(180):
        at = start + dt.timedelta(minutes=n, seconds=7)
        country = ("US", "DE", "FR")[n % 3]
        rows.append({**event(f"imp-{n}", "impression", at, offset=2 * n), "country": country})
        clicks = int(n % 5 == 0)
        if clicks:
            click = event(f"clk-{n}", "click", at + dt.timedelta(seconds=5), offset=2 * n + 1)
            rows.append({**click, "impression_id": f"i-imp-{n}", "country": country})
        bucket = at.replace(second=0)
        counted.append(speed_row(bucket, 1, clicks, clicks, country=country))
    archive(spark, lake, rows)
    write_speed(lake, counted)


def _run_in_one_shell(commands: list[str], env: dict[str, str], cwd: Path) -> list[str]:
    """The commands in one bash, as a user pastes them into one terminal (a step may keep a
    variable for a later one); each one's output, told apart by a marker line."""
    marker = "::ctr-getting-started-step::"
    script = "".join(f"printf '\\n{marker}\\n'\n{command}\n" for command in commands)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{script}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    outputs = done.stdout.split(f"\n{marker}\n")[1:]
    assert len(outputs) == len(commands), done.stdout
    return outputs


def test_the_getting_started_commands_run_as_written(
    spark: SparkSession, kafka_env: dict[str, str], tmp_path: Path
) -> None:
    steps = first_steps.steps()
    assert len(steps) >= 9, "the page lost its commands"
    assert [block.partition("\n")[2].rstrip("\n") for block in blocks()] == [
        step.command for step in steps
    ]
    lake = new_lake(tmp_path)
    # curl exits non-zero on an HTTP error (with the error's body on stdout): a 4xx fails.
    (tmp_path / ".curlrc").write_text("fail-with-body\n")
    _history(lake, spark, dt.datetime.now(dt.UTC))
    env = {
        **kafka_env,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "API_TOKEN": TOKEN,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "CURL_HOME": str(tmp_path),
    }
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0)
    with running_api(settings, lake) as url:
        ran = _run_in_one_shell(
            [step.command.replace(DEMO_URL, url) for step in steps], env, tmp_path
        )
    outputs = {step.what: out for step, out in zip(steps, ran, strict=True)}  # by what it does

    print(*(f"# {what}\n{out[:2000]}" for what, out in outputs.items()), sep="\n")  # on failure
    answers = list(outputs.values())
    first_query = orjson.loads(answers[0])
    assert 1 <= len(first_query["rows"]) <= 5
    assert {row["country"] for row in first_query["rows"]} <= {"US", "DE", "FR"}
    assert answers[1].splitlines()[0].startswith("bucket_start,")
    http_sql = orjson.loads(next(o for w, o in outputs.items() if w.startswith("the same over")))
    assert http_sql["columns"] == ["minutes"], http_sql
    after_backfill = next(o for w, o in outputs.items() if w.startswith("where the backfilled"))
    assert "batch" in after_backfill, after_backfill
    assert "speed" not in after_backfill, after_backfill  # the backfill covered every minute
    drift = next(o for w, o in outputs.items() if w.startswith("drift"))
    runs = re.findall(r"^\S (ctr-\S+) ", drift, re.MULTILINE)  # a row per run, its id first
    assert runs, drift
    assert len(runs) == len(set(runs)), drift


@pytest.mark.parametrize("step", first_steps.steps(), ids=lambda step: step.what[:40])
def test_each_command_of_the_page_is_a_platform_command(step: first_steps.Step) -> None:
    """What the page shows is `ctr` or `curl` against the demo's API: nothing the test would
    have to stand in for silently."""
    lines = [line for line in step.command.splitlines() if line and not line.startswith(" ")]
    commands = [line for line in lines if not _ASSIGNMENTS.fullmatch(line)]  # `START=$(date …)`
    assert commands, lines
    assert all(c.split()[0] in ("ctr", "curl") for c in commands), commands
    assert DEMO_URL in step.command or commands[0].startswith("ctr ")
