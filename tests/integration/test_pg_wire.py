"""The views over PostgreSQL's wire protocol (API_PG_PORT), with the clients people use: psql
(Debian's postgresql-client), psycopg 3, SQLAlchemy with pandas, and pgJDBC (DBeaver's, Metabase's
driver). Each connects with a key as password, lists the views through its own catalog queries,
runs a query with a bound parameter and gets the rows POST /api/v1/sql gives; the sandbox's
refusals, the key's scope and its share of the workers hold over the wire as over HTTP."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd  # type: ignore[import-untyped]
import psycopg
import pytest
import sqlalchemy
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import ByteSize, SecretStr

from access.key_store import create_key, revoke_key
from access.roles import Access
from alerts.settings import AlertSettings
from api.main import create_app
from api.settings import ApiSettings
from infra.broker import free_port
from lake.settings import LakeSettings
from runtime.jars import jars
from runtime.kafka_settings import KafkaSettings
from runtime.spark_settings import default_jar_cache
from serving_layer.json_values import jsonable
from serving_layer.sandbox.database import view_names
from tests.support.api_server import running_app
from tests.support.lake_writer import build_sandbox_lake
from tests.support.waiting import wait_until

TOKEN = "pg-wire-token-0123456789"
ROWS_SQL = (
    "SELECT bucket_start, campaign_id, impressions, clicks, "
    "CAST(clicks / impressions AS DECIMAL(10, 4)) AS ctr FROM ctr_batch "
    "WHERE campaign_id = {} ORDER BY bucket_start"
)
ENDLESS = "SELECT max(range % 7) FROM range(1000000000000)"
ANALYST = Access("analyst", "analyst")
PROBE = Path(__file__).resolve().parents[1] / "support" / "pg_jdbc" / "PgJdbcProbe.java"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> LakeSettings:
    return build_sandbox_lake(tmp_path_factory.mktemp("pg-wire"))


@pytest.fixture(scope="module")
def keys(lake: LakeSettings) -> dict[str, str]:
    """An analyst's, a second analyst's, an advertiser's of a campaign with no rows."""
    made = {}
    for name, role, campaigns in (
        ("analyst", "analyst", ()),
        ("other-analyst", "analyst", ()),
        ("advertiser", "advertiser", ("cmp-9",)),
        ("canceller", "analyst", ()),
    ):
        _, made[name] = create_key(lake, name, role, campaigns=campaigns, allow_unknown=True)
    return made


class Server:
    def __init__(self, url: str, pg_port: int, app: Any) -> None:
        self.url = url
        self.pg_port = pg_port
        self.app = app

    def dsn(self, key: str | None = None, **options: str) -> str:
        """A libpq connection string; the key is the password."""
        parts = {"host": "127.0.0.1", "port": str(self.pg_port), "dbname": "ctr", "user": "tester"}
        if key is not None:
            parts["password"] = key
        return " ".join(f"{k}={v}" for k, v in {**parts, **options}.items())

    def http_sql(self, key: str, sql: str) -> httpx.Response:
        """``sql`` over POST /api/v1/sql with ``key``."""
        return httpx.post(
            f"{self.url}/api/v1/sql",
            json={"sql": sql},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )

    def http_rows(self, key: str, sql: str) -> list[list[object]]:
        response = self.http_sql(key, sql)
        assert response.status_code == 200, response.text
        rows: list[list[object]] = response.json()["rows"]
        return rows


def _serve(lake: LakeSettings, **overrides: Any) -> Iterator[Server]:
    pg_port = free_port()
    settings = ApiSettings(
        token=SecretStr(TOKEN),
        **{
            "refresh_s": 0,
            "keys_check_s": 0,
            "key_use_flush_s": 3600,
            "sql_timeout_s": 2,
            "sql_workers": 2,
            "sql_queue": 2,
            "sql_memory_limit": ByteSize(512 * 2**20),
            # A key stopped at the time limit stays backed off for the test's next query,
            # however slow the machine is between the two.
            "sql_backoff_s": 120,
            "sql_max_backoff_s": 120,
            "sql_forgive_s": 600,
            "pg_port": pg_port,
            **overrides,
        },
    )
    app = create_app(settings, lake, KafkaSettings(), alert_settings=AlertSettings())
    with running_app(app, settings) as url:
        yield Server(url, pg_port, app)


@pytest.fixture(scope="module")
def server(lake: LakeSettings, keys: dict[str, str]) -> Iterator[Server]:
    yield from _serve(lake)


def _connect(server: Server, key: str, **options: str) -> psycopg.Connection[Any]:
    return psycopg.connect(server.dsn(key, **options), autocommit=True, connect_timeout=30)


