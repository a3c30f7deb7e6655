"""Limits at the edge (api/edge.py) against the real server: a client that sends a huge head,
too many headers, a slow head or body, or too many connections is refused with a 4xx before the
application parses anything, and everyone else is answered meanwhile."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ByteSize, SecretStr

from api.edge import EdgeLimits
from api.settings import ApiSettings
from lake.settings import LakeSettings
from tests.support.api_server import running_api
from tests.support.lake_writer import cover, ctr_row, minute, write_batch
from tests.support.lakes import new_lake
from tests.support.waiting import wait_until

TOKEN = "edge-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    root = tmp_path_factory.mktemp("edge-lake")
    lake = new_lake(root)
    write_batch(lake, "run-a", [ctr_row(minute(5), 100, 10)])
    cover(lake, "run-a", minute(0), minute(30))
    return lake


@pytest.fixture(scope="module")
def base_url(lake: LakeSettings) -> Iterator[str]:
    settings = ApiSettings(
        token=SecretStr(TOKEN),
        max_header_bytes=ByteSize(8192),
        max_headers=20,
        max_request_line_bytes=ByteSize(2048),
        header_timeout_s=1.0,
        body_timeout_s=1.0,
        max_connections_per_client=6,
    )
    with running_api(settings, lake) as url:
        yield url


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _exchange(url: str, *chunks: bytes, pause_s: float = 0.0) -> bytes:
    """Send ``chunks`` on a fresh connection (``pause_s`` between them) and read the answer
    until the server closes."""
    with socket.create_connection(_address(url), timeout=10) as sock:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                time.sleep(pause_s)
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = b""
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            received += data
    return received


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


def _while_answering(url: str, attack: threading.Thread) -> None:
    """Run ``attack`` while another client's /healthz requests keep being answered (at least
    one of them while it runs)."""
    answered = 0
    attack.start()
    with httpx.Client(timeout=10) as client:
        while attack.is_alive() or not answered:
            assert client.get(f"{url}/healthz").status_code == 200
            answered += 1
            attack.join(timeout=0.05)
    attack.join()


def test_a_huge_header_is_a_431_and_stalls_no_one(base_url: str) -> None:
    answers: list[bytes] = []
    # 4 MB of one header, in 64 KiB chunks: refused after the first 8 KiB.
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "
    chunks = [head, *([b"a" * 65536] * 64), b"\r\n\r\n"]
    attack = threading.Thread(target=lambda: answers.append(_exchange(base_url, *chunks)))
    _while_answering(base_url, attack)
    assert _status(answers[0]) == 431
    assert b"API_MAX_HEADER_BYTES" in answers[0]
    assert b"x-content-type-options: nosniff" in answers[0]


def test_too_many_headers_is_a_431(base_url: str) -> None:
    headers = b"".join(b"X-H%d: 1\r\n" % i for i in range(25))
    answer = _exchange(base_url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
    assert _status(answer) == 431
    assert b"API_MAX_HEADERS" in answer
    # Twenty are fine.
    headers = b"".join(b"X-H%d: 1\r\n" % i for i in range(18))
    answer = _exchange(
        base_url, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + headers + b"\r\n"
    )
    assert _status(answer) == 200


def test_a_long_request_line_is_a_414(base_url: str) -> None:
    answer = _exchange(base_url, b"GET /healthz?" + b"a" * 4096 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _status(answer) == 414
    assert b"API_MAX_REQUEST_LINE_BYTES" in answer


def test_a_slow_head_is_a_408(base_url: str) -> None:
    answers: list[bytes] = []
    # A byte every 0.3 s: each arrives in time, the head as a whole does not.
    chunks = [bytes([b]) for b in b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]
    attack = threading.Thread(
        target=lambda: answers.append(_exchange(base_url, *chunks, pause_s=0.3))
    )
    _while_answering(base_url, attack)
    assert _status(answers[0]) == 408
    assert b"API_HEADER_TIMEOUT_S" in answers[0]


def test_a_silent_connection_is_closed(base_url: str) -> None:
    answer = _exchange(base_url)  # connects, sends nothing, reads
    assert _status(answer) == 408


def test_a_slow_body_is_a_408(base_url: str) -> None:
    head = (
        b"POST /api/v1/sql HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    answer = _exchange(base_url, head, b'{"sql": ', pause_s=2.5)
    assert _status(answer) == 408
    assert b"API_BODY_TIMEOUT_S" in answer


@pytest.fixture
def capped_url(lake: LakeSettings) -> Iterator[str]:
    """Six connections per client, and held ones kept open however slow the machine."""
    settings = ApiSettings(
        token=SecretStr(TOKEN), header_timeout_s=600.0, max_connections_per_client=6
    )
    with running_api(settings, lake) as url:
        yield url


def test_connections_per_client_are_capped(capped_url: str) -> None:
    base_url = capped_url
    host, port = _address(base_url)
    held = [socket.create_connection((host, port), timeout=10) for _ in range(6)]
    try:
        for sock in held:  # each answered, so the server has counted each: no race with the 7th
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head and (data := sock.recv(65536)):
                head += data
            assert _status(head) == 200
        answer = _exchange(base_url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _status(answer) == 429
        assert b"retry-after: 1" in answer.lower()
        assert b"API_MAX_CONNECTIONS_PER_CLIENT" in answer
    finally:
        for sock in held:
            sock.close()
    # Once the server has seen the six close, the client is answered again.
    answered = wait_until(
        lambda: httpx.get(f"{base_url}/healthz").status_code == 200,
        timeout_s=60,
        what="the closed connections no longer count",
    )
    assert answered


def test_keep_alive_requests_pass_and_refusals_are_counted(base_url: str) -> None:
    with httpx.Client(timeout=10) as client:
        for _ in range(5):  # one connection, several heads: each is counted on its own
            answer = client.get(f"{base_url}/healthz", headers={"X-Pad": "p" * 4000})
            assert answer.status_code == 200
        _exchange(base_url, b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n")
        metrics = client.get(f"{base_url}/metrics", headers=AUTH).text
    refused = {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "ctr_api_edge_refused"
        for sample in family.samples
    }
    assert refused["head_bytes"] >= 1


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="'max_head_bytes' must be >= 1"):
        EdgeLimits(max_head_bytes=0)
    with pytest.raises(ValueError, match="'head_timeout_s' must be > 0"):
        EdgeLimits(head_timeout_s=0)
