"""Domain values as JSON-ready values."""

from __future__ import annotations

from serving_layer.freshness import Freshness


def freshness_json(freshness: Freshness) -> dict[str, object]:
    return {
        "latest_covered_bucket": freshness.latest_covered_bucket,
        "latest_speed_bucket": freshness.latest_speed_bucket,
        "speed_updated_at": freshness.speed_updated_at,
        "speed_watermark": freshness.speed_watermark,
        "speed_lag_records": freshness.speed_lag_records,
        "versions": freshness.versions,
    }
