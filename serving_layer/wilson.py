"""The Wilson score interval for a click-through rate."""

from __future__ import annotations

import math
from typing import Final

Z_95: Final = 1.959963984540054  # the 97.5th percentile of the standard normal distribution


def wilson_interval(clicks: int, impressions: int, z: float = Z_95) -> tuple[float, float] | None:
    """95% Wilson score interval of ``clicks / impressions``; None without impressions.

    A short bucket can hold more clicks than impressions without click attribution (a click
    lands in the minute after its impression): the proportion is then capped at 1. With
    ``clicks <= impressions`` the bounds hold ``clicks / impressions``.

    >>> [round(x, 4) for x in wilson_interval(10, 100)]
    [0.0552, 0.1744]
    """
    if impressions <= 0:
        return None
    n = impressions
    p = min(max(clicks, 0), n) / n
    z2 = z * z
    denominator = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # The interval holds p; at p = 0 or 1 rounding can leave a bound an ulp on the wrong side.
    return min(max(center - half, 0.0), p), max(min(center + half, 1.0), p)
