"""`python -m bench.limits_store`: what one check of the API's shared limits costs, measured
before choosing their store (issue 68): a key's lease taken and given back, a back-off check,
a strike, keys' uses pushed and the commit election — on a private PostgreSQL
(`infra/postgres.sh`), beside the same checks in the process and one commit to the lake's key
store (what counting on the lake would cost per request). Prints the figures; writes nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from access.key_store import record_use
from api.limits import LocalLimits, PostgresLimits
from infra.private_postgres import private_postgres
from lake.settings import LakeSettings
from serving_layer.sandbox.backoff import ClientBackoff


def timed(what: str, action: Callable[[], object], rounds: int) -> dict[str, float]:
    """``action`` run ``rounds`` times (after a few unmeasured): its median and p99 in µs."""
    for _ in range(min(rounds, 20)):
        action()
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        took.append((time.perf_counter() - started) * 1e6)
    took.sort()
    figures = {"median_us": statistics.median(took), "p99_us": took[int(len(took) * 0.99) - 1]}
    print(
        f"{what:<52} median {figures['median_us']:>9.1f} µs   "
        f"p99 {figures['p99_us']:>9.1f} µs   ({rounds} rounds)",
        flush=True,
    )
    return figures


def measure_store(name: str, store: LocalLimits | PostgresLimits, rounds: int) -> None:
    shares = store.shares("ctr", longest_s=10.0)
    backoffs = store.backoffs(ClientBackoff(), time.monotonic)

    def lease_round_trip() -> None:
        lease = shares.take("key:bench", 2)
        assert lease is not None
        shares.give_back(lease)

    timed(f"{name}: lease taken and given back", lease_round_trip, rounds)
    timed(f"{name}: back-off check (not backed off)", lambda: backoffs.wait_s("key:bench"), rounds)
    backoffs.strike("key:struck", 1)
    timed(f"{name}: back-off check (backed off)", lambda: backoffs.wait_s("key:struck"), rounds)
    timed(f"{name}: strike", lambda: backoffs.strike("key:striking", 1), max(rounds // 10, 10))


def measure_key_uses(store: PostgresLimits, rounds: int) -> None:
    now = dt.datetime.now(dt.UTC)
    uses = {f"key-{n}": now for n in range(100)}
    timed("postgres: 100 keys' uses pushed", lambda: store.push_key_uses(uses), rounds)
    store.commit_key_uses(0.001, lambda pending: None)
    timed(
        "postgres: commit election (not due)",
        lambda: store.commit_key_uses(3600, lambda pending: None),
        rounds,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.limits_store", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2000, help="per figure (default 2000)")
    args = parser.parse_args(argv)
    measure_store("in process", LocalLimits(), args.rounds)
    with private_postgres(os.environ) as url:
        store = PostgresLimits(url)
        try:
            store.check()
            measure_store("postgres", store, args.rounds)
            measure_key_uses(store, max(args.rounds // 10, 10))
        finally:
            store.close()
    with tempfile.TemporaryDirectory(prefix="ctr-bench-lake-") as root:
        lake = LakeSettings(lake_root=str(Path(root) / "lake"))
        used = {"bench": dt.datetime.now(dt.UTC)}
        timed("lake (local disk): one commit to access/keys", lambda: record_use(lake, used), 20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