def test_psql_lists_the_views_describes_one_and_queries_it(
    server: Server, keys: dict[str, str]
) -> None:
    psql = shutil.which("psql")
    assert psql is not None, "psql is installed by make test (postgresql's client)"
    result = subprocess.run(
        [
            psql,
            "-X",
            "-A",
            "-t",
            "-F",
            "|",
            server.dsn(),
            "-c",
            "\\dt",
            "-c",
            "\\d ctr_batch",
            "-c",
            ROWS_SQL.format("'cmp-1'"),
            # psql 15 has no \bind: SQL's PREPARE binds the parameter.
            "-c",
            "PREPARE by_campaign(text) AS " + ROWS_SQL.format("$1"),
            "-c",
            "EXECUTE by_campaign('cmp-1')",
            "-c",
            "EXECUTE by_campaign(lower('CMP-1'))",
            "-c",
            "COPY ctr_batch TO '/tmp/out.csv'",
            "-c",
            "SELECT 41 + 1",
        ],
        env={**os.environ, "PGPASSWORD": keys["analyst"], "PGCONNECT_TIMEOUT": "30"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = result.stdout.splitlines()
    listed = {line.split("|")[1] for line in lines if line.startswith("public|")}
    assert listed == set(view_names(ANALYST)), result.stdout
    assert "bucket_start|timestamp with time zone" in "\n".join(lines), result.stdout
    http = server.http_rows(keys["analyst"], ROWS_SQL.format("'cmp-1'"))
    expected = [
        "|".join(_psql_text(value) for value in row) for row in http
    ]  # psql prints PostgreSQL's text of each value
    # The literal query's rows, then the prepared one's with the bound value.
    assert [line for line in lines if line in expected] == expected * 2, result.stdout
    assert "EXECUTE takes constants only, got LOWER('CMP-1')" in result.stderr
    assert "refused: COPY statements are not allowed" in result.stderr
    assert lines[-1] == "42", "the connection goes on after a refused statement"


def _psql_text(value: object) -> str:
    if isinstance(value, str) and value.endswith("Z"):
        return value.replace("T", " ").replace("Z", "+00")
    return str(value)


def test_psycopg_gets_the_rows_of_the_http_api_with_faithful_types(
    server: Server, keys: dict[str, str]
) -> None:
    with _connect(server, keys["analyst"]) as conn:
        listed = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "ORDER BY table_name",
            ("public",),
        ).fetchall()
        assert [name for (name,) in listed] == sorted(view_names(ANALYST))
        cursor = conn.execute(ROWS_SQL.format("%s"), ("cmp-1",))
        rows = cursor.fetchall()
        assert cursor.description is not None
        types = {column.name: column.type_code for column in cursor.description}
        assert types == {
            "bucket_start": 1184,  # timestamptz
            "campaign_id": 25,  # text
            "impressions": 20,  # bigint
            "clicks": 20,
            "ctr": 1700,  # numeric
        }
        assert rows[0][0] == dt.datetime(2026, 11, 22, 10, 0, tzinfo=dt.UTC)
        assert isinstance(rows[0][4], decimal.Decimal)
        http = server.http_rows(keys["analyst"], ROWS_SQL.format("'cmp-1'"))
        assert [[jsonable(v) for v in row] for row in rows] == http
        # A sealed sketch (below admin) is bytea.
        sketch = conn.execute("SELECT reach_sketch FROM ctr_batch LIMIT 1")
        assert sketch.description is not None
        assert sketch.description[0].type_code == 17
        # The same statement prepared once and run with other values (psycopg prepares it on the
        # server after five runs, and keeps sending its parameters in binary).
        for campaign, count in [("cmp-1", 2), ("nobody", 0)] * 4:
            found = conn.execute(
                "SELECT count(*) FROM ctr_batch WHERE campaign_id = %s", (campaign,), prepare=True
            ).fetchone()
            assert found == (count,)


def test_sqlalchemy_lists_the_views_and_pandas_reads_a_query_with_a_parameter(
    server: Server, keys: dict[str, str]
) -> None:
    engine = sqlalchemy.create_engine(
        f"postgresql+psycopg://notebook:{keys['analyst']}@127.0.0.1:{server.pg_port}/ctr"
    )
    try:
        inspector = sqlalchemy.inspect(engine)
        assert sorted(inspector.get_table_names()) == sorted(view_names(ANALYST))
        columns = [c["name"] for c in inspector.get_columns("ctr_batch")]
        assert columns[:4] == ["bucket_start", "campaign_id", "ad_id", "site_id"]
        frame = pd.read_sql(
            sqlalchemy.text(ROWS_SQL.format(":campaign")),
            engine,
            params={"campaign": "cmp-1"},
            coerce_float=False,  # numeric stays Decimal
        )
    finally:
        engine.dispose()
    http = server.http_rows(keys["analyst"], ROWS_SQL.format("'cmp-1'"))
    assert list(frame.columns) == ["bucket_start", "campaign_id", "impressions", "clicks", "ctr"]
    assert [
        [jsonable(v.to_pydatetime() if isinstance(v, pd.Timestamp) else v) for v in row]
        for row in frame.itertuples(index=False)
    ] == http


def test_pgjdbc_lists_the_views_runs_a_prepared_statement_and_survives_a_refusal(
    server: Server, keys: dict[str, str]
) -> None:
    java = shutil.which("java")
    assert java is not None
    driver = jars("pgjdbc", default_jar_cache(os.environ))
    result = subprocess.run(
        [
            java,
            "-cp",
            os.pathsep.join(str(j) for j in driver),
            str(PROBE),
            f"jdbc:postgresql://127.0.0.1:{server.pg_port}/ctr?connectTimeout=30",
            keys["analyst"],
            ROWS_SQL.format("?"),
            "cmp-1",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    facts: dict[str, list[list[str]]] = {}
    for line in result.stdout.splitlines():
        kind, *values = line.split("\t")
        facts.setdefault(kind, []).append(values)
    assert facts["SERVER"] == [["PostgreSQL 16.0 (ctr-lambda)"]]
    assert sorted(name for (name,) in facts["TABLE"]) == sorted(view_names(ANALYST))
    assert facts["COLUMN"][0] == ["bucket_start", "timestamptz"]
    http = server.http_rows(keys["analyst"], ROWS_SQL.format("'cmp-1'"))
    expected = [[_psql_text(v) for v in row] for row in http]
    # Five runs in text, the sixth a named server-side statement in binary (prepareThreshold).
    assert facts["ROW"] == expected * 5
    assert facts["LAST"] == expected
    assert facts["ERROR"][0][0] == "42501"
    assert "refused: DROP statements are not allowed" in facts["ERROR"][0][1]
    assert facts["AFTER"] == [["42"]]


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE ctr_batch",
        "COPY (SELECT 1) TO '/tmp/pg-wire-out.csv'",
        "SELECT * FROM read_csv('/etc/passwd')",
        "ATTACH '/tmp/pg-wire.duckdb' AS other",
        "INSTALL httpfs",
        "SELECT * FROM duckdb_tables()",
        "SELECT * FROM ctr_batch; SELECT * FROM events",
    ],
)
def test_the_sandbox_refuses_over_the_wire_what_it_refuses_over_http(
    server: Server, keys: dict[str, str], sql: str
) -> None:
    response = server.http_sql(keys["analyst"], sql)
    assert response.status_code == 400, response.text
    with _connect(server, keys["analyst"]) as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        assert refused.value.sqlstate is not None
        assert refused.value.sqlstate.startswith(("42", "0A")), refused.value
        # An error, not a disconnect.
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)


