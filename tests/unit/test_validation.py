"""The event contract, held to :func:`events.model.validate`.

Unit tests pin every field rule, its boundaries and the garbage a Kafka topic can carry; the
property tests hold the two halves of the validator to agreeing: the fast path (msgspec decoding
into :class:`Event`) accepts a record exactly when the reason path (``_reasons``) finds nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.countries import ISO_3166_ALPHA2
from events.model import (
    _INVISIBLE,
    _VISIBLE,
    DEFAULT_RULES,
    DEVICE_TYPES,
    EVENT_TYPES,
    FIELDS,
    MAX_EVENT_ID_CHARS,
    MAX_ID_CHARS,
    MAX_RECORD_BYTES,
    Event,
    Invalid,
    ValidationRules,
    _reasons,
    validate,
)
from tests.support.event_cases import (
    MAX_MS,
    MIN_MS,
    REASON_PREFIX,
    REF,
    invisible,
    json_values,
    valid,
    valid_events,
)

ID_FIELDS = ("impression_id", "ad_id", "campaign_id", "site_id", "user_id")
STRING_FIELDS = ("event_id", *ID_FIELDS)

PROPERTY = settings(
    max_examples=300,
    deadline=None,
    database=None,  # nothing written under the working tree
    suppress_health_check=[HealthCheck.too_slow],
)


def as_bytes(obj: Any) -> bytes:
    return orjson.dumps(obj)


def as_str(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def as_mapping(obj: Any) -> Any:
    return obj


def as_escaped(obj: Any) -> bytes:
    """ASCII JSON: every other character written as an escape (``\\u202e``)."""
    return json.dumps(obj, ensure_ascii=True).encode()


FORMS: list[Any] = [
    pytest.param(as_bytes, id="bytes"),
    pytest.param(as_str, id="str"),
    pytest.param(as_mapping, id="mapping"),
]
ALL_FORMS: list[Any] = [*FORMS, pytest.param(as_escaped, id="escaped")]
Form = Callable[[Any], Any]


def fields_of(event: Event) -> dict[str, Any]:
    return msgspec.structs.asdict(event)


def refused(result: Event | Invalid) -> tuple[str, ...]:
    """The reasons of a result that must be an Invalid."""
    assert isinstance(result, Invalid), f"expected Invalid, got {result!r}"
    assert result.reasons, "an Invalid must carry at least one reason"
    return result.reasons


# --- valid records ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_valid_record_gives_the_event_field_for_field(form: Form) -> None:
    event = validate(form(valid()), REF)
    assert isinstance(event, Event)
    assert fields_of(event) == valid()
    assert event.key == b"imp-0001"


def test_to_json_round_trips_through_validate() -> None:
    event = validate(as_bytes(valid()), REF)
    assert isinstance(event, Event)
    assert orjson.loads(event.to_json()) == valid()
    assert validate(event.to_json(), REF) == event


@pytest.mark.parametrize("form", FORMS)
def test_unknown_fields_are_ignored(form: Form) -> None:
    record = {**valid(), "campaign_name": "spring sale", "extra": {"nested": [1, None, 2.5]}}
    event = validate(form(record), REF)
    assert isinstance(event, Event)
    assert fields_of(event) == valid()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("event_id", "e" * MAX_EVENT_ID_CHARS, id="event_id-64-chars"),
        pytest.param("event_id", "x", id="event_id-1-char"),
        pytest.param("event_id", "é" * MAX_EVENT_ID_CHARS, id="event_id-64-non-ascii-chars"),
        *(pytest.param(name, "i" * MAX_ID_CHARS, id=f"{name}-128-chars") for name in ID_FIELDS),
        pytest.param("ad_id", "😀" * MAX_ID_CHARS, id="ad_id-128-astral-chars"),
        # Visible text of any script, with ASCII spaces (the one space allowed, even at the ends),
        # combining marks, right-to-left letters (no bidi controls) and private-use characters.
        pytest.param("campaign_id", "spring sale 2024", id="campaign_id-ascii-spaces"),
        pytest.param("campaign_id", " cmp-3 ", id="campaign_id-ascii-spaces-at-the-ends"),
        pytest.param("site_id", "bücher.de", id="site_id-latin-1"),
        pytest.param("ad_id", "広告-1", id="ad_id-cjk"),
        pytest.param("user_id", "Jose\u0301", id="user_id-combining-mark"),
        pytest.param("campaign_id", "קמפיין-1", id="campaign_id-hebrew"),
        pytest.param("ad_id", "\ue000", id="ad_id-private-use"),
        pytest.param("ad_id", "👍🏽", id="ad_id-emoji-with-skin-tone"),
        *(pytest.param("event_type", kind, id=f"event_type-{kind}") for kind in EVENT_TYPES),
        *(pytest.param("device_type", kind, id=f"device-{kind}") for kind in DEVICE_TYPES),
        pytest.param("country", "GB", id="country-GB"),
        pytest.param("country", "ZW", id="country-ZW"),
        pytest.param("country", "AX", id="country-AX"),
        pytest.param("event_time", MIN_MS, id="event_time-exactly-min"),
        pytest.param("event_time", MAX_MS, id="event_time-exactly-reference-plus-skew"),
        pytest.param("event_time", REF, id="event_time-exactly-reference"),
    ],
)
@pytest.mark.parametrize("form", ALL_FORMS)
def test_values_at_the_edge_of_the_contract_are_valid(form: Form, field: str, value: Any) -> None:
    record = {**valid(), field: value}
    event = validate(form(record), REF)
    assert isinstance(event, Event), event
    assert fields_of(event) == record


# --- one bad field at a time ------------------------------------------------------------------


def _string_field_cases(name: str, limit: int) -> list[Any]:
    return [
        pytest.param(name, 7, "must be a string, got number", id=f"{name}-int"),
        pytest.param(name, None, "must be a string, got null", id=f"{name}-null"),
        pytest.param(name, True, "must be a string, got boolean", id=f"{name}-bool"),
        pytest.param(name, ["a"], "must be a string, got array", id=f"{name}-array"),
        pytest.param(name, {"a": "b"}, "must be a string, got object", id=f"{name}-object"),
        pytest.param(name, "", "must not be empty", id=f"{name}-empty"),
        pytest.param(
            name,
            "z" * (limit + 1),
            f"{limit + 1} characters exceeds the limit of {limit}",
            id=f"{name}-{limit + 1}-chars",
        ),
    ]


BAD_FIELDS: list[Any] = [
    *_string_field_cases("event_id", MAX_EVENT_ID_CHARS),
    *(case for name in ID_FIELDS for case in _string_field_cases(name, MAX_ID_CHARS)),
    pytest.param("event_type", "conversion", "got 'conversion'", id="event_type-conversion"),
    pytest.param("event_type", "Click", "got 'Click'", id="event_type-wrong-case"),
    pytest.param("event_type", "", "got ''", id="event_type-empty"),
    pytest.param("event_type", 1, "got number 1", id="event_type-int"),
    pytest.param("event_type", None, "got null", id="event_type-null"),
    pytest.param("event_time", str(REF), "must be an integer", id="event_time-string"),
    pytest.param(
        "event_time",
        True,
        "must be an integer (epoch milliseconds), got boolean",
        id="event_time-bool",
    ),
    pytest.param("event_time", float(REF), f"got number {float(REF)}", id="event_time-float"),
    pytest.param("event_time", REF + 0.5, "must be an integer", id="event_time-fractional"),
    pytest.param("event_time", None, "got null", id="event_time-null"),
    pytest.param("event_time", [REF], "got array", id="event_time-array"),
    pytest.param(
        "event_time",
        MIN_MS - 1,
        f"{MIN_MS - 1} is before {MIN_MS} (ancient",
        id="event_time-min-minus-1",
    ),
    pytest.param("event_time", 0, "is before", id="event_time-epoch-zero"),
    pytest.param(
        "event_time", REF // 1000, "ancient or not milliseconds", id="event_time-seconds-not-ms"
    ),
    pytest.param(
        "event_time",
        MAX_MS + 1,
        f"{MAX_MS + 1} is 3600 s in the future",
        id="event_time-reference-plus-skew-plus-1",
    ),
    pytest.param("event_time", REF * 1000, "in the future", id="event_time-microseconds"),
    pytest.param("country", "XX", "got 'XX'", id="country-XX"),
    pytest.param("country", "us", "got 'us'", id="country-lowercase"),
    pytest.param("country", "USA", "got 'USA'", id="country-alpha3"),
    pytest.param("country", "", "got ''", id="country-empty"),
    pytest.param("country", 1, "got number 1", id="country-int"),
    pytest.param("country", None, "got null", id="country-null"),
    pytest.param("device_type", "phone", "got 'phone'", id="device-phone"),
    pytest.param("device_type", "Mobile", "got 'Mobile'", id="device-wrong-case"),
    pytest.param("device_type", None, "got null", id="device-null"),
    pytest.param("schema_version", 2, "must be 1, got number 2", id="schema-2"),
    pytest.param("schema_version", 0, "must be 1, got number 0", id="schema-0"),
    pytest.param("schema_version", "1", "must be 1, got '1'", id="schema-string"),
    pytest.param("schema_version", True, "must be 1, got boolean", id="schema-bool"),
    pytest.param("schema_version", 1.0, "must be 1, got number 1.0", id="schema-float"),
    pytest.param("schema_version", None, "must be 1, got null", id="schema-null"),
]


@pytest.mark.parametrize(("field", "value", "problem"), BAD_FIELDS)
@pytest.mark.parametrize("form", FORMS)
def test_a_bad_field_is_refused_with_its_reason(
    form: Form, field: str, value: Any, problem: str
) -> None:
    reasons = refused(validate(form({**valid(), field: value}), REF))
    assert len(reasons) == 1, reasons
    assert reasons[0].startswith(f"{field}: "), reasons
    assert problem in reasons[0], reasons


def test_country_must_be_an_assigned_alpha2_code() -> None:
    assert len(ISO_3166_ALPHA2) == 249
    assert all(re.fullmatch("[A-Z]{2}", code) for code in ISO_3166_ALPHA2)
    for code in ("US", "DE", "JP", "BR"):
        assert isinstance(validate({**valid(), "country": code}, REF), Event)
    for code in ("XX", "UK", "EU", "ZZ"):  # unassigned or reserved, not in the list
        assert refused(validate({**valid(), "country": code}, REF))[0].startswith("country: ")


def test_long_values_are_shortened_in_the_reason() -> None:
    (reason,) = refused(validate({**valid(), "country": "Q" * 500}, REF))
    assert reason.startswith("country: ")
    assert reason.endswith("...")
    assert len(reason) < 120


# --- look-alike values: control, format and invisible characters ------------------------------

# Each value looks like another (or like nothing) on a screen; the reason names the first such
# character by code point, and its name where it has one.
LOOK_ALIKES: list[Any] = [
    pytest.param("cmp-\u202egnp.exe", "U+202E RIGHT-TO-LEFT OVERRIDE", id="rlo"),  # cmp-exe.png
    pytest.param("cmp-001\u200b", "U+200B ZERO WIDTH SPACE", id="zero-width-space"),
    pytest.param("cmp\t001", "U+0009 <control>", id="tab"),
    pytest.param("cmp-001\n", "U+000A <control>", id="line-feed-at-the-end"),
    pytest.param("cmp\r\n", "U+000D <control>", id="carriage-return"),
    pytest.param("\x00", "U+0000 <control>", id="nul"),
    pytest.param("cmp\x7f", "U+007F <control>", id="delete"),
    pytest.param("cmp\x85", "U+0085 <control>", id="c1-next-line"),
    pytest.param("cmp\xa0001", "U+00A0 NO-BREAK SPACE", id="no-break-space"),
    pytest.param("cmp\u3000001", "U+3000 IDEOGRAPHIC SPACE", id="ideographic-space"),
    pytest.param("cmp-\xad001", "U+00AD SOFT HYPHEN", id="soft-hyphen"),
    pytest.param("\u200ecmp", "U+200E LEFT-TO-RIGHT MARK", id="lrm"),
    pytest.param("cmp\u061c", "U+061C ARABIC LETTER MARK", id="alm"),
    pytest.param("\u2067cmp\u2069", "U+2067 RIGHT-TO-LEFT ISOLATE", id="isolate-first-named"),
    pytest.param("\u202acmp", "U+202A LEFT-TO-RIGHT EMBEDDING", id="embedding"),
    pytest.param("\ufeffcmp", "U+FEFF ZERO WIDTH NO-BREAK SPACE", id="bom"),
    pytest.param("cmp\u2028", "U+2028 LINE SEPARATOR", id="line-separator"),
    pytest.param("cmp\u2060", "U+2060 WORD JOINER", id="word-joiner"),
    pytest.param("a\u200db", "U+200D ZERO WIDTH JOINER", id="zero-width-joiner"),
    pytest.param("❤\ufe0f", "U+FE0F VARIATION SELECTOR-16", id="variation-selector"),
    pytest.param("cmp\u3164", "U+3164 HANGUL FILLER", id="hangul-filler"),
    pytest.param("cmp\u115f", "U+115F HANGUL CHOSEONG FILLER", id="hangul-choseong-filler"),
    pytest.param("cmp\uffa0", "U+FFA0 HALFWIDTH HANGUL FILLER", id="halfwidth-hangul-filler"),
    pytest.param("cmp\U000e0041", "U+E0041 TAG LATIN CAPITAL LETTER A", id="tag"),
    pytest.param("cmp\u2800", "U+2800 BRAILLE PATTERN BLANK", id="braille-blank"),
    pytest.param("cmp\ufdd0", "U+FDD0 <noncharacter>", id="noncharacter"),
    pytest.param("cmp\U0010ffff", "U+10FFFF <noncharacter>", id="astral-noncharacter"),
    pytest.param("cmp\u2065", "U+2065 <unassigned>", id="reserved-default-ignorable"),
]
LOOK_ALIKE_PROBLEM = "(control, format and invisible characters are not allowed)"


@pytest.mark.parametrize(("value", "character"), LOOK_ALIKES)
@pytest.mark.parametrize("form", ALL_FORMS)
def test_a_look_alike_value_is_refused_naming_the_character(
    form: Form, value: str, character: str
) -> None:
    reasons = refused(validate(form({**valid(), "campaign_id": value}), REF))
    assert reasons == (f"campaign_id: contains {character} {LOOK_ALIKE_PROBLEM}",)


@pytest.mark.parametrize("field", STRING_FIELDS)
@pytest.mark.parametrize("form", ALL_FORMS)
def test_every_string_field_refuses_invisible_characters(form: Form, field: str) -> None:
    reasons = refused(validate(form({**valid(), field: "x\u200by"}), REF))
    assert reasons == (f"{field}: contains U+200B ZERO WIDTH SPACE {LOOK_ALIKE_PROBLEM}",)


def test_a_lone_surrogate_in_a_mapping_is_refused() -> None:
    # JSON cannot carry one (the decoders refuse the escape), and a str holding one is refused as
    # text that is not UTF-8; an already decoded object can.
    reasons = refused(validate({**valid(), "user_id": "u\ud800"}, REF))
    assert reasons == (f"user_id: contains U+D800 <surrogate> {LOOK_ALIKE_PROBLEM}",)


@pytest.mark.parametrize("form", ALL_FORMS)
def test_invisible_characters_elsewhere_are_allowed(form: Form) -> None:
    # Unknown fields are ignored, and the enums' own rules already refuse anything else.
    record = {**valid(), "note": "a\u202eb\t\u200b\x00"}
    event = validate(form(record), REF)
    assert isinstance(event, Event), event
    assert fields_of(event) == valid()


def test_escapes_of_visible_characters_are_accepted() -> None:
    # A backslash sends the record to the slower check, which must still accept it.
    record = (
        as_bytes({**valid(), "note": 'say "hi"'})
        .replace(b'"cmp-3"', b'"cmp-\\u0033"')
        .replace(b'"site-9"', b'"site\\/9"')
    )
    assert b"\\" in record
    event = validate(record, REF)
    assert isinstance(event, Event), event
    assert fields_of(event) == {**valid(), "site_id": "site/9"}


@pytest.mark.parametrize("form", ALL_FORMS)
def test_a_look_alike_is_reported_with_every_other_problem(form: Form) -> None:
    record = {
        **valid(),
        "ad_id": "ad\u202e",
        "campaign_id": "\u200b" + "c" * MAX_ID_CHARS,  # too long: one reason per field
        "event_time": MIN_MS - 1,
        "country": "XX",
    }
    reasons = refused(validate(form(record), REF))
    assert [reason.split(":", 1)[0] for reason in reasons] == [
        "ad_id",
        "campaign_id",
        "event_time",
        "country",
    ]
    assert reasons[0] == f"ad_id: contains U+202E RIGHT-TO-LEFT OVERRIDE {LOOK_ALIKE_PROBLEM}"
    assert reasons[1] == f"campaign_id: {MAX_ID_CHARS + 1} characters exceeds the limit of 128"


def test_the_refused_characters_are_exactly_the_rule() -> None:
    """The model's spelled-out character set against the Unicode database
    (tests.support.event_cases), code point by code point, for both of its forms: the search and
    the decoder's pattern."""
    every = "".join(map(chr, range(0x110000)))
    expected = {char for char in every if invisible(char)}
    assert set(_INVISIBLE.findall(every)) == expected
    visible = re.compile(_VISIBLE)
    assert [c for c in every if (visible.search(c) is None) != (c in expected)] == []
    assert visible.search("cmp-001\n") is None  # \Z, not $: no newline at the end slips by


