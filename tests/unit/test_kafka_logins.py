"""The local cluster's logins as data: the roles' credentials (a file from before the roles
included), each node's server.properties with and without them, and the ACLs the Kafka page
gives for a cluster of your own (the same as `ctr kafka up` grants)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from infra.broker.acls import kafka_acls_command, platform_grants
from infra.broker.layout import Layout
from infra.broker.properties import node_properties
from infra.broker_auth import (
    ROLES,
    USERS,
    Credentials,
    CredentialsError,
    User,
    load_credentials,
    load_or_create_credentials,
)
from runtime.kafka_settings import KafkaSettings

KAFKA_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "kafka.md"


def properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


def test_a_credentials_file_from_before_the_roles_keeps_its_client_user_as_the_admin(
    tmp_path: Path,
) -> None:
    path = tmp_path / "credentials.json"
    old = {
        "mechanism": "SCRAM-SHA-256",
        "broker": {"username": "ctr-broker", "password": "b"},
        "client": {"username": "ctr", "password": "c"},
    }
    path.write_text(json.dumps(old))
    found = load_credentials(path)
    assert found.admin == User("ctr", "c")
    assert not found.complete
    with pytest.raises(CredentialsError, match="no producer user yet"):
        found.user("producer")

    completed = load_or_create_credentials(path, "SCRAM-SHA-256")
    assert completed.admin == User("ctr", "c")
    assert [completed.user(r).username for r in ROLES] == [
        "ctr", "ctr-producer", "ctr-consumer", "ctr-monitor"
    ]  # fmt: skip
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_credentials(path) == completed  # written, and read back the same
    assert load_or_create_credentials(path, "SCRAM-SHA-256") == completed


def test_a_node_with_logins_authorizes_every_request_and_guards_its_controller_listener() -> None:
    credentials = Credentials.generate("SCRAM-SHA-256")
    layout = Layout.create("127.0.0.1", [9092], 9192, auth="SCRAM-SHA-256")
    [node] = layout.nodes
    secured = properties(node_properties(layout, node, Path("/run/node-1"), credentials))
    assert secured["listener.security.protocol.map"] == (
        "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT"
    )
    assert secured["sasl.mechanism.controller.protocol"] == "PLAIN"
    assert secured["listener.name.controller.sasl.enabled.mechanisms"] == "PLAIN"
    jaas = secured["listener.name.controller.plain.sasl.jaas.config"]
    broker = credentials.broker
    assert f'username="{broker.username}" password="{broker.password}"' in jaas
    accepted = {u.username for u in credentials.users if f'user_{u.username}="' in jaas}
    assert accepted == {"ctr-broker", "ctr-admin"}  # no role but the admin reaches it
    assert secured["authorizer.class.name"] == (
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    )
    assert secured["super.users"] == "User:ctr-broker;User:ctr-admin"
    assert "allow.everyone.if.no.acl.found" not in secured

    open_node = properties(node_properties(layout, node, Path("/run/node-1")))
    assert open_node["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert "authorizer.class.name" not in open_node


def test_a_controller_of_its_own_takes_the_same_logins() -> None:
    credentials = Credentials.generate("SCRAM-SHA-512")
    layout = Layout.create("127.0.0.1", [9092, 9093, 9094], 9192, auth="SCRAM-SHA-512")
    controller = properties(
        node_properties(layout, layout.controller, Path("/run/node-0"), credentials)
    )
    assert controller["listeners"] == "CONTROLLER://127.0.0.1:9192"
    assert controller["listener.security.protocol.map"].endswith(",CONTROLLER:SASL_PLAINTEXT")
    assert controller["authorizer.class.name"].endswith("StandardAuthorizer")
    broker = properties(
        node_properties(layout, layout.brokers[0], Path("/run/node-1"), credentials)
    )
    assert broker["sasl.mechanism.controller.protocol"] == "PLAIN"
    assert broker["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"


def test_the_kafka_page_gives_every_grant_as_a_kafka_acls_command() -> None:
    page = KAFKA_PAGE.read_text()
    grants = platform_grants(KafkaSettings())
    assert {g.role for g in grants} == {"producer", "consumer", "monitor"}  # the admin: super
    missing = [
        command
        for command in (kafka_acls_command(g, USERS[g.role]) for g in grants)
        if command not in page
    ]
    assert missing == []
