"""The speed layer's click attribution, as pure logic on Arrow micro-batches: a click credited
to its open impression once, repeats and orphans counted apart, closed buckets forgotten, and
attributed clicks never above the impressions of their key (a property over random streams,
against a plain reference model)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speed_layer.attribution import BUCKET_MS, EVENTS_SCHEMA, MEASURES, Attribution
from views.columns import DIMENSIONS

HOUR = dt.timedelta(hours=1)
T0 = int(dt.datetime(2026, 11, 25, 10, 0, tzinfo=dt.UTC).timestamp() * 1000)
Key = tuple[int, str]  # (minute after T0, ad)


def ms(minutes: float) -> int:
    return T0 + round(minutes * 60_000)


def batch(*events: tuple[int, str, float, str]) -> pa.Table:
    """(impression id, "impression" | "click", minute after T0, ad) -> a micro-batch's events
    (the other dimensions fixed; the id stands for its 64-bit hash)."""
    fixed = {d: "x" for d in DIMENSIONS}
    return pa.Table.from_pylist(
        [
            {**fixed, "impression": i, "event_type": kind, "event_ms": ms(m), "ad_id": ad}
            for i, kind, m, ad in events
        ],
        schema=EVENTS_SCHEMA,
    )


def counts(increments: pa.Table) -> dict[Key, tuple[int, int, int]]:
    """(minute, ad) -> (attributed, orphan, repeat)."""
    found: dict[Key, tuple[int, int, int]] = {}
    for r in increments.to_pylist():
        minute = (int(r["bucket_start"].timestamp() * 1000) - T0) // 60_000
        key = (minute, r["ad_id"])
        assert key not in found  # one row per key
        found[key] = tuple(r[m] for m in MEASURES)
    return found


def test_a_click_is_credited_to_its_impression_in_the_impressions_bucket() -> None:
    attribution = Attribution(HOUR)
    assert counts(attribution.process(batch((1, "impression", 0.5, "a")), ms(0))) == {}
    got = attribution.process(batch((1, "click", 3.2, "a")), ms(0))
    assert counts(got) == {(0, "a"): (1, 0, 0)}  # minute 0, not the click's minute 3
    assert attribution.impressions == 1


def test_clicks_after_the_first_are_repeats_on_the_impression_within_and_across_batches() -> None:
    attribution = Attribution(HOUR)
    first = attribution.process(
        batch(
            (1, "impression", 0.1, "a"),
            (1, "click", 0.2, "a"),
            (1, "click", 0.3, "a"),
            (2, "impression", 0.4, "a"),
            (2, "click", 1.1, "a"),
        ),
        ms(0),
    )
    assert counts(first) == {(0, "a"): (2, 0, 1)}
    later = attribution.process(batch((1, "click", 2.0, "a"), (2, "click", 2.5, "a")), ms(0))
    assert counts(later) == {(0, "a"): (0, 0, 2)}


def test_a_click_before_its_impression_arrives_is_an_orphan_in_its_own_bucket() -> None:
    attribution = Attribution(HOUR)
    early = attribution.process(batch((7, "click", 1.5, "b")), ms(0))
    assert counts(early) == {(1, "b"): (0, 1, 0)}
    # The impression arrives afterwards: counted, and a later click is attributed to it.
    assert counts(attribution.process(batch((7, "impression", 1.0, "b")), ms(0))) == {}
    assert counts(attribution.process(batch((7, "click", 1.8, "b")), ms(0))) == {
        (1, "b"): (1, 0, 0)
    }


def test_a_click_outside_the_window_after_its_impression_is_an_orphan() -> None:
    attribution = Attribution(dt.timedelta(minutes=2))
    got = attribution.process(
        batch(
            (1, "impression", 5.0, "a"),
            (1, "click", 4.9, "a"),  # before the impression (in event time): not after it
            (1, "click", 7.5, "a"),  # 2.5 minutes after: beyond the window
            (1, "click", 6.9, "a"),  # within it
        ),
        ms(0),
    )
    assert counts(got) == {(4, "a"): (0, 1, 0), (5, "a"): (1, 0, 0), (7, "a"): (0, 1, 0)}


def test_a_click_whose_impressions_bucket_closed_is_an_orphan() -> None:
    attribution = Attribution(HOUR)
    attribution.process(batch((1, "impression", 0.5, "a"), (2, "impression", 1.5, "a")), ms(0))
    # The watermark closed minute 0: its impression is gone, minute 1's is still open.
    got = attribution.process(batch((1, "click", 1.7, "a"), (2, "click", 1.8, "a")), ms(1))
    assert counts(got) == {(1, "a"): (1, 1, 0)}
    assert attribution.impressions == 1


def test_late_events_are_left_out() -> None:
    attribution = Attribution(HOUR)
    attribution.process(batch((1, "impression", 5.5, "a")), ms(5))
    late = batch((2, "impression", 4.5, "a"), (1, "click", 4.9, "a"), (2, "click", 5.6, "a"))
    # The late impression does not enter the state (speed/ctr did not count it), the late
    # click is not counted (speed/late has it): the on-time click of 2 is an orphan.
    assert counts(attribution.process(late, ms(5))) == {(5, "a"): (0, 1, 0)}
    assert attribution.impressions == 1


def test_expiry_bounds_the_state_to_the_open_buckets() -> None:
    attribution = Attribution(HOUR)
    for second in range(0, 30 * 60, 10):  # 30 minutes of batches, 10 s apart
        minute = second / 60
        open_from = max(0, int(minute) - 10)  # a 10-minute watermark
        events = [(second * 100 + n, "impression", minute, "a") for n in range(20)]
        attribution.process(batch(*events), ms(open_from))
    # Minutes 19..29 are open: 6 batches of 20 impressions each.
    assert attribution.impressions == 11 * 6 * 20
    assert 0 < attribution.nbytes < 11 * 6 * 20 * 40
    attribution.expire(ms(30))
    assert attribution.impressions == 0
    assert attribution.nbytes == 0


def test_many_batches_of_one_bucket_keep_the_first_impression_of_an_id() -> None:
    """Chunks of a bucket are merged as they come: the order of arrival is kept (a duplicated
    impression is one impression, its first arrival's key)."""
    attribution = Attribution(HOUR)
    for n in range(20):
        duplicate = (100, "impression", 0.2, "first" if n == 0 else "again")
        attribution.process(batch((n, "impression", 0.1, f"ad{n}"), duplicate), 0)
    clicks = [(n, "click", 0.5, "c") for n in (*range(20), 100, 100)]
    got = attribution.process(batch(*clicks), 0)
    assert counts(got) == {
        **{(0, f"ad{n}"): (1, 0, 0) for n in range(20)},
        (0, "first"): (1, 0, 1),
    }
    assert attribution.impressions == 40


def test_the_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="'window' must be positive"):
        Attribution(dt.timedelta(0))


