"""SASL logins on the local cluster: its credentials, generated once and kept owner-only.

With authentication on (``ctr kafka up --auth scram``, ``KAFKA_LOCAL_AUTH=scram``), the
brokers' listener speaks SASL_PLAINTEXT (SASL_SSL with TLS) and accepts only SCRAM logins, and
every request is authorized (Kafka's StandardAuthorizer, no allow-everyone): a login may do
only what an ACL (:mod:`infra.broker.acls`) grants it. The users, one per role:

- ``ctr-broker``: the brokers, to each other and to the controller (a super user);
- ``ctr-admin``: the platform's admin (a super user): ``ctr kafka …``, the tests, an operator;
- ``ctr-producer``: the ad servers and ``ctr produce`` / ``ctr replay``: write the event topic
  and the dead-letter topic, nothing else;
- ``ctr-consumer``: the archiver and the speed job: read the event topic, in their own
  consumer groups;
- ``ctr-monitor``: the API: the topics' offsets (``/metrics``' dead-letter depth), no records.

They are created when the log directories are formatted (``kafka-storage format
--add-scram``, KIP-900), or through the Admin API: for a cluster formatted without logins when
it is first started with them, and for a cluster whose ``credentials.json`` predates a role
(it had one client user, ``ctr``, which stays its admin) at its next start. Their random
passwords are in ``RUN_DIR/kafka/credentials.json`` (mode 600), reused by every later start of
the same cluster's data: SCRAM credentials live in the cluster's metadata, not in its
configuration. ``RUN_DIR/kafka/<role>.env`` (mode 600; the admin's is ``client.env``) holds a
role's settings as ``export`` lines for a shell (``source`` it),
``RUN_DIR/kafka/client.properties`` the admin's login as librdkafka properties (``kcat -F``).

The KRaft controller's listener takes SASL/PLAIN logins (SASL_PLAINTEXT), from the brokers'
user and the admin only. SCRAM cannot authenticate there: a controller would have to read the
credentials from the metadata it serves, so Kafka accepts only mechanisms whose users are in
the configuration (PLAIN's ``user_<name>`` JAAS options, in each node's owner-only
``server.properties``) or certificates (mTLS). PLAIN rather than mTLS: it needs no CA nor a
client certificate per node and tool, and its password never crosses a network, since the
local cluster's controller listens on loopback (or on the namespaces' private bridge), which
only root can observe, and root reads ``credentials.json`` anyway. On a cluster of your own,
use SASL_SSL or mTLS there (docs/guides/kafka.md).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import secrets
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final, Literal

from pydantic import SecretStr

from infra.errors import InfraError
from runtime.kafka_settings import KafkaSettings

BROKER_USER: Final = "ctr-broker"
# The users of the platform's roles (the admin of a cluster made before the roles: "ctr").
USERS: Final[dict[str, str]] = {
    "admin": "ctr-admin",
    "producer": "ctr-producer",
    "consumer": "ctr-consumer",
    "monitor": "ctr-monitor",
}
Role = Literal["admin", "producer", "consumer", "monitor"]
ROLES: Final[tuple[Role, ...]] = ("admin", "producer", "consumer", "monitor")
MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")
# The listener clients and brokers use when authentication is on, without and with TLS.
SASL_LISTENER: Final = "SASL_PLAINTEXT"
SASL_TLS_LISTENER: Final = "SASL_SSL"
SCRAM_MODULE: Final = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_MODULE: Final = "org.apache.kafka.common.security.plain.PlainLoginModule"
# The controller listener's mechanism (see the module's docstring) and protocol.
CONTROLLER_MECHANISM: Final = "PLAIN"
CONTROLLER_PROTOCOL: Final = "SASL_PLAINTEXT"


class CredentialsError(InfraError, RuntimeError):
    """The credentials file is missing, unreadable or damaged; the message names the fix."""


def auth_mechanism(value: str | None) -> str | None:
    """``none``/``scram``/``scram-sha-256``/``scram-sha-512`` (any case) as the SCRAM mechanism
    it means, None for no authentication; ValueError for anything else."""
    if value is None:
        return None
    name = value.strip().upper()
    if name in ("", "NONE", "PLAINTEXT"):
        return None
    if name == "SCRAM":
        return MECHANISMS[0]
    if name in MECHANISMS:
        return name
    raise ValueError(f"{value!r}: none, scram (SCRAM-SHA-256), scram-sha-256 or scram-sha-512")


@dataclass(frozen=True)
class User:
    username: str
    password: str

    @classmethod
    def generate(cls, username: str) -> User:
        # URL-safe characters only: nothing to quote in server.properties, in JAAS or in
        # kafka-storage's [name=…,password=…] syntax.
        return cls(username, secrets.token_urlsafe(32))

    def __repr__(self) -> str:  # never the password
        return f"User({self.username!r}, password=***)"


@dataclass(frozen=True)
class TlsFiles:
    """The brokers' TLS key and certificate (PKCS12, one for every broker: its names are all
    the brokers' addresses), that certificate as the clients' trust anchor (PEM), and the
    keystore's password."""

    keystore: Path
    ca: Path
    password: str

    def __repr__(self) -> str:  # never the password
        return f"TlsFiles({str(self.keystore)!r}, ca={str(self.ca)!r}, password=***)"


