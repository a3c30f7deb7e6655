"""Where a reach query reads the batch layer's hour rows (``batch/ctr_hours``:
:mod:`batch_layer.hours`) instead of their minute rows.

An hour's rows stand in for its minute rows when the hour is wholly covered, lies wholly in the
query's range, and every minute row of it is the run's that wrote the hour rows
(:func:`serving_layer.ctr_sql.hour_check_sql`): a run stopped between its minute commit and its
hour commit, or an hour two runs covered in parts, keeps the minute rows' answer. Buckets no
shorter than an hour are made of whole hours, except where the range or the coverage starts or
ends mid-hour: such a bucket is counted from its minute rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

from runtime.times import EPOCH
from serving_layer.query import CtrQuery

Intervals = list[tuple[dt.datetime, dt.datetime]]
HOUR = dt.timedelta(hours=1)


def candidate_hours(
    query: CtrQuery, covered: Sequence[tuple[dt.datetime, dt.datetime]]
) -> Intervals:
    """The whole hours of the ``covered`` intervals (disjoint, in order) inside ``query``'s
    range; none for minute buckets (an hour row would hold 60 of them)."""
    if query.granularity == "minute":
        return []
    hours = []
    for start, end in covered:
        lo, hi = _ceil(max(start, query.start)), _floor(min(end, query.end))
        if lo < hi:
            hours.append((lo, hi))
    return hours


def hours_of(intervals: Iterable[tuple[dt.datetime, dt.datetime]]) -> list[dt.datetime]:
    """Every hour start of ``intervals`` (whole hours)."""
    return [start + n * HOUR for start, end in intervals for n in range(int((end - start) / HOUR))]


def joined(hours: Iterable[dt.datetime]) -> Intervals:
    """Hour starts (in order) as intervals, adjacent hours joined."""
    parts: Intervals = []
    for hour in hours:
        if parts and parts[-1][1] == hour:
            parts[-1] = (parts[-1][0], hour + HOUR)
        else:
            parts.append((hour, hour + HOUR))
    return parts


def subtract(
    parts: Sequence[tuple[dt.datetime, dt.datetime]],
    minus: Sequence[tuple[dt.datetime, dt.datetime]],
) -> Intervals:
    """``parts`` without ``minus`` (both disjoint and in order)."""
    left: Intervals = []
    for start, end in parts:
        lo = start
        for m_start, m_end in minus:
            if m_end <= lo or m_start >= end:
                continue
            if m_start > lo:
                left.append((lo, m_start))
            lo = max(lo, m_end)
        if lo < end:
            left.append((lo, end))
    return left


def _floor(moment: dt.datetime) -> dt.datetime:
    return EPOCH + (moment - EPOCH) // HOUR * HOUR


def _ceil(moment: dt.datetime) -> dt.datetime:
    floor = _floor(moment)
    return floor if floor == moment else floor + HOUR