@dataclass
class _Entry:
    minute: int
    ad: str
    time: int
    clicked: bool = False


def _reference(
    batches: list[tuple[int, list[tuple[int, str, float, str]]]], window_ms: int
) -> list[Counter[tuple[Key, str]]]:
    """The rule as plainly as it can be said: per batch, the increments per (key, measure)."""
    state: dict[int, list[_Entry]] = {}
    out: list[Counter[tuple[Key, str]]] = []
    for open_from, events in batches:
        for i in list(state):
            state[i] = [e for e in state[i] if e.minute >= open_from]
        got: Counter[tuple[Key, str]] = Counter()
        on_time = [e for e in events if int(e[2]) >= open_from]
        for i, kind, minute, ad in on_time:
            if kind == "impression":
                state.setdefault(i, []).append(_Entry(int(minute), ad, ms(minute)))
        for i, kind, minute, ad in on_time:
            if kind != "click":
                continue
            entries = sorted(state.get(i, []), key=lambda e: e.minute)  # stable: arrival
            first = entries[0] if entries else None
            if first is None or not 0 <= ms(minute) - first.time <= window_ms:
                got[((int(minute), ad), "orphan_clicks")] += 1
            elif first.clicked:
                got[((first.minute, first.ad), "repeat_clicks")] += 1
            else:
                first.clicked = True
                got[((first.minute, first.ad), "attributed_clicks")] += 1
        out.append(got)
    return out


