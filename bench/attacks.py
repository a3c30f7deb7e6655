"""The probes of issue 55 against a running API, with a victim's latency measured meanwhile:
``python -m bench.attacks [--tree PATH] [--duration S] [--label NAME]``.

A lake like the serving benchmark's (24 h of minute buckets, 300 dimension combinations, reach
lists and sketches; a writer commits to speed/ctr every second, as the stream does) is served by
the API of the checkout at ``--tree`` (default: this one) in a subprocess, so an earlier commit
(a ``git worktree``) is probed the same way on the same machine: before and after. Each attack
runs ``--duration`` seconds (at most 120, the issue's bound) from an attacker's key at
127.0.0.1 while a victim, another key at 127.0.0.2 (and, for /api/v1/ctr, a third at the
attacker's address), sends one small query after another; the victim's latencies are over the
attack's window only:

- ``sql_hog``: four concurrent ``SELECT count(*) FROM range(100000000000) …`` (each stopped at
  the 10 s time limit), again as soon as each answers; the victim's ``SELECT 42``;
- ``sql_kill``: two streams of a worker-killing ``levenshtein`` of 90,000 characters, each
  followed 1.1 s later by ``SELECT 1``; the workers killed (``/metrics``), the victim's
  ``SELECT 42``;
- ``ctr_heavy``: four concurrent 24-hour per-minute queries by every dimension with
  ``reach=true`` (each a new ``end`` minute: nothing cached), the victims' small uncached
  queries (an hour per minute of one campaign, a new minute or campaign each time);
- ``ctr_oversized``: one answer over ``API_CTR_MAX_BYTES`` (16 MiB here; 200,000 rows of the
  lake are 97 MB) asked 20 times in a row with an analyst's key: how many were computed
  (``ctr_api_cache_misses_total``) and their latencies.

A refused attacker request (429) waits 0.2 s before the next, so the attacker's own loop does
not take the shared cores. Results: ``bench/results/attacks-LABEL.json`` and a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.serving import RESULTS
from bench.serving_lake import END, SpeedWriter, build_lake
from bench.serving_load import wait_until_up
from infra.broker import free_port
from lake.settings import LakeSettings

TOKEN: Final = "attacks-token-0123456789abcdef"
ATTACKER: Final = "127.0.0.1"
ELSEWHERE: Final = "127.0.0.2"
HOG: Final = "SELECT count(*) FROM range(100000000000) t(i) WHERE i % 7 = 0"
KILLER: Final = "SELECT levenshtein(repeat('a', 90000), repeat('b', 90000))"
REFUSED_PAUSE_S: Final = 0.2
MAX_DURATION_S: Final = 120.0


@dataclass
class Timings:
    """Latencies (s) and statuses of one client's requests."""

    latencies: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)

    def add(self, seconds: float, status: int) -> None:
        self.latencies.append(seconds)
        self.statuses[status] += 1

    def summary(self) -> dict[str, object]:
        if not self.latencies:
            return {"requests": 0}
        ordered = sorted(self.latencies)
        q = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else []

        def pct(n: int) -> float:
            return round((q[n - 1] if q else ordered[0]) * 1000, 1)

        return {
            "requests": len(ordered),
            "p50_ms": pct(50),
            "p90_ms": pct(90),
            "p99_ms": pct(99),
            "max_ms": round(ordered[-1] * 1000, 1),
            "statuses": dict(sorted(self.statuses.items())),
        }


