"""The API behind a load balancer, against the real server: X-Forwarded-For believed from the
trusted proxies of API_TRUSTED_PROXIES only (whom per-client limits count, what the access log
names), a trusted proxy's connections not capped per client, and /readyz, the balancer's check,
503 until the replica has read the lake."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from api.settings import ApiSettings
from lake.settings import LakeSettings
from tests.support.api_server import running_api
from tests.support.lake_writer import cover, ctr_row, minute, write_batch
from tests.support.lakes import new_lake

TOKEN = "balancer-test-token-0123456789"
FORWARDED = {"X-Forwarded-For": "203.0.113.7, 198.51.100.20"}


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    lake = new_lake(tmp_path_factory.mktemp("balancer-lake"))
    write_batch(lake, "run-a", [ctr_row(minute(5), 100, 10)])
    cover(lake, "run-a", minute(0), minute(30))
    return lake


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def access_log() -> Iterator[list[str]]:
    handler, log = _Collect(), logging.getLogger("ctr.access")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _settings(**overrides: object) -> ApiSettings:
    return ApiSettings(token=SecretStr(TOKEN), **overrides)  # type: ignore[arg-type]


def test_trusted_proxies_are_addresses_and_cidrs() -> None:
    settings = _settings(trusted_proxies=" 10.0.0.5, 10.1.2.3/16,::1 ")
    assert settings.trusted_proxies == "10.0.0.5/32,10.1.0.0/16,::1/128"
    assert [str(n) for n in settings.trusted_proxy_networks] == [
        "10.0.0.5/32",
        "10.1.0.0/16",
        "::1/128",
    ]
    assert _settings().trusted_proxy_networks == ()
    with pytest.raises(ValidationError, match=r"API_TRUSTED_PROXIES: 'balancer\.local' is neither"):
        _settings(trusted_proxies="10.0.0.5,balancer.local")


def test_forwarded_for_is_believed_from_a_trusted_proxy_only(
    lake: LakeSettings, access_log: list[str]
) -> None:
    """Loopback is this test's proxy: trusted, the client is the last address the header names
    that is not a trusted proxy; not trusted (the default, where uvicorn alone would believe
    any local peer), the client is the peer."""
    with running_api(_settings(trusted_proxies="127.0.0.1"), lake) as url:
        assert httpx.get(f"{url}/healthz", headers=FORWARDED).status_code == 200
    with running_api(_settings(), lake) as url:
        assert httpx.get(f"{url}/healthz", headers=FORWARDED).status_code == 200
        assert httpx.get(f"{url}/readyz").status_code == 200  # a balancer's check: not logged
    clients = [line.rsplit("client=", 1)[1] for line in access_log]
    assert clients == ["198.51.100.20", "127.0.0.1"]


def _hold(url: str, count: int) -> list[tuple[socket.socket, int]]:
    """``count`` connections, each sending one /healthz and kept open: (socket, its status)."""
    host, port = url.removeprefix("http://").split(":")
    held = []
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head and (data := sock.recv(65536)):
            head += data
        held.append((sock, int(head.split(b" ", 2)[1])))
    return held


@pytest.mark.parametrize(
    ("trusted", "statuses"), [("", [200, 200, 429]), ("127.0.0.0/8", [200] * 3)]
)
def test_a_trusted_proxys_connections_are_not_capped_per_client(
    lake: LakeSettings, trusted: str, statuses: list[int]
) -> None:
    settings = _settings(
        trusted_proxies=trusted, max_connections_per_client=2, header_timeout_s=600.0
    )
    with running_api(settings, lake) as url:
        held = _hold(url, 3)
        try:
            assert [status for _, status in held] == statuses
        finally:
            for sock, _ in held:
                sock.close()


def test_readyz_is_503_until_the_lake_is_read(tmp_path: Path) -> None:
    lake = new_lake(tmp_path)
    write_batch(lake, "run-a", [ctr_row(minute(5), 100, 10)])
    log = Path(lake.table("batch/ctr")) / "_delta_log"
    first = log / "00000000000000000000.json"
    good = first.read_bytes()
    first.write_bytes(b"not a Delta log\n")
    with running_api(_settings(refresh_s=0, cache_stale_s=0), lake) as url:
        refused = httpx.get(f"{url}/readyz")
        assert (refused.status_code, refused.json()["status"]) == (503, "not ready")
        assert httpx.get(f"{url}/healthz").status_code == 200  # up, not ready
        first.write_bytes(good)
        assert httpx.get(f"{url}/readyz").json() == {"status": "ready"}