@dataclass(frozen=True)
class Credentials:
    """The local cluster's SCRAM mechanism, the brokers' user and a user per role (a role
    None: the file predates it, and the next start creates it); with ``tls``, the listener is
    SASL_SSL."""

    mechanism: str
    broker: User
    roles: dict[Role, User | None]
    tls: TlsFiles | None = None

    @property
    def listener(self) -> str:
        return SASL_LISTENER if self.tls is None else SASL_TLS_LISTENER

    @property
    def admin(self) -> User:
        admin = self.roles.get("admin")
        if admin is None:  # every file has it (a file of before the roles: as "client")
            raise CredentialsError("the credentials file names no admin user")
        return admin

    @property
    def users(self) -> list[User]:
        """Every user, the brokers' first (the roles' that the file has)."""
        return [self.broker, *(u for u in self.roles.values() if u is not None)]

    @property
    def complete(self) -> bool:
        return all(self.roles.get(role) is not None for role in ROLES)

    @property
    def super_users(self) -> list[str]:
        """The principals every request is allowed: the brokers and the platform's admin."""
        return [self.broker.username, self.admin.username]

    @classmethod
    def generate(cls, mechanism: str) -> Credentials:
        return cls(
            mechanism,
            User.generate(BROKER_USER),
            {role: User.generate(USERS[role]) for role in ROLES},
        )

    def completed(self) -> Credentials:
        """These credentials with a new user for every role they lack."""
        roles: dict[Role, User | None] = {
            role: self.roles.get(role) or User.generate(USERS[role]) for role in ROLES
        }
        return dataclasses.replace(self, roles=roles)

    def user(self, role: Role) -> User:
        found = self.roles.get(role)
        if found is None:
            raise CredentialsError(
                f"the cluster has no {role} user yet (its credentials predate the roles): "
                "start it once with `ctr kafka up` to create it"
            )
        return found

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments that put every user in the cluster's metadata."""
        return [
            argument
            for user in self.users
            for argument in (
                "--add-scram",
                f"{self.mechanism}=[name={user.username},password={user.password}]",
            )
        ]

    def broker_jaas(self) -> str:
        """What a broker logs in to the other brokers with (its listener's JAAS line)."""
        return (
            f'{SCRAM_MODULE} required username="{self.broker.username}" '
            f'password="{self.broker.password}";'
        )

    def controller_jaas(self) -> str:
        """The controller listener's JAAS line: the login a node uses to reach the controller
        (the brokers' user), and the users the controller accepts (the brokers' and the
        admin's)."""
        accepted = " ".join(
            f'user_{user.username}="{user.password}"' for user in (self.broker, self.admin)
        )
        return (
            f'{PLAIN_MODULE} required username="{self.broker.username}" '
            f'password="{self.broker.password}" {accepted};'
        )

    def client_settings(self, kafka: KafkaSettings, role: Role = "admin") -> KafkaSettings:
        """``kafka`` logging in as the user of ``role`` (the admin by default), over TLS,
        trusting the brokers' certificate, if the listener has it."""
        user = self.user(role)
        return kafka.model_copy(
            update={
                "security_protocol": self.listener,
                "sasl_mechanism": self.mechanism,
                "sasl_username": user.username,
                "sasl_password": SecretStr(user.password),
                "ssl_ca_location": None if self.tls is None else self.tls.ca,
            }
        )

    def to_json(self) -> str:
        raw: dict[str, object] = {"mechanism": self.mechanism, "broker": asdict(self.broker)}
        raw.update({role: asdict(user) for role, user in self.roles.items() if user is not None})
        return json.dumps(raw, indent=2) + "\n"


