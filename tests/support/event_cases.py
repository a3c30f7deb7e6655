"""Events for the validator's tests: one valid event, the reference time they are validated
against, hypothesis strategies for valid events and arbitrary JSON values, and the characters a
string field must not contain, read from the Unicode database (test support)."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Final

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


# --- the look-alike rule, from the Unicode database -----------------------------------------------

# Default_Ignorable_Code_Point (DerivedCoreProperties.txt, Unicode 15.1): characters drawn as
# nothing. Those not in Cf: the grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian
# and other variation selectors, unassigned code points reserved as ignorable, the tag block.
DEFAULT_IGNORABLE: Final = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
# Format characters (Cf) newer than this Python's Unicode database (14.0 in Python 3.11).
NEWER_FORMAT: Final = range(0x13439, 0x13440)  # Egyptian hieroglyph format controls, Unicode 15
BRAILLE_PATTERN_BLANK: Final = "\u2800"  # So, but a blank the width of a letter
_IGNORABLE: Final = frozenset(
    code for low, high in DEFAULT_IGNORABLE for code in range(low, high + 1)
) | frozenset(NEWER_FORMAT)


def invisible(char: str) -> bool:
    """Whether the contract refuses ``char`` in a string field: controls, format characters,
    separators and spaces but the ASCII space, surrogates, noncharacters, default ignorables."""
    code = ord(char)
    category = unicodedata.category(char)
    return (
        category in {"Cc", "Cf", "Cs", "Zl", "Zp"}
        or (category == "Zs" and char != " ")
        or 0xFDD0 <= code <= 0xFDEF
        or (code & 0xFFFE) == 0xFFFE
        or code in _IGNORABLE
        or char == BRAILLE_PATTERN_BLANK
    )


# What a string field may hold (surrogates cannot be written as UTF-8, so JSON cannot hold them).
visible_characters = st.characters(exclude_categories=["Cc", "Cf", "Cs", "Zl", "Zp"]).filter(
    lambda char: not invisible(char)
)
# What it may not: the named look-alikes of the issue and any character of the refused kinds
# (surrogates left out: only a mapping can hold them).
invisible_characters = st.sampled_from(
    [
        "\u202e",  # RIGHT-TO-LEFT OVERRIDE
        "\u200b",  # ZERO WIDTH SPACE
        "\t",
        "\x00",
        "\x7f",
        "\x85",  # NEXT LINE (C1)
        "\xa0",  # NO-BREAK SPACE
        "\xad",  # SOFT HYPHEN
        "\u061c",  # ARABIC LETTER MARK
        "\u2066",  # LEFT-TO-RIGHT ISOLATE
        "\u2028",  # LINE SEPARATOR
        "\ufeff",  # ZERO WIDTH NO-BREAK SPACE (BOM)
        "\ufe0f",  # VARIATION SELECTOR-16
        "\u3164",  # HANGUL FILLER
        "\U000e0041",  # TAG LATIN CAPITAL LETTER A
        "\ufdd0",  # a noncharacter
        "\U0010ffff",  # a noncharacter
        BRAILLE_PATTERN_BLANK,
    ]
) | st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Zs"], exclude_characters=[" "])


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
    return st.text(visible_characters, min_size=1, max_size=max_size)


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
