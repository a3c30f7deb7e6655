"""How every component reaches Kafka: one settings object, read from the environment."""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.errors import SetupError

LOOPBACK_HOSTS = frozenset({"localhost", "ip6-localhost"})
# librdkafka logs every refused connection to stderr unless given a logger.
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")

SecurityProtocol = Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"]
SaslMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]
LOGIN_MODULES: Final[dict[str, str]] = {
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
}
# librdkafka's names for what Kafka's Java client (Spark's kafka source) configures otherwise:
# the credentials go into a JAAS line, the CA file into a PEM trust store.
_LIBRDKAFKA_ONLY: Final = frozenset(
    {"sasl.username", "sasl.password", "sasl.mechanisms", "ssl.ca.location"}
)
# The environment variables that say how to reach (and log in to) a cluster, for a child process.
CONNECTION_ENV: Final = (
    "KAFKA_BOOTSTRAP_SERVERS",
    "KAFKA_SECURITY_PROTOCOL",
    "KAFKA_SASL_MECHANISM",
    "KAFKA_SASL_USERNAME",
    "KAFKA_SASL_PASSWORD",
    "KAFKA_SSL_CA_LOCATION",
    "KAFKA_CLIENT_CONFIG",
)


class KafkaAuthError(SetupError, ValueError):
    """The security settings do not fit together (a protocol without credentials, ...)."""


