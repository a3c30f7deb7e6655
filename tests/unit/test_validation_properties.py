"""Properties of :func:`events.model.validate` under hostile input (hypothesis).

Whatever the bytes, the validator returns an :class:`Event` or an :class:`Invalid` whose reasons
are short ``field: problem`` lines, never an exception; a valid event survives any way of
writing its JSON; a wrong value in one field is refused with one reason naming that field.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from events.model import (
    FIELDS,
    MAX_NESTING,
    MAX_RECORD_BYTES,
    Event,
    Invalid,
    ValidationRules,
    validate,
    validate_many,
)
from tests.support.event_cases import (
    REASON_PREFIX,
    REF,
    invisible_characters,
    json_values,
    valid,
    valid_events,
    visible_characters,
)

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    database=None,  # nothing written under the working tree
    suppress_health_check=[HealthCheck.too_slow],
)
MAX_REASON_CHARS = 160
STRING_FIELDS = ("event_id", "impression_id", "ad_id", "campaign_id", "site_id", "user_id")
ENUM_FIELDS = ("event_type", "country", "device_type")


def check_outcome(result: Event | Invalid) -> None:
    """The contract of every answer: an Event, or reasons that are short and name a field."""
    if isinstance(result, Event):
        return
    assert isinstance(result, Invalid), result
    assert result.reasons
    for reason in result.reasons:
        assert REASON_PREFIX.match(reason), reason
        assert len(reason) <= MAX_REASON_CHARS, reason


# --- arbitrary and mangled input never raises ---------------------------------------------------

# Bytes that break parsers: quotes, escapes, brackets, invalid UTF-8 lead and continuation bytes,
# a BOM, NUL, digits and the letters of NaN/Infinity/true/false/null.
QUOTES_AND_BRACKETS = [b'"', b"\\", b"\\u", b"\\ud800", b"[", b"]", b"{", b"}", b":", b","]
BAD_UTF8_BOM_NUL = [b"\xff", b"\xc3", b"\x80", b"\xed\xa0\x80", b"\xef\xbb\xbf", b"\x00"]
NUMBERS_AND_WORDS = [b"9" * 30, b"-", b"e999", b"NaN", b"Infinity", b"true", b"null", b"1.5", b" "]
TRICKY = st.sampled_from([*QUOTES_AND_BRACKETS, *BAD_UTF8_BOM_NUL, *NUMBERS_AND_WORDS])


@st.composite
def mangled_records(draw: st.DrawFn) -> bytes:
    """A valid record's JSON with a few bytes cut, replaced or inserted."""
    record = bytearray(orjson.dumps(valid()))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(record)))
        cut = draw(st.integers(0, 3))
        insert = draw(TRICKY | st.binary(min_size=0, max_size=3))
        record[at : at + cut] = insert
    return bytes(record)


@PROPERTY
@given(mangled_records())
def test_mangled_records_never_raise(record: bytes) -> None:
    check_outcome(validate(record, REF))


@PROPERTY
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_never_raise(record: bytes) -> None:
    check_outcome(validate(record, REF))


@PROPERTY
@given(
    st.lists(
        st.tuples(
            mangled_records() | st.just(orjson.dumps(valid())) | st.binary(max_size=300),
            st.integers(REF - 10**10, REF + 10**10),
        ),
        max_size=12,
    )
)
def test_validate_many_gives_each_record_the_verdict_validate_gives_it(
    records: list[tuple[bytes, int]],
) -> None:
    """The Spark jobs' batch form against the record form, each record with its own reference."""
    verdicts = validate_many([r for r, _ in records], [ref for _, ref in records])
    one_by_one = [validate(record, ref) for record, ref in records]
    valid_rows = [i for i, v in enumerate(one_by_one) if isinstance(v, Event)]
    assert verdicts.valid_rows == valid_rows
    assert verdicts.events == [one_by_one[i] for i in valid_rows]
    invalid = [(i, v.reason) for i, v in enumerate(one_by_one) if isinstance(v, Invalid)]
    assert list(zip(verdicts.invalid_rows, verdicts.reasons, strict=True)) == invalid


def test_validate_many_refuses_references_that_do_not_match_the_records() -> None:
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        validate_many([b"{}", b"{}"], [REF])


