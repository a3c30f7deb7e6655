"""How many times the fault tests repeat their faults: once in `make test`, more in
`make test-faults` (CTR_FAULT_ROUNDS)."""

from __future__ import annotations

import os

ROUNDS = int(os.environ.get("CTR_FAULT_ROUNDS", "1"))
if ROUNDS < 1:
    raise ValueError(f"CTR_FAULT_ROUNDS must be at least 1, got {ROUNDS}")


def timeout(seconds_per_round: int) -> int:
    """A test's pytest timeout when each round of its faults may take ``seconds_per_round``."""
    return seconds_per_round * ROUNDS
