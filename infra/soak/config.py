"""The soak's settings, read once from the environment at its entry point: ``SOAK_MINUTES``
(60), ``SOAK_RATE`` (1000 events/s), ``CHAOS`` (0|1), ``SOAK_SAMPLE_S`` (60),
``SOAK_KILL_EVERY_S`` (240), ``SOAK_SEED``, ``RUN_DIR``. The rest of the environment is kept
as it was (:attr:`Config.environ`): the demo's commands run in it."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent.parent


@dataclass
class Config:
    minutes: float
    rate: int
    chaos: bool
    sample_s: float
    kill_every_s: float
    seed: int
    run_dir: Path
    # The environment the soak started in: the demo's own settings (DEMO_BATCH_MINUTES,
    # API_PORT, ...) pass through it to every command the soak runs.
    environ: Mapping[str, str]

    @property
    def out(self) -> Path:
        return self.run_dir / "soak"

    @property
    def demo(self) -> Path:
        return self.out / "demo"

    def scaled_windows(self) -> dict[str, str]:
        """Retention windows shrunk to fit the soak, so that each turns over within its first
        half and the second half shows whether the clean-up holds the series flat (in
        production the same mechanisms hold them at the full windows). The environment's
        own values win."""
        mib = 2**20
        defaults = {
            "LAKE_LOG_RETENTION_HOURS": "0.25",
            "LAKE_HISTORY_RETENTION_HOURS": "0.25",
            "LAKE_VACUUM_RETENTION_HOURS": "0.25",
            "SPEED_VACUUM_RETENTION_HOURS": "0.25",
            "DEMO_MAINTENANCE_MINUTES": "15",
            "ARCHIVER_MAINTENANCE_SECONDS": "300",
            "KAFKA_TOPIC_CONFIG": json.dumps(
                {"retention.bytes": str(16 * mib), "segment.bytes": str(4 * mib)}
            ),
        }
        return {k: self.environ.get(k) or v for k, v in defaults.items()}

    @property
    def brokers(self) -> int:
        return 3 if self.chaos else 1

    @property
    def netns(self) -> bool:
        """Under chaos, the brokers in network namespaces (so one can be cut off), if this
        machine allows it (root, iproute2)."""
        return self.chaos and os.geteuid() == 0 and shutil.which("ip") is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Config:
        def number(name: str, default: float) -> float:
            raw = environ.get(name, "") or str(default)
            try:
                value = float(raw)
            except ValueError:
                raise SystemExit(f"soak: error: {name} must be a number, got {raw!r}") from None
            if value <= 0:
                raise SystemExit(f"soak: error: {name} must be above 0, got {raw!r}")
            return value

        #: 1: a component SIGKILLed (or a broker cut off) every SOAK_KILL_EVERY_S, and the time
        #: it takes to come back measured; 0: none.
        chaos = environ.get("CHAOS", "0") or "0"
        if chaos not in ("0", "1"):
            raise SystemExit(f"soak: error: CHAOS must be 0 or 1, got {chaos!r}")
        return cls(
            #: How long the soak runs, in minutes.
            minutes=number("SOAK_MINUTES", 60),
            #: Events per second from the soak's traffic generator.
            rate=int(number("SOAK_RATE", 1000)),
            chaos=chaos == "1",
            #: Seconds between samples (memory, CPU, files, lags, freshness) in samples.csv.
            sample_s=number("SOAK_SAMPLE_S", 60),
            #: Seconds between chaos rounds (CHAOS=1).
            kill_every_s=number("SOAK_KILL_EVERY_S", 240),
            #: Seed of the chaos rounds' random choices; default the start time (the log names it).
            seed=int(environ.get("SOAK_SEED", "") or time.time()),
            run_dir=Path(environ.get("RUN_DIR", "run")).resolve(),
            environ=dict(environ),
        )