def test_every_refused_character_gets_a_short_reason() -> None:
    for code in range(0x110000):
        char = chr(code)
        if invisible(char):
            (reason,) = _reasons({**valid(), "impression_id": char}, REF, DEFAULT_RULES)
            assert reason.startswith(f"impression_id: contains U+{code:04X} "), reason
            assert len(reason) <= 160, reason


# --- custom rules -----------------------------------------------------------------------------

STRICT = ValidationRules(min_event_time_ms=REF - 1_000, max_future_skew_ms=0)


@pytest.mark.parametrize(
    ("event_time", "problem"),
    [
        pytest.param(REF - 1_000, None, id="exactly-custom-min"),
        pytest.param(REF, None, id="exactly-reference-no-skew"),
        pytest.param(
            REF - 1_001, f"{REF - 1_001} is before {REF - 1_000}", id="custom-min-minus-1"
        ),
        pytest.param(REF + 1, f"{REF + 1} is 0 s in the future", id="reference-plus-1"),
        pytest.param(REF + 5_000, f"{REF + 5_000} is 5 s in the future", id="reference-plus-5s"),
        pytest.param(REF - 60_000, "is before", id="valid-by-default-rules-only"),
    ],
)
@pytest.mark.parametrize("form", FORMS)
def test_custom_rules_move_the_time_bounds(
    form: Form, event_time: int, problem: str | None
) -> None:
    result = validate(form({**valid(), "event_time": event_time}), REF, STRICT)
    if problem is None:
        assert isinstance(result, Event), result
        assert result.event_time == event_time
    else:
        (reason,) = refused(result)
        assert reason.startswith("event_time: ")
        assert problem in reason


