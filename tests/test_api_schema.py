"""schemathesis against the served OpenAPI schema: generated requests never get a 5xx."""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error

from api import ApiSettings
from infra.lake import LakeSettings
from tests.lake_writer import cover, ctr_row, minute, write_batch, write_speed
from tests.test_api import AUTH, TOKEN, serve


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[schemathesis.BaseSchema]:
    root = tmp_path_factory.mktemp("schema-lake")
    lake = LakeSettings(lake_root=root / "lake", checkpoint_root=root / "checkpoints")
    write_batch(lake, "run-a", [ctr_row(minute(5), 100, 10)])
    cover(lake, "run-a", minute(0), minute(30))
    write_speed(lake, [ctr_row(minute(45), 40, 4)])
    for url in serve(ApiSettings(token=TOKEN, sql_timeout_s=2, max_range_days=31), lake):
        yield schemathesis.openapi.from_url(f"{url}/openapi.json")


# schemathesis' pytest plugin does not run on pytest 9 ('Function' has no '_nodeid'): drive
# each operation's hypothesis strategy directly.
@pytest.mark.timeout(120)
def test_no_server_errors(api_schema: schemathesis.BaseSchema) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 5
    for operation in operations:

        @hypothesis.given(case=operation.as_strategy())
        @hypothesis.settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=list(hypothesis.HealthCheck),
            derandomize=True,
            database=None,
        )
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(headers=AUTH, checks=[not_a_server_error])

        check()
