"""Every error a user sees names its cause: the line Spark, delta-rs or Kafka gave, not the
wrapper's ("An error occurred while calling o182.getResult")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from pyspark.sql import SparkSession

from runtime.errors import reason_in, reason_of
from runtime.streaming import cause_of

# What `ctr speed` reported before: a foreachBatch function whose Spark job the driver aborted
# (the shape of Spark 4's FOREACH_BATCH_USER_FUNCTION_ERROR around a Py4J error).
RESULT_TOO_LARGE = """\
[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in \
foreach batch sink. Reason: An exception was raised by the Python Proxy. Return Message: \
Traceback (most recent call last):
  File "/work/.venv/lib/python3.11/site-packages/py4j/clientserver.py", line 617, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/work/main/speed_layer/job.py", line 201, in __call__
    answers = plan.frame.toArrow()
py4j.protocol.Py4JJavaError: An error occurred while calling o182.getResult.
: org.apache.spark.SparkException: Job aborted due to stage failure: Total size of serialized \
results of 2 tasks (1100.5 KiB) is bigger than spark.driver.maxResultSize (1024.0 KiB)
\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2856)
\tat org.apache.spark.scheduler.DAGScheduler.abortStage(DAGScheduler.scala:2792)
"""

# A task that lost its connection: the reason is the deepest "Caused by".
CONNECTION_LOST = """\
py4j.protocol.Py4JJavaError: An error occurred while calling o77.save.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed \
1 times, most recent failure: Lost task 0.0 in stage 3.0 (TID 5) (127.0.0.1 executor driver): \
org.apache.hadoop.fs.s3a.AWSClientIOException: getFileStatus on s3a://lake/x: Unable to execute
\tat org.apache.hadoop.fs.s3a.S3AUtils.translateException(S3AUtils.java:215)
Caused by: java.util.concurrent.ExecutionException: java.net.ConnectException: refused
\tat java.base/java.util.concurrent.FutureTask.report(FutureTask.java:122)
Caused by: java.net.ConnectException: Connection refused (Connection refused)
\tat java.base/sun.nio.ch.Net.connect0(Native Method)
"""

# A Python error raised inside a task: Spark wraps its traceback in its own.
TASK_RAISED = """\
py4j.protocol.Py4JJavaError: An error occurred while calling o90.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Lost task 0.0: \
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/work/main/speed_layer/tasks.py", line 88, in count_and_write
    raise ValueError("no such column: impression_id")
ValueError: no such column: impression_id
"""


def test_a_driver_side_abort_is_reported_by_its_reason_not_the_py4j_call() -> None:
    reason = reason_in(RESULT_TOO_LARGE)
    assert "bigger than spark.driver.maxResultSize" in reason
    assert reason.endswith("(SparkException)")
    assert "o182" not in reason
    failed = RuntimeError(RESULT_TOO_LARGE)
    assert "spark.driver.maxResultSize (1024.0 KiB)" in cause_of(failed)


def test_the_deepest_java_cause_is_the_reason() -> None:
    assert (
        reason_in(CONNECTION_LOST) == "Connection refused (Connection refused) (ConnectException)"
    )


def test_a_python_error_raised_in_a_task_is_the_reason() -> None:
    assert reason_in(TASK_RAISED) == "no such column: impression_id (ValueError)"


def test_a_kafka_error_says_what_librdkafka_said() -> None:
    error = KafkaException(KafkaError(KafkaError._TRANSPORT, "127.0.0.1:9 connect refused"))
    assert reason_of(error) == "127.0.0.1:9 connect refused (Kafka _TRANSPORT)"


def test_an_error_without_a_wrapper_is_its_first_line() -> None:
    assert reason_of(ValueError("a bad day\nwith details")) == "a bad day"
    assert reason_of(ValueError()) == "ValueError"


def test_a_real_py4j_error_is_reported_by_the_java_exception(spark: SparkSession) -> None:
    """A Py4J call that fails in the JVM: str() names only the call; the reason is Java's."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

    jvm = spark.sparkContext._jvm
    assert jvm is not None
    with pytest.raises(Py4JJavaError) as raised:
        jvm.java.io.FileInputStream("/no/such/file")  # no Python class stands for this one
    assert "An error occurred while calling" in str(raised.value)
    reason = reason_of(raised.value)
    assert reason == "/no/such/file (No such file or directory) (FileNotFoundException)"


def test_a_spark_error_is_reported_by_its_first_line(spark: SparkSession) -> None:
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException) as raised:
        spark.sql("SELECT * FROM no_such_table_here")
    reason = reason_of(raised.value)
    assert reason.startswith("[TABLE_OR_VIEW_NOT_FOUND]")
    assert "no_such_table_here" in reason


def test_the_cli_names_delta_rs_s_reason_without_a_traceback(tmp_path: Path) -> None:
    """A table whose log is not JSON: `ctr views list` says what delta-rs found, in one line."""
    log = tmp_path / "lake" / "views" / "registry" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text('{"commitInfo": garbage\n')
    env = {
        **os.environ,
        "LAKE_ROOT": str(tmp_path / "lake"),
        "CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ctr")), "views", "list"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: Kernel error: Json error: Encountered unexpected 'g' whilst parsing value "
        "(DeltaError)"
    ]