def test_the_reference_time_moves_the_future_bound() -> None:
    record = as_bytes({**valid(), "event_time": REF + 2 * 3_600_000})
    assert refused(validate(record, REF))[0].startswith("event_time: ")
    assert isinstance(validate(record, REF + 3_600_000), Event)


# --- garbage ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        pytest.param(b"not json at all", "record: not valid JSON (", id="text"),
        pytest.param("not json at all", "record: not valid JSON (", id="text-str"),
        pytest.param(as_bytes(valid())[:40], "record: not valid JSON (", id="truncated"),
        pytest.param(
            b"{", "record: not valid JSON (unexpected end of data at byte 1)", id="open-brace"
        ),
        pytest.param(b"\xff\xfe\x00garbage", "record: not valid UTF-8 (", id="binary"),
        pytest.param(b"", "record: not valid JSON (", id="empty-bytes"),
        pytest.param("", "record: not valid JSON (", id="empty-str"),
        pytest.param(b"   \n", "record: not valid JSON (", id="whitespace"),
        pytest.param(b"{'event_id': 'e1'}", "record: not valid JSON (", id="python-repr"),
        pytest.param(as_bytes(valid()) + b"}", "record: not valid JSON (", id="trailing-brace"),
        pytest.param(b"NaN", "record: not valid JSON (", id="nan"),
        pytest.param(b"[]", "record: expected a JSON object, got array", id="array"),
        pytest.param(
            as_bytes([valid()]), "record: expected a JSON object, got array", id="event-in-array"
        ),
        pytest.param(b"null", "record: expected a JSON object, got null", id="null"),
        pytest.param(b"42", "record: expected a JSON object, got number", id="number"),
        pytest.param(b"-1.5e3", "record: expected a JSON object, got number", id="float"),
        pytest.param(b'"hello"', "record: expected a JSON object, got string", id="string"),
        pytest.param(b"true", "record: expected a JSON object, got boolean", id="boolean"),
        pytest.param(None, "record: expected a JSON object, got null", id="python-none"),
        pytest.param([valid()], "record: expected a JSON object, got array", id="python-list"),
    ],
)
def test_garbage_is_refused_with_one_record_reason(record: Any, expected: str) -> None:
    (reason,) = refused(validate(record, REF))
    assert reason.startswith(expected), reason


