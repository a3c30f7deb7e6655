"""What the streaming jobs share: their progress, its phases, and the loop that drives them.
(Their checkpoints, as the jobs read them: :mod:`lake.checkpoints`.)"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from runtime.errors import CtrError, reason_in

if TYPE_CHECKING:
    from confluent_kafka import Consumer
    from pyspark.sql.streaming import StreamingQuery

    from runtime.kafka_settings import KafkaSettings


class PhaseClock:
    """Milliseconds per named phase of a micro-batch, measured lap by lap (the jobs log them
    and the benchmarks print them)."""

    def __init__(self) -> None:
        self.ms: dict[str, int] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = self.ms.get(name, 0) + round((now - self._last) * 1000)
        self._last = now


class Periodic:
    """When a streaming job's periodic work (roll-up, maintenance) is due: every ``period_s``,
    the first time ``first_after_s`` after the job started (at most one period). A job
    restarted more often than its period (a crash loop, a chaos round) must not postpone that
    work again at each start: it would never run."""

    def __init__(
        self,
        period_s: float,
        *,
        first_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.period_s = period_s
        self._clock = clock
        first = period_s if first_after_s is None else min(first_after_s, period_s)
        self._last = clock() - period_s + first

    def due(self) -> bool:
        """True (and the period starts again) when the work is due now."""
        now = self._clock()
        if now - self._last < self.period_s:
            return False
        self._last = now
        return True


# How long a stopping job waits for its maintenance pass under way (BackgroundPass.join).
MAINTENANCE_JOIN_SECONDS: Final = 120.0


class BackgroundPass:
    """A streaming job's periodic work (compaction, roll-ups, VACUUM) in a thread of its own,
    one pass at a time: the micro-batches go on committing while it runs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, target: Callable[..., object], *args: object, **kwargs: object) -> bool:
        """Run ``target(*args, **kwargs)`` in a daemon thread, unless a pass is still running;
        returns whether it started."""
        if self.running:
            return False
        self._thread = threading.Thread(
            target=target, args=args, kwargs=kwargs, name=self.name, daemon=True
        )
        self._thread.start()
        return True

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the pass under way (if any); returns whether none is running."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.running


class RecentPhases:
    """The callback's phases of the last few micro-batches (ms per phase, by batch id), joined
    with Spark's trigger phases when the batch's progress is reported, and its counts (records,
    invalid ones...) beside them."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._by_batch: dict[int, dict[str, int]] = {}
        self._counts: dict[int, dict[str, int]] = {}

    def record(
        self, batch_id: int, phases: dict[str, int], counts: dict[str, int] | None = None
    ) -> None:
        self._by_batch[batch_id] = phases
        self._counts[batch_id] = counts or {}
        for old in sorted(self._by_batch)[: -self.keep]:
            del self._by_batch[old], self._counts[old]

    def counts_of(self, progress: StreamProgress) -> dict[str, int]:
        """The callback's counts of the reported batch."""
        return self._counts.get(progress.batch_id, {})

    def of(self, progress: StreamProgress) -> dict[str, int]:
        """Spark's phases of the trigger (``spark.*``; addBatch holds the callback), then the
        callback's own."""
        return {
            **{f"spark.{k}": v for k, v in progress.durations_ms.items()},
            **self._by_batch.get(progress.batch_id, {}),
        }


@dataclass(frozen=True)
class BatchMetadata:
    """A micro-batch as the checkpoint's offset log records it."""

    batch_id: int
    watermark_ms: int  # event-time watermark the batch runs under (0 before any event)
    timestamp_ms: int  # the batch's processing time, fixed for replays


@dataclass(frozen=True)
class StreamProgress:
    batch_id: int
    input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    batch_duration_ms: int
    offsets_behind: int | None
    watermark: dt.datetime | None
    metrics: dict[str, int]  # the query's observed metrics (Dataset.observe), flattened
    end_offsets: dict[str, dict[str, int]] | None = None  # Kafka offsets the batch read up to
    # Spark's own phases of the trigger (latestOffset, queryPlanning, walCommit, addBatch,
    # commitOffsets, triggerExecution, ...), in milliseconds.
    durations_ms: dict[str, int] = field(default_factory=dict)
    # The job's own phases of the batch (its writes...), when it reports them.
    phases_ms: dict[str, int] = field(default_factory=dict)
    # The job's own counts of the batch (records, invalid ones, ...), when it reports them.
    counts: dict[str, int] = field(default_factory=dict)


def parse_progress(progress: dict[str, Any]) -> StreamProgress:
    """One of Spark's progress reports (a dict of its JSON) as a :class:`StreamProgress`."""
    behind: int | None = None
    end_offsets: dict[str, dict[str, int]] | None = None
    for source in progress.get("sources", []):
        lag = _offsets_behind(source.get("latestOffset"), source.get("endOffset"))
        if lag is not None:
            behind = lag + (behind or 0)
        end_offsets = _kafka_offsets(source.get("endOffset")) or end_offsets
    watermark = (progress.get("eventTime") or {}).get("watermark")
    if watermark and _parse_time(watermark).timestamp() == 0:
        watermark = None  # no event seen yet
    return StreamProgress(
        batch_id=int(progress["batchId"]),
        input_rows=int(progress.get("numInputRows", 0)),
        input_rows_per_second=float(progress.get("inputRowsPerSecond") or 0.0),
        processed_rows_per_second=float(progress.get("processedRowsPerSecond") or 0.0),
        batch_duration_ms=int(progress.get("batchDuration") or 0),
        offsets_behind=behind,
        watermark=_parse_time(watermark) if watermark else None,
        metrics={
            f"{name}.{key}": int(value)
            for name, row in (progress.get("observedMetrics") or {}).items()
            for key, value in _as_dict(row).items()
            if isinstance(value, int | float)
        },
        end_offsets=end_offsets,
        durations_ms={
            str(k): int(v)
            for k, v in (progress.get("durationMs") or {}).items()
            if isinstance(v, int | float)
        },
    )


