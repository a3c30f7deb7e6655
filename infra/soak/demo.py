"""The soak's `make demo`: its processes, lake, checkpoints and broker, and the environment
its commands run in (the soak's own, from :class:`~infra.soak.config.Config`, plus what
``demo.sh`` wrote to its env file)."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from infra.broker import read_pid
from infra.soak.config import ROOT, Config
from infra.soak.console import log


class Demo:
    """The soak's `make demo`: its processes, lake, checkpoints and broker."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.dir = config.demo
        # The environment of the demo's commands: the soak's, then with the demo's settings.
        self.env = dict(config.environ)

    def start(self, ground_truth: Path) -> None:
        env = {
            **self.config.environ,
            "RUN_DIR": str(self.config.out),
            "DEMO_RATE": str(self.config.rate),
            "DEMO_BROKERS": str(self.config.brokers),
            "DEMO_NETNS": "1" if self.config.netns else "0",
            "DEMO_GROUND_TRUTH": str(ground_truth),
            **self.config.scaled_windows(),
        }
        for name in ("LAKE_ROOT", "CHECKPOINT_ROOT", "KAFKA_BOOTSTRAP_SERVERS", "API_TOKEN"):
            env.pop(name, None)
        log(f"starting the platform (make demo at {self.config.rate:,} events/s)")
        subprocess.run(["bash", "infra/demo.sh"], cwd=ROOT, env=env, check=True)
        self.env = {**self.config.environ, **self._demo_env()}

    def _demo_env(self) -> dict[str, str]:
        """The settings demo.sh wrote to its env file (``export A="x" B="y"`` lines)."""
        script = f"set -a; source {self.dir / 'env'}; env -0"
        out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
        pairs = (item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
        return {k: v for k, v in pairs}

    def down(self) -> None:
        env = {**self.env, "RUN_DIR": str(self.config.out)}
        subprocess.run(["bash", "infra/demo-down.sh"], cwd=ROOT, env=env, check=False)

    def running(self) -> bool:
        return (self.dir / "run-id").exists()

    # paths and pids
    def pid(self, name: str) -> int | None:
        return read_pid(self.dir / f"{name}.pid")

    def child(self, name: str) -> int | None:
        return read_pid(self.dir / f"{name}.child.pid")

    @property
    def lake(self) -> Path:
        return Path(self.env.get("LAKE_ROOT", self.dir / "lake"))

    @property
    def checkpoints(self) -> Path:
        return Path(self.env.get("CHECKPOINT_ROOT", self.dir / "checkpoints"))

    def broker_pids(self) -> dict[int, int | None]:
        nodes = sorted((self.dir / "kafka").glob("node-*"))
        return {int(n.name.split("-")[1]): read_pid(n / "kafka.pid") for n in nodes}

    def api(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        port = self.env.get("API_PORT", "8000")
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            headers={"Authorization": f"Bearer {self.env.get('API_TOKEN', '')}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (OSError, TimeoutError):
            return 0, b""  # no answer (refused, reset, timed out)

    def lags(self) -> dict[str, int | None]:
        from infra.demo_drain import behind
        from lake.checkpoints import Checkpoint
        from runtime.kafka_settings import KafkaSettings
        from runtime.object_store import ObjectStoreSettings
        from runtime.offsets import topic_offsets

        kafka = KafkaSettings.from_environ(self.env)  # the demo's broker and its credentials
        local = ObjectStoreSettings(lake_root="")  # the soak's checkpoints are a local folder
        try:
            ends = {o.partition: o.latest for o in topic_offsets(kafka, kafka.topic, timeout_s=5)}
        except Exception:  # the broker between a kill and its restart
            return {"archiver": None, "speed": None}
        return {
            job: behind(
                ends, Checkpoint(str(self.checkpoints / job), local).committed_offsets(kafka.topic)
            )
            for job in ("archiver", "speed")
        }