def _padded(total_bytes: int) -> bytes:
    """A valid event whose JSON is exactly ``total_bytes`` long, padded by an unknown field."""
    base = as_bytes({**valid(), "pad": ""})
    record = as_bytes({**valid(), "pad": "p" * (total_bytes - len(base))})
    assert len(record) == total_bytes
    return record


@pytest.mark.parametrize("form", [pytest.param(bytes, id="bytes"), pytest.param(str, id="str")])
def test_record_size_limit_boundary(form: Callable[[bytes], Any]) -> None:
    def as_form(raw: bytes) -> Any:
        return raw if form is bytes else raw.decode()

    assert isinstance(validate(as_form(_padded(MAX_RECORD_BYTES)), REF), Event)
    (reason,) = refused(validate(as_form(_padded(MAX_RECORD_BYTES + 1)), REF))
    assert reason == f"record: {MAX_RECORD_BYTES + 1} bytes exceeds the limit of {MAX_RECORD_BYTES}"


def test_oversize_record_is_refused_before_parsing() -> None:
    record = as_bytes({**valid(), "comment": "c" * 9000})
    (reason,) = refused(validate(record, REF))
    assert reason.startswith("record: ")
    assert f"exceeds the limit of {MAX_RECORD_BYTES}" in reason
    # Size is checked first: an oversize non-JSON blob gets the size reason, not a parse error.
    (reason,) = refused(validate(b"\xff" * 10_000, REF))
    assert reason == f"record: 10000 bytes exceeds the limit of {MAX_RECORD_BYTES}"


