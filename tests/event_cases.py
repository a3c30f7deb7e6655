"""Events for the validator's tests: one valid event, the reference time they are validated
against, and hypothesis strategies for valid events and arbitrary JSON values (test support)."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import strategies as st

from events.countries import ISO_3166_ALPHA2
from events.model import (
    DEFAULT_RULES,
    DEVICE_TYPES,
    EVENT_TYPES,
    FIELDS,
    MAX_EVENT_ID_CHARS,
    MAX_ID_CHARS,
)

REF = 1_700_000_000_000  # 2023-11-14T22:13:20Z, the "now" every test validates against
MIN_MS = DEFAULT_RULES.min_event_time_ms
MAX_MS = REF + DEFAULT_RULES.max_future_skew_ms
# What every reason starts with: the field it is about (or "record"), a colon, the problem.
REASON_PREFIX = re.compile(rf"^({'|'.join((*FIELDS, 'record'))}): \S")


def valid() -> dict[str, Any]:
    """A valid click, as its JSON object."""
    return {
        "event_id": "evt-0001",
        "event_type": "click",
        "event_time": REF - 60_000,
        "impression_id": "imp-0001",
        "ad_id": "ad-17",
        "campaign_id": "cmp-3",
        "site_id": "site-9",
        "country": "US",
        "device_type": "mobile",
        "user_id": "user-42",
        "schema_version": 1,
    }


INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | INT64
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)


def ids(max_size: int) -> st.SearchStrategy[str]:
    return st.text(min_size=1, max_size=max_size)


@st.composite
def valid_events(draw: st.DrawFn) -> tuple[int, dict[str, Any]]:
    """(reference time, a valid event's JSON object at that time): every field drawn."""
    reference = draw(st.integers(MIN_MS, 4_102_444_800_000))  # up to 2100-01-01
    event = {
        "event_id": draw(ids(MAX_EVENT_ID_CHARS)),
        "event_type": draw(st.sampled_from(sorted(EVENT_TYPES))),
        "event_time": draw(
            st.integers(MIN_MS, reference + DEFAULT_RULES.max_future_skew_ms)
            | st.sampled_from([MIN_MS, reference + DEFAULT_RULES.max_future_skew_ms])
        ),
        "impression_id": draw(ids(MAX_ID_CHARS)),
        "ad_id": draw(ids(MAX_ID_CHARS)),
        "campaign_id": draw(ids(MAX_ID_CHARS)),
        "site_id": draw(ids(MAX_ID_CHARS)),
        "country": draw(st.sampled_from(sorted(ISO_3166_ALPHA2))),
        "device_type": draw(st.sampled_from(sorted(DEVICE_TYPES))),
        "user_id": draw(ids(MAX_ID_CHARS)),
        "schema_version": 1,
    }
    return reference, event
