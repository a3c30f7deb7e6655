"""KAFKA_JVM_OPTIONS: more options for the local Kafka nodes' JVMs, split as a shell would."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infra.broker_settings import BrokerSettings


def test_the_options_split_as_a_shell_splits_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_JVM_OPTIONS", "-Xlog:gc:file='/tmp/a b.log' -XX:+UseSerialGC")
    options = BrokerSettings().jvm_arguments()
    assert options == ["-Xlog:gc:file=/tmp/a b.log", "-XX:+UseSerialGC"]


def test_an_unclosed_quote_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_JVM_OPTIONS", "-Dname='unclosed")
    with pytest.raises(ValidationError, match=r"KAFKA_JVM_OPTIONS=.* is not words"):
        BrokerSettings()
