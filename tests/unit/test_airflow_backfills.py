"""infra/airflow-backfills.sh's errors (issue 80): an unknown action prints the usage (not a
stray `set -euo pipefail`), an unknown backfill or DAG is named as such, with the DAGs there are,
never a bare curl 404 or Airflow's traceback. Against a stand-in for Airflow's REST API."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

import pytest

SCRIPT: Final = Path(__file__).parents[2] / "infra" / "airflow-backfills.sh"
# python3 (the venv's) and curl, nothing else of this machine's.
PATH: Final = f"{Path(sys.executable).parent}:/usr/bin:/bin"
DAGS: Final = ("ctr_batch", "ctr_recompute_stale")
BACKFILL: Final = {
    "id": 3,
    "dag_id": "ctr_batch",
    "from_date": "2026-11-22T03:00:00Z",
    "to_date": "2026-11-22T05:00:00Z",
    "max_active_runs": 1,
    "completed_at": None,
    "is_paused": False,
}


class FakeAirflow(BaseHTTPRequestHandler):
    """The few routes the script calls, answered as Airflow 3's API answers them."""

    def do_POST(self) -> None:
        self._answer(200, {"access_token": "t"} if self.path == "/auth/token" else {})

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/api/v2/dags":
            self._answer(200, {"dags": [{"dag_id": d} for d in DAGS]})
        elif path.startswith("/api/v2/dags/"):
            known = path.removeprefix("/api/v2/dags/") in DAGS
            self._answer(200 if known else 404, {} if known else {"detail": "not found"})
        elif path == "/api/v2/backfills" and "dag_id=ctr_batch" in query:
            self._answer(200, {"backfills": [BACKFILL]})
        else:
            self._answer(200, {"backfills": []})

    def do_PUT(self) -> None:
        if self.path == "/api/v2/backfills/3/cancel":
            self._answer(200, BACKFILL)
        else:
            self._answer(404, {"detail": "Backfill not found"})

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def airflow(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The script's environment: AIRFLOW_HOME with a password file, the stand-in's port."""
    (tmp_path / "simple_auth_manager_passwords.json.generated").write_text('{"admin": "pw"}')
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeAirflow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {
            "PATH": PATH,
            "AIRFLOW_HOME": str(tmp_path),
            "AIRFLOW_PORT": str(server.server_address[1]),
        }
    finally:
        server.shutdown()
        server.server_close()


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_an_unknown_action_prints_the_usage_comment_only() -> None:
    result = run({"PATH": PATH}, "cancle")
    assert result.returncode == 2
    said = result.stderr.splitlines()
    assert said[0] == "airflow-backfills: unknown action 'cancle'"
    assert "bash infra/airflow-backfills.sh cancel|pause|unpause BACKFILL_ID" in result.stderr
    assert said[-1].startswith("Reads AIRFLOW_HOME")
    assert "set -euo pipefail" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cancel", "three"], "BACKFILL_ID: a number, got 'three'"),
        (["create", "--from-date", "2026-11-22"], "create: --dag-id DAG_ID is required"),
        (["list", "ctr;batch"], "DAG_ID: letters, digits"),
    ],
)
def test_bad_arguments_are_named_before_airflow_is_asked(args: list[str], message: str) -> None:
    result = run({"PATH": PATH}, *args)  # no AIRFLOW_HOME: nothing is asked
    assert result.returncode == 1
    assert message in result.stderr


def test_an_unknown_backfill_is_named(airflow: dict[str, str]) -> None:
    result = run(airflow, "cancel", "7")
    assert result.returncode == 1
    assert "airflow-backfills: no backfill 7 (list them:" in result.stderr
    assert "curl" not in result.stderr
    assert run(airflow, "cancel", "3").stdout == "backfill 3: cancel requested\n"


@pytest.mark.parametrize(
    "args",
    [
        ["list", "ctr_bach"],
        ["list", "--dag-id", "ctr_bach"],
        ["create", "--dag-id", "ctr_bach", "--from-date", "2026-11-22T03:00:00+00:00"],
    ],
)
def test_an_unknown_dag_is_named_with_the_known_ones(
    airflow: dict[str, str], args: list[str]
) -> None:
    result = run(airflow, *args)
    assert result.returncode == 1
    assert result.stderr == (
        "airflow-backfills: no DAG 'ctr_bach' in this Airflow; its DAGs: "
        "ctr_batch, ctr_recompute_stale\n"
    )


def test_list_shows_the_dags_backfills(airflow: dict[str, str]) -> None:
    result = run(airflow, "list")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "1 backfill(s) of ctr_batch",
        "  id 3: ctr_batch 2026-11-22T03:00:00Z .. 2026-11-22T05:00:00Z, max_active_runs 1, "
        "running",
    ]
