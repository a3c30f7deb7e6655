"""What each login may do: the ACLs of the platform's roles on its topics and consumer groups.

``ctr kafka up --auth scram`` grants them on the local cluster (at every start, idempotently);
for a cluster of your own, docs/guides/kafka.md gives them as ``kafka-acls.sh`` commands
(:func:`kafka_acls_command`, held equal to the page by a unit test). The brokers and the admin
are super users and need none; anything not granted here is refused (no allow-everyone):

- producer: WRITE on the event topic and the dead-letter topic (WRITE implies DESCRIBE, which
  its metadata requests need; and since Kafka 3.0, KIP-679, an idempotent producer needs no
  IDEMPOTENT_WRITE on the cluster once it may write a topic);
- consumer: READ on the event topic (and DESCRIBE, implied: the offsets Spark's driver lists),
  READ on the consumer groups of the archiver and the speed job (by their prefixes, see
  :mod:`runtime.connectors`);
- monitor: DESCRIBE on both topics: their offsets (the dead-letter depth on ``/metrics``), no
  records.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from infra.broker.errors import BrokerError
from infra.broker_auth import Credentials, Role
from runtime.connectors import ARCHIVER_GROUP, SPEED_GROUP
from runtime.kafka_settings import KafkaSettings
from runtime.topics import admin_client

Operation = Literal["READ", "WRITE", "DESCRIBE"]
Resource = Literal["topic", "group"]
_RESOURCES: Final = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}


@dataclass(frozen=True)
class Grant:
    """One ACL: ``role``'s user may do ``operation`` on the ``resource`` called ``name`` (or,
    ``prefixed``, on every one whose name starts with it)."""

    role: Role
    operation: Operation
    resource: Resource
    name: str
    prefixed: bool = False


def platform_grants(kafka: KafkaSettings) -> list[Grant]:
    """The ACLs of the roles on the topics of ``kafka`` (``KAFKA_TOPIC``, ``KAFKA_DLQ_TOPIC``)."""
    return [
        Grant("producer", "WRITE", "topic", kafka.topic),
        Grant("producer", "WRITE", "topic", kafka.dlq_topic),
        Grant("consumer", "READ", "topic", kafka.topic),
        Grant("consumer", "READ", "group", ARCHIVER_GROUP, prefixed=True),
        Grant("consumer", "READ", "group", SPEED_GROUP, prefixed=True),
        Grant("monitor", "DESCRIBE", "topic", kafka.topic),
        Grant("monitor", "DESCRIBE", "topic", kafka.dlq_topic),
    ]


def binding(grant: Grant, principal: str) -> AclBinding:
    """``grant`` for the user ``principal``, from any host."""
    return AclBinding(
        _RESOURCES[grant.resource],
        grant.name,
        ResourcePatternType.PREFIXED if grant.prefixed else ResourcePatternType.LITERAL,
        f"User:{principal}",
        "*",
        getattr(AclOperation, grant.operation),
        AclPermissionType.ALLOW,
    )


def apply_grants(
    admin: KafkaSettings,
    credentials: Credentials,
    grants: Iterable[Grant],
    *,
    timeout_s: float = 30.0,
) -> None:
    """Create the ACLs of ``grants`` for the users of ``credentials`` through ``admin`` (a super
    user's settings): those that exist already stay as they are. Returns once the broker
    answering ``admin`` applies them all."""
    wanted = [binding(g, credentials.user(g.role).username) for g in grants]
    apply_bindings(admin, wanted, timeout_s=timeout_s)


def apply_bindings(
    admin: KafkaSettings, wanted: list[AclBinding], *, timeout_s: float = 30.0
) -> None:
    """Create the ACLs ``wanted`` through ``admin`` (see :func:`apply_grants`). A controller
    that does not answer in time (a broker just restarted, a busy machine) is asked again
    until ``timeout_s`` has passed: creating an ACL that exists is a no-op."""
    client = admin_client(admin)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            for future in client.create_acls(wanted, request_timeout=timeout_s).values():
                future.result()
            break
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.SECURITY_DISABLED:
                raise BrokerError(
                    f"the running cluster has no authorizer ({error.str()}): it was started by "
                    "an earlier version, without ACLs; restart it (`ctr kafka down`, then `ctr "
                    "kafka up`: its data stays) to turn them on"
                ) from None
            if not _worth_again(error) or time.monotonic() > deadline:
                raise BrokerError(f"creating the cluster's ACLs failed: {error}") from None
            time.sleep(0.5)
    # The controller has committed them; each broker applies them as it reads the metadata log.
    deadline = time.monotonic() + timeout_s
    pending = list(wanted)
    while pending:
        pending = [b for b in pending if not _applied(client, b, timeout_s)]
        if pending and time.monotonic() > deadline:
            raise BrokerError(f"the cluster's ACLs were not applied within {timeout_s:g} s")
        if pending:
            time.sleep(0.1)


# The controller or the broker was not there in time: asked again.
_AGAIN: Final = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_CONTROLLER,
    }
)


def _worth_again(error: KafkaError) -> bool:
    return bool(error.retriable()) or error.code() in _AGAIN


def _applied(client: AdminClient, wanted: AclBinding, timeout_s: float) -> bool:
    exactly = AclBindingFilter(
        wanted.restype,
        wanted.name,
        wanted.resource_pattern_type,
        wanted.principal,
        wanted.host,
        wanted.operation,
        wanted.permission_type,
    )
    try:
        return bool(client.describe_acls(exactly, request_timeout=timeout_s).result())
    except KafkaException as exc:
        raise BrokerError(f"reading the cluster's ACLs failed: {exc.args[0]}") from None


def kafka_acls_command(grant: Grant, principal: str) -> str:
    """``grant`` for ``principal`` as Apache Kafka's ``kafka-acls.sh`` adds it (an admin's
    login in ``admin.properties``)."""
    pattern = " --resource-pattern-type prefixed" if grant.prefixed else ""
    return (
        "kafka-acls.sh --bootstrap-server $BOOTSTRAP --command-config admin.properties --add "
        f"--allow-principal User:{principal} --operation {grant.operation.capitalize()} "
        f"--{grant.resource} {grant.name}{pattern}"
    )
