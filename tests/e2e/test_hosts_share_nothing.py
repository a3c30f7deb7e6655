"""Hosts that share nothing (issue 67): the speed job and the archiver run on a Spark standalone
cluster whose workers are bare test hosts (Spark and Python only), their drivers on hosts of
their own; each driver is SIGKILLed and started again on a fresh host, with clicks arriving
for impressions from before the kill. Their checkpoints, the attribution state and the speed
job's status are on the object store (the local S3 server), the only thing the hosts share with
Kafka: counts exact, every click attributed, every record archived once. An API and the alerts
runner's reader on hosts of their own report the speed job's freshness. (infra.hosts: a host
is a mount namespace with its own /tmp and working folder; the test's tmp folders are out of
its sight.)"""

from __future__ import annotations

import datetime as dt
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infra.broker import free_port
from infra.hosts import Host, HostProcess, Hosts
from infra.s3 import LocalS3, LocalS3Settings, free_base_port
from lake.checkpoints import Checkpoint
from lake.settings import LakeSettings
from lake.speed_status import read_status
from lake.storage import open_delta
from runtime.kafka_settings import KafkaSettings
from runtime.object_store import ObjectStoreSettings
from runtime.topics import delete_topics, ensure_topics
from speed_layer.tables import sum_per_key
from tests.support.events import send
from tests.support.events import wire_event as event
from tests.support.hosts import SparkCluster, new_hosts, spark_cluster
from tests.support.waiting import wait_until

T0 = dt.datetime(2026, 11, 29, 9, 0, tzinfo=dt.UTC)
IMPRESSIONS = 600  # before the kill
CLICKED_BEFORE = 100  # of those, clicked before the kill
CLICKED_AFTER = 200  # of those, clicked after the kill (their state must survive the move)
NEW = 50  # impressions after the kill, each clicked
TOKEN = "hosts-test-token-0123456789"


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def impression(n: int) -> dict[str, object]:
    return event(f"imp-{n}", "impression", at(n * 0.5), ad=f"ad-{n % 4}")


def click(n: int, *, suffix: str = "") -> dict[str, object]:
    """The click on impression ``n``: its impression's id and dimensions, 20 s after it."""
    return event(
        f"clk-{n}{suffix}", "click", at(n * 0.5 + 20), ad=f"ad-{n % 4}", impression_id=f"i-imp-{n}"
    )


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    run_dir = tmp_path_factory.mktemp("s3-run")
    store = LocalS3(LocalS3Settings(run_dir=run_dir, port=free_base_port(), bucket="shared"))
    assert store.start()
    try:
        yield store
    finally:
        store.stop(discard=True)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    with new_hosts(tmp_path_factory) as made:
        yield made


@pytest.fixture(scope="module")
def cluster(hosts: Hosts) -> SparkCluster:
    """Two workers of one core each on bare hosts: the two jobs' executors, one each."""
    return spark_cluster(hosts, workers=2, bare=True)


class Site:
    """What every host is given: Kafka, the lake and its checkpoints on the object store, the
    cluster and the environment jobs ship to it."""

    def __init__(
        self, topics: KafkaSettings, s3: LocalS3, cluster: SparkCluster, archive: Path
    ) -> None:
        self.topics = topics
        prefix = f"s3://shared/site-{uuid.uuid4().hex[:8]}"
        self.store = ObjectStoreSettings.model_validate(s3.environment())
        self.lake = LakeSettings(
            lake_root=f"{prefix}/lake", checkpoint_root=f"{prefix}/checkpoints",
            object_store=self.store,
        )  # fmt: skip
        self.env = {
            **topics.environ(),
            "KAFKA_TOPIC": topics.topic,
            "KAFKA_DLQ_TOPIC": topics.dlq_topic,
            **self.store.environment(),
            "LAKE_ROOT": str(self.lake.lake_root),
            "CHECKPOINT_ROOT": str(self.lake.checkpoint_root),
            "SPARK_MASTER": cluster.url,
            "SPARK_PYTHON_ARCHIVE": str(archive),
            "PYSPARK_PYTHON": sys.executable,
            # One executor of one core each: both jobs run at once on the two workers.
            "SPARK_CONF": json.dumps({"spark.cores.max": "1", "spark.executor.memory": "1g"}),
            "SPARK_SHUFFLE_PARTITIONS": "2",
            "SPEED_TRIGGER_SECONDS": "1",
            "ARCHIVER_TRIGGER_SECONDS": "1",
        }

    def start(self, host: Host, name: str, *args: str) -> HostProcess:
        return host.start(name, [str(host.venv_command("ctr")), *args], env=self.env)


def _ended(process: HostProcess, timeout_s: float) -> None:
    wait_until(lambda: not process.alive(), timeout_s=timeout_s, what=f"{process.name} ended")
    assert process.popen.returncode == 0, process.output()[-5000:]


@pytest.fixture(scope="module")
def site(
    kafka: KafkaSettings, s3: LocalS3, cluster: SparkCluster, python_archive: Path
) -> Iterator[Site]:
    name = f"ad-events-hosts-{uuid.uuid4().hex[:8]}"
    topics = kafka.model_copy(update={"topic": name, "dlq_topic": f"{name}-dlq"})
    ensure_topics(topics)
    yield Site(topics, s3, cluster, python_archive)
    delete_topics(topics, [topics.topic, topics.dlq_topic])


