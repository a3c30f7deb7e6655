"""The serving benchmark's HTTP load: CLIENTS concurrent clients against the API server, from
wrk when it is installed, else from a minimal Python client; their latency percentiles, and the
API's response-cache counters read around a run.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from bench.serving_mix import wrk_script

CLIENTS = 32
TOKEN = "bench-token-0123456789abcdef"
AUTH: Final = {"Authorization": f"Bearer {TOKEN}"}


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "max_ms": ordered[-1] * 1000}


_WRK_UNITS: Final = {"us": 0.001, "ms": 1.0, "s": 1000.0}
WRK_THREADS: Final = 2
# wrk leaves a request slower than its timeout (default 2 s) out of the latencies; a slow
# answer must count, so the timeout is far above any p99 of interest.
WRK_TIMEOUT_S: Final = 30.0


def _wrk(
    url: str, duration_s: float, clients: int, paths: Sequence[str], token: str = TOKEN
) -> dict[str, float]:
    """The load from wrk (C, HdrHistogram percentiles): ``clients`` keep-alive connections on
    :data:`WRK_THREADS` threads sending requests back to back: the one path, or several in turn
    (a Lua script, :func:`bench.serving_mix.wrk_script`). Costs the shared two cores far less
    than a Python client, so the figures are the server's."""
    with tempfile.TemporaryDirectory(prefix="ctr-bench-wrk-") as scratch:
        target = [f"{url}{paths[0]}"]
        if len(paths) > 1:
            script = Path(scratch) / "mix.lua"
            script.write_text(wrk_script(paths, WRK_THREADS))
            target = ["-s", str(script), url]
        done = subprocess.run(
            ["wrk", f"-t{WRK_THREADS}", f"-c{clients}", f"-d{duration_s:.0f}s", "--latency",
             "--timeout", f"{WRK_TIMEOUT_S:.0f}s",
             "-H", f"Authorization: Bearer {token}", *target],
            capture_output=True, text=True, check=True, timeout=duration_s + 60,
        )  # fmt: skip
    out = done.stdout
    percentile = {
        m.group(1): float(m.group(2)) * _WRK_UNITS[m.group(3)]
        for m in re.finditer(r"^\s+(50|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    }
    requests = re.search(r"^\s*(\d+) requests in", out, re.MULTILINE)
    rate = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.MULTILINE)
    if len(percentile) != 2 or requests is None or rate is None:
        raise RuntimeError(f"could not read wrk's output:\n{out}\n{done.stderr}")
    maximum = re.search(r"^\s+Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", out, re.MULTILINE)
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.+)$", out, re.MULTILINE)
    socket_error_count = (
        sum(int(n) for n in re.findall(r"\d+", socket_errors.group(1))) if socket_errors else 0
    )
    return {
        "p50_ms": percentile["50"],
        "p99_ms": percentile["99"],
        "max_ms": float(maximum.group(1)) * _WRK_UNITS[maximum.group(2)] if maximum else 0.0,
        "requests_per_s": float(rate.group(1)),
        "requests": int(requests.group(1)),
        "errors": (int(non_2xx.group(1)) if non_2xx else 0) + socket_error_count,
    }


async def python_load(
    url: str, duration_s: float, clients: int, paths: Sequence[str], token: str = TOKEN
) -> tuple[list[float], int]:
    """``clients`` keep-alive connections sending ``paths`` in turn back to back, each from its
    own offset (an equal share apart), so that with several paths concurrent requests differ.
    An error: a status other than 200, or for a single path (the dashboard query) no rows.

    A minimal HTTP/1.1 client on asyncio streams: httpx's pool costs more CPU per request than
    the server does on a cache hit, and the load generator shares the machine's two cores.
    """
    import asyncio
    from urllib.parse import urlsplit

    target = urlsplit(url)
    requests = [
        f"GET {path} HTTP/1.1\r\nHost: {target.netloc}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
        for path in paths
    ]
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration_s

    async def worker(client: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(target.hostname, target.port)
        sent = client * len(requests) // clients
        try:
            while time.perf_counter() < deadline:
                request = requests[sent % len(requests)]
                sent += 1
                started = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                latencies.append(time.perf_counter() - started)
                if not head.startswith(b"HTTP/1.1 200") or (
                    len(requests) == 1 and b'"rows":[{' not in body
                ):
                    errors += 1
        finally:
            writer.close()

    await asyncio.gather(*(worker(client) for client in range(clients)))
    return latencies, errors


def wait_until_up(url: str, server: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            raise RuntimeError("the API server did not start")
        time.sleep(0.2)


def api_load(
    url: str, duration_s: float, paths: Sequence[str], token: str = TOKEN
) -> tuple[str, dict[str, float]]:
    """(load generator, its figures) for ``paths`` sent in turn with the bearer ``token``: wrk
    if installed, else the Python client."""
    import asyncio

    if shutil.which("wrk"):
        return "wrk", _wrk(url, duration_s, CLIENTS, paths, token)
    print("bench serving: no wrk (make bench installs it); a Python client")
    latencies, errors = asyncio.run(python_load(url, duration_s, CLIENTS, paths, token))
    return "python asyncio", {
        **percentiles(latencies),
        "requests_per_s": len(latencies) / duration_s,
        "requests": len(latencies),
        "errors": errors,
    }


def cache_metrics(metrics: str) -> dict[str, float]:
    """The API's response-cache counters from its Prometheus text."""
    found = {}
    for line in metrics.splitlines():
        if line.startswith("ctr_api_cache_") and "_created" not in line and "#" not in line:
            name, value = line.split()
            found[name.removeprefix("ctr_api_")] = float(value)
    return found


def cache_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """The response cache's counters over a run, and its hit rate: answers served from the
    cache (current, stale, or waiting on a computation another request started) per request."""
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    served = delta.get("cache_hits_total", 0.0) + delta.get("cache_stale_hits_total", 0.0)
    requests = served + delta.get("cache_misses_total", 0.0)
    return {**delta, "cache_hit_rate": served / requests if requests else 0.0}
