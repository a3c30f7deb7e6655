"""schemathesis against the served OpenAPI schema: generated requests, valid and invalid, never
get a 5xx, and every answer conforms to the document (status code, content type, body)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
from pydantic import SecretStr
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.generation import GenerationMode

from api.settings import ApiSettings
from tests.support.api_server import running_api
from tests.support.lake_writer import cover, ctr_row, minute, write_batch, write_speed
from tests.support.lakes import new_lake

TOKEN = "schema-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[schemathesis.BaseSchema]:
    root = tmp_path_factory.mktemp("schema-lake")
    lake = new_lake(root)
    write_batch(lake, "run-a", [ctr_row(minute(5), 100, 10)])
    cover(lake, "run-a", minute(0), minute(30))
    write_speed(lake, [ctr_row(minute(45), 40, 4)])
    settings = ApiSettings(token=SecretStr(TOKEN), sql_timeout_s=2, max_range_days=31)
    with running_api(settings, lake) as url:
        yield schemathesis.openapi.from_url(f"{url}/openapi.json")


CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def run(operation: Any, mode: GenerationMode, examples: int, checks: list[Any]) -> None:
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(case: Any) -> None:
        case.call_and_validate(headers=AUTH, checks=checks)

    check()


# schemathesis' pytest plugin does not run on pytest 9 ('Function' has no '_nodeid'): drive
# each operation's hypothesis strategy directly, with a bounded budget (derandomized).
@pytest.mark.timeout(180)
def test_generated_requests(api_schema: schemathesis.BaseSchema) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 5
    for operation in operations:
        run(operation, GenerationMode.POSITIVE, 25, CONFORMANCE)
        if len(operation.query) or len(operation.body):
            run(operation, GenerationMode.NEGATIVE, 15, CONFORMANCE)
        if len(operation.body):
            # JSON bodies have real types (a query string is text whatever the schema says):
            # every schema-violating body must be refused.
            run(operation, GenerationMode.NEGATIVE, 25, [*CONFORMANCE, negative_data_rejection])
