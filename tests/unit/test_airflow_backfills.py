"""infra/airflow-backfills.sh's errors (issue 70): an unknown action prints the usage (not a
stray `set -euo pipefail`), an unknown backfill or DAG is named as such, with the DAGs there are,
never a bare curl 404 or Airflow's traceback. A cancel notes the backfill's runs that Airflow
marked failed though they never ran. Against a stand-in for Airflow's REST API."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, unquote

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
    "created_at": "2026-11-29T10:00:00.250000Z",
}
NOTE: Final = "never ran: backfill 3 was cancelled (Airflow marks its queued runs failed)"


def dag_run(hour: int, run_type: str, state: str, *, ran: bool, updated: str) -> dict[str, Any]:
    """A run of ctr_batch as Airflow lists it, with the updated_at it filters on (not listed)."""
    return {
        "dag_run_id": f"{run_type}__2026-11-22T{hour:02}:00:00+00:00",
        "dag_id": "ctr_batch",
        "run_type": run_type,
        "state": state,
        "start_date": f"2026-11-29T{hour:02}:10:00Z" if ran else None,
        "note": None,
        "updated_at": f"2026-11-29T{updated}Z",
    }


# Backfill 3 (created 10:00:00.25) ran 03:00, which failed, and 04:00; cancelled at 11:00 while
# 05:00 and 06:00 were queued. 02:00 is of backfill 2, cancelled before 3 was created; 07:00 a
# scheduled run marked failed before it started; 08:00 has a note already.
DAG_RUNS: Final = (
    dag_run(2, "backfill", "failed", ran=False, updated="09:00:00"),
    dag_run(3, "backfill", "failed", ran=True, updated="10:30:00"),
    dag_run(4, "backfill", "success", ran=True, updated="10:45:00"),
    dag_run(5, "backfill", "failed", ran=False, updated="11:00:00.5"),
    dag_run(6, "backfill", "failed", ran=False, updated="11:00:00.5"),
    dag_run(7, "scheduled", "failed", ran=False, updated="10:50:00"),
    {**dag_run(8, "backfill", "failed", ran=False, updated="11:00:00.5"), "note": "by hand"},
)
PAGE: Final = 2  # Airflow's api.maximum_page_limit (100 by default): a longer limit is cut to it


class StandIn(ThreadingHTTPServer):
    """The stand-in for Airflow's API; `noted`: the PATCHes of runs, (run id, query, body)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), FakeAirflow)
        self.noted: list[tuple[str, dict[str, list[str]], object]] = []


class FakeAirflow(BaseHTTPRequestHandler):
    """The few routes the script calls, answered as Airflow 3's API answers them."""

    server: StandIn

    def do_POST(self) -> None:
        self._answer(200, {"access_token": "t"} if self.path == "/auth/token" else {})

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path == "/api/v2/dags/ctr_batch/dagRuns":
            self._answer(200, dag_runs(parse_qs(query)))
        elif path == "/api/v2/dags":
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
            self._answer(
                200, {**BACKFILL, "is_paused": True, "completed_at": "2026-11-29T11:00:01Z"}
            )
        else:
            self._answer(404, {"detail": "Backfill not found"})

    def do_PATCH(self) -> None:
        path, _, query = self.path.partition("?")
        run_id = unquote(path.removeprefix("/api/v2/dags/ctr_batch/dagRuns/"))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        known = [r for r in DAG_RUNS if r["dag_run_id"] == run_id]
        if not known or self.headers["Content-Type"] != "application/json":
            self._answer(404, {"detail": f"The DagRun with run_id: `{run_id}` was not found"})
            return
        self.server.noted.append((run_id, parse_qs(query), body))
        self._answer(200, {**known[0], **body})

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def dag_runs(query: dict[str, list[str]]) -> dict[str, object]:
    """GET /api/v2/dags/ctr_batch/dagRuns: its run_type, state and updated_at_gte filters, pages."""
    since = (
        datetime.fromisoformat(query["updated_at_gte"][0]) if "updated_at_gte" in query else None
    )
    found = [
        {k: v for k, v in r.items() if k != "updated_at"}
        for r in DAG_RUNS
        if r["run_type"] in query.get("run_type", [r["run_type"]])
        and r["state"] in query.get("state", [r["state"]])
        and (since is None or datetime.fromisoformat(r["updated_at"]) >= since)
    ]
    offset = int(query.get("offset", ["0"])[0])
    limit = min(int(query.get("limit", ["50"])[0]), PAGE)
    return {"dag_runs": found[offset : offset + limit], "total_entries": len(found)}


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def airflow(tmp_path: Path, stand_in: StandIn) -> dict[str, str]:
    """The script's environment: AIRFLOW_HOME with a password file, the stand-in's port."""
    (tmp_path / "simple_auth_manager_passwords.json.generated").write_text('{"admin": "pw"}')
    return {
        "PATH": PATH,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW_PORT": str(stand_in.server_address[1]),
    }


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
    assert run(airflow, "cancel", "3").stdout.startswith("backfill 3: cancel requested\n")


def test_a_cancel_notes_the_runs_airflow_failed_though_they_never_ran(
    airflow: dict[str, str], stand_in: StandIn
) -> None:
    result = run(airflow, "cancel", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "backfill 3: cancel requested",
        f"backfill 3: 2 run(s) that never ran noted '{NOTE}'",
    ]
    # Not 02:00 (backfill 2's), 03:00 (it ran), 04:00 (succeeded), 07:00 (not a backfill's) nor
    # 08:00 (its note is kept).
    assert stand_in.noted == [
        (f"backfill__2026-11-22T{hour}:00:00+00:00", {"update_mask": ["note"]}, {"note": NOTE})
        for hour in ("05", "06")
    ]


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
