"""`ctr kafka …`: the local broker and the platform's topics."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from cli.console import console, fail
from infra.broker import BrokerError, BrokerSettings, EmbeddedBroker
from infra.kafka_settings import KafkaSettings
from infra.status import cluster_status
from infra.topics import KafkaUnavailableError, ensure_topics

app = typer.Typer(
    help="Local Kafka broker and topics (Tansu locally, any Kafka cluster by configuration).",
    no_args_is_help=True,
)


@app.command()
def up() -> None:
    """Start the embedded broker (if KAFKA_BOOTSTRAP_SERVERS is local) and create the topics."""
    kafka = KafkaSettings()
    if kafka.is_loopback and len(kafka.servers) == 1:
        broker = EmbeddedBroker(kafka, BrokerSettings())
        try:
            state = broker.start()
        except (BrokerError, KafkaUnavailableError) as exc:
            fail(str(exc))
        if state.started_by_us:
            console.print(
                f"broker: Tansu running on {kafka.bootstrap_servers} (pid {state.pid}, "
                f"log {broker.settings.log_file})"
            )
        else:
            console.print(f"broker: already answering on {kafka.bootstrap_servers}")
    else:
        console.print(f"broker: using the cluster at {kafka.bootstrap_servers} (none started)")
    create_topics()


@app.command()
def down() -> None:
    """Stop the embedded broker started by `ctr kafka up` (its data is in memory: gone)."""
    kafka = KafkaSettings()
    if not (kafka.is_loopback and len(kafka.servers) == 1):
        console.print(f"broker: {kafka.bootstrap_servers} is not local; nothing to stop")
        return
    stopped = EmbeddedBroker(kafka, BrokerSettings()).stop()
    console.print("broker: stopped" if stopped else "broker: was not running")


@app.command("create-topics")
def create_topics() -> None:
    """Create the event and dead-letter topics if missing (idempotent)."""
    kafka = KafkaSettings()
    try:
        results = ensure_topics(kafka)
    except KafkaUnavailableError as exc:
        fail(str(exc))
    for result in results:
        console.print(f"topic {result.name}: {result.status} ({result.partitions} partitions)")


@app.command()
def status() -> None:
    """Brokers, topics, partitions and their earliest/latest offsets."""
    kafka = KafkaSettings()
    try:
        report = cluster_status(kafka)
    except (KafkaUnavailableError, LookupError) as exc:
        fail(str(exc))
    out = Console()  # the report goes to stdout, messages to stderr
    out.print(f"cluster {report.cluster_id} at {kafka.bootstrap_servers}")
    out.print(f"brokers: {', '.join(report.brokers)} (controller {report.controller_id})")
    table = Table("topic", "partition", "earliest", "latest", "records")
    for p in report.partitions:
        table.add_row(
            p.topic, str(p.partition), f"{p.earliest:,}", f"{p.latest:,}", f"{p.records:,}"
        )
    out.print(table)
    if not report.partitions:
        out.print("no topics yet: run `ctr kafka create-topics`")
