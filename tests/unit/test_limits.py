"""The limits the API's replicas count together (api/limits), their pure parts: a key's share
counted beyond the gate (refused with a 429 that says so, the gate's place given back), the
leases given back, the setting kept secret, and a store that does not answer refusing with a
503 — never a request served past an uncounted limit."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from alerts.settings import AlertSettings
from api.errors import GateBusyError, LimitsUnavailableError
from api.limits import Lease, LocalLimits, PostgresLimits, open_limits
from api.main import create_app
from api.query_gate import QueryGate
from api.settings import ApiSettings
from infra.broker import free_port
from runtime.kafka_settings import KafkaSettings
from serving_layer.sandbox.backoff import ClientBackoff
from tests.support.api_server import running_app
from tests.support.fake_clock import FakeClock, run_in_virtual_time
from tests.support.lakes import new_lake

TOKEN = "limits-unit-token-0123456789"
PASSWORD = "not-to-be-printed-42"


class ReplicaShares:
    """Shares counted as if by every replica: ``elsewhere`` computations of each client run on
    other replicas; the leases of this one are recorded."""

    what = "ctr"

    def __init__(self, elsewhere: int, *, blocking: bool = False) -> None:
        self.elsewhere = elsewhere
        self.blocking = blocking
        self.held: list[Lease] = []
        self.threads: set[str] = set()

    def take(self, client: str, share: int) -> Lease | None:
        self.threads.add(threading.current_thread().name)
        if self.elsewhere + len(self.held) >= share:
            return None
        lease = Lease(self.what, client, len(self.held) + 1)
        self.held.append(lease)
        return lease

    def give_back(self, lease: Lease) -> None:
        self.threads.add(threading.current_thread().name)
        self.held.remove(lease)


def _gate(shares: ReplicaShares, per_client: int = 2) -> QueryGate:
    return QueryGate(workers=4, per_client=per_client, queue=2, queue_timeout_s=5.0, shares=shares)


def test_a_key_at_its_share_on_other_replicas_is_refused_and_frees_its_place() -> None:
    async def scenario() -> None:
        shares = ReplicaShares(elsewhere=2)
        gate = _gate(shares)
        with pytest.raises(GateBusyError) as refused:
            async with gate.place("key:a"):
                pytest.fail("admitted past the key's share")
        assert str(refused.value) == (
            "this key has 2 queries running across the API's replicas, its share "
            "(API_CTR_WORKERS_PER_KEY); try again when one has answered"
        )
        assert refused.value.retry_after_s == 1
        stats = gate.stats()
        assert (stats.running, stats.waiting, stats.admitted, stats.rejected_busy) == (0, 0, 0, 1)

    run_in_virtual_time(scenario())


def test_a_lease_is_held_while_the_block_runs_and_given_back_after_it() -> None:
    async def scenario() -> None:
        shares = ReplicaShares(elsewhere=1)
        gate = _gate(shares)
        async with gate.place("key:a"):
            assert [lease.client for lease in shares.held] == ["key:a"]
            # The key's second computation would be its third across the replicas.
            with pytest.raises(GateBusyError, match="across the API's replicas"):
                async with gate.place("key:a"):
                    pass
        assert shares.held == []
        with pytest.raises(RuntimeError, match="the computation failed"):
            async with gate.place("key:a"):
                raise RuntimeError("the computation failed")
        assert shares.held == []
        assert gate.stats().running == 0

    run_in_virtual_time(scenario())


def test_a_store_over_the_network_is_asked_from_a_thread_not_the_event_loop() -> None:
    shares = ReplicaShares(elsewhere=0, blocking=True)

    async def scenario() -> None:
        async with _gate(shares).place("key:a"):
            assert len(shares.held) == 1
        assert shares.held == []

    asyncio.run(scenario())
    assert shares.threads
    assert threading.current_thread().name not in shares.threads


def test_in_process_shares_count_each_key_on_its_own() -> None:
    shares = LocalLimits().shares("sql", longest_s=10)
    first = shares.take("key:a", 2)
    second = shares.take("key:a", 2)
    assert first is not None
    assert second is not None
    assert shares.take("key:a", 2) is None
    assert shares.take("key:b", 2) is not None
    shares.give_back(first)
    assert shares.take("key:a", 2) is not None


def test_without_a_limits_url_each_process_counts_its_own() -> None:
    settings = ApiSettings(token=SecretStr(TOKEN))
    assert settings.limits_url is None
    store = open_limits(settings)
    assert isinstance(store, LocalLimits)
    assert not store.shared
    backoffs = store.backoffs(ClientBackoff(first_s=2, max_s=60, forgive_s=60), FakeClock())
    assert backoffs.strike("key:a", 1) == 2.0
    assert backoffs.wait_s("key:a") == 2.0


def test_the_limits_url_is_a_secret_and_must_be_postgresql() -> None:
    url = f"postgresql://api:{PASSWORD}@db.example:5432/ctr"
    settings = ApiSettings(token=SecretStr(TOKEN), limits_url=SecretStr(url))
    assert settings.limits_url is not None
    assert settings.limits_url.get_secret_value() == url
    assert PASSWORD not in repr(settings) + str(settings)
    with pytest.raises(ValidationError, match="API_LIMITS_URL must be a postgresql://") as bad:
        ApiSettings(
            token=SecretStr(TOKEN), limits_url=SecretStr(f"redis://:{PASSWORD}@db.example/0")
        )
    assert PASSWORD not in str(bad.value)


@pytest.fixture
def unreachable() -> Iterator[PostgresLimits]:
    """A store at a port nothing listens on (connections are refused at once)."""
    store = PostgresLimits(
        SecretStr(f"postgresql://api:{PASSWORD}@127.0.0.1:{free_port()}/ctr"), timeout_s=2
    )
    yield store
    store.close()


def test_a_store_that_does_not_answer_refuses_rather_than_lets_through(
    unreachable: PostgresLimits,
) -> None:
    shares = unreachable.shares("ctr", longest_s=10)
    backoffs = unreachable.backoffs(ClientBackoff(), FakeClock())
    for check in (
        lambda: shares.take("key:a", 2),
        lambda: backoffs.wait_s("key:a"),
        lambda: backoffs.strike("key:a", 1),
    ):
        with pytest.raises(LimitsUnavailableError, match=r"\(API_LIMITS_URL\) did not answer") as e:
            check()
        assert PASSWORD not in str(e.value)


def test_the_api_answers_a_503_while_its_limits_store_does_not_answer(
    unreachable: PostgresLimits, tmp_path: Path
) -> None:
    settings = ApiSettings(token=SecretStr(TOKEN), refresh_s=0)
    app = create_app(
        settings,
        new_lake(tmp_path),
        KafkaSettings(),
        alert_settings=AlertSettings(),
        limits=unreachable,
    )
    with (
        running_app(app, settings) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as client,
    ):
        refused = client.post("/api/v1/sql", json={"sql": "SELECT 1"})
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "5"
        detail = refused.json()["detail"]
        assert "(API_LIMITS_URL) did not answer" in detail
        assert "refused until it does" in detail
        assert PASSWORD not in refused.text
        # What counts nothing against a key is served.
        assert client.get("/healthz").status_code == 200