def test_oversize_str_record_is_measured_in_utf8_bytes() -> None:
    # 3,000 euro signs are 3,000 characters but 9,000 UTF-8 bytes: the same record is refused as
    # bytes, and the str form of it must be too (MAX_RECORD_BYTES is a byte limit).
    raw = as_bytes({**valid(), "comment": "€" * 3_000})
    text = raw.decode()
    assert len(raw) > MAX_RECORD_BYTES >= len(text)
    assert refused(validate(raw, REF))[0].startswith("record: ")
    reasons = refused(validate(text, REF))
    assert reasons[0].startswith("record: "), reasons
    assert f"exceeds the limit of {MAX_RECORD_BYTES}" in reasons[0]


def test_str_record_that_is_not_utf8_encodable_is_refused_not_raised() -> None:
    # A str holding a lone surrogate (e.g. bytes decoded with errors="surrogateescape") has no
    # UTF-8 form; validate must return an Invalid, never raise.
    record = as_str(valid()).replace("evt-0001", "evt-\udcff")
    reasons = refused(validate(record, REF))
    assert reasons[0].startswith(("record: ", "event_id: ")), reasons


def _with(field: str, raw_value: bytes) -> bytes:
    """The valid record with ``field``'s JSON value replaced by raw bytes."""
    record = as_bytes(valid())
    old = as_bytes({field: valid()[field]})[1:-1]  # "field":value
    assert record.count(old) == 1
    return record.replace(old, old[: len(field) + 3] + raw_value)


def _unknown(raw_value: bytes) -> bytes:
    """The valid record plus an unknown field holding raw bytes."""
    return as_bytes(valid())[:-1] + b',"extra":' + raw_value + b"}"


