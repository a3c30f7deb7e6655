"""infra/airflow_api.py's command line (pure parsing; the REST calls run against a real Airflow in
tests/e2e/test_airflow_postgres.py): the DAG ids may follow the options, as airflow-up.sh gives
them."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import airflow_api


class Recorded:
    def __init__(self, url: str, password_file: Path) -> None:
        self.url = url
        self.token = "t0ken"


def test_the_dags_to_unpause_may_follow_the_options(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    unpaused: list[tuple[list[str], float]] = []
    monkeypatch.setenv("AIRFLOW_HOME", "/nowhere")
    monkeypatch.setattr(airflow_api, "AirflowApi", Recorded)
    monkeypatch.setattr(
        airflow_api, "unpause", lambda _api, ids, wait: unpaused.append((ids, wait))
    )
    airflow_api.main(["unpause", "--url", "http://a:1", "--wait", "5", "ctr_batch", "ctr_x"])
    assert unpaused == [(["ctr_batch", "ctr_x"], 5.0)]
    airflow_api.main(["token"])
    assert capsys.readouterr().out.splitlines()[-1] == "t0ken"


def test_unpause_without_dags_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", "/nowhere")
    with pytest.raises(SystemExit) as exited:
        airflow_api.main(["unpause", "--url", "http://a:1"])
    assert exited.value.code == 2
