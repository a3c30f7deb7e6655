"""The speed benchmark's view of the API: waiting for ``ctr serve``, and the watcher that polls
it for the probes' rows (what a dashboard sees) and records every request's time and version.
"""

from __future__ import annotations

import subprocess
import threading
import time

import httpx

POLL_EVERY_S = 0.1


class ApiWatcher(threading.Thread):
    """Polls the API for the probes' rows: ad_id -> when it was first served (epoch s)."""

    def __init__(self, base_url: str, token: str, since_ms: int) -> None:
        super().__init__(name="api-watcher", daemon=True)
        self.base_url, self.token, self.since_ms = base_url, token, since_ms
        self.seen: dict[str, float] = {}
        # Every answered request: (sent at, answered at, speed/ctr version it read), epoch s.
        self.requests: list[tuple[float, float, int]] = []
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.since_ms / 1000 - 60))
        end = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.since_ms / 1000 + 86_400))
        params = {"campaign_id": "probe", "group_by": "ad_id", "granularity": "all",
                  "start": start, "end": end, "limit": "100000"}  # fmt: skip
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.base_url, headers=headers, timeout=10) as client:
            while not self._halt.is_set():
                try:
                    sent = time.time()
                    response = client.get("/api/v1/ctr", params=params)
                    now = time.time()
                    response.raise_for_status()
                    body = response.json()
                    for row in body["rows"]:
                        self.seen.setdefault(row["ad_id"], now)
                    version = body["freshness"]["versions"].get("speed/ctr")
                    self.requests.append((sent, now, -1 if version is None else int(version)))
                except (httpx.HTTPError, ValueError, KeyError):
                    self.errors += 1
                self._halt.wait(POLL_EVERY_S)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():  # never started when the job or the API did not come up
            self.join(timeout=15)


def wait_for_api(port: int, api: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and api.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("ctr serve did not start (see its log)")
