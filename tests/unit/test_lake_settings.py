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
    from runtime.object_store import ObjectStoreSettings, spark_conf
    from runtime.spark import submit_args

    monkeypatch.setenv("LAKE_ROOT", "s3a://bucket/lake/")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8333")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3-secret-0451")
    lake = LakeSettings()
    assert lake.on_object_store
    assert MASTER_EVENTS.path(lake) == "s3://bucket/lake/master/events"  # one path, every client
    assert store_path(MASTER_EVENTS.path(lake)) == "bucket/lake/master/events"
    options = delta_options(MASTER_EVENTS.path(lake))
    assert options is not None
    assert options["AWS_CONDITIONAL_PUT"] == "etag"
    assert options["AWS_ALLOW_HTTP"] == "true"
    assert options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] == "false"
    assert delta_options("/tmp/lake/master/events") is None
    conf = spark_conf(ObjectStoreSettings())
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == "s3-secret-0451"
    # Never on a spark-submit command line (which names 'secret' in its redaction pattern).
    assert "s3-secret-0451" not in " ".join(submit_args(SparkSettings()))
    assert any(
        "hadoop-aws" in arg for arg in submit_args(SparkSettings())
    )  # the S3 connector's class path
