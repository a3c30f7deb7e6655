"""The view functions alone, on a handful of events: the whole result, compared row by row.

Everything else tests them through a job (archiver, speed job, batch job); these say what the
definitions are, in the smallest example that shows each rule.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from runtime.times import from_micros
from views.ctr import attributed_ctr, ctr

T = dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
EVENTS = (
    "event_id string, event_type string, event_time timestamp, impression_id string, "
    "campaign_id string, ad_id string, site_id string, country string, device_type string"
)


def at(seconds: float) -> dt.datetime:
    return T + dt.timedelta(seconds=seconds)


def event(n: int, kind: str, seconds: float, impression: str, ad: str = "a1") -> tuple[object, ...]:
    return (f"e{n}", kind, at(seconds), impression, "c1", ad, "s1", "DE", "mobile")


def rows(frame: DataFrame) -> list[tuple[object, ...]]:
    """The rows in order, the bucket as UTC (``collect`` would give the machine's local time)."""
    us = frame.select(F.unix_micros("bucket_start").alias("us"), *frame.columns[1:])
    return [(from_micros(r["us"]), *tuple(r)[1:]) for r in us.orderBy(*us.columns).collect()]


def test_ctr_counts_impressions_and_clicks_per_minute_and_dimensions(
    spark: SparkSession,
) -> None:
    """The docstring's example and one more ad: five events, three rows."""
    events = spark.createDataFrame(
        [
            event(1, "impression", 5, "i1"),
            event(2, "impression", 59, "i2"),
            event(3, "click", 60, "i1"),  # 10:01:00 opens the next minute
            event(4, "impression", 70, "i3", ad="a2"),
            event(5, "click", 75, "i3", ad="a2"),
        ],
        EVENTS,
    )
    assert rows(events.transform(ctr)) == [
        (at(0), "c1", "a1", "s1", "DE", "mobile", 2, 0),
        (at(60), "c1", "a1", "s1", "DE", "mobile", 0, 1),
        (at(60), "c1", "a2", "s1", "DE", "mobile", 1, 1),
    ]


def test_attributed_ctr_credits_clicks_to_their_impression_within_the_window(
    spark: SparkSession,
) -> None:
    """The docstring's example, plus a click later than the window after its impression:
    impressions, clicks, raw, orphan and repeat clicks per row."""
    events = spark.createDataFrame(
        [
            event(1, "impression", 30, "i1"),
            event(2, "click", 70, "i1"),  # credited: 40 s after
            event(3, "click", 120, "i1"),  # credited again: a repeat
            event(4, "click", 300, "i-unseen"),  # no impression: an orphan
            event(5, "impression", 400, "i2"),
            event(6, "click", 1400, "i2"),  # 1,000 s after: past the window, an orphan
        ],
        EVENTS,
    )
    window = dt.timedelta(minutes=10)
    # columns: bucket, dimensions, impressions, clicks, raw_clicks, orphan_clicks, repeat_clicks
    dims = ("c1", "a1", "s1", "DE", "mobile")
    assert rows(attributed_ctr(events, window)) == [
        (at(0), *dims, 1, 1, 0, 0, 1),
        (at(60), *dims, 0, 0, 1, 0, 0),
        (at(120), *dims, 0, 0, 1, 0, 0),
        (at(300), *dims, 0, 0, 1, 1, 0),
        (at(360), *dims, 1, 0, 0, 0, 0),
        (at(1380), *dims, 0, 0, 1, 1, 0),
    ]
