"""`ctr --help` and every subcommand's help: the entry points a newcomer meets first."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from lake.settings import LakeSettings
from lake.speed_status import write_status
from runtime.streaming import StreamProgress

runner = CliRunner()


def test_top_level_help_lists_every_subcommand_with_a_line() -> None:
    result = runner.invoke(app, ["--help"], terminal_width=200, env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for command, words in [
        ("produce", "synthetic ad traffic"),
        ("replay", "Replay a file of events"),
        ("kafka", "Local Apache Kafka cluster"),
        ("archive", "exactly once"),
        ("batch", "Recompute batch/ctr"),
        ("backfill", "hour by hour"),
        ("speed", "speed/ctr"),
    ]:
        line = next(line for line in result.output.splitlines() if line.startswith(f"│ {command} "))
        assert words in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["produce"], ["--events", "--rate", "--seed", "--duplicates", "--ground-truth"]),
        (["replay"], ["FILE", "--speed", "JSON Lines"]),
        (["kafka"], ["up", "down", "status", "create-topics"]),
        (["kafka", "up"], ["--brokers", "RUN_DIR/kafka"]),
        (["kafka", "status"], ["earliest/latest offsets"]),
        (["archive"], ["--available-now", "master/rejected", "CHECKPOINT_ROOT"]),
        (["batch"], ["--start", "--end", "batch/coverage"]),
        (["backfill"], ["--from", "--to", "airflow backfill create"]),
        (["speed"], ["--available-now", "--reset", "SPEED_WATERMARK", "status"]),
        (["speed", "status"], ["--json", "lag", "watermark"]),
    ],
)
def test_subcommand_help(args: list[str], expected: list[str]) -> None:
    result = runner.invoke(app, [*args, "--help"], terminal_width=200, env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for text in expected:
        assert text in result.output


def test_bad_option_values_name_the_option() -> None:
    result = runner.invoke(
        app, ["produce", "--duplicates", "2"], terminal_width=200, env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2
    assert "--duplicates" in result.output
    result = runner.invoke(
        app, ["produce", "--start", "yesterday"], terminal_width=200, env={"COLUMNS": "200"}
    )
    assert result.exit_code == 2
    assert "--start" in result.output
    assert "ISO-8601" in result.output


def test_speed_status_reads_the_jobs_status_file(tmp_path: Path) -> None:
    env = {"CHECKPOINT_ROOT": str(tmp_path), "COLUMNS": "200"}
    missing = runner.invoke(app, ["speed", "status"], env=env)
    assert missing.exit_code == 1
    assert "has not run" in missing.output

    progress = StreamProgress(
        batch_id=7,
        input_rows=5000,
        input_rows_per_second=5012.5,
        processed_rows_per_second=6100.0,
        batch_duration_ms=820,
        offsets_behind=130,
        watermark=dt.datetime(2026, 11, 22, 9, 50, tzinfo=dt.UTC),
        metrics={"speed.invalid": 3},
    )
    write_status(LakeSettings(checkpoint_root=tmp_path), progress)
    shown = runner.invoke(app, ["speed", "status"], env=env)
    assert shown.exit_code == 0, shown.output
    for words in (
        "last batch     7",
        "5,012 rows/s",
        "820 ms",
        "offsets behind 130",
        "2026-11-22T09:50:00+00:00",
        "3 in the last batch",
    ):
        assert words in shown.output
    raw = runner.invoke(app, ["speed", "status", "--json"], env=env)
    assert json.loads(raw.output)["offsets_behind"] == 130


@pytest.mark.parametrize(
    "args",
    [["--ctr-drop", "ad-001-01"], ["--start", "yesterday"], ["--campaigns", "0"]],
)
def test_a_produce_usage_error_comes_before_any_other_output(args: list[str]) -> None:
    """`ctr produce` printed "seed …" before its usage error (issue 70)."""
    result = runner.invoke(app, ["produce", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert result.output.startswith("Usage:")
    assert "seed" not in result.output


def test_the_delivery_report_names_a_missing_field(capsys: pytest.CaptureFixture[str]) -> None:
    from cli.ingest import _report_delivery
    from ingest.producer import DeliveryStats

    stats = DeliveryStats(dead_lettered=2, flushed=True)
    stats.invalid_reasons.update({"schema_version (missing)": 1, "record": 1})
    _report_delivery(stats)
    assert "dead-lettered by field: schema_version (missing) 1, record 1" in capsys.readouterr().err
