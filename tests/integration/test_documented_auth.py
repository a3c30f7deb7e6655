"""The HTTP reference's claim about each operation's key, held against the running app: an
operation the page says needs a key answers 401 without one; one it says takes a key optionally,
or says nothing of keys, answers without one."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from api.settings import ApiSettings
from reference import api_page
from tests.support.api_server import running_api
from tests.support.lake_writer import build_sandbox_lake

TOKEN = "documented-auth-token-0123456789"


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    lake = build_sandbox_lake(Path(tmp_path_factory.mktemp("documented-auth")))
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, key_use_flush_s=3600)
    with running_api(settings, lake) as url:
        yield url


def _operations(document: dict[str, object]) -> Iterator[tuple[str, str, dict[str, object]]]:
    paths = document["paths"]
    assert isinstance(paths, dict)
    for path, methods in paths.items():
        for method, operation in methods.items():
            yield method.upper(), path, operation


def test_each_operation_answers_without_a_key_as_the_reference_says(base_url: str) -> None:
    document = httpx.get(f"{base_url}/openapi.json", timeout=30).json()
    page = Path("docs/reference/http-api.md").read_text()
    checked = 0
    for method, path, operation in _operations(document):
        section = page.split(f"## `{method} {path}`", 1)[1].split("\n## ", 1)[0]
        says_needed = api_page.NEEDS_KEY in section
        says_optional = api_page.KEY_OPTIONAL in section
        assert not (says_needed and says_optional), (method, path)
        url = base_url + re.sub(r"\{[^}]+\}", "x", path)
        response = httpx.request(method, url, json={} if method != "GET" else None, timeout=60)
        if says_needed:
            assert response.status_code == 401, (method, path, response.status_code)
        else:
            assert response.status_code != 401, (method, path, response.text[:200])
        if operation.get("security") and not says_needed:
            assert says_optional, (method, path)
        checked += 1
    assert checked >= 10
