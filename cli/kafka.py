"""`ctr kafka …`: the local Apache Kafka cluster and the platform's topics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from cli.console import SafeConsole, console, fail
from cli.tables import Column, Json, Listing, Wide, one_output, print_json, print_table
from infra.broker_settings import BrokerSettings
from runtime.kafka_settings import KafkaSettings

if TYPE_CHECKING:
    from infra.cluster_status import ClusterStatus

# The Kafka client (confluent_kafka) is imported inside each command: `ctr --help` loads no
# engine.

app = typer.Typer(
    help="Local Apache Kafka cluster (1 or 3 brokers) and the topics; any Kafka cluster by "
    "configuration.",
    no_args_is_help=True,
)


def _local(kafka: KafkaSettings) -> bool:
    """Loopback, or the addresses of the local cluster's network namespaces (--netns)."""
    from infra.netns import BrokerNetwork

    network = BrokerNetwork()
    return kafka.is_loopback or all(network.contains(s.rpartition(":")[0]) for s in kafka.servers)


@app.command()
def up(
    brokers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=3,
            help="1: one broker+controller on the bootstrap port (9092); 3: brokers on 9092, "
            "9093, 9094 and a controller, topics with 3 replicas and min.insync.replicas=2. "
            "Default: what RUN_DIR/kafka holds, else 1.",
        ),
    ] = None,
    netns: Annotated[
        bool,
        typer.Option(
            "--netns",
            help="3 brokers, each in its own network namespace (10.77.0.1-3:<port>, the "
            "controller on the bridge 10.77.0.254), so that `ctr kafka partition N` can cut "
            "one off from the others and the clients. Needs root and iproute2.",
        ),
    ] = False,
    auth: Annotated[
        str | None,
        typer.Option(
            "--auth",
            metavar="none|scram|scram-sha-512",
            help="Authentication on the brokers' listener. scram (SCRAM-SHA-256) or "
            "scram-sha-512: SASL_PLAINTEXT, SCRAM logins only (the brokers' own too), every "
            "request authorized by ACLs; the controller's listener takes the brokers' and the "
            "admin's SASL/PLAIN logins only. A user per role (admin, producer, consumer, "
            "monitor), whose random passwords are generated once into RUN_DIR/kafka/"
            "credentials.json (owner-only); RUN_DIR/kafka/client.env holds the admin's KAFKA_* "
            "settings, producer.env, consumer.env and monitor.env the others' (source one). A "
            "cluster that has none gets its users when first started with --auth (it must be "
            "stopped; its data stays), a cluster from before the roles gets theirs at its next "
            "start; --auth none turns logins off again. Default: KAFKA_LOCAL_AUTH, else what "
            "RUN_DIR/kafka holds, else none.",
        ),
    ] = None,
    tls: Annotated[
        bool | None,
        typer.Option(
            "--tls/--no-tls",
            help="With --auth: the listener is SASL_SSL, with a certificate for the brokers' "
            "addresses made once by the JDK's keytool under RUN_DIR/kafka/tls (ca.pem: the "
            "clients' KAFKA_SSL_CA_LOCATION). Default: KAFKA_LOCAL_TLS, else as the cluster is.",
        ),
    ] = None,
) -> None:
    """Start the local Kafka cluster (if KAFKA_BOOTSTRAP_SERVERS is local) and create the
    topics. Its log directories live under RUN_DIR/kafka: records and offsets survive
    `ctr kafka down`."""
    from infra.broker import LocalKafka
    from infra.netns import BrokerNetwork

    kafka = KafkaSettings()
    if brokers == 2:
        fail("--brokers: 1 or 3 (a quorum-friendly cluster), not 2")
    if netns and brokers == 1:
        fail("--netns: the isolated cluster has 3 brokers (--brokers 3 or no --brokers)")
    if _local(kafka):
        try:
            settings = BrokerSettings() if auth is None else BrokerSettings(local_auth=auth)
        except ValueError as exc:
            raise typer.BadParameter(_first_error(exc), param_hint="--auth") from None
        if tls is not None:
            settings = settings.model_copy(update={"local_tls": tls})
        cluster = LocalKafka(
            kafka, settings, brokers=brokers, network=BrokerNetwork() if netns else None
        )
        console.print("broker: starting Apache Kafka (KRaft) …")
        state = cluster.start()
        if state.started_by_us:
            layout = cluster.layout()
            nodes = ", ".join(
                f"node {n.node_id} ({n.roles}, {n.address}, pid {state.pids.get(n.node_id)})"
                for n in layout.nodes
            )
            console.print(
                f"broker: {len(layout.brokers)} broker(s) at {state.bootstrap_servers}: {nodes}; "
                f"logs and data under {cluster.settings.kafka_dir}"
            )
            if layout.auth is not None:
                directory = cluster.settings.kafka_dir
                console.print(
                    f"        clients log in with SASL/{layout.auth}"
                    f"{' over TLS' if layout.tls else ''}, one login per role, each allowed "
                    "what its ACLs grant: source its owner-only env file (KAFKA_* settings, "
                    f"the password included): the admin ({cluster.kafka.sasl_username!r}): "
                    f"{cluster.client_env_file}; producers: {directory / 'producer.env'}; the "
                    f"archiver and the speed job: {directory / 'consumer.env'}; the API: "
                    f"{directory / 'monitor.env'}"
                )
            elif len(layout.brokers) > 1 or state.bootstrap_servers != kafka.bootstrap_servers:
                console.print(f"        clients: KAFKA_BOOTSTRAP_SERVERS={state.bootstrap_servers}")
            kafka = cluster.client_settings(layout)
        else:
            console.print(f"broker: already answering on {kafka.bootstrap_servers} (not ours)")
    else:
        console.print(f"broker: using the cluster at {kafka.bootstrap_servers} (none started)")
    _create_topics(kafka)


