"""The CTR route's admission (api/query_gate.py), pure logic on an event loop: places in
order, a cap per client, a bounded queue, a bounded wait. The loop runs in virtual time
(its clock is the gate's): waits take no real time, whatever the machine's speed."""

from __future__ import annotations

import asyncio

import pytest

from api.errors import GateBusyError
from api.query_gate import QueryGate
from tests.support.fake_clock import run_in_virtual_time


def _gate(**overrides: float) -> QueryGate:
    settings = {"workers": 2, "per_client": 1, "queue": 2, "queue_timeout_s": 5.0, **overrides}
    return QueryGate(
        workers=int(settings["workers"]),
        per_client=int(settings["per_client"]),
        queue=int(settings["queue"]),
        queue_timeout_s=settings["queue_timeout_s"],
    )


async def _settled() -> None:
    """Until every task has run as far as it can (a moment of virtual time)."""
    await asyncio.sleep(0.001)


async def _hold(gate: QueryGate, client: str, release: asyncio.Event, log: list[str]) -> None:
    async with gate.place(client):
        log.append(client)
        await release.wait()


def test_one_client_never_holds_every_place() -> None:
    async def scenario() -> list[str]:
        gate, log = _gate(), list[str]()
        release = asyncio.Event()
        heavy = [asyncio.create_task(_hold(gate, "attacker", release, log)) for _ in range(2)]
        await _settled()
        assert log == ["attacker"]  # the second waits: one place per client
        # Another client gets the free place at once, ahead of the attacker's waiting query.
        async with gate.place("analyst"):
            log.append("analyst")
        assert gate.stats().waiting == 1
        release.set()
        await asyncio.gather(*heavy)
        return log

    assert run_in_virtual_time(scenario()) == ["attacker", "analyst", "attacker"]


def test_a_full_queue_is_busy_at_once() -> None:
    async def scenario() -> None:
        gate, log = _gate(per_client=2, queue=1), list[str]()
        release = asyncio.Event()
        held = [asyncio.create_task(_hold(gate, f"c{n}", release, log)) for n in range(3)]
        await _settled()
        assert (gate.stats().running, gate.stats().waiting) == (2, 1)
        with pytest.raises(GateBusyError, match="too many queries at once"):
            async with gate.place("late"):
                pass
        release.set()
        await asyncio.gather(*held)
        assert gate.stats().rejected_busy == 1
        assert gate.stats().admitted == 3

    run_in_virtual_time(scenario())


def test_a_wait_past_the_timeout_is_busy_and_leaves_the_queue() -> None:
    async def scenario() -> None:
        gate, log = _gate(workers=1, queue_timeout_s=0.05), list[str]()
        release = asyncio.Event()
        held = asyncio.create_task(_hold(gate, "a", release, log))
        await _settled()
        with pytest.raises(GateBusyError, match=r"within 0\.05 s") as raised:
            async with gate.place("b"):
                pass
        assert raised.value.retry_after_s == 1
        assert gate.stats().waiting == 0
        release.set()
        await held
        async with gate.place("b"):  # the place is free again
            pass

    run_in_virtual_time(scenario())


def test_a_client_that_goes_away_gives_its_place_back() -> None:
    async def scenario() -> None:
        gate, log = _gate(workers=1), list[str]()
        release = asyncio.Event()
        first = asyncio.create_task(_hold(gate, "a", release, log))
        waiting = asyncio.create_task(_hold(gate, "b", release, log))
        await _settled()
        waiting.cancel()  # disconnected while queued
        await _settled()
        assert gate.stats().waiting == 0
        first.cancel()  # disconnected while running
        await _settled()
        assert gate.stats().running == 0
        async with gate.place("c"):
            assert gate.stats().running == 1

    run_in_virtual_time(scenario())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"workers": 0}, "'workers' must be >= 1"),
        ({"per_client": 3}, "'per_client' must be within 1..2"),
        ({"queue": -1}, "'queue' must be >= 0"),
        ({"queue_timeout_s": 0}, "'queue_timeout_s' must be > 0"),
    ],
)
def test_bad_arguments(arguments: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _gate(**arguments)


def test_one_client_fills_half_the_queue_at_most() -> None:
    """Issue 55: one key's waiting queries left no place in the queue for another key's."""

    async def scenario() -> None:
        gate, log = _gate(workers=1, per_client=1, queue=4), list[str]()
        release = asyncio.Event()
        held = [asyncio.create_task(_hold(gate, "attacker", release, log)) for _ in range(3)]
        await _settled()
        assert (gate.stats().running, gate.stats().waiting) == (1, 2)
        with pytest.raises(GateBusyError, match="this key has 1 queries running"):
            async with gate.place("attacker"):
                pass
        # Another client still finds a place in the queue, and is served in its turn.
        other = asyncio.create_task(_hold(gate, "analyst", release, log))
        await _settled()
        assert gate.stats().waiting == 3
        release.set()
        await asyncio.gather(*held, other)
        assert log.count("analyst") == 1

    run_in_virtual_time(scenario())