@PROPERTY
@given(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=5), json_values, max_size=14))
def test_arbitrary_json_objects_never_raise(obj: dict[str, Any]) -> None:
    for record in (obj, orjson.dumps(obj)):
        check_outcome(validate(record, REF))


INVALID_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\xc0\xaf"]


@PROPERTY
@given(st.sampled_from(STRING_FIELDS), st.sampled_from(INVALID_UTF8))
def test_invalid_utf8_anywhere_in_a_string_is_refused(field: str, bad: bytes) -> None:
    value = valid()[field].encode()
    record = orjson.dumps(valid()).replace(b'"' + value + b'"', b'"' + value + bad + b'"', 1)
    (reason,) = validate(record, REF).reasons  # type: ignore[union-attr]
    assert reason.startswith("record: not valid UTF-8 ("), reason


@PROPERTY
@given(st.integers(0, 2 * MAX_NESTING), st.sampled_from([(b"[", b"]"), (b'{"k":', b"}")]))
def test_nesting_is_refused_exactly_past_the_limit(levels: int, pair: tuple[bytes, bytes]) -> None:
    opening, closing = pair
    inner = opening * levels + b"0" + closing * levels
    record = orjson.dumps(valid())[:-1] + b',"extra":' + inner + b"}"
    assume(len(record) <= MAX_RECORD_BYTES)
    result = validate(record, REF)
    if levels + 1 <= MAX_NESTING:  # the record's own object is the first level
        assert isinstance(result, Event), result
    else:
        assert result == Invalid((f"record: JSON nested deeper than {MAX_NESTING} levels",))


# --- valid events survive any way of writing them -------------------------------------------------


@st.composite
def rewritten(draw: st.DrawFn) -> tuple[int, dict[str, Any], bytes]:
    """A valid event, serialised with shuffled keys, any spacing, and maybe every non-ASCII
    character escaped."""
    reference, event = draw(valid_events())
    keys = draw(st.permutations(list(event)))
    unknown_keys = st.text(max_size=6).filter(lambda k: k not in FIELDS)
    extra = draw(st.dictionaries(unknown_keys, json_values, max_size=2))
    ordered = {**{key: event[key] for key in keys}, **extra}
    text = json.dumps(
        ordered,
        ensure_ascii=draw(st.booleans()),
        indent=draw(st.none() | st.integers(0, 3)),
        separators=draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")])),
    )
    return reference, event, text.encode()


@PROPERTY
@given(rewritten())
def test_any_serialisation_of_a_valid_event_validates_to_it(
    case: tuple[int, dict[str, Any], bytes],
) -> None:
    reference, event, record = case
    assume(len(record) <= MAX_RECORD_BYTES)
    result = validate(record, reference)
    assert isinstance(result, Event), result
    assert msgspec.structs.asdict(result) == event
    assert validate(result.to_json(), reference) == result  # and its own JSON round-trips


# --- one wrong value, one reason naming its field ------------------------------------------------

INT64 = st.integers(-(2**63), 2**63 - 1)  # what orjson can write
NOT_STRINGS = (
    st.none()
    | st.booleans()
    | INT64
    | st.floats(allow_nan=False)
    | st.lists(INT64, max_size=2)
    | st.dictionaries(st.text(max_size=3), INT64, max_size=2)
)


def wrong_values(field: str) -> st.SearchStrategy[Any]:
    """Values of a wrong JSON type for ``field``."""
    if field in STRING_FIELDS or field in ENUM_FIELDS:
        return NOT_STRINGS
    if field == "event_time":  # anything but an integer
        return NOT_STRINGS.filter(lambda v: type(v) is not int) | st.text(max_size=12)
    return (NOT_STRINGS | st.text(max_size=3)).filter(lambda v: not (type(v) is int and v == 1))


