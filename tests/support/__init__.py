"""What the tests share: builders of events and lakes, the API server in a thread, the fault
injectors, a clock the tests move, and the one way to wait on a real process."""

from __future__ import annotations

from pathlib import Path
from typing import Final

# The repository's root.
ROOT: Final = Path(__file__).resolve().parents[2]
