"""The logins the local cluster's listener requires: none, or SASL/SCRAM (over TLS or not),
chosen by ``KAFKA_LOCAL_AUTH`` / ``KAFKA_LOCAL_TLS`` or kept as the cluster was formatted;
the users' credentials in ``credentials.json`` and the brokers' certificate under ``tls/``
(files made by :mod:`infra.broker_auth`); the users of the running cluster completed, and the
roles' env files written."""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import Future

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from infra.broker.errors import BrokerError
from infra.broker.layout import Layout
from infra.broker_auth import (
    ROLES,
    Credentials,
    CredentialsError,
    User,
    ensure_tls,
    load_credentials,
    load_or_create_credentials,
    load_tls,
    write_client_env,
    write_client_properties,
)
from infra.broker_settings import BrokerSettings
from runtime.kafka_settings import KafkaSettings
from runtime.topics import KafkaAuthenticationError, admin_client, wait_for_cluster


class Logins:
    """What the settings ask of the cluster's logins, and the credentials it has."""

    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.credentials_file = settings.kafka_dir / "credentials.json"
        self.tls_dir = settings.kafka_dir / "tls"

    def check(self, layout: Layout) -> None:
        """The authentication asked for (``local_auth``) is the cluster's, or one it can be
        switched to (``LocalKafka._switch_auth``): none and SCRAM either way, not one SCRAM
        mechanism for the other."""
        asked = self.settings.local_auth
        if asked in (None, "none") or layout.auth in (None, asked):
            return
        raise BrokerError(
            f"the cluster under {self.settings.kafka_dir} requires {layout.auth} logins, not "
            f"{asked} (KAFKA_LOCAL_AUTH / --auth): its users were created for {layout.auth}; "
            "`ctr kafka down --delete-data` first (its records go), or use another RUN_DIR"
        )

    def wanted_auth(self, layout: Layout) -> str | None:
        """The mechanism the cluster should require from this start on (None: no logins)."""
        asked = self.settings.local_auth
        if asked is None:
            return layout.auth
        return None if asked == "none" else asked

    def wanted_tls(self, auth: str | None, current: bool) -> bool:
        """Whether the listener should be SASL_SSL from this start on (``local_tls``, else as
        it is; never without logins)."""
        asked = self.settings.local_tls
        if asked and auth is None:
            raise BrokerError(
                "TLS on the local cluster (KAFKA_LOCAL_TLS / --tls) comes with SCRAM logins: "
                "add --auth scram (KAFKA_LOCAL_AUTH=scram)"
            )
        return bool(current if asked is None else asked) and auth is not None

    def credentials(self, layout: Layout | None) -> Credentials | None:
        """The SCRAM users of the cluster (None without authentication)."""
        if layout is None or layout.auth is None:
            return None
        try:
            credentials = load_credentials(self.credentials_file)
            if layout.tls:
                credentials = dataclasses.replace(credentials, tls=load_tls(self.tls_dir))
        except CredentialsError as exc:
            raise BrokerError(str(exc)) from None
        return credentials

    def for_start(self, layout: Layout, *, formatted: bool) -> Credentials | None:
        """The cluster's credentials: those recorded (with a new user for each role they
        lack: :meth:`complete_users` creates it once the cluster runs), or for a cluster not
        ``formatted`` yet, new ones (kept in ``credentials.json``, owner-only, with the
        cluster's directory)."""
        if layout.auth is None:
            return None
        self.settings.kafka_dir.mkdir(parents=True, exist_ok=True)
        self.settings.kafka_dir.chmod(0o700)
        try:
            if formatted:  # its file must be there: the users are in its metadata
                load_credentials(self.credentials_file)
            credentials = load_or_create_credentials(self.credentials_file, layout.auth)
            if layout.tls:  # the brokers' certificate: made once, valid for their addresses
                hosts = [n.host for n in layout.brokers]
                files = ensure_tls(self.tls_dir, hosts, self.settings.java)
                credentials = dataclasses.replace(credentials, tls=files)
        except CredentialsError as exc:
            raise BrokerError(str(exc)) from None
        return credentials

    def create_users(self, kafka: KafkaSettings, mechanism: str) -> None:
        """The users of ``credentials.json`` (made now if missing) for ``mechanism``, created
        through the Admin API of the running cluster ``kafka`` reaches."""
        try:
            credentials = load_or_create_credentials(self.credentials_file, mechanism)
            _create_users(kafka, mechanism, credentials.users)
        except CredentialsError as exc:
            raise BrokerError(str(exc)) from None

    def complete_users(self, admin: KafkaSettings, credentials: Credentials) -> None:
        """Create, through ``admin`` (a super user's settings), the users of ``credentials``
        the running cluster lacks (the roles a file from before them did not have), and wait
        until they can log in."""
        client = admin_client(admin)
        try:
            described = client.describe_user_scram_credentials()
            assert isinstance(described, Future)  # one future when asked for every user
            existing = described.result(timeout=60)
        except KafkaException as exc:
            raise BrokerError(f"listing the cluster's SCRAM users failed: {exc}") from None
        missing = [u for u in credentials.users if u.username not in existing]
        if not missing:
            return
        _create_users(admin, credentials.mechanism, missing)
        for role in ROLES:  # the brokers learn new users from the metadata log
            if credentials.user(role) in missing:
                _wait_for_login(credentials.client_settings(admin, role))

    def write_client_files(self, kafka: KafkaSettings, credentials: Credentials) -> None:
        """Each role's settings as ``export`` lines (``<role>.env``, the admin's
        ``client.env``), and the admin's login as librdkafka properties, all owner-only."""
        for role in ROLES:
            name = "client.env" if role == "admin" else f"{role}.env"
            write_client_env(
                self.settings.kafka_dir / name, credentials.client_settings(kafka, role)
            )
        write_client_properties(
            self.settings.kafka_dir / "client.properties", credentials.client_settings(kafka)
        )


def _create_users(kafka: KafkaSettings, mechanism_name: str, users: list[User]) -> None:
    """The SCRAM ``users``, created through the Admin API of a running cluster."""
    mechanism = {
        "SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256,
        "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512,
    }[mechanism_name]
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            user.username, ScramCredentialInfo(mechanism, 8192), user.password.encode()
        )
        for user in users
    ]
    admin = admin_client(kafka)
    try:
        for future in admin.alter_user_scram_credentials(upserts).values():
            future.result(timeout=60)
    except KafkaException as exc:
        raise BrokerError(f"creating the cluster's SCRAM users failed: {exc}") from None


def _wait_for_login(kafka: KafkaSettings, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            wait_for_cluster(kafka, timeout_s=5)
            return
        except KafkaAuthenticationError:
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"the new user {kafka.sasl_username!r} was not accepted within {timeout_s:g} s"
                ) from None
