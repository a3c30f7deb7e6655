"""Security headers on every answer of the real API (uvicorn on a loopback port, Delta tables),
and /docs and the dashboard in headless Chromium under its Content-Security-Policy: nothing
fetched from another origin, no violation of the policy."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, NamedTuple

import httpx
import pytest
from pydantic import ByteSize, SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from api.security_headers import SecurityHeaders
from api.settings import ApiSettings
from infra.browser import Page
from tests.support import ROOT
from tests.support.api_server import running_api
from tests.support.dashboard_lake import TOKEN as DASHBOARD_TOKEN
from tests.support.lake_writer import cover, ctr_row, minute, write_batch
from tests.support.lakes import new_lake
from tests.support.waiting import wait_until

TOKEN: Final = "security-headers-token-0123"
AUTH: Final = {"Authorization": f"Bearer {TOKEN}"}
RANGE: Final = {"start": "2026-11-22T10:00:00Z", "end": "2026-11-22T11:00:00Z"}
MAX_BODY: Final = 1024
EXPECTED: Final = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
        "form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
# Run before any script of each document: the page's CSP violations, in window.__csp.
RECORD_VIOLATIONS: Final = """window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => window.__csp.push({
  directive: e.effectiveDirective, blocked: e.blockedURI, source: e.sourceFile,
  line: e.lineNumber, sample: e.sample }));"""
# Every URL the document and its scripts fetched (blocked ones included).
FETCHED: Final = """[...performance.getEntriesByType("navigation"),
  ...performance.getEntriesByType("resource")].map((e) => e.name)"""


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("headers-lake")
    lake = new_lake(root)
    write_batch(lake, "run-a", [ctr_row(minute(5), 100, 10), ctr_row(minute(6), 50, 1)])
    cover(lake, "run-a", minute(0), minute(30))
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0, max_body_bytes=ByteSize(MAX_BODY))
    with running_api(settings, lake) as url:
        yield url


def _security_headers(response: httpx.Response) -> dict[str, list[str]]:
    return {name: response.headers.get_list(name) for name in EXPECTED}


class Case(NamedTuple):
    """A request, and the status and content type of its answer."""

    method: str
    path: str
    status: int
    content_type: str
    request: dict[str, Any]


JSON: Final = "application/json"
HTML: Final = "text/html; charset=utf-8"
CASES: Final = {
    "ctr-json": Case("GET", "/api/v1/ctr", 200, JSON, {"params": RANGE, "headers": AUTH}),
    "ctr-csv": Case(
        "GET",
        "/api/v1/ctr",
        200,
        "text/csv; charset=utf-8",
        {"params": {**RANGE, "format": "csv"}, "headers": AUTH},
    ),
    "guard-401": Case("GET", "/api/v1/ctr", 401, JSON, {"params": RANGE}),
    "guard-413": Case(
        "POST", "/api/v1/sql", 413, JSON, {"content": b"x" * (MAX_BODY + 1), "headers": AUTH}
    ),
    "bad-parameter-400": Case(
        "GET", "/api/v1/ctr", 400, JSON, {"params": {"granularity": "fortnight"}, "headers": AUTH}
    ),
    "no-route-404": Case("GET", "/no/such/page", 404, JSON, {}),
    "method-405": Case("DELETE", "/healthz", 405, JSON, {}),
    "healthz": Case("GET", "/healthz", 200, JSON, {}),
    "metrics": Case(
        "GET", "/metrics", 200, "text/plain; version=1.0.0; charset=utf-8", {"headers": AUTH}
    ),
    "openapi": Case("GET", "/openapi.json", 200, JSON, {}),
    "dashboard": Case("GET", "/", 200, HTML, {}),
    "static-file": Case("GET", "/static/app.js", 200, "text/javascript; charset=utf-8", {}),
    "static-404": Case("GET", "/static/missing.js", 404, JSON, {}),
    "docs": Case("GET", "/docs", 200, HTML, {}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_every_kind_of_answer_carries_the_headers_once(base_url: str, case: Case) -> None:
    response = httpx.request(case.method, base_url + case.path, timeout=30, **case.request)
    assert (response.status_code, response.headers.get("content-type")) == (
        case.status,
        case.content_type,
    )
    assert _security_headers(response) == {name: [value] for name, value in EXPECTED.items()}


def test_redoc_is_off(base_url: str) -> None:
    assert httpx.get(f"{base_url}/redoc", timeout=10).status_code == 404


def test_a_header_the_app_sets_is_kept_not_doubled() -> None:
    def framed(request: Request) -> PlainTextResponse:
        return PlainTextResponse(
            "ok", headers={"X-Frame-Options": "SAMEORIGIN", "Content-Security-Policy": "sandbox"}
        )

    async def get() -> httpx.Response:
        app = SecurityHeaders(Starlette(routes=[Route("/", framed)]))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get("/")

    response = asyncio.run(get())
    assert _security_headers(response) == {
        **{name: [value] for name, value in EXPECTED.items()},
        "x-frame-options": ["SAMEORIGIN"],
        "content-security-policy": ["sandbox"],
    }


def test_headers_must_name_something() -> None:
    with pytest.raises(ValueError, match="'headers' must name at least one header"):
        SecurityHeaders(Starlette(), headers={})


def _violations_and_foreign_fetches(page: Page, origin: str) -> tuple[Any, list[str]]:
    fetched: list[str] = page.evaluate(FETCHED)
    return page.evaluate("window.__csp"), [url for url in fetched if not url.startswith(origin)]


def test_docs_render_from_this_server_under_the_policy(base_url: str, page: Page) -> None:
    page.send("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_VIOLATIONS})
    page.navigate(f"{base_url}/docs")
    page.wait_for("document.querySelectorAll('.opblock').length > 0")

    schema = httpx.get(f"{base_url}/openapi.json", timeout=10).json()
    listed = page.evaluate(
        """[...document.querySelectorAll('.opblock-summary')].map((s) => [
          s.querySelector('.opblock-summary-method').textContent.toLowerCase(),
          s.querySelector('.opblock-summary-path').dataset.path])"""
    )
    assert sorted(listed) == sorted(
        [method, path] for path, operations in schema["paths"].items() for method in operations
    )

    # An operation tried from the page: Swagger UI's request and its rendering of the answer.
    health = "#operations-operations-healthz_healthz_get"
    page.evaluate(f"document.querySelector('{health} .opblock-summary-control').click()")
    page.wait_for(f"document.querySelector('{health} .try-out__btn') !== null")
    page.evaluate(f"document.querySelector('{health} .try-out__btn').click()")
    page.wait_for(f"document.querySelector('{health} .execute') !== null")
    page.evaluate(f"document.querySelector('{health} .execute').click()")
    answer = page.wait_for(
        f"document.querySelector('{health} .live-responses-table tbody .response-col_status')"
        "?.textContent.trim()"
    )
    assert answer == "200"

    violations, foreign = _violations_and_foreign_fetches(page, base_url)
    assert (violations, foreign) == ([], [])
    assert page.evaluate("document.title") == "ctr-lambda - Swagger UI"


def test_the_dashboard_works_under_the_policy(
    dashboard_url: str, page: Page, tmp_path: Path
) -> None:
    downloads = tmp_path / "downloads"
    page.allow_downloads(downloads)
    page.send("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_VIOLATIONS})
    page.navigate(f"{dashboard_url}/#token={DASHBOARD_TOKEN}")
    page.wait_for("document.body.dataset.state === 'ready'")
    assert page.evaluate("ctrDashboard.charts.series.ctr.data.datasets[0].data.length") > 0

    # Another range, the table sorted, its CSV downloaded (a blob: URL the page makes).
    page.evaluate("""document.querySelector('#range [data-range="6h"]').click()""")
    page.wait_for("document.body.dataset.state === 'ready'")
    page.evaluate("""document.querySelector('#data-table thead button[data-sort="ctr"]').click()""")
    page.wait_for("location.search.includes('table_sort=')")
    page.evaluate("document.getElementById('download-csv').click()")
    wait_until(
        lambda: [p for p in downloads.glob("*.csv") if p.stat().st_size > 0],
        timeout_s=60,
        what=f"a CSV was downloaded into {downloads}",
    )

    violations, foreign = _violations_and_foreign_fetches(page, dashboard_url)
    assert (violations, foreign) == ([], [])
    headers = httpx.get(f"{dashboard_url}/", timeout=10).headers
    assert headers["content-security-policy"] == EXPECTED["content-security-policy"]


def test_vendored_swagger_ui_is_the_locked_version() -> None:
    lock = json.loads((ROOT / "dashboard/package-lock.json").read_text())
    locked = lock["packages"]["node_modules/swagger-ui-dist"]["version"]
    vendor = ROOT / "api/static/vendor/swagger-ui"
    assert f'PACKAGE_VERSION:"{locked}"' in (vendor / "swagger-ui-bundle.js").read_text(), (
        "api/static/vendor/swagger-ui/ is not the Swagger UI version pinned in "
        "dashboard/package-lock.json: run `make dashboard` and commit the result"
    )
    assert sorted(p.name for p in vendor.iterdir()) == [
        "LICENSE",
        "NOTICE",
        "favicon-32x32.png",
        "swagger-ui-bundle.js",
        "swagger-ui-bundle.js.LICENSE.txt",
        "swagger-ui.css",
    ]
