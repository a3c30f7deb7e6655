"""How many records a Kafka topic holds (the dead-letter topic's depth, for ``/metrics``).

The sum over partitions of latest - earliest offset (verified ends, see ``runtime.offsets``),
looked up with a short timeout at most every ``refresh_s`` seconds. An unreachable broker or a
missing topic gives ``None`` (the metric is left out) and one log line, never an error: a
scrape must not fail, nor wait long, because Kafka is away.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaException

from runtime.kafka_settings import KafkaSettings
from runtime.offsets import topic_offsets

log = logging.getLogger(__name__)


class TopicDepth:
    """Cached record count of one topic."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        *,
        timeout_s: float,
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"'timeout_s' must be > 0, got {timeout_s}")
        self.kafka = kafka
        self.topic = topic
        self.timeout_s = timeout_s
        self.refresh_s = refresh_s
        self._clock = clock
        self._value: int | None = None
        self._looked_up_at = float("-inf")
        self._failing = False
        self._lock = threading.Lock()

    def records(self) -> int | None:
        """Records in the topic now (within ``refresh_s``), or None if Kafka did not say."""
        if self._clock() - self._looked_up_at < self.refresh_s:
            return self._value
        if not self._lock.acquire(blocking=False):
            return self._value  # another scrape is looking it up: answer with the last value
        try:
            self._value = self._lookup()
            self._looked_up_at = self._clock()
            return self._value
        finally:
            self._lock.release()

    def _lookup(self) -> int | None:
        try:
            ends = topic_offsets(self.kafka, self.topic, timeout_s=self.timeout_s)
        except (KafkaException, LookupError) as exc:
            if not self._failing:
                log.warning(
                    "cannot read the depth of %s on %s (left out of /metrics until it can): %s",
                    self.topic, self.kafka.bootstrap_servers, exc,
                )  # fmt: skip
            self._failing = True
            return None
        if self._failing:
            log.info("reading the depth of %s again", self.topic)
        self._failing = False
        return sum(end.records for end in ends)
