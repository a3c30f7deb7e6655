"""KafkaSettings' security settings as librdkafka configuration, as Spark kafka-source options
and as a child process's environment; what a wrong combination says. No broker: the
authentication itself is tested against real brokers in test_kafka_auth.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from runtime.connectors import MAX_POLL_RECORDS, kafka_options, read_kafka
from runtime.kafka_settings import KafkaSettings, jaas_config

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
SERVERS = "b1:9092,b2:9092"


def sasl(**values: object) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers=SERVERS,
        security_protocol="SASL_SSL",
        sasl_username="ingest",
        sasl_password=SecretStr("s3cret"),
        **values,  # type: ignore[arg-type]
    )


def unquote_jaas(value: str) -> str:
    """A JAAS quoted string read back as Kafka's parser (java.io.StreamTokenizer) reads it."""
    assert value.startswith('"')
    assert value.endswith('"')
    return re.sub(r"\\(.)", r"\1", value[1:-1])


def test_plaintext_settings_add_nothing_to_the_clients() -> None:
    kafka = KafkaSettings(bootstrap_servers=SERVERS)
    config = kafka.client(acks="all")
    assert not {k for k in config if k.startswith(("security.", "sasl.", "ssl."))}
    assert config["bootstrap.servers"] == SERVERS
    assert config["acks"] == "all"
    assert kafka.spark_options() == {
        "kafka.bootstrap.servers": SERVERS,
        "kafka.security.protocol": "PLAINTEXT",
    }


def test_sasl_settings_reach_librdkafka() -> None:
    config = sasl(sasl_mechanism="SCRAM-SHA-512", ssl_ca_location=Path("/etc/ca.pem")).client()
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert config["sasl.username"] == "ingest"
    assert config["sasl.password"] == "s3cret"
    assert config["ssl.ca.location"] == "/etc/ca.pem"


def test_sasl_settings_reach_sparks_kafka_source_as_a_jaas_line() -> None:
    options = kafka_options(sasl(ssl_ca_location=Path("/etc/ca.pem")), ["events"])
    assert options == {
        "kafka.bootstrap.servers": SERVERS,
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-256",
        "kafka.sasl.jaas.config": f'{SCRAM} required username="ingest" password="s3cret";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/etc/ca.pem",
        "subscribe": "events",
    }


@pytest.mark.parametrize(
    "password",
    ['pa"ss', "back\\slash", '\\"both\\"', "semi;colon", "trailing\\", "spaces and = signs", "ü"],
)
def test_the_jaas_line_escapes_quotes_and_backslashes(password: str) -> None:
    line = jaas_config("SCRAM-SHA-256", 'us"er', password)
    match = re.fullmatch(
        rf"{re.escape(SCRAM)} required username=(\"(?:[^\"\\]|\\.)*\") "
        r"password=(\"(?:[^\"\\]|\\.)*\");",
        line,
    )
    assert match is not None, line
    assert unquote_jaas(match.group(1)) == 'us"er'
    assert unquote_jaas(match.group(2)) == password


def test_plain_uses_its_own_login_module() -> None:
    assert jaas_config("PLAIN", "u", "p").startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
    )


def test_the_escape_hatchs_librdkafka_credentials_become_a_jaas_line_for_spark() -> None:
    kafka = KafkaSettings(
        bootstrap_servers=SERVERS,
        client_config={
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "old",
            "sasl.password": "style",
            "socket.keepalive.enable": True,
        },
    )
    options = kafka.spark_options()
    assert options["kafka.security.protocol"] == "SASL_PLAINTEXT"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.sasl.jaas.config"] == (
        f'{SCRAM} required username="old" password="style";'
    )
    assert options["kafka.socket.keepalive.enable"] == "true"
    assert not {"kafka.sasl.username", "kafka.sasl.password", "kafka.sasl.mechanisms"} & set(
        options
    )
    assert kafka.client()["sasl.password"] == "style"  # librdkafka: as given


def test_a_given_jaas_line_is_left_alone() -> None:
    jaas = "org.example.Login required token=x;"
    kafka = KafkaSettings(
        bootstrap_servers=SERVERS,
        security_protocol="SASL_SSL",
        client_config={"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config": jaas},
    )
    assert kafka.spark_options()["kafka.sasl.jaas.config"] == jaas


def test_sasl_without_credentials_names_the_missing_settings() -> None:
    with pytest.raises(ValidationError, match="KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"):
        KafkaSettings(security_protocol="SASL_PLAINTEXT")
    with pytest.raises(ValidationError, match="needs KAFKA_SASL_PASSWORD"):
        KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_username="u")


def test_credentials_without_sasl_are_refused_not_ignored() -> None:
    with pytest.raises(ValidationError, match="sends no credentials"):
        KafkaSettings(sasl_username="u", sasl_password=SecretStr("p"))


def test_the_environment_configures_it_and_errors_never_show_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "sasl_plaintext")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "scram-sha-512")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "ingest")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "do-not-print-me")
    kafka = KafkaSettings()
    assert (kafka.security_protocol, kafka.sasl_mechanism) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
    assert "do-not-print-me" not in repr(kafka) + str(kafka) + kafka.describe_auth()
    assert kafka.describe_auth() == "SASL_PLAINTEXT, SCRAM-SHA-512 as 'ingest'"

    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")
    with pytest.raises(ValidationError) as refused:
        KafkaSettings()
    assert "do-not-print-me" not in str(refused.value)


def test_a_child_process_environment_round_trips() -> None:
    kafka = sasl(client_config={"socket.keepalive.enable": True})
    env = kafka.environ()
    assert env["KAFKA_SASL_PASSWORD"] == "s3cret"
    again = KafkaSettings.from_environ(env)
    assert again.client() == kafka.client()
    assert again.spark_options() == kafka.spark_options()


def test_from_environ_takes_no_credentials_from_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "mine")
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "mine")
    other = KafkaSettings.from_environ({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert other.security_protocol == "PLAINTEXT"
    assert other.sasl_username is None


class _Reader:
    """What read_kafka gives Spark's reader (no JVM: the options it assembles)."""

    def __init__(self) -> None:
        self.options: dict[str, str] = {}

    def format(self, name: str) -> _Reader:
        assert name == "kafka"
        return self

    def option(self, key: str, value: str) -> _Reader:
        self.options[key] = value
        return self

    def load(self) -> dict[str, str]:
        return self.options


def test_sparks_kafka_reads_poll_many_records_at_once_unless_told_otherwise() -> None:
    class Spark:
        read = readStream = _Reader()

    default = read_kafka(Spark(), sasl(), stream=True, group_prefix="g")  # type: ignore[arg-type]
    assert default["kafka.max.poll.records"] == MAX_POLL_RECORDS == "20000"
    assert default["groupIdPrefix"] == "g"
    assert default["kafka.sasl.mechanism"] == "SCRAM-SHA-256"
    Spark.read = _Reader()
    told = read_kafka(
        Spark(),  # type: ignore[arg-type]
        sasl(),
        stream=False,
        group_prefix="g",
        **{"kafka.max.poll.records": "800"},
    )
    assert told["kafka.max.poll.records"] == "800"