_event = st.tuples(
    st.integers(0, 5),
    st.sampled_from(["impression", "click"]),
    st.integers(0, 8 * 60 - 1).map(lambda s: s / 60),  # within minutes 0..7, second steps
    st.sampled_from(["a", "b"]),
)


@settings(max_examples=200, deadline=None)
@given(
    stream=st.lists(
        st.tuples(st.integers(0, 3), st.lists(_event, max_size=12)), min_size=1, max_size=14
    ),
    window_minutes=st.sampled_from([1, 3, 60]),
)
def test_attributed_clicks_never_exceed_the_impressions_of_their_key(
    stream: list[tuple[int, list[tuple[int, str, float, str]]]], window_minutes: int
) -> None:
    window = dt.timedelta(minutes=window_minutes)
    attribution = Attribution(window)
    batches: list[tuple[int, list[tuple[int, str, float, str]]]] = []
    open_from = 0
    for step, events in stream:
        open_from += step if open_from < 6 else 0  # the watermark only moves forward
        batches.append((open_from, events))
    expected = _reference(batches, int(window.total_seconds() * 1000))

    impressions: Counter[Key] = Counter()
    attributed: Counter[Key] = Counter()
    for (open_from, events), wanted in zip(batches, expected, strict=True):
        got: Counter[tuple[Key, str]] = Counter()
        for key, values in counts(attribution.process(batch(*events), ms(open_from))).items():
            assert key[0] >= open_from  # increments land on open buckets only
            for measure, value in zip(MEASURES, values, strict=True):
                got[(key, measure)] += value
        assert +got == wanted
        on_time = [e for e in events if int(e[2]) >= open_from]
        impressions.update((int(m), ad) for _, kind, m, ad in on_time if kind == "impression")
        for (key, measure), value in got.items():
            if measure == "attributed_clicks":
                attributed[key] += value
        clicks = sum(1 for e in on_time if e[1] == "click")
        assert sum(got.values()) == clicks  # every on-time click counted once
    for key, value in attributed.items():
        assert value <= impressions[key]
    assert BUCKET_MS == 60_000


@pytest.mark.parametrize("distinct", [3, 6_100])  # the rows as one number; as rows (too many)
def test_distinct_dimensions_index_every_row(distinct: int) -> None:
    from speed_layer.attribution import _distinct

    n = 2 * distinct
    dims = pa.table(
        {d: [None if i % 97 == 0 else f"{d}-{(i * (k + 1)) % distinct}" for i in range(n)]
         for k, d in enumerate(DIMENSIONS)}
    )  # fmt: skip
    found, index = _distinct(dims)
    rows = dims.to_pylist()
    assert len(set(map(tuple, (r.values() for r in found.to_pylist())))) == found.num_rows
    assert [found.slice(int(i), 1).to_pylist()[0] for i in index] == rows


@given(
    stream=st.lists(
        st.tuples(st.integers(0, 3), st.lists(_event, max_size=12)), min_size=2, max_size=14
    ),
    cut=st.integers(0, 13),
)
@settings(max_examples=60)
def test_a_state_restored_from_its_snapshot_attributes_every_later_click_alike(
    stream: list[tuple[int, list[tuple[int, str, float, str]]]], cut: int
) -> None:
    """A snapshot (issue 67: what a cold start reads instead of every change file since the
    open buckets began) restores the attribution exactly: from then on, the same increments."""
    whole = Attribution(HOUR)
    open_from = 0
    batches = []
    for step, events in stream:
        open_from += step if open_from < 6 else 0
        batches.append((open_from, batch(*events)))
    cut = min(cut, len(batches) - 1)
    for open_from, events in batches[:cut]:
        whole.process(events, ms(open_from))
    restored = Attribution.from_table(whole.to_table(), HOUR)
    assert restored.impressions == whole.impressions
    for open_from, events in batches[cut:]:
        assert counts(restored.process(events, ms(open_from))) == counts(
            whole.process(events, ms(open_from))
        )
