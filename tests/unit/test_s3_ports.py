"""The local S3 server's block of eight ports: chosen where no outgoing connection can take one
of them, and checked by binding (a port a connection holds is as taken as a listened one)."""

from __future__ import annotations

import socket
from pathlib import Path

from infra.s3 import _bindable, _ephemeral_low, free_base_port


def test_the_block_lies_below_the_ephemeral_range_and_is_free() -> None:
    low = _ephemeral_low()
    for _ in range(20):
        base = free_base_port()
        block = [base + i for i in range(4)] + [base + 10000 + i for i in range(4)]
        assert min(block) >= 1024
        assert max(block) < low
        assert all(_bindable(port) for port in block)


def test_a_port_held_by_a_connection_is_not_free() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            local_port = client.getsockname()[1]  # nobody listens on it: a connection holds it
            assert not _bindable(local_port)
        assert not _bindable(server.getsockname()[1])


def test_the_ephemeral_range_is_read_from_the_kernel_and_defaults_where_it_cannot_be(
    tmp_path: Path,
) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert _ephemeral_low(ranges) == 40000
    assert _ephemeral_low(tmp_path / "missing") == 32768