def test_a_setting_set_over_the_wire_changes_nothing_in_the_sandbox(
    server: Server, keys: dict[str, str]
) -> None:
    with _connect(server, keys["analyst"]) as conn:
        conn.execute("SET enable_external_access = true")
        assert conn.execute("SHOW enable_external_access").fetchone() == ("true",)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM read_csv('/etc/passwd')")


def test_a_wrong_key_an_advertisers_raw_table_and_a_revoked_key_are_refused(
    server: Server, lake: LakeSettings, keys: dict[str, str]
) -> None:
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        _connect(server, "not-a-key-0123456789")
    metrics = httpx.get(
        f"{server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ).text
    assert 'ctr_api_pg_refused_connections_total{reason="wrong_key"}' in metrics
    assert "ctr_api_pg_open_connections" in metrics
    with _connect(server, keys["advertiser"]) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="events"):
            conn.execute("SELECT * FROM events")
        # Its database holds its campaigns' rows only.
        assert conn.execute("SELECT count(*) FROM ctr_batch").fetchone() == (0,)
        listed = conn.execute("SELECT table_name FROM information_schema.tables").fetchall()
        assert {"events", "rejected", "drift"}.isdisjoint(name for (name,) in listed)
    _, key = create_key(lake, "to-revoke", "analyst")
    with _connect(server, key) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        revoke_key(lake, "to-revoke", reason="test")
        with pytest.raises(psycopg.Error) as revoked:
            conn.execute("SELECT 1")
        assert revoked.value.sqlstate == "28000"
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        _connect(server, key)


