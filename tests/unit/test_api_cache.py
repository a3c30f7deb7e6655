"""The response cache: hits per snapshot version, single flight, stale answers within bounds."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from api.response_cache import ResponseCache
from tests.support.fake_clock import FakeClock
from tests.support.waiting import wait_until


def test_hit_per_version_and_recompute_on_a_new_one() -> None:
    cache = ResponseCache[bytes](8)
    assert cache.get("q", 1, lambda: b"one") == b"one"
    assert cache.get("q", 1, lambda: b"other") == b"one"
    assert cache.get("q", 2, lambda: b"two") == b"two"
    assert (cache.hits, cache.misses) == (1, 2)


def test_concurrent_misses_compute_once() -> None:
    cache = ResponseCache[bytes](8)
    calls = 0
    gate = threading.Event()

    def compute() -> bytes:
        nonlocal calls
        calls += 1
        gate.wait(60)
        return b"body"

    results: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get("q", 1, compute)))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    wait_until(
        lambda: cache.hits == 7,
        timeout_s=60,
        what="seven requests wait for the first one's computation",
    )
    gate.set()
    for thread in threads:
        thread.join()
    assert (calls, results) == (1, [b"body"] * 8)


def test_stale_answer_while_the_new_version_is_computed() -> None:
    cache = ResponseCache[bytes](8, max_stale_s=60)
    cache.get("q", 1, lambda: b"v1")
    gate = threading.Event()

    def slow() -> bytes:
        gate.wait(60)
        return b"v2"

    assert cache.get("q", 2, slow) == b"v1"
    gate.set()
    wait_until(
        lambda: cache.get("q", 2, slow) == b"v2",
        timeout_s=60,
        what="the background computation answers",
    )
    cache.close()


def test_no_stale_answer_beyond_the_bound() -> None:
    cache = ResponseCache[bytes](8, max_stale_s=0)
    cache.get("q", 1, lambda: b"v1")
    assert cache.get("q", 2, lambda: b"v2") == b"v2"


def test_errors_reach_the_caller_and_are_not_cached() -> None:
    cache = ResponseCache[bytes](8)

    def fail() -> bytes:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        cache.get("q", 1, fail)
    assert cache.get("q", 1, lambda: b"ok") == b"ok"


def test_bounded() -> None:
    cache = ResponseCache[bytes](2)
    for key in ("a", "b", "c"):
        cache.get(key, 1, key.encode)
    assert cache.get("a", 1, lambda: b"recomputed") == b"recomputed"


def test_peek_answers_from_the_cache_and_never_computes_on_the_caller() -> None:
    cache = ResponseCache[bytes](8, max_stale_s=60)

    def must_not_run() -> bytes:
        raise AssertionError("peek computed on the caller's thread")

    assert cache.peek("q", 1, must_not_run) is None  # a miss: the caller goes to get()
    assert cache.get("q", 1, lambda: b"v1") == b"v1"
    assert cache.peek("q", 1, must_not_run) == b"v1"
    gate = threading.Event()

    def refresh() -> bytes:
        gate.wait(60)
        return b"v2"

    assert cache.peek("q", 2, refresh) == b"v1"  # stale, while the background computes v2
    gate.set()
    wait_until(
        lambda: cache.peek("q", 2, must_not_run) == b"v2",
        timeout_s=60,
        what="the background computation answers",
    )
    cache.close()
    assert ResponseCache[bytes](0).peek("q", 1, must_not_run) is None  # caching off


def test_bounded_in_bytes() -> None:
    cache = ResponseCache[bytes](100, max_bytes=8000)
    for key in "abcdefghij":  # ten answers of 900 bytes: 9,000 bytes, over the bound
        cache.get(key, 1, lambda: b"x" * 900)
    assert cache.bytes <= 8000
    assert cache.get("a", 1, lambda: b"recomputed") == b"recomputed"  # the oldest went first
    assert cache.get("j", 1, lambda: b"recomputed") == b"x" * 900
    # An answer over an eighth of the bound is answered, not kept.
    assert cache.get("huge", 1, lambda: b"h" * 1001) == b"h" * 1001
    assert cache.get("huge", 1, lambda: b"again") == b"again"
    assert cache.bytes <= 8000


def test_a_new_version_replaces_its_entrys_bytes() -> None:
    cache = ResponseCache[bytes](100, max_bytes=8000)
    cache.get("q", 1, lambda: b"x" * 500)
    cache.get("q", 2, lambda: b"y" * 300)
    assert cache.bytes == 300
    with pytest.raises(ValueError, match="'max_bytes' must be >= 0"):
        ResponseCache[bytes](1, max_bytes=-1)


def test_one_claim_owns_a_computation_and_the_others_wait_for_it() -> None:
    cache = ResponseCache[bytes](8)
    future, owner = cache.claim("q", 1)
    again, second = cache.claim("q", 1)
    assert (owner, second, again is future) == (True, False, True)
    cache.fill("q", 1, lambda: b"body", future)
    assert future.result(timeout=1) == b"body"
    assert cache.get("q", 1, lambda: b"other") == b"body"  # cached
    # An abandoned claim hands its error to the waiters and frees the key.
    future, owner = cache.claim("r", 1)
    cache.abandon("r", 1, future, RuntimeError("busy"))
    with pytest.raises(RuntimeError, match="busy"):
        future.result(timeout=1)
    assert cache.claim("r", 1)[1] is True


def wait_for(cache: ResponseCache[bytes], key: str, version: int, body: bytes) -> None:
    wait_until(
        lambda: (
            cache.peek(key, version, lambda: pytest.fail("computed on the request path")) == body
        ),
        timeout_s=60,
        what=f"{key} at v{version} becomes {body!r}",
    )


def test_refresh_ahead_recomputes_the_answers_being_read_for_the_new_snapshot() -> None:
    cache = ResponseCache[bytes](8, max_stale_s=60)
    ahead = {"q": lambda snap: b"q@" + snap, "r": lambda snap: b"r@" + snap}
    for key in ("q", "r"):
        cache.get(key, 1, lambda key=key: ahead[key](b"1"))  # type: ignore[misc]
        cache.peek(key, 1, lambda: pytest.fail("cached"), ahead=ahead[key])
    cache.get("plain", 1, lambda: b"plain@1")  # read without an ahead computation

    assert cache.refresh_ahead(2, b"2") == 2
    wait_for(cache, "q", 2, b"q@2")
    wait_for(cache, "r", 2, b"r@2")
    assert cache.ahead_refreshes == 2
    # Already current: nothing to do again.
    assert cache.refresh_ahead(2, b"2") == 0


def test_refresh_ahead_skips_answers_nobody_read_lately() -> None:
    clock = FakeClock()
    cache = ResponseCache[bytes](8, max_stale_s=60, ahead_s=0.05, clock=clock)
    cache.get("q", 1, lambda: b"q@1")
    cache.peek("q", 1, lambda: pytest.fail("cached"), ahead=lambda snap: b"q@" + snap)
    clock.now += 0.1
    assert cache.refresh_ahead(2, b"2") == 0


def test_refresh_ahead_spends_at_most_its_budget_cheapest_first() -> None:
    clock = FakeClock()
    cache = ResponseCache[bytes](8, max_stale_s=60, ahead_budget_s=0.1, clock=clock)

    def costly(seconds: float, body: bytes) -> bytes:
        clock.now += seconds  # what computing it took
        return body

    cache.get("cheap", 1, lambda: costly(0.0, b"cheap@1"))
    cache.get("dear", 1, lambda: costly(0.2, b"dear@1"))  # over the budget alone

    def named(key: str) -> Callable[[bytes], bytes]:
        return lambda snap: key.encode()

    for key in ("dear", "cheap"):
        cache.peek(key, 1, lambda: pytest.fail("cached"), ahead=named(key))
    assert cache.refresh_ahead(2, b"2") == 1
    wait_for(cache, "cheap", 2, b"cheap")
    # The costly one is served stale (within max_stale_s) and recomputed when read.
    assert cache.peek("dear", 2, lambda: b"dear@2") == b"dear@1"


class TooLargeError(ValueError):
    """A refusal of the kind the CTR route remembers."""


def test_a_refusal_holds_for_its_snapshot_and_a_while_after() -> None:
    clock = FakeClock(100.0)
    cache = ResponseCache[bytes](
        8,
        refusal_s=60.0,
        refused=lambda error: isinstance(error, TooLargeError),
        clock=clock,
    )
    calls = 0

    def refused() -> bytes:
        nonlocal calls
        calls += 1
        raise TooLargeError("over the byte cap")

    with pytest.raises(TooLargeError):
        cache.get("q", 1, refused)
    for version in (1, 2, 3):  # its snapshot, and later ones within refusal_s
        with pytest.raises(TooLargeError, match="over the byte cap"):
            cache.peek("q", version, refused)
    assert (calls, cache.refusal_hits) == (1, 3)
    clock.now += 61.0
    with pytest.raises(TooLargeError):
        cache.peek("q", 1, refused)  # its own snapshot's answer does not change
    assert cache.peek("q", 4, refused) is None  # a minute later: forgotten, computed again
    assert calls == 1


def test_other_errors_are_not_remembered() -> None:
    cache = ResponseCache[bytes](8, refusal_s=60.0, refused=lambda e: isinstance(e, TooLargeError))

    def broken() -> bytes:
        raise RuntimeError("the lake is unreadable")

    with pytest.raises(RuntimeError):
        cache.get("q", 1, broken)
    assert cache.peek("q", 1, broken) is None
    assert cache.get("q", 1, lambda: b"fine") == b"fine"
