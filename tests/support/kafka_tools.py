"""Apache Kafka's own command-line tools, run from the cached jars as an operator (or an
attacker) would run ``kafka-configs.sh`` (test support)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from infra.broker import LocalKafka
from infra.broker_auth import write_private
from runtime.jars import jar_dir

CONFIG_COMMAND = "kafka.admin.ConfigCommand"  # what kafka-configs.sh runs
# A refused client gives up after this long, not the tools' 30 s per request.
_FAST_TIMEOUTS = {"default.api.timeout.ms": "5000", "request.timeout.ms": "2000"}


def kafka_configs(
    cluster: LocalKafka,
    directory: Path,
    *arguments: str,
    login: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``kafka-configs.sh arguments…`` with the client properties ``login`` (none: no login)
    in an owner-only file under ``directory``."""
    properties = directory / "tool.properties"
    lines = {**_FAST_TIMEOUTS, **(login or {})}
    write_private(properties, "".join(f"{k}={v}\n" for k, v in lines.items()))
    classpath = f"{jar_dir('kafka', cluster.settings.jar_cache)}/*"
    command = [cluster.settings.java, "-cp", classpath, CONFIG_COMMAND]
    command += ["--command-config", str(properties), *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def controller_address(cluster: LocalKafka) -> str:
    controller = cluster.layout().controller
    return f"{controller.host}:{controller.controller_port}"
