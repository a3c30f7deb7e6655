"""`ctr produce` and `ctr replay`: events into Kafka."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.console import console, fail, progress_bar, styled
from runtime.kafka_settings import KafkaSettings
from runtime.shutdown import StopRequest

# The producer and the generators (confluent_kafka, msgspec) are imported where a command runs
# them: `ctr --help` loads no engine.
if TYPE_CHECKING:
    from ingest.ground_truth import GroundTruth
    from ingest.producer import DeliveryStats, EventProducer
    from ingest.send_loop import Pacing, ProduceSummary
    from ingest.traffic import TrafficConfig

DEFAULT_CLOCK_RATE = 1000.0


def _parse_time(value: str | None, option: str) -> int | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"not an ISO-8601 time: {value!r}", param_hint=option) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def _open_producer(validate_records: bool = True) -> EventProducer:
    from ingest.producer import EventProducer
    from ingest.settings import ProducerSettings

    producer = EventProducer(KafkaSettings(), ProducerSettings(), validate_records=validate_records)
    producer.check_ready()
    return producer


def _report_delivery(stats: DeliveryStats) -> None:
    console.print(
        f"delivered {stats.delivered:,} to the event topic, "
        f"{stats.dead_letter_delivered:,} to the dead-letter topic, {stats.failed:,} failed"
    )
    if stats.invalid_reasons:
        top = ", ".join(f"{field} {n:,}" for field, n in stats.invalid_reasons.most_common(6))
        console.print(f"dead-lettered by field: {top}")
    if stats.failed:
        for error in stats.errors:
            console.print(styled("  ", "red", str(error)))
        fail(f"{stats.failed:,} record(s) were not delivered")


def produce(
    events: Annotated[
        int | None,
        typer.Option(help="Stop after this many records (all kinds). Default: no limit."),
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="Stop after this many seconds. Default: no limit.")
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(
            help="Records per second, paced by the wall clock. Default: as fast as possible."
        ),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="RNG seed; with --start the stream is byte-identical.")
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(
            help="Event time of the first record (ISO-8601, UTC if no offset). Default: now, or "
            "with --events and no --rate, early enough that the last record is about now. With "
            "--rate and a past --start: the records up to now at once (a backlog, as after an "
            "outage), then at --rate, the clicks of the backlog's impressions in their time."
        ),
    ] = None,
    clock_rate: Annotated[
        float,
        typer.Option(help="Without --rate: records per second of event time in the stream."),
    ] = DEFAULT_CLOCK_RATE,
    duplicates: Annotated[
        float, typer.Option(min=0, max=0.5, help="Share of records that resend an earlier event.")
    ] = 0.0,
    late: Annotated[
        float,
        typer.Option(min=0, max=0.9, help="Share of events whose event_time is 10 min to 3 h old."),
    ] = 0.0,
    malformed: Annotated[
        float, typer.Option(min=0, max=0.5, help="Share of records that break the contract.")
    ] = 0.0,
    repeat_clicks: Annotated[
        float,
        typer.Option(
            min=0,
            max=0.9,
            help="Share of clicks followed by a second click on the same impression.",
        ),
    ] = 0.0,
    orphan_clicks: Annotated[
        float,
        typer.Option(
            min=0,
            max=0.9,
            help="Share of clicks followed by a click naming an impression never sent.",
        ),
    ] = 0.0,
    campaigns: Annotated[int, typer.Option(min=1, help="Number of campaigns.")] = 20,
    sites: Annotated[int, typer.Option(min=1, help="Number of sites.")] = 300,
    ground_truth: Annotated[
        Path | None,
        typer.Option(help="Write exact counts per minute bucket and dimensions here (CSV)."),
    ] = None,
    ctr_drop: Annotated[
        list[str] | None,
        typer.Option(
            help="Inject a change: ID=FACTOR multiplies the CTR of ad ID (ad-001-01), or of "
            "every ad of campaign ID (cmp-001), by FACTOR in this stream (0.7: a 30 % drop; "
            "0: click tracking broken). Repeatable. Sent beside running traffic, it moves that "
            "ad's CTR by less: the two streams mix."
        ),
    ] = None,
    skip_validation: Annotated[
        bool,
        typer.Option(
            help="Send malformed records to the event topic instead of the dead-letter topic "
            "(to exercise the pipeline's quarantine)."
        ),
    ] = False,
) -> None:
    """Generate realistic synthetic ad traffic (impressions and clicks) into Kafka.

    Runs until --events, --duration or Ctrl-C; either way it flushes and reports what was
    delivered. Malformed records go to the dead-letter topic with their reason.
    """
    from ingest.ground_truth import GroundTruth
    from ingest.send_loop import Pacing
    from ingest.traffic import TrafficConfig

    # Every argument is checked before anything is printed: a usage error comes first.
    chosen = seed if seed is not None else random.SystemRandom().randrange(2**31)
    events_per_second = rate or clock_rate
    start_ms = _start_ms(start, events, paced=rate is not None, per_second=events_per_second)
    try:
        config = TrafficConfig(
            seed=chosen,
            start_ms=start_ms,
            events_per_second=events_per_second,
            campaigns=campaigns,
            sites=sites,
            duplicate_fraction=duplicates,
            late_fraction=late,
            malformed_fraction=malformed,
            repeat_click_fraction=repeat_clicks,
            orphan_click_fraction=orphan_clicks,
            ctr_factors=_factors(ctr_drop or []),
        )
    except ValueError as exc:
        message = str(exc)
        if message.startswith("ctr_factors: "):
            raise typer.BadParameter(message.partition(": ")[2], param_hint="--ctr-drop") from None
        raise typer.BadParameter(message) from None
    if seed is None:
        console.print(f"seed {chosen} (pass --seed {chosen} to repeat this stream)")
    producer = _open_producer(validate_records=not skip_validation)
    # A long run's counts go to a file beside the ground truth as they pile up.
    truth = (
        GroundTruth(spill=ground_truth.with_name(ground_truth.name + ".partial"))
        if ground_truth is not None
        else None
    )
    # A paced stream whose clock starts in the past sends its backlog up to now at once.
    behind_s = max(0.0, time.time() - start_ms / 1000) if rate is not None else 0.0
    pacing = Pacing(rate=rate, duration_s=duration, catch_up_s=behind_s)
    summary = _send_traffic(config, producer, limit=events, pacing=pacing, truth=truth)
    _report_sent(summary)
    if truth is not None and ground_truth is not None:
        _write_ground_truth(truth, ground_truth)
    _report_delivery(producer.stats)


def _factors(values: list[str]) -> tuple[tuple[str, float], ...]:
    """``--ctr-drop`` values, ID=FACTOR each."""
    found = []
    for value in values:
        target, sign, factor = value.partition("=")
        try:
            found.append((target.strip(), float(factor)))
        except ValueError:
            sign = ""
        if not sign or not target.strip():
            raise typer.BadParameter(
                f"ID=FACTOR (ad-001-01=0.7), got {value!r}", param_hint="--ctr-drop"
            )
    return tuple(found)


def _start_ms(start: str | None, events: int | None, *, paced: bool, per_second: float) -> int:
    """--start in epoch ms; by default now, or with --events and no --rate, early enough that
    the last record is about now."""
    start_ms = _parse_time(start, "--start")
    if start_ms is not None:
        return start_ms
    start_ms = int(time.time() * 1000)
    if events is not None and not paced:
        start_ms -= int(events / per_second * 1000)
    return start_ms


def _send_traffic(
    config: TrafficConfig,
    producer: EventProducer,
    *,
    limit: int | None,
    pacing: Pacing,
    truth: GroundTruth | None,
) -> ProduceSummary:
    """The generated traffic into ``producer``, with a progress bar, until done or Ctrl-C."""
    from ingest.send_loop import produce as produce_records
    from ingest.traffic import TrafficGenerator

    with (
        StopRequest() as stop,
        producer,
        progress_bar("events", total_known=limit is not None) as bar,
    ):
        task = bar.add_task("producing", total=limit)
        summary = produce_records(
            TrafficGenerator(config),
            producer,
            limit=limit,
            pacing=pacing,
            stop=stop,
            ground_truth=truth,
            on_progress=lambda n: bar.update(task, completed=n),
        )
        bar.update(task, description="flushing")
    return summary


def _report_sent(summary: ProduceSummary) -> None:
    console.print(
        f"sent {summary.records:,} records in {summary.seconds:.1f} s ({summary.rate:,.0f}/s): "
        f"{summary.events:,} events ({summary.late:,} late: over 10 min old when sent), "
        f"{summary.duplicates:,} duplicates, "
        f"{summary.malformed:,} malformed"
        + (f"; stopped by {summary.stopped_by}" if summary.stopped_by else "")
    )


def _write_ground_truth(truth: GroundTruth, path: Path) -> None:
    rows = truth.write_csv(path)
    console.print(
        f"ground truth: {rows:,} rows, {truth.impressions:,} impressions, "
        f"{truth.clicks:,} clicks -> {path}"
    )


def replay(
    file: Annotated[
        Path,
        typer.Argument(
            metavar="FILE", help="JSON Lines file, or CSV with a header row (by .csv suffix)."
        ),
    ],
    speed: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Keep the original event-time spacing, sped up by this factor. "
            "Default: as fast as possible.",
        ),
    ] = None,
) -> None:
    """Replay a file of events into Kafka, preserving event_time.

    Invalid lines go to the dead-letter topic with their reason and FILE:LINE.
    """
    from ingest.replay import replay as replay_file

    if not file.is_file():
        raise typer.BadParameter(f"no such file: {file}", param_hint="FILE")
    producer = _open_producer()
    with StopRequest() as stop, producer, progress_bar("lines", total_known=False) as bar:
        task = bar.add_task(f"replaying {file.name}")
        try:
            summary = replay_file(
                file,
                producer,
                speed=speed,
                stop=stop,
                on_progress=lambda n: bar.update(task, completed=n),
            )
        except ValueError as exc:
            fail(str(exc))
    console.print(
        f"replayed {summary.lines:,} lines in {summary.seconds:.1f} s: {summary.sent:,} sent, "
        f"{summary.dead_lettered:,} dead-lettered"
        + (f"; stopped by {summary.stopped_by}" if summary.stopped_by else "")
    )
    _report_delivery(producer.stats)