def load_credentials(path: Path) -> Credentials:
    """The credentials of ``path``; :class:`CredentialsError` naming the fix if unreadable.
    A file of before the roles has its one client user as the admin, and no other role."""
    try:
        raw = json.loads(path.read_text())
        roles: dict[Role, User | None] = {
            role: User(**raw[role]) if role in raw else None for role in ROLES
        }
        if roles["admin"] is None:
            roles["admin"] = User(**raw["client"])
        return Credentials(raw["mechanism"], User(**raw["broker"]), roles)
    except FileNotFoundError:
        raise CredentialsError(
            f"{path} is missing, but this cluster was formatted with SCRAM credentials (they "
            "live in its metadata): without the file no client can log in; `ctr kafka down "
            "--delete-data` starts an empty cluster with new ones"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CredentialsError(
            f"{path} is damaged or unreadable ({type(exc).__name__}); `ctr kafka down "
            "--delete-data` starts an empty cluster with new credentials"
        ) from None


def load_or_create_credentials(path: Path, mechanism: str) -> Credentials:
    """The credentials of ``path`` with a user for every role (those it lacked made now), or
    new ones; written there (mode 600) when anything was made."""
    if path.exists():
        found = load_credentials(path)
        if found.mechanism != mechanism:
            raise CredentialsError(
                f"{path} holds {found.mechanism} credentials, not {mechanism}: the cluster was "
                "formatted with those"
            )
        if found.complete:
            return found
        created = found.completed()
    else:
        created = Credentials.generate(mechanism)
    write_private(path, created.to_json())
    return created


def load_tls(directory: Path) -> TlsFiles:
    """The TLS files under ``directory``; :class:`CredentialsError` naming the fix if missing."""
    files = TlsFiles(directory / "broker.p12", directory / "ca.pem", "")
    try:
        password = (directory / "keystore.password").read_text().strip()
    except OSError:
        password = ""
    if not password or not files.keystore.is_file() or not files.ca.is_file():
        raise CredentialsError(
            f"the brokers' TLS files under {directory} are missing or incomplete; start the "
            "cluster with `ctr kafka up --tls` to generate them again"
        )
    return TlsFiles(files.keystore, files.ca, password)


def ensure_tls(directory: Path, hosts: Iterable[str], java: str) -> TlsFiles:
    """The TLS files under ``directory``, generated with the JDK's keytool if missing: an EC key
    and a self-signed certificate valid for ``hosts`` (IP addresses or names) and ten years."""
    try:
        return load_tls(directory)
    except CredentialsError:
        pass
    keytool = _keytool(java)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    password = secrets.token_urlsafe(24)
    keystore, ca = directory / "broker.p12", directory / "ca.pem"
    keystore.unlink(missing_ok=True)
    names = ",".join(f"ip:{host}" if _is_ip(host) else f"dns:{host}" for host in sorted(set(hosts)))
    # The password through the environment (keytool's :env), not the command line.
    environment = {**os.environ, "CTR_KEYSTORE_PASSWORD": password}
    common = ["-storetype", "PKCS12", "-keystore", str(keystore), "-alias", "broker"]
    for command in (
        [keytool, "-genkeypair", *common, "-keyalg", "EC", "-groupname", "secp256r1",
         "-sigalg", "SHA256withECDSA", "-dname", "CN=ctr-lambda local Kafka",
         "-ext", f"SAN={names}", "-ext", "bc:c", "-validity", "3650",
         "-storepass:env", "CTR_KEYSTORE_PASSWORD", "-keypass:env", "CTR_KEYSTORE_PASSWORD"],
        [keytool, "-exportcert", "-rfc", *common, "-file", str(ca),
         "-storepass:env", "CTR_KEYSTORE_PASSWORD"],
    ):  # fmt: skip
        done = subprocess.run(
            command, env=environment, capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise CredentialsError(
                f"keytool could not make the brokers' TLS certificate: "
                f"{(done.stderr or done.stdout).strip()[:300]}"
            )
    keystore.chmod(0o600)
    write_private(directory / "keystore.password", password + "\n")
    return TlsFiles(keystore, ca, password)


def _keytool(java: str) -> str:
    """The keytool of the JDK/JRE that ``java`` belongs to (else the one on PATH)."""
    resolved = shutil.which(java)
    if resolved is not None:
        beside = Path(resolved).resolve().with_name("keytool")
        if beside.is_file():
            return str(beside)
    found = shutil.which("keytool")
    if found is None:
        raise CredentialsError(
            "keytool (part of every Java runtime) is not found next to java or on PATH: "
            "TLS for the local cluster needs it"
        )
    return found


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def write_client_env(path: Path, kafka: KafkaSettings) -> None:
    """``export`` lines of ``kafka``'s connection (credentials included) for a shell, mode 600."""
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in kafka.environ().items())
    write_private(
        path,
        "# the local Kafka cluster's client settings (source this file); owner-only: it holds "
        "the password\n"
        f"export {exports}\n",
    )


def write_client_properties(path: Path, kafka: KafkaSettings) -> None:
    """The same login as librdkafka properties, mode 600: ``kcat -F path`` and other
    librdkafka tools (kcat needs librdkafka 2.6.1 or newer for SCRAM with Kafka 4)."""
    lines = "".join(f"{name}={value}\n" for name, value in kafka.security_config().items())
    write_private(path, "# the local Kafka cluster's client login (kcat -F this-file)\n" + lines)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, from the first byte on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
        os.chmod(temporary, 0o600)  # an existing file keeps its mode through O_CREAT
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
