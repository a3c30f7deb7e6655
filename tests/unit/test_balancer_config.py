"""The load balancer's generated HAProxy configuration (infra/balancer.py): what it says, and
that HAProxy itself accepts it (the replicas test runs it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from infra.balancer import BalancerConfig, BalancerError, Replica, haproxy_binary, haproxy_config

REPLICAS = (Replica("api-1", "127.0.0.1", 8001), Replica("api-2", "10.0.0.2", 8000))


def test_the_config_spreads_checks_forwards_and_caps_clients() -> None:
    text = haproxy_config(
        BalancerConfig(port=8080, replicas=REPLICAS, max_connections_per_client=7),
        stats_socket=Path("/run/lb/haproxy.sock"),
    )
    lines = [line.strip() for line in text.splitlines()]
    assert "bind 127.0.0.1:8080" in lines
    assert "balance roundrobin" in lines
    assert "http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host balancer" in lines
    assert [line for line in lines if line.startswith("server ")] == [
        "server api-1 127.0.0.1:8001",
        "server api-2 10.0.0.2:8000",
    ]
    # The client's own X-Forwarded-For dropped, the balancer's added.
    assert lines.index("http-request del-header x-forwarded-for") > 0
    assert "option forwardfor" in lines
    (cap,) = [line for line in lines if line.startswith("http-request deny")]
    assert cap.startswith("http-request deny deny_status 429 ")
    assert cap.endswith("if { sc0_conn_cur gt 7 }")
    assert "stats socket /run/lb/haproxy.sock mode 600 level user" in lines


def test_haproxy_accepts_the_config(tmp_path: Path) -> None:
    try:
        binary = haproxy_binary()
    except BalancerError as exc:
        pytest.skip(str(exc))
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        haproxy_config(
            BalancerConfig(port=8080, replicas=REPLICAS, check_interval_s=0.5),
            stats_socket=tmp_path / "haproxy.sock",
        )
    )
    checked = subprocess.run(
        [binary, "-c", "-f", config], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stderr + checked.stdout


def test_config_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="'replicas' must name at least one replica"):
        BalancerConfig(port=8080, replicas=())
    with pytest.raises(ValueError, match="'replicas' must have distinct names"):
        BalancerConfig(port=8080, replicas=(REPLICAS[0], REPLICAS[0]))
    with pytest.raises(ValueError, match="'max_connections_per_client' must be >= 1, got 0"):
        BalancerConfig(port=8080, replicas=REPLICAS, max_connections_per_client=0)
    with pytest.raises(ValueError, match="'check_interval_s' must be > 0"):
        BalancerConfig(port=8080, replicas=REPLICAS, check_interval_s=0)
