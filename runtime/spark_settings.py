"""Where Spark runs and how (environment variables SPARK_*)."""

from __future__ import annotations

import os
import sys

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SparkSettings(BaseSettings):
    """Where Spark runs (environment variables ``SPARK_*``)."""

    model_config = SettingsConfigDict(env_prefix="SPARK_", extra="ignore")

    master: str = "local[2]"
    app_name: str = "ctr-lambda"
    shuffle_partitions: int = Field(default=4, ge=1)
    ui_enabled: bool = False
    driver_memory: str = "2g"
    # Anything else, e.g. object-store credentials {"spark.hadoop.fs.s3a.access.key": "…"}.
    conf: dict[str, str] = Field(default_factory=dict)
    # The Python of the workers (PySpark's own variable; default: this interpreter, which has
    # pyarrow, msgspec, ...) and the address the driver binds (Spark's own variable).
    python: str = Field(default_factory=lambda: sys.executable, validation_alias="PYSPARK_PYTHON")
    local_ip: str = Field(default="127.0.0.1", validation_alias="SPARK_LOCAL_IP")
    # Where the sessions `ctr` starts itself write Spark's warnings (only errors reach the
    # console); empty: Spark's default, everything on the console. Jobs under spark-submit
    # keep Spark's default.
    log_file: str = Field(
        default_factory=lambda: os.path.join(os.environ.get("RUN_DIR", "run"), "logs", "spark.log")
    )

    @field_validator("master")
    @classmethod
    def _check_master(cls, value: str) -> str:
        if not value.startswith(("local", "spark://", "yarn", "k8s://")):
            raise ValueError(f"SPARK_MASTER={value!r} is not local[N], spark://…, yarn or k8s://…")
        return value