@app.command()
def down(
    delete_data: Annotated[
        bool,
        typer.Option(
            "--delete-data", help="Also delete RUN_DIR/kafka: every record and offset goes."
        ),
    ] = False,
) -> None:
    """Stop the local cluster started by `ctr kafka up` (its data stays unless --delete-data)."""
    from infra.broker import LocalKafka

    kafka = KafkaSettings()
    if not _local(kafka):
        console.print(f"broker: {kafka.bootstrap_servers} is not local; nothing to stop")
        return
    cluster = LocalKafka(kafka, BrokerSettings())
    stopped = cluster.stop(delete_data=delete_data)
    message = "broker: stopped" if stopped else "broker: was not running"
    if delete_data:
        message += f"; deleted {cluster.settings.kafka_dir}"
    console.print(message)


@app.command()
def partition(
    node: Annotated[int, typer.Argument(metavar="NODE", help="the broker's node id (1-3)")],
    heal: Annotated[
        bool, typer.Option("--heal", help="Bring it back instead (its link up again).")
    ] = False,
) -> None:
    """Cut a broker of the isolated cluster (`ctr kafka up --netns`) off from the controller,
    the other brokers and every client (its process runs on), or --heal it."""
    from infra.broker import LocalKafka

    layout = LocalKafka(KafkaSettings(), BrokerSettings()).existing_layout()
    if layout is None or layout.network is None:
        fail("no isolated cluster here: start one with `ctr kafka up --netns`")
    if node not in [n.node_id for n in layout.brokers]:
        fail(f"node {node}: the brokers are {[n.node_id for n in layout.brokers]}")
    if heal:
        layout.network.heal(node)
    else:
        layout.network.partition(node)
    console.print(f"broker {node}: {'healed' if heal else 'cut off'}")


@app.command("create-topics")
def create_topics() -> None:
    """Create the event and dead-letter topics if missing (idempotent)."""
    kafka = KafkaSettings()
    _create_topics(_local_cluster_client(kafka) or kafka)