class Api:
    """The API of ``tree`` over ``lake`` in a subprocess, and clients of it."""

    def __init__(self, tree: Path, lake: LakeSettings, run_dir: Path) -> None:
        self.tree = tree
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(tree),
            "LAKE_ROOT": str(lake.lake_root),
            "CHECKPOINT_ROOT": str(lake.checkpoint_root),
            "RUN_DIR": str(run_dir),
            "API_TOKEN": TOKEN,
            "API_PORT": str(self.port),
            "API_ACCESS_LOG": "false",
            # One answer of the lake over API_CTR_MAX_BYTES (ctr_oversized): 200,000 rows are
            # about 30 MB; the heavy queries' 10,000 under 2 MB.
            "API_MAX_ROWS": "200000",
            "API_CTR_MAX_BYTES": "16MiB",
        }
        self.server: subprocess.Popen[bytes] | None = None

    def key(self, name: str, *options: str) -> str:
        created = subprocess.run(
            [sys.executable, "-c", "from cli.main import main; main()", "keys", "create", name,
             *options],
            env=self.env, cwd=self.tree, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return created.stdout.strip().splitlines()[-1]

    def start(self) -> None:
        self.server = subprocess.Popen(
            [sys.executable, "-c", "from cli.main import main; main()", "serve"],
            env=self.env,
            cwd=self.tree,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until_up(self.url, self.server)

    def stop(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=30)

    def client(self, key: str, address: str = ATTACKER) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=120,
            transport=httpx.HTTPTransport(local_address=address),
        )

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    return float(sample.value)
        return 0.0


def _loop(
    until: float, request: Callable[[int], httpx.Response], timings: Timings, pause_on_429: bool
) -> None:
    n = 0
    while time.monotonic() < until:
        started = time.monotonic()
        try:
            status = request(n).status_code
        except httpx.HTTPError:
            status = 0
        timings.add(time.monotonic() - started, status)
        n += 1
        if status == 429 and pause_on_429:
            time.sleep(REFUSED_PAUSE_S)


def _sql(client: httpx.Client, sql: str) -> httpx.Response:
    return client.post("/api/v1/sql", json={"sql": sql})


def _iso(moment: dt.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def heavy_ctr(n: int) -> dict[str, str]:
    """24 hours per minute by every dimension with reach: 432,000 rows before the limit; a new
    end (a whole minute: a query's end is its minute's) for each ``n``, so nothing is cached."""
    end = END - dt.timedelta(minutes=n % 720)
    return {
        "start": _iso(end - dt.timedelta(hours=24)),
        "end": _iso(end),
        "granularity": "minute",
        "group_by": "campaign_id,ad_id,site_id,country,device_type",
        "reach": "true",
    }


def oversized_ctr() -> dict[str, str]:
    """One of the heavy queries with every row asked for: over API_CTR_MAX_BYTES."""
    return {**heavy_ctr(0), "limit": "200000", "order_by": "-impressions"}


def small_ctr(n: int) -> dict[str, str]:
    """An hour per minute of one campaign (a dashboard's panel), a new one for each ``n``."""
    end = END - dt.timedelta(hours=2, minutes=n % 600)
    return {
        "start": _iso(end - dt.timedelta(hours=1)),
        "end": _iso(end),
        "granularity": "minute",
        "campaign_id": f"cmp-{1 + (n // 600) % 20:03d}",
    }


def _attack(
    duration_s: float,
    attackers: list[Callable[[int], httpx.Response]],
    victims: dict[str, Callable[[int], httpx.Response]],
    *,
    between: Callable[[int], httpx.Response] | None = None,
) -> dict[str, object]:
    """Run ``attackers`` (each in a loop of its own) and ``victims`` for ``duration_s``."""
    until = time.monotonic() + duration_s
    attack = [Timings() for _ in attackers]
    victim = {name: Timings() for name in victims}

    def attacker_loop(i: int, request: Callable[[int], httpx.Response]) -> None:
        n = 0
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                status = request(n * len(attackers) + i).status_code
            except httpx.HTTPError:
                status = 0
            attack[i].add(time.monotonic() - started, status)
            n += 1
            if status == 429:
                time.sleep(REFUSED_PAUSE_S)
            if between is not None and time.monotonic() < until:
                time.sleep(1.1)
                between(n)

    threads = [
        threading.Thread(target=attacker_loop, args=(i, r)) for i, r in enumerate(attackers)
    ] + [
        threading.Thread(target=_loop, args=(until, request, victim[name], False))
        for name, request in victims.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    merged = Timings()
    for timings in attack:
        merged.latencies += timings.latencies
        merged.statuses += timings.statuses
    return {
        "attacker": merged.summary(),
        **{f"victim_{name}": t.summary() for name, t in victim.items()},
    }


ATTACKS: Final = ("sql_hog", "sql_kill", "ctr_heavy", "ctr_oversized")


def probe(
    tree: Path, duration_s: float, root: Path, attacks: Sequence[str] = ATTACKS
) -> dict[str, dict[str, object]]:
    lake = LakeSettings(lake_root=root / "lake", checkpoint_root=root / "checkpoints")
    print("attacks: writing the lake ...", flush=True)
    build_lake(lake)
    api = Api(tree, lake, root / "run")
    attacker_key = api.key("attacker", "--scope", "advertiser", "--campaign", "cmp-003")
    victim_key = api.key("victim", "--scope", "analyst")
    neighbour_key = api.key("neighbour", "--scope", "analyst")
    api.start()
    writer = SpeedWriter(lake)
    writer.start()
    results: dict[str, dict[str, object]] = {}
    try:
        with (
            api.client(attacker_key) as attacker,
            api.client(victim_key, ELSEWHERE) as victim,
            api.client(neighbour_key) as neighbour,
        ):
            # Warm: the workers started, the relations of the snapshot made.
            _sql(victim, "SELECT 42")
            victim.get("/api/v1/ctr", params=small_ctr(11_999))

            if "sql_hog" in attacks:
                print(f"attacks: sql_hog for {duration_s:.0f} s ...", flush=True)
                results["sql_hog"] = _attack(
                    duration_s,
                    [lambda n: _sql(attacker, HOG)] * 4,
                    {"other_address": lambda n: _sql(victim, "SELECT 42")},
                )
                time.sleep(12)  # the last stopped queries' workers free again

            if "sql_kill" in attacks:
                print(f"attacks: sql_kill for {duration_s:.0f} s ...", flush=True)
                restarts = api.metric("ctr_sql_worker_restarts_total")
                results["sql_kill"] = _attack(
                    duration_s,
                    [lambda n: _sql(attacker, KILLER)] * 2,
                    {"other_address": lambda n: _sql(victim, "SELECT 42")},
                    between=lambda n: _sql(attacker, "SELECT 1"),
                )
                time.sleep(15)
                _sql(victim, "SELECT 42")  # a killed worker is replaced when next needed
                _sql(neighbour, "SELECT 42")
                killed = api.metric("ctr_sql_worker_restarts_total") - restarts
                results["sql_kill"] = {**results["sql_kill"], "workers_replaced": killed}

            if "ctr_heavy" in attacks:
                print(f"attacks: ctr_heavy for {duration_s:.0f} s ...", flush=True)
                results["ctr_heavy"] = _attack(
                    duration_s,
                    [lambda n: attacker.get("/api/v1/ctr", params=heavy_ctr(n))] * 4,
                    {
                        "other_address": lambda n: victim.get("/api/v1/ctr", params=small_ctr(n)),
                        "same_address": lambda n: neighbour.get(
                            "/api/v1/ctr", params=small_ctr(6_000 + n)
                        ),
                    },
                )
                time.sleep(10)

            if "ctr_oversized" in attacks:
                print("attacks: ctr_oversized, 20 requests ...", flush=True)
                misses = api.metric("ctr_api_cache_misses_total")
                oversized = Timings()
                params = oversized_ctr()
                for _ in range(20):  # an analyst's key: the whole answer, every campaign
                    started = time.monotonic()
                    status = neighbour.get("/api/v1/ctr", params=params).status_code
                    oversized.add(time.monotonic() - started, status)
                results["ctr_oversized"] = {
                    **oversized.summary(),
                    "computed": api.metric("ctr_api_cache_misses_total") - misses,
                }
    finally:
        writer.stop.set()
        api.stop()
    return results


def table(results: dict[str, dict[str, object]]) -> str:
    lines = [
        "| attack | who | requests | p50 ms | p90 ms | p99 ms | max ms | statuses |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    extras = []
    for attack, parts in results.items():
        rows = {"attacker": parts} if "requests" in parts else parts
        for who, figures in rows.items():
            if isinstance(figures, dict) and figures.get("requests"):
                lines.append(
                    f"| {attack} | {who} | {figures['requests']} | {figures['p50_ms']} | "
                    f"{figures['p90_ms']} | {figures['p99_ms']} | {figures['max_ms']} | "
                    f"{figures['statuses']} |"
                )
        for name in ("workers_replaced", "computed"):
            if name in parts:
                extras.append(f"{attack}: {name.replace('_', ' ')} {parts[name]:.0f}")
    return "\n".join([*lines, "", *extras])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attacks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="the checkout to serve")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per attack")
    parser.add_argument("--label", default="after", help="the results file's name")
    parser.add_argument(
        "--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS), help="default: all"
    )
    args = parser.parse_args(argv)
    duration = min(args.duration, MAX_DURATION_S)
    with tempfile.TemporaryDirectory(prefix="ctr-attacks-") as scratch:
        results = probe(args.tree.resolve(), duration, Path(scratch), args.attacks)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"attacks-{args.label}.json"
    record = {"tree": str(args.tree.resolve()), "duration_s": duration, **results}
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(table(results))
    print(f"attacks: results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
