"""The local broker's settings (environment variables BROKER_*)."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.spark_settings import default_jar_cache


class BrokerSettings(BaseSettings):
    """Where the local cluster keeps its state (``RUN_DIR``) and how its JVMs run."""

    model_config = SettingsConfigDict(extra="ignore")

    # The run directory whose kafka/ folder holds the local cluster's state (data, logs, pid
    # files): KAFKA_RUN_DIR, when set, without moving the rest of RUN_DIR (the demo's env file
    # points it at the demo's cluster), else RUN_DIR. Relative: to the working directory.
    run_dir: Path = Field(
        default=Path("run"), validation_alias=AliasChoices("KAFKA_RUN_DIR", "RUN_DIR")
    )
    # Seconds `ctr kafka up` waits for every broker to register; then it stops with the last
    # error and where the logs are.
    start_timeout_s: float = Field(default=90.0, gt=0, validation_alias="KAFKA_START_TIMEOUT_S")
    # Each local Kafka node's JVM heap (e.g. 512m, 1g): fixed (-Xms = -Xmx) and touched at
    # start, so its memory is flat from the first minute.
    heap: str = Field(default="512m", pattern=r"^\d+[kmg]$", validation_alias="KAFKA_HEAP")
    # More options for each local Kafka node's JVM (and the one that formats its log
    # directory), split as a shell splits words and put after the platform's own, so they win:
    # GC logging, say, or -XX:TieredStopAtLevel=1 for short-lived clusters (the test suite's).
    jvm_options: str = Field(default="", validation_alias="KAFKA_JVM_OPTIONS")
    # The port of the local cluster's controller listener. Unset: the first broker's port
    # plus 100.
    controller_port: int | None = Field(
        default=None, ge=1, le=65535, validation_alias="KAFKA_CONTROLLER_PORT"
    )
    # The Java (17 or later) the local Kafka nodes run on: its bin/java. Unset: `java` on the
    # PATH.
    java_home: Path | None = Field(default=None, validation_alias="JAVA_HOME")
    # Where `make setup` put the jar sets (runtime.jars): the local Kafka nodes run on its
    # kafka set. The same folder as SparkSettings.jar_cache.
    jar_cache: Path = Field(
        default_factory=lambda: default_jar_cache(os.environ), validation_alias="CTR_JAR_CACHE"
    )
    # Authentication on the brokers' listener: "none", or SCRAM ("scram" is SCRAM-SHA-256).
    # Unset: what the cluster under kafka_dir was formatted with, else none.
    # Normalised to "none", "SCRAM-SHA-256" or "SCRAM-SHA-512".
    local_auth: str | None = Field(
        default=None, validation_alias=AliasChoices("KAFKA_LOCAL_AUTH", "local_auth")
    )

    # The listener over TLS (SASL_SSL; with local_auth only). Unset: as the cluster is.
    local_tls: bool | None = Field(
        default=None, validation_alias=AliasChoices("KAFKA_LOCAL_TLS", "local_tls")
    )

    @field_validator("jvm_options")
    @classmethod
    def _words(cls, value: str) -> str:
        try:
            shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"KAFKA_JVM_OPTIONS={value!r} is not words: {exc}") from exc
        return value

    def jvm_arguments(self) -> list[str]:
        """:attr:`jvm_options` as the JVM's arguments."""
        return shlex.split(self.jvm_options)

    @field_validator("local_auth", mode="before")
    @classmethod
    def _auth(cls, value: object) -> object:
        if not isinstance(value, str) or not value.strip():
            return value or None
        from infra.broker_auth import auth_mechanism

        return auth_mechanism(value) or "none"

    @property
    def kafka_dir(self) -> Path:
        return self.run_dir / "kafka"

    @property
    def java(self) -> str:
        if self.java_home is not None:
            return str(self.java_home / "bin" / "java")
        return shutil.which("java") or "java"
