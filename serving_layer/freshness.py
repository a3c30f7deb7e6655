"""How fresh an answer is: the newest exact bucket, the newest approximate one, stream lag."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


@dataclass(frozen=True)
class Freshness:
    """Per response. ``latest_covered_bucket``: the last minute the batch layer made exact;
    ``latest_speed_bucket``: the newest minute in speed/ctr; ``speed_*``: what the streaming job
    last reported (None when unknown): when, its watermark, and how many Kafka records it has
    not read yet (consumer lag). ``versions``: the Delta table versions the answer read.
    ``settle``: how long after a minute the batch layer covers it (the version's
    :attr:`~views.definitions.Definition.settle`): the minutes since are the speed layer's.
    ``clicks_window``: the version's click attribution window (0 without attribution): a
    minute younger than it can still receive its impressions' clicks, so its CTR still rises."""

    latest_covered_bucket: dt.datetime | None
    latest_speed_bucket: dt.datetime | None
    speed_updated_at: dt.datetime | None
    speed_watermark: dt.datetime | None
    speed_lag_records: int | None
    versions: dict[str, int | None]
    settle: dt.timedelta = dt.timedelta(0)
    clicks_window: dt.timedelta = dt.timedelta(0)
