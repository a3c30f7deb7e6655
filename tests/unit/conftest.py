"""The unit tier: no JVM, no broker, no browser, nothing that waits on another process's start.
A test here that asks for one of those fixtures is in the wrong tier: it fails at collection."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

HEAVY: Final = frozenset(
    {"spark", "spark_settings", "kafka", "topics", "kafka_env", "page", "dashboard_url"}
)
HERE: Final = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE not in Path(str(item.path)).parents:
            continue
        heavy = sorted(HEAVY & set(getattr(item, "fixturenames", ())))
        if heavy:
            raise pytest.UsageError(
                f"{item.nodeid} is in the unit tier but uses {', '.join(heavy)}: "
                "move it to tests/integration or tests/e2e"
            )
