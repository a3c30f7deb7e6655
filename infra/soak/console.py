"""What the soak prints while it runs: timestamped lines, and a progress line per sample."""

from __future__ import annotations

import datetime as dt


def log(message: str) -> None:
    print(f"soak: {dt.datetime.now(dt.UTC):%H:%M:%S} {message}", flush=True)


def progress(rows: list[tuple[float, str, float]], elapsed_s: float, duration_s: float) -> None:
    """One line of the latest samples (``rows``: ``(t, series, value)``): memory, lags,
    freshness, p99."""
    latest: dict[str, float] = {}
    for _, name, value in rows:
        latest[name] = value
    rss = sum(v for k, v in latest.items() if k.startswith("rss_mb."))
    log(
        f"{elapsed_s / 60:5.1f}/{duration_s / 60:g} min  rss {rss:,.0f} MB  "
        f"lag archiver {latest.get('lag_records.archiver', float('nan')):,.0f} "
        f"speed {latest.get('lag_records.speed', float('nan')):,.0f}  "
        f"fresh {latest.get('freshness_s.speed', float('nan')):.1f} s  "
        f"p99 {latest.get('api_p99_ms.fixed_query', float('nan')):.0f} ms"
    )
