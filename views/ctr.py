"""The click-through base view: impressions and clicks per minute and ad dimensions."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from views.columns import DIMENSIONS


def ctr(events: DataFrame) -> DataFrame:
    """Count impressions and clicks per one-minute event-time bucket and dimensions.

    Used as ``events.transform(ctr)`` by the batch job (on deduplicated events) and by the
    streaming job (after ``withWatermark("event_time", …)``): the bucket is a tumbling event-time
    window, which Structured Streaming can age out of its state.

    Parameters
    ----------
    events
        Columns ``event_time`` (timestamp), ``event_type`` ("impression" | "click") and the
        dimensions ``campaign_id``, ``ad_id``, ``site_id``, ``country``, ``device_type``.

    Returns
    -------
    DataFrame
        ``bucket_start`` (timestamp, start of the minute), the five dimensions, ``impressions``
        and ``clicks`` (long): one row per bucket and dimension combination that had events.

    Examples
    --------
    Two impressions and a click of one ad at 10:00:05, 10:00:59 and 10:01:00 give two rows:
    (10:00, …, impressions=2, clicks=0) and (10:01, …, impressions=0, clicks=1).
    """
    window = F.window("event_time", "1 minute")
    return (
        events.groupBy(window, *DIMENSIONS)
        .agg(
            F.count(F.when(F.col("event_type") == "impression", 1)).alias("impressions"),
            F.count(F.when(F.col("event_type") == "click", 1)).alias("clicks"),
        )
        .select(F.col("window.start").alias("bucket_start"), *DIMENSIONS, "impressions", "clicks")
    )
