"""The serving benchmark's runs against the API server: ``ctr serve`` in a subprocess over the
lake while :class:`~bench.serving_lake.SpeedWriter` commits every second; the dashboard query
and the mix, as the admin and with an advertiser's key, the cache counters read around each.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from access.key_store import create_key
from bench.serving_lake import ADVERTISER_CAMPAIGNS, SpeedWriter, dashboard_params, dashboard_path
from bench.serving_load import (
    AUTH,
    CLIENTS,
    TOKEN,
    api_load,
    cache_delta,
    cache_metrics,
    python_load,
    wait_until_up,
)
from infra.broker import free_port
from lake.settings import LakeSettings


@dataclass
class ApiRuns:
    """The figures of :func:`run_api`'s loads."""

    load_generator: str
    single: dict[str, float]
    mix: dict[str, float]
    speed_commits: int
    # The same two runs with an advertiser's key (ADVERTISER_CAMPAIGNS).
    advertiser_single: dict[str, float]
    advertiser_mix: dict[str, float]
    admin_mix_after: dict[str, float]


def start_api_server(
    lake: LakeSettings, environ: Mapping[str, str], *, own_session: bool = False
) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    """``ctr serve`` over ``lake`` on a free port, with the bearer TOKEN: (the process, its URL,
    its environment: ``environ`` with the lake's and the API's settings). ``own_session``: in a
    session of its own, as `make demo` starts it (setsid)."""
    port = free_port()
    env = {
        **environ,
        "LAKE_ROOT": str(lake.lake_root),
        "CHECKPOINT_ROOT": str(lake.checkpoint_root),
        "API_TOKEN": TOKEN,
        "API_PORT": str(port),
    }
    server = subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", "serve"],
        env=env,
        start_new_session=own_session,
    )
    return server, f"http://127.0.0.1:{port}", env


def run_api(
    lake: LakeSettings, duration: float, mix_paths: Sequence[str], environ: Mapping[str, str]
) -> ApiRuns:
    """The API server in a subprocess while the writer commits every second: the dashboard query
    from CLIENTS clients, then the mix, the cache counters read around each. The server's
    environment is ``environ`` with the lake's and the API's settings."""
    import asyncio

    import httpx

    server, url, _ = start_api_server(lake, environ)
    writer = SpeedWriter(lake)
    try:
        wait_until_up(url, server)
        asyncio.run(python_load(url, 2.0, CLIENTS, [dashboard_path()]))  # warm-up
        writer.start()
        print(f"bench serving: {CLIENTS} clients for {duration:.0f} s ...", flush=True)
        load_generator, single = api_load(url, duration, [dashboard_path()])
        checked = httpx.get(f"{url}/api/v1/ctr", params=dashboard_params(),
                            headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
        if checked.status_code != 200 or not checked.json()["rows"]:
            raise RuntimeError(f"the dashboard query failed: {checked.text[:500]}")
        before = cache_metrics(httpx.get(f"{url}/metrics", headers=AUTH).text)
        single.update(before)
        print(
            f"bench serving: {len(mix_paths)} distinct queries, {CLIENTS} clients for "
            f"{duration:.0f} s ...",
            flush=True,
        )
        _, mix = api_load(url, duration, mix_paths)
        after = cache_metrics(httpx.get(f"{url}/metrics", headers=AUTH).text)
        mix.update(cache_delta(before, after))
        # The same, with an advertiser's key: each answer computed over its campaigns only.
        # The lake's minutes are a fixed day's (END): its campaigns may be older than 30 days.
        _, key = create_key(
            lake,
            "bench-advertiser",
            "advertiser",
            campaigns=ADVERTISER_CAMPAIGNS,
            allow_unknown=True,
        )
        asyncio.run(python_load(url, 2.0, CLIENTS, [dashboard_path()], key))  # warm-up
        print(f"bench serving: an advertiser's key, {CLIENTS} clients ...", flush=True)
        _, advertiser_single = api_load(url, duration, [dashboard_path()], key)
        scoped = httpx.get(f"{url}/api/v1/ctr", params=dashboard_params(),
                           headers={"Authorization": f"Bearer {key}"}).json()  # fmt: skip
        if {r["campaign_id"] for r in scoped["rows"]} != set(ADVERTISER_CAMPAIGNS):
            raise RuntimeError(f"the advertiser's answer is not its scope's: {scoped}")
        before = cache_metrics(httpx.get(f"{url}/metrics", headers=AUTH).text)
        _, advertiser_mix = api_load(url, duration, mix_paths, key)
        after = cache_metrics(httpx.get(f"{url}/metrics", headers=AUTH).text)
        advertiser_mix.update(cache_delta(before, after))
        # The admin's mix once more: the lake grew meanwhile (a speed commit a second), so the
        # advertiser's runs are bracketed by two of the admin's.
        print("bench serving: the admin's mix again ...", flush=True)
        _, admin_mix_after = api_load(url, duration, mix_paths)
        writer.stop.set()
        writer.join()
    finally:
        writer.stop.set()
        server.terminate()
        server.wait(timeout=30)
    single["speed_commits_during_run"] = writer.commits
    return ApiRuns(
        load_generator,
        single,
        mix,
        writer.commits,
        advertiser_single,
        advertiser_mix,
        admin_mix_after,
    )