HOSTILE: list[Any] = [
    pytest.param(
        b'{"event_id":"\xff\xfe"}',
        "record: not valid UTF-8 (invalid start byte at byte 13)",
        id="utf8-in-string",
    ),
    pytest.param(
        _with("event_id", b'"e\xc0\xaf"'), "record: not valid UTF-8 (", id="utf8-overlong"
    ),
    pytest.param(
        _with("ad_id", b'"\xed\xa0\x80"'), "record: not valid UTF-8 (", id="utf8-encoded-surrogate"
    ),
    pytest.param(_unknown(b'"\xff"'), "record: not valid UTF-8 (", id="utf8-in-unknown-field"),
    pytest.param(
        as_bytes(valid())[:-1] + b',"\xff":1}', "record: not valid UTF-8 (", id="utf8-in-key"
    ),
    pytest.param(as_str(valid()).encode("utf-16"), "record: not valid UTF-8 (", id="utf-16"),
    pytest.param(
        b"\xef\xbb\xbf" + as_bytes(valid()),
        "record: not valid JSON (UTF-8 byte order mark",
        id="bom",
    ),
    pytest.param(
        _with("event_id", b'"\\ud800"'),
        "record: not valid JSON (no low surrogate",
        id="escaped-lone-surrogate",
    ),
    pytest.param(b"[" * 1000, "record: JSON nested deeper than 512 levels", id="1000-brackets"),
    pytest.param(
        b"[" * 4000 + b"]" * 4000, "record: JSON nested deeper than 512 levels", id="4000-levels"
    ),
    pytest.param(
        b'{"a":' * 1000 + b"1" + b"}" * 1000,
        "record: JSON nested deeper than 512 levels",
        id="1000-objects",
    ),
    pytest.param(
        _unknown(b"[" * 600 + b"]" * 600),
        "record: JSON nested deeper than 512 levels",
        id="deep-unknown-field",
    ),
    pytest.param(
        _unknown(b'[{"":' * 300 + b"1" + b"}]" * 300),
        "record: JSON nested deeper than 512",
        id="deep-mixed",
    ),
    pytest.param(
        _with("event_time", b"9" * 500),
        "event_time: must be a 64-bit integer (epoch milliseconds), got an integer beyond",
        id="500-digit-time",
    ),
    pytest.param(
        _with("event_time", b"9" * 5000),
        "record: not valid JSON (number is infinity",
        id="5000-digit-time",
    ),
    pytest.param(
        _with("event_time", str(2**63).encode()),
        "event_time: must be a 64-bit integer",
        id="time-2^63",
    ),
    pytest.param(
        _with("event_time", b"-" + b"9" * 30),
        "event_time: must be a 64-bit integer",
        id="time-huge-negative",
    ),
    pytest.param(
        _with("event_time", b"1e400"), "record: not valid JSON (number is infinity", id="time-1e400"
    ),
    pytest.param(
        _with("event_time", b"1.7e12"),
        "event_time: must be an integer (epoch milliseconds), got number",
        id="time-exponent",
    ),
    pytest.param(_with("event_time", b"NaN"), "record: not valid JSON (", id="time-NaN"),
    pytest.param(_with("event_time", b"Infinity"), "record: not valid JSON (", id="time-Infinity"),
    pytest.param(
        _with("event_time", b"-Infinity"), "record: not valid JSON (", id="time-minus-Infinity"
    ),
    pytest.param(
        _with("schema_version", b"-0"),
        "schema_version: must be 1, got number 0",
        id="schema-minus-zero",
    ),
    pytest.param(
        _with("schema_version", b"1e0"),
        "schema_version: must be 1, got number 1.0",
        id="schema-1e0",
    ),
    pytest.param(
        _with("country", b"9" * 500),  # msgspec refuses it, orjson cannot parse it as a double
        "record: not valid JSON (number is infinity when parsed as double",
        id="country-huge-int",
    ),
    pytest.param(
        as_bytes(valid()) * 2,
        "record: not valid JSON (unexpected content after document",
        id="two-documents",
    ),
    pytest.param(b"\x00" * 100, "record: not valid JSON (", id="nul-bytes"),
]


@pytest.mark.parametrize(("record", "expected"), HOSTILE)
def test_hostile_bytes_get_one_short_reason(record: bytes, expected: str) -> None:
    (reason,) = refused(validate(record, REF))
    assert reason.startswith(expected), reason
    assert len(reason) <= 120, reason


@pytest.mark.parametrize(
    "value",
    [pytest.param(10**5000, id="5000-digit-int"), pytest.param(-(10**30), id="huge-negative")],
)
@pytest.mark.parametrize("field", ["event_time", "country", "schema_version", "ad_id"])
def test_huge_python_ints_are_refused_without_printing_them(field: str, value: int) -> None:
    # str() of an int past 4,300 digits raises ValueError; the reason must not try.
    (reason,) = refused(validate({**valid(), field: value}, REF))
    assert reason.startswith(f"{field}: "), reason
    assert len(reason) <= 120, reason


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_in_a_mapping_are_refused(value: float) -> None:
    (reason,) = refused(validate({**valid(), "event_time": value}, REF))
    assert reason.startswith("event_time: must be an integer"), reason


