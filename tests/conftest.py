"""One Kafka broker per test session: a local Apache Kafka broker on free ports that requires
SASL/SCRAM logins and authorizes every request by ACLs (the tests log in as its admin), or the
cluster named by KAFKA_BOOTSTRAP_SERVERS. Each test gets topics of its
own. One SparkSession per test session. The dashboard tests' lake, API server and browser page."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from pydantic import SecretStr
from pyspark.sql import SparkSession

from api.settings import ApiSettings
from infra.broker import LocalKafka, scratch_cluster
from infra.browser import CHROMIUM_MISSING, Page, chromium_binary, chromium_page
from infra.hosts import Hosts
from lake.settings import LakeSettings
from runtime.kafka_settings import KafkaSettings
from runtime.object_store import ObjectStoreSettings
from runtime.spark import spark_session
from runtime.spark_settings import SparkSettings
from runtime.topics import delete_topics, ensure_topics
from tests.support.api_server import running_api
from tests.support.dashboard_lake import NOW, TOKEN, Lake
from tests.support.hosts import new_hosts
from tests.support.lakes import new_lake

# The JVMs the tests start (every `ctr` job, Airflow's spark-submit, the tests' own Kafka
# clusters) live seconds to minutes on small data: with the C1 compiler only, they spend less
# CPU compiling than C2's faster code would save them (test_dags, test_s3_lake, test_batch_job:
# 14 % less CPU, 11 % less time; test_broker: 23 % less time). The session's broker and
# SparkSession run the whole session and keep the JVM's defaults (_long_lived), as production
# does. SPARK_SUBMIT_OPTS: the options of every driver JVM spark-submit starts.
_SHORT_LIVED = "-XX:TieredStopAtLevel=1"
_JVM_OPTIONS = ("SPARK_SUBMIT_OPTS", "KAFKA_JVM_OPTIONS")
for _variable in _JVM_OPTIONS:
    os.environ.setdefault(_variable, _SHORT_LIVED)


@contextmanager
def _long_lived() -> Iterator[None]:
    """The JVMs started in the block without the short-lived options above."""
    with pytest.MonkeyPatch.context() as patch:
        for variable in _JVM_OPTIONS:
            if os.environ.get(variable) == _SHORT_LIVED:
                patch.delenv(variable)
        yield


# Airflow's logging setup (imported by the DAG tests) raises py4j's level to INFO; its "closing
# connection" message at interpreter exit then hits a closed stream. Keep py4j to warnings.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def local_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka | None]:
    """The session's local broker (None when KAFKA_BOOTSTRAP_SERVERS names a cluster): SASL/SCRAM
    required and ACLs on, so that every test's clients prove they log in with the credentials
    of their settings."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield None
        return
    with ExitStack() as stack:
        with _long_lived():
            _, cluster = stack.enter_context(
                scratch_cluster(tmp_path_factory.mktemp("run"), auth="scram")
            )
        yield cluster


@pytest.fixture(scope="session")
def kafka(local_kafka: LocalKafka | None) -> KafkaSettings:
    """The session's broker, as its admin (a super user: the tests create and delete topics).
    External: KAFKA_BOOTSTRAP_SERVERS and its KAFKA_SECURITY_PROTOCOL / KAFKA_SASL_* settings."""
    return KafkaSettings() if local_kafka is None else local_kafka.kafka


@pytest.fixture
def topics(kafka: KafkaSettings) -> Iterator[KafkaSettings]:
    """Kafka settings naming a fresh event topic (6 partitions) and dead-letter topic."""
    name = f"ad-events-{uuid.uuid4().hex[:10]}"
    settings = kafka.model_copy(update={"topic": name, "dlq_topic": f"{name}-dlq"})
    ensure_topics(settings)
    yield settings
    delete_topics(settings, [settings.topic, settings.dlq_topic])


@pytest.fixture
def kafka_env(topics: KafkaSettings, tmp_path: Path) -> dict[str, str]:
    """Environment for a `ctr` subprocess that talks to this test's topics."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    env.update(topics.environ())  # the cluster and its credentials
    env.update(
        KAFKA_TOPIC=topics.topic,
        KAFKA_DLQ_TOPIC=topics.dlq_topic,
        RUN_DIR=str(tmp_path / "run"),
    )
    return env


@pytest.fixture(scope="session")
def spark_settings() -> SparkSettings:
    return SparkSettings(master="local[2]", shuffle_partitions=2)


@pytest.fixture(scope="session")
def spark(spark_settings: SparkSettings) -> Iterator[SparkSession]:
    """The test session's one SparkSession (started on first use: ~8 s)."""
    # The store the environment names (the tests' lakes are local: none in use).
    with _long_lived():
        session = spark_session(spark_settings, ObjectStoreSettings())
    yield session
    session.stop()


@pytest.fixture
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    """Test hosts of this test (infra.hosts, tests.support.hosts), stopped after it; the test
    skips, saying why, where they cannot be made (not root)."""
    with new_hosts(tmp_path_factory) as made:
        yield made


@pytest.fixture(scope="session")
def python_archive() -> Path:
    """The packed environment a cluster's executors run (`make python-archive`): built here when
    the code or the dependencies changed since (minutes for new dependencies, seconds for new
    code), else as it is."""
    from infra.python_archive import PythonArchiveSettings, build

    return build(PythonArchiveSettings()).path


@pytest.fixture
def lake(tmp_path: Path) -> LakeSettings:
    return new_lake(tmp_path)


@pytest.fixture
def dashboard_lake(tmp_path: Path) -> Lake:
    return Lake.fresh(tmp_path / "lake")


@pytest.fixture
def dashboard_url(dashboard_lake: Lake) -> Iterator[str]:
    """The real API (``api.main.create_app``) over the dashboard lake, on a loopback port."""
    with running_api(ApiSettings(token=SecretStr(TOKEN)), dashboard_lake.settings) as url:
        yield url


@pytest.fixture
def page(tmp_path: Path) -> Iterator[Page]:
    """A page of a fresh headless Chromium whose documents start at the dashboard lake's
    :data:`~tests.support.dashboard_lake.NOW`; the test fails if the page threw."""
    if chromium_binary() is None:
        pytest.fail(CHROMIUM_MISSING)
    with chromium_page(tmp_path / "chromium") as page:
        page.start_clock_at(NOW)
        yield page
    assert page.exceptions == [], f"the page threw: {page.exceptions}"