def _local_cluster_client(kafka: KafkaSettings) -> KafkaSettings | None:
    """For the local cluster under RUN_DIR/kafka, the settings of its clients (its addresses,
    its client user's credentials when it requires logins); None if there is none."""
    from infra.broker import LocalKafka

    if not _local(kafka):
        return None
    cluster = LocalKafka(kafka, BrokerSettings())
    layout = cluster.existing_layout()
    return None if layout is None else cluster.client_settings(layout)


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return str(errors()[0].get("msg", exc))
    return str(exc)


def _create_topics(kafka: KafkaSettings) -> None:
    from runtime.topics import ensure_topics

    results = ensure_topics(kafka)
    for result in results:
        console.print(f"topic {result.name}: {result.status} ({result.partitions} partitions)")


@app.command()
def status(wide: Wide = False, as_json: Json = False) -> None:
    """Brokers, the controller, and per partition its leader, replicas, in-sync replicas and
    earliest/latest offsets."""
    from infra.broker import BrokerError, LocalKafka
    from infra.cluster_status import cluster_status
    from runtime.topics import KafkaUnavailableError

    one_output(as_json, wide)
    kafka = KafkaSettings()
    controller = "controller {} (as reported by the brokers)"
    if _local(kafka):
        cluster = LocalKafka(kafka, BrokerSettings())
        try:
            layout = cluster.existing_layout()
            if layout is not None:
                kafka = cluster.client_settings(layout)
        except BrokerError:
            layout = None
        if layout is not None:
            node = layout.controller
            controller = (
                f"controller: node {node.node_id} at {node.host}:{node.controller_port} "
                "(the KRaft quorum's only voter)"
            )
    try:
        report = cluster_status(kafka)
    except (KafkaUnavailableError, LookupError) as exc:
        fail(str(exc))
    if as_json:
        print_json(status_record(report, kafka.bootstrap_servers))
        return
    out = SafeConsole()  # the report goes to stdout, messages to stderr
    out.print(f"cluster {report.cluster_id} at {kafka.bootstrap_servers}")
    brokers = ", ".join(f"{i}@{address}" for i, address in sorted(report.brokers.items()))
    out.print(f"brokers: {brokers}")
    out.print(controller.format(report.controller_id))
    print_table(partitions_listing(report), out, wide=wide)
    under = sum(p.under_replicated for p in report.partitions)
    if under:
        out.print(f"{under} partition(s) under-replicated (in-sync replicas < replicas)")
    if not report.partitions:
        out.print("no topics yet: run `ctr kafka create-topics`")


def partitions_listing(report: ClusterStatus) -> Listing:
    """``ctr kafka status``'s table: a row per partition."""
    listing = Listing(
        Column("topic", whole=True),
        Column("partition", whole=True, justify="right"),
        "leader",
        "replicas",
        "isr",
        Column("earliest", whole=True, justify="right"),
        Column("latest", whole=True, justify="right"),
    )
    for p in report.partitions:
        isr = ",".join(map(str, p.isr))
        listing.add_row(
            p.topic,
            str(p.partition),
            str(p.leader) if p.leader >= 0 else Text("none", style="red"),
            ",".join(map(str, p.replicas)),
            Text(isr, style="yellow") if p.under_replicated else isr,
            f"{p.earliest:,}",
            f"{p.latest:,}",
        )
    return listing


def status_record(report: ClusterStatus, bootstrap_servers: str) -> dict[str, object]:
    """``ctr kafka status --json`` (a partition without a leader: ``leader`` None)."""
    return {
        "cluster_id": report.cluster_id,
        "bootstrap_servers": bootstrap_servers,
        "brokers": {str(i): address for i, address in sorted(report.brokers.items())},
        "controller_id": report.controller_id,
        "partitions": [
            {
                "topic": p.topic,
                "partition": p.partition,
                "leader": p.leader if p.leader >= 0 else None,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "under_replicated": p.under_replicated,
                "earliest": p.earliest,
                "latest": p.latest,
            }
            for p in report.partitions
        ],
    }
