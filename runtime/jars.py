"""Where `make setup` put the JVM dependencies of a jar set (``infra/<set>/pom.xml``).

``infra/jars.sh`` resolves each POM with Maven into ``$CTR_JAR_CACHE/<set>-<hash>`` (default
``~/.cache/ctr-lambda/jars``), the hash being that of the POM: this module finds the same
directory under the cache its caller names (``SparkSettings.jar_cache``), so a changed POM never
runs on stale jars and nothing is fetched at run time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final

# The POMs live with the local infrastructure that fetches them (infra/jars.sh).
INFRA: Final = Path(__file__).resolve().parents[1] / "infra"


class JarsMissingError(RuntimeError):
    """The jar set was not fetched (run `make setup`)."""


def jar_dir(jar_set: str, cache: Path) -> Path:
    """The directory holding every jar of ``jar_set`` in the jar cache ``cache``;
    :class:`JarsMissingError` if absent."""
    pom = INFRA / jar_set / "pom.xml"
    if not pom.is_file():
        raise ValueError(f"'jar_set' names no POM: {pom} does not exist")
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    directory = cache / f"{jar_set}-{digest}"
    if not (directory / ".complete").is_file():
        raise JarsMissingError(
            f"the {jar_set} jars are not in {directory}: run 'make setup' "
            f"(or 'bash infra/jars.sh {jar_set}') to fetch them from Maven Central"
        )
    return directory


def jars(jar_set: str, cache: Path) -> list[Path]:
    """Every jar of ``jar_set`` in the jar cache ``cache``, sorted."""
    return sorted(jar_dir(jar_set, cache).glob("*.jar"))