def test_a_deep_python_object_in_an_unknown_field_is_ignored() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    assert isinstance(validate({**valid(), "extra": deep}, REF), Event)


def test_nesting_up_to_the_limit_is_accepted_at_any_stack_depth() -> None:
    # 511 levels inside the record's own object: 512 in all, the limit. The verdict must not
    # depend on how deep the caller's stack is (msgspec recurses per level).
    record = _unknown(b"[" * 511 + b"]" * 511)

    def at_depth(frames: int) -> Event | Invalid:
        return at_depth(frames - 1) if frames else validate(record, REF)

    for frames in (0, 200, 400):
        assert isinstance(at_depth(frames), Event)
    (reason,) = refused(validate(_unknown(b"[" * 512 + b"]" * 512), REF))
    assert reason == "record: JSON nested deeper than 512 levels"


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    record = {**valid(), "extra": "[" * 1000 + '\\"{' * 300}
    assert isinstance(validate(as_bytes(record), REF), Event)


@pytest.mark.parametrize(
    "wrap", [pytest.param(bytearray, id="bytearray"), pytest.param(memoryview, id="memoryview")]
)
def test_bytes_like_records_are_validated_as_bytes(wrap: Callable[[bytes], Any]) -> None:
    event = validate(wrap(as_bytes(valid())), REF)
    assert isinstance(event, Event)
    assert fields_of(event) == valid()
    assert refused(validate(wrap(b"\xff"), REF))[0].startswith("record: not valid UTF-8")


# --- repeated keys: the last occurrence wins, and every occurrence must be valid ---------------


def test_a_repeated_key_takes_its_last_value() -> None:
    record = b'{"country":"DE",' + as_bytes(valid())[1:]
    event = validate(record, REF)
    assert isinstance(event, Event)
    assert event.country == "US"  # valid() says US, and comes last


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        pytest.param(
            b'"country":"XX"',
            "country: a repeated key with an invalid occurrence (Invalid enum value 'XX')",
            id="bad-enum-first",
        ),
        pytest.param(
            b'"event_time":"soon"',
            "event_time: a repeated key with an invalid occurrence (Expected `int`, got `str`)",
            id="bad-type-first",
        ),
    ],
)
def test_an_invalid_earlier_occurrence_of_a_repeated_key_is_refused(
    first: bytes, expected: str
) -> None:
    record = b"{" + first + b"," + as_bytes(valid())[1:]
    assert refused(validate(record, REF)) == (expected,)


def test_an_earlier_occurrence_with_an_invisible_character_is_refused() -> None:
    # A parser that keeps the first occurrence would read the look-alike value.
    record = b'{"campaign_id":"cmp-\\u202e3",' + as_bytes(valid())[1:]
    assert refused(validate(record, REF)) == (
        "campaign_id: a repeated key with an invalid occurrence "
        "(contains a control, format or invisible character)",
    )
    record = as_bytes(valid())[:-1] + b',"campaign_id":"cmp-\\u202e3"}'
    (reason,) = refused(validate(record, REF))
    assert reason.startswith("campaign_id: contains U+202E RIGHT-TO-LEFT OVERRIDE"), reason


def test_an_invalid_last_occurrence_of_a_repeated_key_is_refused() -> None:
    record = as_bytes(valid())[:-1] + b',"country":"XX"}'
    (reason,) = refused(validate(record, REF))
    assert reason.startswith("country: must be an ISO 3166-1 alpha-2 code"), reason


@pytest.mark.parametrize("missing", [pytest.param(name, id=name) for name in FIELDS])
@pytest.mark.parametrize("form", FORMS)
def test_each_field_is_required(form: Form, missing: str) -> None:
    record = {name: value for name, value in valid().items() if name != missing}
    assert refused(validate(form(record), REF)) == (f"record: missing field(s) {missing}",)


@pytest.mark.parametrize("form", FORMS)
def test_missing_fields_are_all_listed_in_contract_order(form: Form) -> None:
    record = {
        name: value
        for name, value in valid().items()
        if name not in {"user_id", "event_type", "country"}
    }
    reasons = refused(validate(form(record), REF))
    assert reasons == ("record: missing field(s) event_type, country, user_id",)


@pytest.mark.parametrize("form", FORMS)
def test_empty_object_lists_every_field(form: Form) -> None:
    reasons = refused(validate(form({}), REF))
    assert reasons == (f"record: missing field(s) {', '.join(FIELDS)}",)


