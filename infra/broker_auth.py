"""SASL/SCRAM on the local cluster: its credentials, generated once and kept owner-only.

With authentication on (``ctr kafka up --auth scram``, ``KAFKA_LOCAL_AUTH=scram``), the
brokers' listener speaks SASL_PLAINTEXT and accepts only SCRAM logins. Two users are created
when the log directories are formatted (``kafka-storage format --add-scram``, KIP-900), or, for
a cluster formatted without, through the Admin API when it is first started with
authentication: one the brokers log in with to each other, one for the platform's clients.
Their random passwords are in ``RUN_DIR/kafka/credentials.json`` (mode 600), reused by every
later start of the same cluster's data: SCRAM credentials live in the cluster's metadata, not in
its configuration.
``RUN_DIR/kafka/client.env`` (mode 600) holds the clients' settings as ``export`` lines for a
shell (``source`` it), ``RUN_DIR/kafka/client.properties`` the login as librdkafka properties
(``kcat -F``). The KRaft controller's listener stays PLAINTEXT on its own address
(SCRAM cannot authenticate controllers: their credentials are in the metadata they serve).
"""

from __future__ import annotations

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
from typing import Final

from pydantic import SecretStr

from infra.errors import InfraError
from runtime.kafka_settings import KafkaSettings

BROKER_USER: Final = "ctr-broker"
CLIENT_USER: Final = "ctr"
MECHANISMS: Final = ("SCRAM-SHA-256", "SCRAM-SHA-512")
# The listener clients and brokers use when authentication is on, without and with TLS.
SASL_LISTENER: Final = "SASL_PLAINTEXT"
SASL_TLS_LISTENER: Final = "SASL_SSL"
SCRAM_MODULE: Final = "org.apache.kafka.common.security.scram.ScramLoginModule"


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
    """The local cluster's SCRAM mechanism and its two users; with ``tls``, the listener is
    SASL_SSL."""

    mechanism: str
    broker: User
    client: User
    tls: TlsFiles | None = None

    @property
    def listener(self) -> str:
        return SASL_LISTENER if self.tls is None else SASL_TLS_LISTENER

    @classmethod
    def generate(cls, mechanism: str) -> Credentials:
        # URL-safe characters only: nothing to quote in server.properties, in JAAS or in
        # kafka-storage's [name=…,password=…] syntax.
        return cls(
            mechanism,
            User(BROKER_USER, secrets.token_urlsafe(32)),
            User(CLIENT_USER, secrets.token_urlsafe(32)),
        )

    def scram_arguments(self) -> list[str]:
        """``kafka-storage format`` arguments that put both users in the cluster's metadata."""
        return [
            argument
            for user in (self.broker, self.client)
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

    def client_settings(self, kafka: KafkaSettings) -> KafkaSettings:
        """``kafka`` logging in as the cluster's client user (over TLS, trusting the brokers'
        certificate, if the listener has it)."""
        return kafka.model_copy(
            update={
                "security_protocol": self.listener,
                "sasl_mechanism": self.mechanism,
                "sasl_username": self.client.username,
                "sasl_password": SecretStr(self.client.password),
                "ssl_ca_location": None if self.tls is None else self.tls.ca,
            }
        )


def load_credentials(path: Path) -> Credentials:
    """The credentials of ``path``; :class:`CredentialsError` naming the fix if unreadable."""
    try:
        raw = json.loads(path.read_text())
        return Credentials(raw["mechanism"], User(**raw["broker"]), User(**raw["client"]))
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
    """The credentials of ``path``, or new ones written there (mode 600) if it does not
    exist yet."""
    if path.exists():
        found = load_credentials(path)
        if found.mechanism != mechanism:
            raise CredentialsError(
                f"{path} holds {found.mechanism} credentials, not {mechanism}: the cluster was "
                "formatted with those"
            )
        return found
    created = Credentials.generate(mechanism)
    raw = {
        "mechanism": mechanism,
        "broker": asdict(created.broker),
        "client": asdict(created.client),
    }
    write_private(path, json.dumps(raw, indent=2) + "\n")
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