def test_one_key_stopped_at_the_time_limit_leaves_the_other_keys_answered(
    server: Server, keys: dict[str, str]
) -> None:
    """The key's share of the workers and its back-off, as over HTTP: an endless query of one
    key holds one worker until the time limit; another key is answered meanwhile; the first is
    stopped (57014) and backed off (53000)."""
    outcome: dict[str, BaseException] = {}

    def endless() -> None:
        with _connect(server, keys["other-analyst"]) as conn:
            try:
                conn.execute(ENDLESS)
            except psycopg.Error as exc:
                outcome["error"] = exc

    hog = threading.Thread(target=endless)
    hog.start()
    pool = server.app.state.sql_pool
    wait_until(lambda: bool(pool.query_pids()), timeout_s=60, what="the endless query runs")
    with _connect(server, keys["analyst"]) as conn:
        assert conn.execute("SELECT count(*) FROM ctr_batch").fetchone() == (2,)
    hog.join(timeout=60)
    error = outcome["error"]
    assert isinstance(error, psycopg.Error)
    assert error.sqlstate == "57014", error
    with _connect(server, keys["other-analyst"]) as conn:
        with pytest.raises(psycopg.Error) as backed_off:
            conn.execute("SELECT 1")
        assert backed_off.value.sqlstate == "53000"
        assert "refused for" in str(backed_off.value)


def test_a_cancel_request_ends_the_clients_wait(server: Server, keys: dict[str, str]) -> None:
    """psql's Ctrl-C: the client's wait ends (57014); the worker runs on to its time limit."""
    with _connect(server, keys["canceller"]) as conn:
        pool = server.app.state.sql_pool

        def cancel_once_it_runs() -> None:
            wait_until(lambda: bool(pool.query_pids()), timeout_s=60, what="the query runs")
            conn.cancel_safe()

        running = threading.Thread(target=cancel_once_it_runs)
        running.start()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute(ENDLESS)
        running.join(timeout=60)


def _certificate(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "server.crt", directory / "server.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_server(
    lake: LakeSettings, keys: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    cert, key = _certificate(tmp_path_factory.mktemp("pg-tls"))
    yield from _serve(
        lake,
        pg_tls_cert=str(cert),
        pg_tls_key=str(key),
        pg_tls_required=True,
        pg_max_connections_per_client=2,
        sql_max_rows=1,
        header_timeout_s=1,
        pg_max_message_bytes=ByteSize(4096),
    )


def test_tls_when_required_plain_text_refused_before_the_password(
    tls_server: Server, keys: dict[str, str]
) -> None:
    with _connect(tls_server, keys["analyst"], sslmode="require") as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
    with pytest.raises(psycopg.OperationalError, match="accepts TLS connections only"):
        _connect(tls_server, keys["analyst"], sslmode="disable")


def test_an_answer_cut_at_the_row_limit_says_so_and_connections_are_capped(
    tls_server: Server, keys: dict[str, str]
) -> None:
    notices: list[str] = []
    with _connect(tls_server, keys["analyst"], sslmode="require") as first:
        first.add_notice_handler(lambda notice: notices.append(str(notice.message_primary)))
        rows = first.execute("SELECT * FROM ctr_batch ORDER BY bucket_start").fetchall()
        assert len(rows) == 1
        assert notices == ["the answer was cut off at 1 rows (API_SQL_MAX_ROWS): 1 rows sent"]
        with (
            _connect(tls_server, keys["analyst"], sslmode="require"),
            pytest.raises(psycopg.OperationalError, match="too many connections from"),
        ):
            _connect(tls_server, keys["other-analyst"], sslmode="require")


def test_a_client_that_never_starts_is_disconnected_at_the_start_up_deadline(
    tls_server: Server,
) -> None:
    """A connection that sends nothing holds no place past API_HEADER_TIMEOUT_S (1 s here)."""
    with socket.create_connection(("127.0.0.1", tls_server.pg_port), timeout=60) as idle:
        assert idle.recv(1) == b"", "the server closes it"
    metrics = httpx.get(
        f"{tls_server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ).text
    assert 'ctr_api_pg_refused_connections_total{reason="startup_timeout"}' in metrics


def test_a_message_over_the_limit_ends_the_connection_before_it_is_read(
    tls_server: Server, keys: dict[str, str]
) -> None:
    huge = (
        "SELECT count(*) FROM ctr_batch WHERE campaign_id IN ("
        + ", ".join(f"'cmp-{i:05d}'" for i in range(1000))
        + ")"
    )
    with _connect(tls_server, keys["analyst"], sslmode="require") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.OperationalError, match="over API_PG_MAX_MESSAGE_BYTES"):
            conn.execute(huge)