def _as_dict(row: Any) -> dict[str, Any]:
    """An observed-metrics row: a pyspark Row in a live query, a dict once serialized."""
    return row.asDict() if hasattr(row, "asDict") else dict(row)


def _kafka_offsets(value: object) -> dict[str, dict[str, int]] | None:
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
        if not isinstance(parsed, dict):
            return None
        return {t: {str(p): int(o) for p, o in parts.items()} for t, parts in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        return None


class KafkaLag:
    """How far a query's committed offsets are behind the brokers' ends, asked from the
    driver between batches (Spark's own figure only counts what maxOffsetsPerTrigger held
    back when the batch was planned)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._consumer: Consumer | None = None

    def behind(self, end_offsets: dict[str, dict[str, int]] | None) -> int | None:
        if not end_offsets:
            return None
        from runtime.offsets import offsets_consumer, partition_offsets

        try:
            if self._consumer is None:
                self._consumer = offsets_consumer(self.settings)
            partitions = [(t, int(p)) for t, parts in end_offsets.items() for p in parts]
            ends = partition_offsets(
                self.settings, partitions, timeout_s=5, consumer=self._consumer
            )
        except Exception:  # a health figure: never let it stop the job
            return None
        return sum(max(0, o.latest - end_offsets[o.topic][str(o.partition)]) for o in ends)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _offsets_behind(latest: object, end: object) -> int | None:
    """Sum over partitions of latest - end, for Kafka-style offsets {topic: {partition: n}}."""
    if not latest or not end:
        return None
    try:
        latest_map: dict[str, dict[str, int]] = (
            json.loads(latest) if isinstance(latest, str) else latest  # type: ignore[assignment]
        )
        end_map: dict[str, dict[str, int]] = (
            json.loads(end) if isinstance(end, str) else end  # type: ignore[assignment]
        )
        return sum(
            max(0, int(offset) - int(end_map.get(topic, {}).get(p, 0)))
            for topic, parts in latest_map.items()
            for p, offset in parts.items()
        )
    except (ValueError, AttributeError, TypeError):
        return None


def _parse_time(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


class QueryFailedError(CtrError, RuntimeError):
    """A streaming query stopped with an error; the message names the query and the cause."""


def drive(
    query: StreamingQuery,
    name: str,
    *,
    on_progress: Callable[[StreamProgress], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    poll_seconds: float = 0.5,
) -> int:
    """Wait for ``query`` (until it ends, or ``should_stop()``), reporting each new micro-batch;
    returns the rows it read. A query that failed raises :class:`QueryFailedError` naming
    ``name`` and the cause."""
    from pyspark.errors import StreamingQueryException

    reports = _NewReports(query)
    rows = 0

    def report_new() -> None:
        nonlocal rows
        for progress in reports.new():
            rows += progress.input_rows
            if on_progress is not None:
                on_progress(progress)

    try:
        while query.isActive:
            if should_stop():
                query.stop()
                break
            try:
                query.awaitTermination(poll_seconds)  # type: ignore[arg-type]  # floats work
            except StreamingQueryException as exc:
                raise QueryFailedError(f"{name} stopped with an error: {cause_of(exc)}") from exc
            report_new()
        exception = query.exception()
        if exception is not None:
            raise QueryFailedError(f"{name} stopped with an error: {cause_of(exception)}")
    finally:
        if query.isActive:
            query.stop()
    report_new()
    return rows


class _NewReports:
    """The progress reports of ``query`` not seen yet, oldest first: every micro-batch once,
    however many ran between two polls (Spark keeps the last ~100); an idle report (no rows)
    that repeats the batch id already reported is left out."""

    def __init__(self, query: StreamingQuery) -> None:
        self.query = query
        self.last: tuple[int, str] = (-1, "")
        self.batch_id = -1

    def new(self) -> list[StreamProgress]:
        fresh = []
        for raw in self.query.recentProgress:
            key = (int(raw["batchId"]), str(raw.get("timestamp", "")))
            if key <= self.last:
                continue
            self.last = key
            progress = parse_progress(raw)
            if progress.batch_id == self.batch_id and not progress.input_rows:
                continue
            self.batch_id = progress.batch_id
            fresh.append(progress)
        return fresh


_DATA_LOSS = re.compile(r"failOnDataLoss|[Ss]ome data may have been (?:lost|missed)")


def cause_of(exc: BaseException) -> str:
    """The root cause of a failed query in one line: what Spark's kafka source says about
    offsets the log no longer holds, else :func:`runtime.errors.reason_in` (the Python error
    raised inside a foreachBatch function, or the Java exception Spark raised)."""
    text = str(exc)
    if _DATA_LOSS.search(text):
        detail = next(
            (line.strip() for line in text.splitlines() if "offset" in line.lower()),
            text.splitlines()[0] if text else "",
        )
        return (
            "lost records: offsets the checkpoint expects are no longer in Kafka (retention "
            "expired, or the topic or the broker's log was replaced); nothing was skipped. "
            "Set failOnDataLoss=false (ARCHIVER_FAIL_ON_DATA_LOSS / SPEED_FAIL_ON_DATA_LOSS) "
            f"to go on from the earliest offset still there. Spark: {detail[:300]}"
        )
    return reason_in(text) or type(exc).__name__
