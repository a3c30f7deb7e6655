"""Domain values as JSON-ready values, and rendered answers."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Response

from serving_layer.freshness import Freshness


@dataclass(frozen=True)
class Rendered:
    """An answer's body, media type and headers, as the response cache keeps it."""

    body: bytes
    media_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = field(default=())

    def __len__(self) -> int:
        """The bytes it holds (the response cache is bounded in them)."""
        return len(self.body) + sum(len(k) + len(v) for k, v in self.headers)

    def response(self) -> Response:
        return Response(self.body, media_type=self.media_type, headers=dict(self.headers))


def freshness_json(freshness: Freshness, *, scoped: bool = False) -> dict[str, object]:
    """``scoped``: for an advertiser key, without the stream's lag (a count of every
    campaign's records)."""
    return {
        "latest_covered_bucket": freshness.latest_covered_bucket,
        "latest_speed_bucket": freshness.latest_speed_bucket,
        "speed_updated_at": freshness.speed_updated_at,
        "speed_watermark": freshness.speed_watermark,
        "speed_lag_records": None if scoped else freshness.speed_lag_records,
        "versions": freshness.versions,
        "settle_minutes": int(freshness.settle.total_seconds() // 60),
    }
