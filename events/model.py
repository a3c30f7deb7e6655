"""The ad event contract (docs/concepts/architecture.md) and the one validation function for it.

Every path that accepts events (the producer, replay, and later the Spark jobs) calls
:func:`validate`; a record is either an :class:`Event` or an :class:`Invalid` listing every
reason it was refused, so the reasons can travel with the record to the dead-letter topic or
the quarantine table.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec
import orjson

from events.countries import ISO_3166_ALPHA2

SCHEMA_VERSION: Final = 1
EVENT_TYPES: Final = frozenset({"impression", "click"})
DEVICE_TYPES: Final = frozenset({"mobile", "desktop", "tablet", "ctv", "other"})
MAX_EVENT_ID_CHARS: Final = 64
MAX_ID_CHARS: Final = 128
MAX_RECORD_BYTES: Final = 8192
# Deeper JSON is refused before decoding: the decoder recurses once per level, and Python's
# recursion limit minus the caller's stack would otherwise decide the verdict (and raise).
MAX_NESTING: Final = 512
_INT64: Final = range(-(2**63), 2**63)

EventType = Literal["impression", "click"]
DeviceType = Literal["mobile", "desktop", "tablet", "ctv", "other"]
if TYPE_CHECKING:
    Country = str
else:  # msgspec checks membership while decoding
    Country = Literal[tuple(sorted(ISO_3166_ALPHA2))]
EventId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_EVENT_ID_CHARS)]
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]

# Characters the string fields must not contain: each is invisible, or reorders or disguises the
# text around it, so that two values that look alike are different rows (`cmp-001` and
# `cmp-001\u200b`) or a value displays as another (`cmp-\u202egnp.exe` shows as `cmp-exe.png`).
# Spelled out rather than read from unicodedata at run time, so that a record's verdict does not
# change with Python's Unicode version; tests/unit/test_validation.py holds it to the categories.
_INVISIBLE_BMP: Final = (
    r"\x00-\x1f\x7f-\x9f"  # Cc: C0 and C1 controls and DEL (tab, CR, LF, NUL, NEL, ...)
    r"\xa0\u1680\u2000-\u200a\u202f\u205f\u3000"  # Zs but the ASCII space: no-break, em, ...
    r"\u2028\u2029"  # Zl, Zp: line and paragraph separators
    # Cf: soft hyphen, Arabic and Syriac marks, zero-width space and joiners, LRM, RLM, ALM, bidi
    # embeddings, overrides and isolates, word joiner, invisible operators, BOM, annotations
    r"\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    r"\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
    # The rest of Unicode's Default_Ignorable_Code_Point (drawn as nothing): the grapheme joiner,
    # Hangul fillers, Khmer inherent vowels, Mongolian and other variation selectors; and
    # BRAILLE PATTERN BLANK, a blank the width of a letter
    r"\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2065\u3164\ufe00-\ufe0f\uffa0\ufff0-\ufff8\u2800"
    r"\ud800-\udfff"  # Cs: lone surrogates (a mapping can hold them; JSON cannot)
    r"\ufdd0-\ufdef\ufffe\uffff"  # noncharacters
)
_INVISIBLE_ASTRAL: Final = (
    # Cf (Unicode 15): Kaithi number signs, Egyptian hieroglyph, shorthand and musical format
    # controls; the tag block with the variation selectors supplement (Default_Ignorable)
    r"\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    r"\U000e0000-\U000e0fff"
    + "".join(rf"\U{plane:04x}fffe-\U{plane:04x}ffff" for plane in range(1, 17))  # noncharacters
)
_INVISIBLE: Final = re.compile(f"[{_INVISIBLE_BMP}{_INVISIBLE_ASTRAL}]")
# The same rule as a pattern a whole value must match, for the decoder. Unrolled, so that an
# ordinary character costs one table lookup: re tests a character against each astral member
# of a class in turn, which made the plain `\A[^...]*\Z` five times slower.
_ANY_ASTRAL: Final = r"\U00010000-\U0010ffff"
_ORDINARY: Final = f"[^{_INVISIBLE_BMP}{_ANY_ASTRAL}]*"
_VISIBLE: Final = rf"\A{_ORDINARY}(?:(?![{_INVISIBLE_ASTRAL}])[{_ANY_ASTRAL}]{_ORDINARY})*\Z"
_VisibleText = Annotated[str, msgspec.Meta(pattern=_VISIBLE)]
_INVISIBLE_PROBLEM: Final = "control, format and invisible characters are not allowed"

_STRING_FIELDS: Final = (
    "event_id",
    "impression_id",
    "ad_id",
    "campaign_id",
    "site_id",
    "user_id",
)
FIELDS: Final = (
    "event_id",
    "event_type",
    "event_time",
    "impression_id",
    "ad_id",
    "campaign_id",
    "site_id",
    "country",
    "device_type",
    "user_id",
    "schema_version",
)


@dataclass(frozen=True, slots=True)
class ValidationRules:
    """Bounds on ``event_time``, relative to a reference time in epoch milliseconds.

    ``reference_ms`` is "now" for producers; the Spark jobs pass the Kafka record timestamp so
    that replaying the same record always gives the same verdict.
    """

    min_event_time_ms: int = 1_262_304_000_000  # 2010-01-01T00:00:00Z: older is garbage
    max_future_skew_ms: int = 3_600_000  # one hour of producer clock skew


DEFAULT_RULES: Final = ValidationRules()


class Event(msgspec.Struct, frozen=True, gc=False):
    """One valid ad event, field for field the Kafka JSON value.

    The type annotations are the static half of the contract: msgspec checks them while it
    decodes, in C, which keeps validation off the producer's critical path. The time bounds,
    which depend on a reference time, are checked by :func:`validate`, and so are invisible
    characters in the string fields (:class:`_Visible`, decoded only when a record could hold
    one).

    ``gc=False``: an event holds only strings and integers, so it can never be part of a
    reference cycle; left out of the garbage collector's tracking, the Spark jobs' batches of
    events no longer trigger collections (about 10 % of a parse).
    """

    event_id: EventId
    event_type: EventType
    event_time: int
    impression_id: Id
    ad_id: Id
    campaign_id: Id
    site_id: Id
    country: Country
    device_type: DeviceType
    user_id: Id
    schema_version: Literal[1]

    def to_json(self) -> bytes:
        return _encoder.encode(self)

    @property
    def key(self) -> bytes:
        """The Kafka key: events of one impression share a partition."""
        return self.impression_id.encode()


class _Visible(msgspec.Struct):
    """The string fields of an event, free of invisible characters (every occurrence of a
    repeated key, like the decoder's other checks). Checked apart from :class:`Event`: only a
    record with an escape or a non-ASCII byte can hold such a character, and most hold neither."""

    event_id: _VisibleText
    impression_id: _VisibleText
    ad_id: _VisibleText
    campaign_id: _VisibleText
    site_id: _VisibleText
    user_id: _VisibleText


_decode: Final = msgspec.json.Decoder(Event).decode
_decode_visible: Final = msgspec.json.Decoder(_Visible).decode
_all_visible: Final = re.compile(_VISIBLE).search
_encoder: Final = msgspec.json.Encoder()
MISSING_FIELDS: Final = "record: missing field(s) "  # the reason's start, the names follow


@dataclass(frozen=True, slots=True)
class Invalid:
    """A record that failed validation, with every reason found (``field: problem``)."""

    reasons: tuple[str, ...]

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def validate(
    record: bytes | bytearray | memoryview | str | Mapping[str, Any],
    reference_ms: int,
    rules: ValidationRules = DEFAULT_RULES,
) -> Event | Invalid:
    """Parse and check one record against the event contract.

    Parameters
    ----------
    record
        The raw Kafka value (UTF-8 JSON bytes or text) or an already decoded object. Anything
        else (``None``, a list, a number) is refused as "not a JSON object"; no input raises.
    reference_ms
        "Now" in epoch milliseconds, for the far-future check (see :class:`ValidationRules`).

    Returns
    -------
    Event | Invalid
        The typed event, or every reason the record breaks the contract.

    Examples
    --------
    >>> validate(b"{", reference_ms=0).reasons
    ('record: not valid JSON (unexpected end of data at byte 1)',)
    """
    if type(record) is bytes or isinstance(record, bytes):
        return _validate_bytes(record, reference_ms, rules)
    if isinstance(record, str):
        try:
            encoded = record.encode()
        except UnicodeEncodeError as exc:  # lone surrogates: text that is not Unicode
            return Invalid((f"record: not valid UTF-8 text ({exc.reason} at {exc.start})",))
        return _validate_bytes(encoded, reference_ms, rules)
    if isinstance(record, bytearray | memoryview):
        return _validate_bytes(bytes(record), reference_ms, rules)
    return _validate_object(record, reference_ms, rules)


@dataclass(frozen=True, slots=True)
class Verdicts:
    """:func:`validate_many`'s answer: the valid records as events, the others' reasons, each
    with its position among the records."""

    events: list[Event]
    valid_rows: list[int]
    invalid_rows: list[int]
    reasons: list[str]  # Invalid.reason of each invalid row


def validate_many(
    records: Sequence[bytes | bytearray | memoryview | str | Mapping[str, Any]],
    references_ms: Sequence[int],
    rules: ValidationRules = DEFAULT_RULES,
) -> Verdicts:
    """:func:`validate` of every record against its own reference time, in one loop.

    The Spark jobs' parse: at a million records a batch, a call per record through
    :func:`validate` and a verdict stored field by field cost as much as the decoding.
    """
    if len(records) != len(references_ms):
        raise ValueError(
            f"records and references_ms must have the same length, "
            f"got {len(records)} and {len(references_ms)}"
        )
    events: list[Event] = []
    valid_rows: list[int] = []
    invalid_rows: list[int] = []
    reasons: list[str] = []
    keep, keep_row = events.append, valid_rows.append
    for row, record in enumerate(records):
        if type(record) is bytes:
            result = _validate_bytes(record, references_ms[row], rules)
        else:
            result = validate(record, references_ms[row], rules)
        if type(result) is Event:
            keep(result)
            keep_row(row)
        else:
            invalid_rows.append(row)
            reasons.append(result.reason)  # type: ignore[union-attr]
    return Verdicts(events, valid_rows, invalid_rows, reasons)


def _validate_bytes(record: bytes, reference_ms: int, rules: ValidationRules) -> Event | Invalid:
    """:func:`validate` for a raw record: the producers' and the Spark jobs' hot path."""
    size = len(record)
    if size > MAX_RECORD_BYTES:
        return Invalid((f"record: {size} bytes exceeds the limit of {MAX_RECORD_BYTES}",))
    ascii_only = record.isascii()
    text = ""
    if not ascii_only:  # msgspec checks UTF-8 only where it decodes a string
        try:
            text = record.decode()
        except UnicodeDecodeError as exc:
            return Invalid((f"record: not valid UTF-8 ({exc.reason} at byte {exc.start})",))
    # A record shorter than MAX_NESTING bytes cannot nest deeper than that: the common
    # case pays one comparison.
    if size > MAX_NESTING and _nesting_depth(record) > MAX_NESTING:
        return Invalid((f"record: JSON nested deeper than {MAX_NESTING} levels",))
    try:
        event = _decode(record)  # the static rules, checked in C while decoding
        # Only an escape (\u202e, \t), a DEL or the character itself can put an invisible
        # character in a string (a raw control byte is not JSON): most records skip this decode.
        if 0x5C in record or (0x7F in record if ascii_only else not _all_visible(text)):
            _decode_visible(record)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        return Invalid(_explain(record, reference_ms, rules, exc))
    event_time = event.event_time  # _check_time, inlined on the hot path
    if rules.min_event_time_ms <= event_time <= reference_ms + rules.max_future_skew_ms:
        return event
    return Invalid(_time_reasons(event_time, reference_ms, rules))


def _validate_object(
    record: Mapping[str, Any], reference_ms: int, rules: ValidationRules
) -> Event | Invalid:
    """:func:`validate` for an already decoded record (anything but text or bytes)."""
    try:
        event = msgspec.convert(record, Event)
        msgspec.convert(record, _Visible)
    # ValueError: msgspec printing an int past 4,300 digits into its message.
    except (msgspec.ValidationError, msgspec.DecodeError, ValueError) as exc:
        return Invalid(_explain(record, reference_ms, rules, exc))
    return _check_time(event, reference_ms, rules)


def _check_time(event: Event, reference_ms: int, rules: ValidationRules) -> Event | Invalid:
    """``event`` if its time lies within ``rules`` around ``reference_ms``."""
    event_time = event.event_time
    if rules.min_event_time_ms <= event_time <= reference_ms + rules.max_future_skew_ms:
        return event
    return Invalid(_time_reasons(event_time, reference_ms, rules))


def _time_reasons(event_time: int, reference_ms: int, rules: ValidationRules) -> tuple[str, ...]:
    reasons: list[str] = []
    _check_event_time(event_time, reference_ms, rules, reasons)
    return tuple(reasons)


def _explain(
    record: bytes | str | Mapping[str, Any],
    reference_ms: int,
    rules: ValidationRules,
    error: Exception,
) -> tuple[str, ...]:
    """Every reason a record was refused (the decoder stops at the first one)."""
    if isinstance(record, bytes | str):
        try:
            obj = orjson.loads(record)
        except orjson.JSONDecodeError as exc:
            return (f"record: not valid JSON ({_json_error(exc)})",)
    else:
        obj = record
    # _reasons spells out the rules the Event type encodes; the tests hold the two to agreeing.
    found = _reasons(obj, reference_ms, rules)
    if found:
        return found
    # The one way they differ: a repeated key. The reason path sees its last occurrence (as
    # every JSON parser here does); the decoder checks every occurrence as it reads it.
    repeated = _AT_FIELD.search(str(error))
    if repeated and repeated.group(2) in FIELDS:
        problem, name = repeated.group(1), repeated.group(2)
        if problem.startswith("Expected `str` matching regex"):  # _Visible's pattern
            problem = "contains a control, format or invisible character"
        return (f"{name}: a repeated key with an invalid occurrence ({problem})",)
    return (f"record: {error}",)


_AT_FIELD: Final = re.compile(r"^(.*) - at `\$\.(\w+)`$")


def _reasons(obj: object, reference_ms: int, rules: ValidationRules) -> tuple[str, ...]:
    """Every rule the record breaks, one ``field: problem`` line each."""
    if not isinstance(obj, Mapping):
        return (f"record: expected a JSON object, got {_json_type(obj)}",)

    reasons: list[str] = []
    missing = [name for name in FIELDS if name not in obj]
    if missing:
        reasons.append(f"{MISSING_FIELDS}{', '.join(missing)}")

    for name in _STRING_FIELDS:
        if name in obj:
            limit = MAX_EVENT_ID_CHARS if name == "event_id" else MAX_ID_CHARS
            _check_string(obj[name], name, limit, reasons)

    event_type = obj.get("event_type")
    if "event_type" in obj and not _member(event_type, EVENT_TYPES):
        reasons.append(f"event_type: must be 'impression' or 'click', got {_show(event_type)}")

    if "event_time" in obj:
        _check_event_time(obj["event_time"], reference_ms, rules, reasons)

    country = obj.get("country")
    if "country" in obj and not _member(country, ISO_3166_ALPHA2):
        reasons.append(
            f"country: must be an ISO 3166-1 alpha-2 code like 'US', got {_show(country)}"
        )

    device = obj.get("device_type")
    if "device_type" in obj and not _member(device, DEVICE_TYPES):
        allowed = ", ".join(sorted(DEVICE_TYPES))
        reasons.append(f"device_type: must be one of {allowed}, got {_show(device)}")

    version = obj.get("schema_version")
    if "schema_version" in obj and (type(version) is not int or version != SCHEMA_VERSION):
        reasons.append(f"schema_version: must be {SCHEMA_VERSION}, got {_show(version)}")
    return tuple(reasons)


def _member(value: object, allowed: frozenset[str]) -> bool:
    return isinstance(value, str) and value in allowed


def id_problem(value: object, name: str, limit: int = MAX_ID_CHARS) -> str | None:
    """Why ``value`` is not an id the event contract allows in field ``name`` (None: it is):
    a string of 1 to ``limit`` characters with no invisible or reordering character. Spaces
    are allowed and significant."""
    reasons: list[str] = []
    _check_string(value, name, limit, reasons)
    return reasons[0] if reasons else None


def _check_string(value: object, name: str, limit: int, reasons: list[str]) -> None:
    if not isinstance(value, str):
        reasons.append(f"{name}: must be a string, got {_json_type(value)}")
    elif not value:
        reasons.append(f"{name}: must not be empty")
    elif len(value) > limit:
        reasons.append(f"{name}: {len(value)} characters exceeds the limit of {limit}")
    elif (found := _INVISIBLE.search(value)) is not None:
        reasons.append(f"{name}: contains {_code_point(found.group())} ({_INVISIBLE_PROBLEM})")


def _code_point(char: str) -> str:
    """``U+202E RIGHT-TO-LEFT OVERRIDE``; a code point without a name by its kind: ``<control>``."""
    code = ord(char)
    name = unicodedata.name(char, "")
    if not name:
        category = unicodedata.category(char)
        if category in _UNNAMED:
            name = _UNNAMED[category]
        elif 0xFDD0 <= code <= 0xFDEF or (code & 0xFFFE) == 0xFFFE:
            name = "<noncharacter>"
        else:
            name = "<unassigned>"
    return f"U+{code:04X} {name}"


_UNNAMED: Final = {"Cc": "<control>", "Cs": "<surrogate>"}


def _check_event_time(
    value: object, reference_ms: int, rules: ValidationRules, reasons: list[str]
) -> None:
    # bool is an int subclass in Python but not an integer in JSON.
    if type(value) is not int:
        reasons.append(f"event_time: must be an integer (epoch milliseconds), got {_show(value)}")
    elif value not in _INT64:
        reasons.append(
            f"event_time: must be a 64-bit integer (epoch milliseconds), got {_show(value)}"
        )
    elif value < rules.min_event_time_ms:
        reasons.append(
            f"event_time: {value} is before {rules.min_event_time_ms} (ancient or not milliseconds)"
        )
    elif value > reference_ms + rules.max_future_skew_ms:
        ahead_s = (value - reference_ms) // 1000
        reasons.append(f"event_time: {value} is {ahead_s} s in the future")


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


def _show(value: object) -> str:
    text = repr(value) if isinstance(value, str) else _json_type(value)
    if isinstance(value, int) and not isinstance(value, bool) and value not in _INT64:
        # Also spares str() of a huge int, which raises past 4,300 digits.
        text = "an integer beyond ±2^63"
    elif isinstance(value, int | float) and not isinstance(value, bool):
        text = f"number {value}"
    return text if len(text) <= 40 else text[:37] + "..."


_JSON_STRING: Final = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEP: Final = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _nesting_depth(record: bytes) -> int:
    """How deep arrays and objects nest in ``record`` (brackets inside strings ignored)."""
    if record.count(b"[") + record.count(b"{") <= MAX_NESTING:
        return 0  # cannot be deeper than that: skip the scan
    brackets = _JSON_STRING.sub(b"", record).translate(None, _NOT_BRACKETS)
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _json_error(exc: orjson.JSONDecodeError) -> str:
    return f"{exc.msg} at byte {exc.pos}"
