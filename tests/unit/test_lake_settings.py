"""Where a job finds the lake: the project's data/ by default, from any working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from lake.catalog import MASTER_EVENTS
from lake.settings import LakeSettings
from runtime.spark_settings import SparkSettings
from tests.support import ROOT


def test_the_default_lake_is_the_projects_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LAKE_ROOT", raising=False)
    monkeypatch.delenv("CHECKPOINT_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    lake = LakeSettings()
    assert MASTER_EVENTS.path(lake) == str(ROOT / "data" / "lake" / "master" / "events")
    assert lake.checkpoint("archiver") == str(ROOT / "data" / "checkpoints" / "archiver")


def test_a_relative_lake_root_is_taken_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LAKE_ROOT", "somewhere/lake")
    monkeypatch.chdir(tmp_path)
    assert MASTER_EVENTS.path(LakeSettings()) == str(tmp_path / "somewhere/lake/master/events")


def test_an_s3_lake_hands_one_store_to_every_client(monkeypatch: pytest.MonkeyPatch) -> None:
    from lake.storage import delta_options, store_path
    from runtime.object_store import spark_conf
    from runtime.spark import submit_args

    monkeypatch.setenv("LAKE_ROOT", "s3a://bucket/lake/")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3-secret-0451")
    lake = LakeSettings()
    # Read once, here (the entry point): nothing below reads the environment again.
    for name in ("LAKE_ROOT", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    store = lake.object_store
    assert lake.on_object_store
    assert store.in_use
    assert MASTER_EVENTS.path(lake) == "s3://bucket/lake/master/events"  # one path, every client
    assert store_path(MASTER_EVENTS.path(lake)) == "bucket/lake/master/events"
    options = delta_options(MASTER_EVENTS.path(lake), store)
    assert options is not None
    assert options["AWS_CONDITIONAL_PUT"] == "etag"
    assert options["AWS_ALLOW_HTTP"] == "true"
    assert options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "false"
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:8333"
    assert delta_options("/tmp/lake/master/events", store) is None
    conf = spark_conf(store)
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == "s3-secret-0451"
    # Never on a spark-submit command line (which names 'secret' in its redaction pattern).
    assert "s3-secret-0451" not in " ".join(submit_args(SparkSettings(), store))
    assert any(
        "hadoop-aws" in arg for arg in submit_args(SparkSettings(), store)
    )  # the S3 connector's class path


def test_the_object_store_is_where_the_lake_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's lake_root is always its lake's, whatever LAKE_ROOT says: a lake given
    explicitly, normalised, or below another (a replay's)."""
    monkeypatch.setenv("LAKE_ROOT", "s3://elsewhere/lake")
    local = LakeSettings(lake_root="/tmp/lake")
    assert local.object_store.lake_root == "/tmp/lake"
    assert not local.object_store.in_use
    remote = LakeSettings(lake_root="s3a://bucket/lake/")
    assert remote.object_store.lake_root == "s3://bucket/lake"
    assert remote.object_store.in_use
    replay = remote.under("replays", "ctr_v2")
    assert replay.object_store.lake_root == "s3://bucket/lake/replays/ctr_v2"
    assert replay.object_store.lake_root == replay.lake_root
    assert remote.object_store.lake_root == "s3://bucket/lake"  # the lake itself unchanged


def test_checkpoints_on_the_object_store_are_where_every_host_finds_them() -> None:
    """Issue 67: CHECKPOINT_ROOT=s3://… was taken as a local folder named ``s3:`` under the
    working directory (the driver died: mkdir of file:…/s3:/bucket/checkpoints failed)."""
    lake = LakeSettings(lake_root="s3://bucket/lake", checkpoint_root="s3a://bucket/ck/")
    assert lake.checkpoints_on_object_store
    assert lake.checkpoint("speed") == "s3://bucket/ck/speed"
    assert lake.under("replays", "v2").checkpoint("speed") == "s3://bucket/ck/replays/v2/speed"
    assert LakeSettings(lake_root="/l", checkpoint_root="file:///tmp/ck").checkpoint("a") == (
        "/tmp/ck/a"
    )


@pytest.mark.parametrize(
    ("lake_root", "checkpoint_root", "message"),
    [
        ("s3://b/lake", "gs://b/ck", "CHECKPOINT_ROOT: a local folder or an S3-compatible store"),
        ("hdfs://nn/lake", "/tmp/ck", "LAKE_ROOT: a local folder or an S3-compatible store"),
        ("/tmp/lake", "s3://b/ck", "the checkpoints go on the lake's store"),
    ],
)
def test_a_root_the_platform_cannot_use_is_refused(
    lake_root: str, checkpoint_root: str, message: str
) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        LakeSettings(lake_root=lake_root, checkpoint_root=checkpoint_root)
