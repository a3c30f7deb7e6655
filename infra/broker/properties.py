"""A node's ``server.properties``: what Kafka reads at start (and the reader of Kafka's own
``meta.properties``)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from infra.broker.layout import Layout, Node
from infra.broker_auth import CONTROLLER_MECHANISM, CONTROLLER_PROTOCOL, Credentials

# Kafka's authorizer for KRaft clusters: ACLs kept in the metadata log.
AUTHORIZER: Final = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def node_properties(
    layout: Layout, node: Node, directory: Path, credentials: Credentials | None = None
) -> str:
    """The node's server.properties: with ``credentials``, a SASL_PLAINTEXT (SASL_SSL with
    their TLS files) listener that takes SCRAM logins only, which the brokers also use between
    themselves; a controller listener that takes the brokers' and the admin's PLAIN logins
    only (:mod:`infra.broker_auth` says why PLAIN); and every request authorized by the ACLs,
    but the brokers' and the admin's (super users)."""
    replicas = min(3, len(layout.brokers))
    controller = layout.controller
    voters = f"{controller.node_id}@{controller.host}:{controller.controller_port}"
    listener = "PLAINTEXT" if credentials is None else credentials.listener
    controller_protocol = "PLAINTEXT" if credentials is None else CONTROLLER_PROTOCOL
    listeners = []
    if node.broker_port is not None:
        listeners.append(f"{listener}://{node.host}:{node.broker_port}")
    if "controller" in node.roles:
        listeners.append(f"CONTROLLER://{node.host}:{node.controller_port}")
    lines = {
        "process.roles": node.roles,
        "node.id": node.node_id,
        "controller.quorum.voters": voters,
        "controller.listener.names": "CONTROLLER",
        "listeners": ",".join(listeners),
        "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:{controller_protocol}",
        "log.dirs": directory / "data",
        "num.partitions": 1,
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": 6,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min(2, replicas),
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min(2, replicas),
        "group.initial.rebalance.delay.ms": 0,
        "unclean.leader.election.enable": "false",
        # A broker that stops heartbeating is fenced after this long: the time a SIGKILLed
        # leader's partitions wait for a new leader (default 9 s).
        "broker.session.timeout.ms": 4000,
        "broker.heartbeat.interval.ms": 500,
        "replica.lag.time.max.ms": 10000,
        # Segments past the topics' retention go within a minute (default 5): a size bound
        # (KAFKA_TOPIC_CONFIG) holds closely.
        "log.retention.check.interval.ms": 60000,
    }
    if credentials is not None:  # every node: a controller's listener, a broker's client of it
        lines["sasl.mechanism.controller.protocol"] = CONTROLLER_MECHANISM
        lines["listener.name.controller.sasl.enabled.mechanisms"] = CONTROLLER_MECHANISM
        jaas = f"listener.name.controller.{CONTROLLER_MECHANISM.lower()}.sasl.jaas.config"
        lines[jaas] = _properties_value(credentials.controller_jaas())
        lines["authorizer.class.name"] = AUTHORIZER
        lines["super.users"] = ";".join(f"User:{name}" for name in credentials.super_users)
    if node.is_broker:
        lines["advertised.listeners"] = f"{listener}://{node.host}:{node.broker_port}"
        lines["inter.broker.listener.name"] = listener
        if credentials is not None:
            mechanism = credentials.mechanism
            lines["sasl.enabled.mechanisms"] = mechanism
            lines["sasl.mechanism.inter.broker.protocol"] = mechanism
            jaas = f"listener.name.{listener.lower()}.{mechanism.lower()}.sasl.jaas.config"
            lines[jaas] = _properties_value(credentials.broker_jaas())
        if credentials is not None and credentials.tls is not None:
            tls = credentials.tls
            lines["ssl.keystore.type"] = "PKCS12"
            lines["ssl.keystore.location"] = _properties_value(str(tls.keystore))
            lines["ssl.keystore.password"] = tls.password
            lines["ssl.key.password"] = tls.password
            # What a broker trusts when it connects to the others (they share the certificate).
            lines["ssl.truststore.type"] = "PEM"
            lines["ssl.truststore.location"] = _properties_value(str(tls.ca))
    return "".join(f"{key}={value}\n" for key, value in lines.items())


def _properties_value(value: str) -> str:
    """``value`` as a Java properties file reads it back (backslashes are escapes there)."""
    return value.replace("\\", "\\\\")


def read_properties(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    return values
