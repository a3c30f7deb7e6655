"""Ports for local servers (brokers, the S3 server, API servers, Spark): chosen where no
outgoing connection can take one, checked by binding (a port a connection holds is as taken as
a listened one), and never handed out twice by one process."""

from __future__ import annotations

import socket
from pathlib import Path

from infra.ports import LOWEST, bindable, ephemeral_low, free_port
from infra.s3 import free_base_port


def test_a_free_port_lies_below_the_ephemeral_range_is_free_and_is_not_handed_out_twice() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST <= port < ephemeral_low() for port in ports)
    assert all(bindable(port) for port in ports)


def test_the_s3_block_lies_below_the_ephemeral_range_is_free_and_shares_no_port() -> None:
    low = ephemeral_low()
    given = {free_port() for _ in range(50)}
    for _ in range(20):
        base = free_base_port()
        block = [base + i for i in range(4)] + [base + 10000 + i for i in range(4)]
        assert min(block) >= LOWEST
        assert max(block) < low
        assert all(bindable(port) for port in block)
        assert not given & set(block)
        given |= set(block)


def test_a_port_held_by_a_connection_is_not_free() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            local_port = client.getsockname()[1]  # nobody listens on it: a connection holds it
            assert not bindable(local_port)
        assert not bindable(server.getsockname()[1])


def test_the_ephemeral_range_is_read_from_the_kernel_and_defaults_where_it_cannot_be(
    tmp_path: Path,
) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert ephemeral_low(ranges) == 40000
    assert ephemeral_low(tmp_path / "missing") == 32768
