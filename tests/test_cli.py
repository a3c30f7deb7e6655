"""`ctr --help` and every subcommand's help: the entry points a newcomer meets first."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_top_level_help_lists_every_subcommand_with_a_line() -> None:
    result = runner.invoke(app, ["--help"], terminal_width=200, env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for command, words in [
        ("produce", "synthetic ad traffic"),
        ("replay", "Replay a file of events"),
        ("kafka", "Local Kafka broker and topics"),
        ("archive", "exactly once"),
        ("batch", "Recompute batch/ctr"),
        ("backfill", "hour by hour"),
    ]:
        line = next(line for line in result.output.splitlines() if line.startswith(f"│ {command} "))
        assert words in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["produce"], ["--events", "--rate", "--seed", "--duplicates", "--ground-truth"]),
        (["replay"], ["FILE", "--speed", "JSON Lines"]),
        (["kafka"], ["up", "down", "status", "create-topics"]),
        (["kafka", "up"], ["embedded broker"]),
        (["kafka", "status"], ["earliest/latest offsets"]),
        (["archive"], ["--available-now", "master/rejected", "CHECKPOINT_ROOT"]),
        (["batch"], ["--start", "--end", "batch/coverage"]),
        (["backfill"], ["--from", "--to", "airflow backfill create"]),
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