@pytest.fixture(scope="module")
def moved(site: Site, hosts: Hosts) -> Site:
    """The speed job and the archiver read what was sent, their drivers' hosts are lost
    (SIGKILL), more is sent (clicks on impressions from before), and both end their work on
    fresh hosts."""
    lake, topics = site.lake, site.topics
    send(
        topics,
        *(impression(n) for n in range(IMPRESSIONS)),
        *(click(n) for n in range(CLICKED_BEFORE)),
    )
    speed = site.start(hosts.host("speed-driver-1"), "speed", "speed")
    archiver = site.start(hosts.host("archiver-driver-1"), "archive", "archive")
    for job, name in ((speed, "speed"), (archiver, "archiver")):
        checkpoint = Checkpoint(lake.checkpoint(name), lake.object_store)

        def done(c: Checkpoint = checkpoint, j: HostProcess = job) -> bool:
            return _read(c, topics.topic) >= IMPRESSIONS + CLICKED_BEFORE or not j.alive()

        wait_until(
            done,
            timeout_s=400,
            what=f"{job.name} read what was sent before the kill",
            poll_s=1,
        )
        assert job.alive(), job.output()[-5000:]
    # The drivers' hosts are lost (SIGKILL: nothing flushed, nothing said); their executors
    # on the workers go with them.
    speed.kill()
    archiver.kill()
    send(
        topics,
        *(click(n) for n in range(CLICKED_BEFORE, CLICKED_BEFORE + CLICKED_AFTER)),
        click(5, suffix="-again"),  # a second click on an impression clicked before: a repeat
        *(impression(n) for n in range(IMPRESSIONS, IMPRESSIONS + NEW)),
        *(click(n) for n in range(IMPRESSIONS, IMPRESSIONS + NEW)),
    )
    # Fresh hosts: nothing of the first drivers' disks, the checkpoints on the store only.
    speed = site.start(hosts.host("speed-driver-2"), "speed", "speed", "--available-now")
    archiver = site.start(hosts.host("archiver-driver-2"), "archive", "archive", "--available-now")
    _ended(speed, 400)
    _ended(archiver, 400)
    return site


def _read(checkpoint: Checkpoint, topic: str) -> int:
    if not checkpoint.exists():
        return 0
    return sum(checkpoint.committed_offsets(topic).values())


CLICKS = CLICKED_BEFORE + CLICKED_AFTER + 1 + NEW


@pytest.mark.timeout(900)
def test_the_speed_job_moves_hosts_and_counts_and_attributes_every_event(
    moved: Site, hosts: Hosts
) -> None:
    lake = moved.lake
    counts = sum_per_key(open_delta(lake.table("speed/ctr"), lake.object_store).to_pyarrow_table())
    total = {
        name: sum(counts.column(name).to_pylist())
        for name in ("impressions", "clicks", "attributed_clicks", "repeat_clicks", "orphan_clicks")
    }
    assert total["impressions"] == IMPRESSIONS + NEW
    assert total["clicks"] == CLICKS
    attributed = CLICKED_BEFORE + CLICKED_AFTER + NEW  # each clicked impression once
    # Within 1 % of the truth (the issue's bound): here every one, the state on the store.
    assert abs(total["attributed_clicks"] - attributed) <= 0.01 * attributed, total
    assert total["attributed_clicks"] == attributed, total
    assert (total["repeat_clicks"], total["orphan_clicks"]) == (1, 0)
    # The attribution's state is under the checkpoint on the store; nothing of it on a
    # driver's or a worker's disk.
    for host in hosts.hosts.values():
        assert not list(host.outside("/home/ctr").glob("**/attribution")), host.name


@pytest.mark.timeout(900)
def test_the_archiver_moves_hosts_and_archives_every_record_once(moved: Site) -> None:
    lake = moved.lake
    events = open_delta(lake.table("master/events"), lake.object_store).to_pyarrow_table(
        columns=["kafka_partition", "kafka_offset"]
    )
    coordinates = set(
        zip(events["kafka_partition"].to_pylist(), events["kafka_offset"].to_pylist(), strict=True)
    )
    assert events.num_rows == len(coordinates) == IMPRESSIONS + NEW + CLICKS


@pytest.mark.timeout(900)
def test_an_api_and_the_alerts_runner_on_other_hosts_see_the_speed_jobs_report(
    moved: Site, hosts: Hosts
) -> None:
    """What a local status file never showed a process on another host."""
    final = read_status(moved.lake)
    assert final is not None
    assert final.batch_id is not None
    port = free_port()
    api_host = hosts.host("api")
    api = api_host.start(
        "api",
        [str(api_host.venv_command("ctr")), "serve", "--host", api_host.address,
         "--port", str(port)],
        env={**moved.env, "API_TOKEN": TOKEN, "API_REFRESH_S": "0"},
    )  # fmt: skip
    url = f"http://{api_host.address}:{port}"

    def answered() -> bool:
        assert api.alive(), api.output()[-3000:]
        try:
            return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(answered, timeout_s=180, what="the API on its host answers", poll_s=0.5)
    answer = httpx.get(
        f"{url}/api/v1/ctr",
        params={"granularity": "all", "start": "2026-11-29T09:00:00Z",
                "end": "2026-11-29T10:00:00Z"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    freshness = answer.json()["freshness"]
    assert freshness["speed_updated_at"] is not None
    assert dt.datetime.fromisoformat(freshness["speed_updated_at"]) == final.updated_at
    probe = (
        "from alerts.lake_counts import LakeCounts\n"
        "from lake.settings import LakeSettings\n"
        "from serving_layer.reader import SnapshotReader\n"
        "reader = SnapshotReader(LakeSettings(), refresh_s=0)\n"
        "status = LakeCounts(reader).snapshot.status\n"
        "print('status', None if status is None else status.batch_id)\n"
        "reader.close()\n"
    )
    alerts_host = hosts.host("alerts")
    seen = alerts_host.run([sys.executable, "-c", probe], env=moved.env, timeout_s=180)
    assert seen.returncode == 0, seen.stderr[-3000:]
    assert f"status {final.batch_id}" in seen.stdout
