"""``python -m bench replicas`` at its smoke size, all real processes (replicas, HAProxy): each
run answers the mix without errors, the balancer spreads it over the replicas, and the figures
it reports are there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.replicas import ReplicasBenchSettings, run
from infra.balancer import BalancerError, haproxy_binary


def test_the_smoke_run_spreads_the_mix_over_the_replicas(tmp_path: Path) -> None:
    try:
        haproxy_binary()
    except BalancerError as exc:
        pytest.skip(str(exc))
    result = run(ReplicasBenchSettings.smoke_run(), os.environ, results=tmp_path)
    assert (tmp_path / "replicas-smoke.json").exists()
    assert list(result["runs"]) == ["1-direct", "1", "2"]
    for figures in result["runs"].values():
        assert figures["requests"] > 0
        assert figures["errors"] == 0
    shares = {name: r["share"] for name, r in result["runs"]["2"]["per_replica"].items()}
    assert set(shares) == {"api-1", "api-2"}
    # Round robin: each gets half the requests, but for the ones in flight at the end.
    assert all(0.4 <= share <= 0.6 for share in shares.values()), shares
    assert result["speedup"]["2"] > 0
