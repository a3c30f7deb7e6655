"""Airflow's own configuration on loopback: ``python -m infra.airflow_config AIRFLOW_HOME``.

Airflow writes ``airflow.cfg`` the first time it runs, with every server it can start bound
to all interfaces (``[api] host = 0.0.0.0``: the API server and UI, with the scheduler's
health check and Celery's Flower alike). ``infra/airflow-up.sh`` starts them on 127.0.0.1
through environment variables, but any other start (``airflow api-server`` in another shell,
a service manager) reads the file. This rewrites those settings in the file itself (comments
and every other line kept), and makes the folder and what Airflow keeps in it (the file, the
SQLite database, the generated admin password) owner-only.
"""

from __future__ import annotations

import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

LOOPBACK: Final = "127.0.0.1"
# (section, option): every address an Airflow component listens on.
LISTENERS: Final[Mapping[tuple[str, str], str]] = {
    ("api", "host"): LOOPBACK,
    ("scheduler", "scheduler_health_check_server_host"): LOOPBACK,
    ("celery", "flower_host"): LOOPBACK,
}
_SECTION: Final = re.compile(r"^\[(?P<name>[^\]]+)\]\s*$")
_OPTION: Final = re.compile(r"^(?P<name>[A-Za-z0-9_]+)\s*=")


def on_loopback(text: str, settings: Mapping[tuple[str, str], str] = LISTENERS) -> str:
    """``text`` (an ``airflow.cfg``) with each of ``settings`` set: its line replaced where it
    is, or added at the end of its section (which is added if missing)."""
    lines = text.splitlines(keepends=True)
    pending = dict(settings)
    out: list[str] = []
    section = ""
    for line in lines:
        header = _SECTION.match(line)
        if header:
            out.extend(_missing(section, pending))
            section = header.group("name")
            out.append(line)
            continue
        option = _OPTION.match(line)
        if option and (section, option.group("name")) in pending:
            name = option.group("name")
            out.append(f"{name} = {pending.pop((section, name))}\n")
        else:
            out.append(line)
    out.extend(_missing(section, pending))
    for (name, key), value in sorted(pending.items()):
        out.append(f"\n[{name}]\n{key} = {value}\n")
    return "".join(out)


def _missing(section: str, pending: dict[tuple[str, str], str]) -> list[str]:
    """The lines of ``pending`` options of ``section`` that were not in it (now removed)."""
    found = [(key, value) for key, value in pending.items() if key[0] == section]
    for key, _ in found:
        del pending[key]
    return [f"{key[1]} = {value}\n" for key, value in found]


def secure(home: Path) -> None:
    """Airflow's folder owner-only, its ``airflow.cfg`` on loopback."""
    home.chmod(stat.S_IMODE(home.stat().st_mode) & 0o700)
    config = home / "airflow.cfg"
    if config.exists():
        config.write_text(on_loopback(config.read_text()))
    for private in (config, home / "airflow.db", *home.glob("simple_auth_manager_passwords*")):
        if private.exists():
            private.chmod(0o600)


if __name__ == "__main__":
    secure(Path(sys.argv[1]))