@st.composite
def one_wrong_field(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    field = draw(st.sampled_from(FIELDS))
    return field, {**valid(), field: draw(wrong_values(field))}


@PROPERTY
@given(one_wrong_field())
def test_a_wrong_type_in_one_field_is_refused_naming_that_field(
    case: tuple[str, dict[str, Any]],
) -> None:
    field, record = case
    for form in (record, orjson.dumps(record), orjson.dumps(record).decode()):
        result = validate(form, REF)
        assert isinstance(result, Invalid), (form, result)
        (reason,) = result.reasons
        assert reason.startswith(f"{field}: "), reason
        assert len(reason) <= MAX_REASON_CHARS, reason


# --- look-alike values: the first invisible character named, on every input form -----------------

LOOK_ALIKE_PROBLEM = "(control, format and invisible characters are not allowed)"


@st.composite
def look_alikes(draw: st.DrawFn) -> tuple[str, str, str]:
    """(field, value, the first invisible character of the value)."""
    field = draw(st.sampled_from(STRING_FIELDS))
    head = draw(st.text(visible_characters, max_size=20))
    char = draw(invisible_characters)
    tail = draw(st.text(max_size=20))  # anything, more invisible characters included
    return field, head + char + tail, char


def named(char: str) -> str:
    """How a reason names ``char``: its code point, then its name or ``<kind>``."""
    return f"U+{ord(char):04X} {unicodedata.name(char, '<')}"


@PROPERTY
@given(look_alikes())
def test_an_invisible_character_is_refused_naming_it_on_every_form(
    case: tuple[str, str, str],
) -> None:
    field, value, char = case
    record = {**valid(), field: value}
    raw = orjson.dumps(record)
    escaped = json.dumps(record, ensure_ascii=True).encode()  # \u escapes only
    for form in (record, raw, raw.decode(), escaped):
        result = validate(form, REF)
        assert isinstance(result, Invalid), (form, result)
        (reason,) = result.reasons
        assert reason.startswith(f"{field}: contains {named(char)}"), (form, reason)
        assert reason.endswith(LOOK_ALIKE_PROBLEM), reason
        assert len(reason) <= MAX_REASON_CHARS, reason


@PROPERTY
@given(st.sampled_from(STRING_FIELDS), st.characters(categories=["Cs"]))
def test_a_lone_surrogate_in_a_mapping_is_refused_naming_it(field: str, char: str) -> None:
    (reason,) = validate({**valid(), field: f"x{char}"}, REF).reasons  # type: ignore[union-attr]
    assert reason == f"{field}: contains U+{ord(char):04X} <surrogate> {LOOK_ALIKE_PROBLEM}"


@PROPERTY
@given(st.sampled_from(STRING_FIELDS), st.text(visible_characters, min_size=1, max_size=40))
def test_visible_text_is_accepted_on_every_form(field: str, value: str) -> None:
    record = {**valid(), field: value}
    raw = orjson.dumps(record)
    for form in (record, raw, raw.decode(), json.dumps(record, ensure_ascii=True).encode()):
        result = validate(form, REF)
        assert isinstance(result, Event), (form, result)
        assert getattr(result, field) == value


# --- repeated keys: the last occurrence wins; each must pass the decoder's checks -----------------

# The decoder checks type, length and allowed values of every occurrence as it reads it; the
# time bounds are checked once, on the value that won.
ANY_TIME = ValidationRules(min_event_time_ms=-(2**63), max_future_skew_ms=2**62)

CANDIDATES = {
    "country": st.sampled_from(["US", "DE", "XX", "us", 7]),
    "event_time": st.sampled_from([REF - 1, REF - 2, "x", 1.5, None, 0]),
    "device_type": st.sampled_from(["mobile", "ctv", "phone", None]),
    "ad_id": st.sampled_from(["a", "b", "", 3, None, "a\u200b", "\u202eb"]),
}


@st.composite
def repeated_keys(draw: st.DrawFn) -> tuple[str, list[Any]]:
    field = draw(st.sampled_from(sorted(CANDIDATES)))
    return field, draw(st.lists(CANDIDATES[field], min_size=2, max_size=3))


@PROPERTY
@given(repeated_keys())
def test_a_repeated_key_takes_the_last_value_and_needs_every_occurrence_valid(
    case: tuple[str, list[Any]],
) -> None:
    field, values = case
    head = b"".join(orjson.dumps({field: v})[1:-1] + b"," for v in values[:-1])
    record = b"{" + head + orjson.dumps({**valid(), field: values[-1]})[1:]
    result = validate(record, REF)
    earlier_ok = all(
        isinstance(validate({**valid(), field: v}, REF, ANY_TIME), Event) for v in values[:-1]
    )
    if earlier_ok and isinstance(validate({**valid(), field: values[-1]}, REF), Event):
        assert isinstance(result, Event), result
        assert getattr(result, field) == values[-1]
    else:
        assert isinstance(result, Invalid), result
        (reason,) = result.reasons
        assert reason.startswith(f"{field}: "), reason