class KafkaSettings(BaseSettings):
    """Kafka connection and topic layout (environment variables ``KAFKA_*``).

    A secured cluster: ``KAFKA_SECURITY_PROTOCOL`` (``SASL_PLAINTEXT``, ``SASL_SSL``, ``SSL``),
    ``KAFKA_SASL_MECHANISM`` (``SCRAM-SHA-256`` by default), ``KAFKA_SASL_USERNAME``,
    ``KAFKA_SASL_PASSWORD`` and, for a private CA, ``KAFKA_SSL_CA_LOCATION`` (a PEM file); every
    client gets them: librdkafka's through :meth:`client`, Spark's kafka source through
    :meth:`spark_options`. ``client_config`` carries any other librdkafka property, e.g.
    ``KAFKA_CLIENT_CONFIG='{"socket.keepalive.enable": true}'`` (applied last).
    """

    # hide_input_in_errors: a validation error must not print the password it was given.
    model_config = SettingsConfigDict(
        env_prefix="KAFKA_", extra="ignore", hide_input_in_errors=True
    )

    # Where the Kafka brokers are (host:port, comma-separated): a loopback address means the
    # local cluster (ctr kafka up starts it); anything else is used as it is and no broker is
    # started.
    bootstrap_servers: str = "127.0.0.1:9092"
    # The event topic: the producer writes the valid events to it, the archiver and the speed
    # job read it.
    topic: str = "ad-events"
    # The dead-letter topic: records the producer refuses, untouched, with the reasons in
    # their headers; /metrics reports its depth.
    dlq_topic: str = "ad-events-dlq"
    # Partitions of the event topic when `ctr kafka up` or `ctr kafka create-topics` creates
    # it; an existing topic keeps its own.
    topic_partitions: int = Field(default=6, ge=1)
    # Partitions of the dead-letter topic when it is created; an existing topic keeps its own.
    dlq_partitions: int = Field(default=1, ge=1)
    # Replicas per partition of the topics `ctr kafka up` / `create-topics` creates. Unset: as
    # many as the cluster has brokers, at most 3.
    replication_factor: int | None = Field(default=None, ge=1)
    # min.insync.replicas of the topics `ctr kafka up` / `create-topics` creates. Unset: 2 with
    # 3 or more replicas, so that acks=all survives the loss of one broker; else the broker's
    # default (1).
    min_insync_replicas: int | None = Field(default=None, ge=1)
    # How every client (producer, admin, consumers, Spark's kafka source) talks to the
    # brokers: PLAINTEXT, SASL_PLAINTEXT, SASL_SSL or SSL (case-insensitive).
    security_protocol: SecurityProtocol = "PLAINTEXT"
    # The SASL login's mechanism with a SASL_* protocol: SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN.
    sasl_mechanism: SaslMechanism = "SCRAM-SHA-256"
    # The SASL user name; required with a SASL_* protocol, refused with any other. Unset (or
    # empty): none.
    sasl_username: str | None = None
    # The SASL password; required with a SASL_* protocol, refused with any other. A secret:
    # never printed (nor echoed in a validation error).
    sasl_password: SecretStr | None = None
    # A PEM file of the CA(s) the brokers' certificates chain to (SSL, SASL_SSL). Unset (or
    # empty): each client's default trusted CAs.
    ssl_ca_location: Path | None = None
    # Any other librdkafka property, as a JSON object, applied last (over the settings above),
    # e.g. {"socket.keepalive.enable": true}; Spark's kafka source gets them as kafka.* options
    # (but the librdkafka-only sasl.username, sasl.password, sasl.mechanisms, ssl.ca.location).
    client_config: dict[str, Any] = Field(default_factory=dict, repr=False)
    # Topic-level settings for the topics `ctr kafka up` / `create-topics` creates, e.g. the
    # disk they may hold: KAFKA_TOPIC_CONFIG='{"retention.bytes": "1073741824"}' (per
    # partition). Unset: the broker's defaults (7 days, no size bound). Existing topics keep
    # theirs (kafka-configs.sh --alter changes them).
    topic_config: dict[str, str] = Field(default_factory=dict)

    @field_validator("bootstrap_servers")
    @classmethod
    def _normalise_servers(cls, value: str) -> str:
        servers = [part.strip() for part in value.split(",") if part.strip()]
        if not servers:
            raise ValueError("KAFKA_BOOTSTRAP_SERVERS must name at least one host:port")
        for server in servers:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"KAFKA_BOOTSTRAP_SERVERS: {server!r} is not host:port")
        return ",".join(servers)

    @field_validator("security_protocol", "sasl_mechanism", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("sasl_username", "ssl_ca_location", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @model_validator(mode="after")
    def _credentials_fit_the_protocol(self) -> KafkaSettings:
        protocol, mechanism, username, password = self._security()
        if protocol.startswith("SASL_") and mechanism.upper() in LOGIN_MODULES:
            missing = [
                name
                for name, value in (
                    ("KAFKA_SASL_USERNAME", username),
                    ("KAFKA_SASL_PASSWORD", password),
                )
                if not value
            ]
            if missing:
                raise KafkaAuthError(
                    f"KAFKA_SECURITY_PROTOCOL={protocol} (SASL, {mechanism}) needs "
                    f"{' and '.join(missing)}"
                )
        elif username or password:
            raise KafkaAuthError(
                f"KAFKA_SASL_USERNAME / KAFKA_SASL_PASSWORD are set but "
                f"KAFKA_SECURITY_PROTOCOL={protocol} sends no credentials: set it to "
                "SASL_PLAINTEXT or SASL_SSL"
            )
        return self

    def _security(self) -> tuple[str, str, str | None, str | None]:
        """Protocol, SASL mechanism, user name and password in effect: the settings, with
        ``client_config``'s librdkafka properties of the same meaning taking precedence (it is
        applied last)."""
        extra = self.client_config
        password = self.sasl_password.get_secret_value() if self.sasl_password else None
        return (
            str(extra.get("security.protocol", self.security_protocol)).upper(),
            str(extra.get("sasl.mechanism", extra.get("sasl.mechanisms", self.sasl_mechanism))),
            _text(extra.get("sasl.username", self.sasl_username)),
            _text(extra.get("sasl.password", password)),
        )

    @property
    def uses_sasl(self) -> bool:
        return self._security()[0].startswith("SASL_")

    @property
    def is_loopback(self) -> bool:
        """True when every bootstrap server is on this machine (the local-cluster case)."""
        return all(_is_loopback_host(s.rpartition(":")[0]) for s in self.servers)

    def effective_replication_factor(self, brokers: int) -> int:
        """Replicas per partition on a cluster of ``brokers`` brokers."""
        if self.replication_factor is not None:
            return self.replication_factor
        return max(1, min(3, brokers))

    def effective_min_insync_replicas(self, brokers: int) -> int | None:
        """``min.insync.replicas`` of the topics (None: the broker's default, 1)."""
        if self.min_insync_replicas is not None:
            return self.min_insync_replicas
        return 2 if self.effective_replication_factor(brokers) >= 3 else None

    @property
    def servers(self) -> list[str]:
        return self.bootstrap_servers.split(",")

    def client(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka configuration for a producer, consumer or admin client: the cluster, its
        security settings, ``client_config``, then ``overrides``."""
        return {
            "bootstrap.servers": self.bootstrap_servers,
            "logger": LIBRDKAFKA_LOG,
            **self.security_config(),
            **self.client_config,
            **overrides,
        }

    def security_config(self) -> dict[str, Any]:
        """The librdkafka properties of the security settings alone (protocol, SASL mechanism
        and credentials, CA file): for tools configured apart (``kcat -F``)."""
        security: dict[str, Any] = {}
        if self.security_protocol != "PLAINTEXT":
            security["security.protocol"] = self.security_protocol
        if self.security_protocol.startswith("SASL_"):
            security["sasl.mechanism"] = self.sasl_mechanism
            security["sasl.username"] = self.sasl_username
            if self.sasl_password is not None:
                security["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location is not None:
            security["ssl.ca.location"] = str(self.ssl_ca_location)
        security.update(
            {
                k: v
                for k, v in self.client_config.items()
                if k.startswith(("security.", "sasl.", "ssl."))
            }
        )
        return security

    def spark_options(self) -> dict[str, str]:
        """The same cluster and credentials for Spark's kafka source and sink (Kafka's Java
        client, options ``kafka.*``): the user name and password as a JAAS line
        (``kafka.sasl.jaas.config``), a CA file as a PEM trust store; ``client_config``'s other
        properties as they are."""
        protocol, mechanism, username, password = self._security()
        options = {"kafka.bootstrap.servers": self.bootstrap_servers}
        options.update(
            {
                f"kafka.{key}": _java_value(value)
                for key, value in self.client_config.items()
                if key not in _LIBRDKAFKA_ONLY
            }
        )
        options["kafka.security.protocol"] = protocol
        if protocol.startswith("SASL_"):
            options["kafka.sasl.mechanism"] = mechanism
            if "sasl.jaas.config" not in self.client_config:  # else: given as it is
                options["kafka.sasl.jaas.config"] = jaas_config(
                    mechanism, username or "", password or ""
                )
        ca = self.client_config.get("ssl.ca.location", self.ssl_ca_location)
        if ca is not None and protocol in ("SSL", "SASL_SSL"):
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = str(ca)
        return options

    def environ(self) -> dict[str, str]:
        """The environment variables that give a child process these settings' connection
        (cluster, protocol, credentials; no topics): for ``ctr`` subprocesses and env files.
        It holds the password: never log it."""
        env = {
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers,
            "KAFKA_SECURITY_PROTOCOL": self.security_protocol,
        }
        if self.security_protocol.startswith("SASL_"):
            env["KAFKA_SASL_MECHANISM"] = self.sasl_mechanism
            env["KAFKA_SASL_USERNAME"] = self.sasl_username or ""
            if self.sasl_password is not None:
                env["KAFKA_SASL_PASSWORD"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location is not None:
            env["KAFKA_SSL_CA_LOCATION"] = str(self.ssl_ca_location)
        if self.client_config:
            env["KAFKA_CLIENT_CONFIG"] = json.dumps(self.client_config)
        return env

    @classmethod
    def from_environ(cls, env: Mapping[str, str], **values: Any) -> KafkaSettings:
        """Settings from a given environment (another process's, an env file's): its ``KAFKA_*``
        variables, then ``values``. Connection variables it lacks (:data:`CONNECTION_ENV`) take
        their defaults, never this process's; other fields fall back to this environment."""
        given: dict[str, Any] = {}
        for name, field in cls.model_fields.items():
            variable = f"KAFKA_{name.upper()}"
            if variable in env:
                raw = env[variable]
                given[name] = json.loads(raw) if name in ("client_config", "topic_config") else raw
            elif variable in CONNECTION_ENV:
                given[name] = field.get_default(call_default_factory=True)
        return cls(**{**given, **values})

    def describe_auth(self) -> str:
        """How these settings log in, without the password: for messages."""
        protocol, mechanism, username, _ = self._security()
        if protocol.startswith("SASL_"):
            return f"{protocol}, {mechanism} as {username!r}"
        return protocol


def jaas_config(mechanism: str, username: str, password: str) -> str:
    r"""The JAAS line of Kafka's Java client for SASL ``mechanism`` (SCRAM-SHA-256/512, PLAIN):
    user name and password as quoted strings, backslashes and quotes escaped (the JAAS parser
    reads ``\\`` and ``\"`` inside quotes as ``\`` and ``"``)."""
    module = LOGIN_MODULES.get(mechanism.upper())
    if module is None:
        raise KafkaAuthError(
            f"SASL mechanism {mechanism!r}: Spark's kafka source is configured here for "
            f"{', '.join(LOGIN_MODULES)} only; pass other mechanisms' kafka.sasl.jaas.config "
            "through KAFKA_CLIENT_CONFIG"
        )
    return f"{module} required username={_jaas_quote(username)} password={_jaas_quote(password)};"


def _jaas_quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _java_value(value: object) -> str:
    """A librdkafka property value as Kafka's Java client reads it (booleans in lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _is_loopback_host(host: str) -> bool:
    host = host.strip("[]")
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
