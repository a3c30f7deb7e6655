"""The running Airflow's REST API, for the scripts that start it (infra/airflow-up.sh, make demo).

``python -m infra.airflow_api token`` prints an access token of the admin (what
``infra/airflow-backfills.sh`` calls the API with).

``python -m infra.airflow_api unpause ctr_batch ctr_maintenance`` unpauses DAGs as soon as the
DAG processor has parsed them, through the API server (one request each), instead of the
``airflow dags reserialize`` and ``airflow dags unpause`` commands, each of which starts
Airflow's whole Python (5-30 s apiece on a busy small machine).

It logs in as the admin of the simple auth manager (its generated password file under
``AIRFLOW_HOME``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class AirflowApiError(Exception):
    """The API server refused or did not answer; the message says which and why."""


class AirflowApi:
    def __init__(self, url: str, password_file: Path, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.token = self._login(password_file)

    def _login(self, password_file: Path) -> str:
        try:
            password = json.loads(password_file.read_text())["admin"]
        except (OSError, ValueError, KeyError) as exc:
            raise AirflowApiError(f"no admin password in {password_file}: {exc}") from exc
        body = {"username": "admin", "password": password}
        answer = self._call("POST", "/auth/token", body, authorized=False)
        return str(answer["access_token"])

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, authorized: bool = True
    ) -> Any:
        headers = {"Content-Type": "application/json"}
        if authorized:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise AirflowApiError(f"{method} {path}: HTTP {exc.code} {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise AirflowApiError(f"{method} {path}: no answer from {self.url}: {exc}") from exc

    def dag_ids(self) -> set[str]:
        """The DAGs the API server knows (the DAG processor has parsed and stored)."""
        answer = self._call("GET", "/api/v2/dags?limit=1000")
        return {dag["dag_id"] for dag in answer["dags"]}

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self._call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})


def unpause(api: AirflowApi, dag_ids: list[str], wait_s: float) -> None:
    """Unpause each of ``dag_ids`` once it is parsed; waits up to ``wait_s`` for all of them."""
    deadline = time.monotonic() + wait_s
    left = list(dag_ids)
    while True:
        known = api.dag_ids()
        for dag_id in [d for d in left if d in known]:
            api.set_paused(dag_id, False)
            left.remove(dag_id)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AirflowApiError(
                f"{', '.join(left)} not parsed within {wait_s:.0f} s "
                f"(known: {', '.join(sorted(known)) or 'none'}); see the DAG processor's log"
            )
        time.sleep(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["token", "unpause"], help="what to do")
    parser.add_argument("dag_ids", nargs="*", metavar="DAG_ID", help="the DAGs to unpause")
    parser.add_argument(
        "--url",
        default=f"http://127.0.0.1:{os.environ.get('AIRFLOW_PORT', '8080')}",
        help="the API server (default http://127.0.0.1:$AIRFLOW_PORT, 8080)",
    )
    parser.add_argument(
        "--wait", type=float, default=180.0, help="seconds to wait for the DAGs to be parsed"
    )
    # Intermixed: the DAG ids may follow the options (a '*' positional is otherwise taken, empty,
    # right after the action, and the ids are refused as unrecognized).
    args = parser.parse_intermixed_args(argv)
    home = os.environ.get("AIRFLOW_HOME")
    if not home:
        parser.error("set AIRFLOW_HOME (source run/demo/env)")
    if args.action == "unpause" and not args.dag_ids:
        parser.error("unpause: name the DAGs")
    try:
        api = AirflowApi(args.url, Path(home) / "simple_auth_manager_passwords.json.generated")
        if args.action == "token":
            print(api.token)
            return
        unpause(api, args.dag_ids, args.wait)
    except AirflowApiError as exc:
        sys.exit(f"airflow: {exc} (is Airflow running at {args.url}?)")
    print(f"airflow: unpaused {' '.join(args.dag_ids)}")


if __name__ == "__main__":
    main()