@pytest.mark.parametrize("form", FORMS)
def test_every_problem_is_reported_not_just_the_first(form: Form) -> None:
    record = {
        **valid(),
        "event_id": "",
        "event_type": "conversion",
        "event_time": True,
        "ad_id": "a" * 200,
        "country": "XX",
        "device_type": "phone",
        "schema_version": 2,
    }
    del record["user_id"]
    reasons = refused(validate(form(record), REF))
    assert sorted(reason.split(":", 1)[0] for reason in reasons) == sorted(
        [
            "record",
            "event_id",
            "event_type",
            "event_time",
            "ad_id",
            "country",
            "device_type",
            "schema_version",
        ]
    )
    assert "record: missing field(s) user_id" in reasons
    assert "event_id: must not be empty" in reasons
    assert "ad_id: 200 characters exceeds the limit of 128" in reasons
    assert "event_time: must be an integer (epoch milliseconds), got boolean" in reasons
    assert "schema_version: must be 1, got number 2" in reasons
    assert Invalid(reasons).reason == "; ".join(reasons)


@pytest.mark.parametrize("form", FORMS)
def test_a_bad_time_is_reported_alongside_type_errors(form: Form) -> None:
    record = {**valid(), "event_time": MIN_MS - 1, "country": "us"}
    reasons = refused(validate(form(record), REF))
    assert [reason.split(":", 1)[0] for reason in reasons] == ["event_time", "country"]
    assert "ancient" in reasons[0]


# --- properties -------------------------------------------------------------------------------

# Values that sit on or near a rule, so that replacements are often valid or barely invalid.
near_values = st.sampled_from(
    [
        "",
        "x",
        "e" * MAX_EVENT_ID_CHARS,
        "e" * (MAX_EVENT_ID_CHARS + 1),
        "i" * MAX_ID_CHARS,
        "i" * (MAX_ID_CHARS + 1),
        "impression",
        "click",
        "conversion",
        "US",
        "us",
        "XX",
        "USA",
        "mobile",
        "ctv",
        "phone",
        0,
        1,
        2,
        1.0,
        "1",
        True,
        False,
        MIN_MS,
        MIN_MS - 1,
        MAX_MS,
        MAX_MS + 1,
        float(REF),
        str(REF),
        "cmp-\u202egnp.exe",
        "cmp-001\u200b",
        "a\tb",
        "x\x7f",
        "\ufeffx",
        "i" * (MAX_ID_CHARS - 1) + "\xa0",
        "i" * MAX_ID_CHARS + "\u200b",
    ]
)
field_values = st.one_of(json_values, near_values, st.integers(MIN_MS - 10, MAX_MS + 10))
extra_fields = st.dictionaries(
    st.text(max_size=10).filter(lambda key: key not in FIELDS), json_values, max_size=3
)


def check_agreement(obj: dict[str, Any]) -> None:
    """The fast path accepts exactly what _reasons finds nothing wrong with, on every input form."""
    expected = _reasons(obj, REF, DEFAULT_RULES)
    forms: list[Any] = [obj]
    raw = orjson.dumps(obj)
    if len(raw) <= MAX_RECORD_BYTES:
        forms += [raw, raw.decode()]
    escaped = as_escaped(obj)  # the same strings, through the decoder's escape path
    if len(escaped) <= MAX_RECORD_BYTES:
        forms.append(escaped)
    for record in forms:
        result = validate(record, REF)
        if expected:
            assert isinstance(result, Invalid), (record, expected, result)
            assert result.reasons == expected
        else:
            assert isinstance(result, Event), (record, result)
            assert fields_of(result) == {name: obj[name] for name in FIELDS}


@PROPERTY
@given(replaced=st.dictionaries(st.sampled_from(FIELDS), field_values), extra=extra_fields)
def test_fast_path_and_reasons_agree_on_replaced_values(
    replaced: dict[str, Any], extra: dict[str, Any]
) -> None:
    check_agreement({**valid(), **extra, **replaced})


@PROPERTY
@given(
    dropped=st.sets(st.sampled_from(FIELDS), max_size=3),
    replaced=st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=2),
)
def test_fast_path_and_reasons_agree_when_fields_are_missing(
    dropped: set[str], replaced: dict[str, Any]
) -> None:
    obj = {**valid(), **replaced}
    for name in dropped:
        del obj[name]
    check_agreement(obj)


@PROPERTY
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(record: bytes) -> None:
    result = validate(record, REF)
    if isinstance(result, Invalid):
        assert result.reasons
        assert all(REASON_PREFIX.match(reason) for reason in result.reasons), result.reasons
    else:
        assert isinstance(result, Event)


@PROPERTY
@given(st.text(max_size=300))
def test_arbitrary_text_never_raises(record: str) -> None:
    result = validate(record, REF)
    assert isinstance(result, Event | Invalid)
    if isinstance(result, Invalid):
        assert all(REASON_PREFIX.match(reason) for reason in result.reasons), result.reasons


@PROPERTY
@given(valid_events())
def test_generated_valid_events_validate_to_themselves(case: tuple[int, dict[str, Any]]) -> None:
    reference, record = case
    for form in (as_bytes, as_str, as_mapping):
        event = validate(form(record), reference)
        assert isinstance(event, Event), (form.__name__, event)
        assert fields_of(event) == record
        assert validate(event.to_json(), reference) == event
