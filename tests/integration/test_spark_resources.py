"""The driver's and the executors' resources take effect however Spark starts: as spark-submit
flags (the Airflow tasks: tests/integration/test_dags.py checks the driver's heap there), and in
the JVM that `ctr` starts itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from runtime.spark_settings import SparkSettings


def test_resources_become_spark_submit_flags() -> None:
    settings = SparkSettings(
        driver_memory="3g",
        executor_memory="2g",
        executor_cores=2,
        num_executors=4,
        dynamic_allocation=True,
        conf={"spark.driver.maxResultSize": "1m"},
    )
    args = settings.submit_args()
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--driver-memory"] == "3g"
    assert flags["--executor-memory"] == "2g"
    assert flags["--executor-cores"] == "2"
    assert flags["--num-executors"] == "4"
    confs = [v for k, v in zip(args[::2], args[1::2], strict=True) if k == "--conf"]
    assert "spark.dynamicAllocation.enabled=true" in confs
    assert "spark.dynamicAllocation.shuffleTracking.enabled=true" in confs
    assert "spark.driver.maxResultSize=1m" in confs
    # Unset: Spark's defaults (nothing on the command line but the driver's memory).
    assert SparkSettings().submit_args() == ["--driver-memory", "2g"]


def test_the_environment_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_EXECUTOR_MEMORY", "6g")
    monkeypatch.setenv("SPARK_EXECUTOR_CORES", "3")
    monkeypatch.setenv("SPARK_DYNAMIC_ALLOCATION", "true")
    settings = SparkSettings()
    assert settings.resources()["spark.executor.memory"] == "6g"
    assert settings.resources()["spark.executor.cores"] == "3"
    assert settings.resources()["spark.dynamicAllocation.enabled"] == "true"


def test_the_jar_cache_is_where_make_setup_puts_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """infra/jars.sh's rule: $CTR_JAR_CACHE, else $XDG_CACHE_HOME/ctr-lambda/jars."""
    monkeypatch.delenv("CTR_JAR_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert SparkSettings().jar_cache == tmp_path / "ctr-lambda" / "jars"
    monkeypatch.setenv("CTR_JAR_CACHE", str(tmp_path / "jars"))
    assert SparkSettings().jar_cache == tmp_path / "jars"


def test_the_driver_ctr_starts_has_the_memory_asked(
    spark: SparkSession, spark_settings: SparkSettings
) -> None:
    """The test session's driver was started by PySpark with the settings' 2g (Spark's default
    would be 1 GiB)."""
    assert spark_settings.driver_memory == "2g"
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    heap = jvm.java.lang.Runtime.getRuntime().maxMemory()
    assert heap > 1.7 * 2**30
