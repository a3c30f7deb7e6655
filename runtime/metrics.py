"""Every process's Prometheus metrics, declared once: a :class:`MetricSpec` names a metric, its
kind, its meaning and its labels, and the code exports it from that declaration, so the metrics
reference (``docs/reference/metrics.md``, generated from :data:`CATALOG`) says what a scrape
shows. A long-running process serves its own on a port (:func:`serve`); a short-lived one (a
batch run) pushes them to a Pushgateway when it ends (:func:`push`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from runtime.errors import CtrError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("ctr.metrics")

Kind = Literal["counter", "gauge", "histogram"]
# The processes that export metrics, in the reference's order: each one's title and where its
# metrics are.
PROCESSES: Final = {
    "api": ("The API", "`ctr serve`, each replica: `GET /metrics` on the API's port, with "
            "API_METRICS_TOKEN or an admin key; its requests, and the lake's state read per "
            "scrape"),
    "streaming": ("The streaming jobs", "Both, each on a port of its own: `ctr archive` "
                  "(ARCHIVER_METRICS_PORT, `query=\"archiver\"`) and `ctr speed` "
                  "(SPEED_METRICS_PORT, `query=\"speed\"`)"),
    "speed": ("The speed job", "`ctr speed` (SPEED_METRICS_PORT), besides the streaming jobs' "
              "metrics"),
    "alerts": ("The alerts runner", "`ctr alerts run` (ALERTS_METRICS_PORT)"),
    "batch": ("Batch runs", "Each run (`ctr batch`, `ctr backfill`, the Airflow tasks, a "
              "version's build) pushes these to CTR_METRICS_PUSHGATEWAY when it ends, grouped "
              "by `job=\"ctr_batch\"` and the version's key `view`"),
}  # fmt: skip


class MetricsSettings(BaseSettings):
    """Where the jobs serve their metrics and where a batch run pushes its own (environment
    variables ``CTR_METRICS_*``; each job's port is its own setting: ARCHIVER_METRICS_PORT,
    SPEED_METRICS_PORT, ALERTS_METRICS_PORT)."""

    model_config = SettingsConfigDict(env_prefix="CTR_METRICS_", extra="ignore")

    # The address the jobs' metrics ports listen on: loopback by default; the address of the
    # host's interface Prometheus reaches (or 0.0.0.0) when Prometheus runs on another host.
    host: str = "127.0.0.1"
    # A Prometheus Pushgateway's URL (http://host:9091): each batch run pushes its figures
    # there when it ends (job ctr_batch). Unset: a batch run pushes nothing.
    pushgateway: str | None = None
    # Seconds a push may take before the run gives up on it (a push never fails a run).
    push_timeout_s: float = Field(default=10.0, gt=0)


@dataclass(frozen=True)
class MetricSpec:
    """One metric as a scrape shows it (a counter's samples end in ``_total``)."""

    process: str
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()

    @property
    def exposed(self) -> str:
        """The name a scrape shows: a counter's with ``_total``."""
        return f"{self.name}_total" if self.kind == "counter" else self.name

    def counter(self, registry: CollectorRegistry) -> Counter:
        from prometheus_client import Counter

        assert self.kind == "counter", self.name
        return Counter(self.name, self.help, self.labels, registry=registry)

    def gauge(self, registry: CollectorRegistry) -> Gauge:
        from prometheus_client import Gauge

        assert self.kind == "gauge", self.name
        return Gauge(self.name, self.help, self.labels, registry=registry)

    def histogram(self, registry: CollectorRegistry, buckets: tuple[float, ...]) -> Histogram:
        from prometheus_client import Histogram

        assert self.kind == "histogram", self.name
        return Histogram(self.name, self.help, self.labels, buckets=buckets, registry=registry)

    def family(self, value: float | None = None) -> GaugeMetricFamily | CounterMetricFamily:
        """A family for a custom collector: with ``value`` (no labels), or empty to
        ``add_metric`` to."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        family = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        assert self.kind != "histogram", self.name
        if value is not None:
            return family(self.name, self.help, value=value)
        return family(self.name, self.help, labels=list(self.labels))


CATALOG: dict[str, MetricSpec] = {}


def metric(
    process: str, name: str, kind: Kind, help_text: str, labels: tuple[str, ...] = ()
) -> MetricSpec:
    """Declare a metric of ``process`` (one of :data:`PROCESSES`); a name is declared once."""
    if process not in PROCESSES:
        raise ValueError(f"unknown process {process!r}: one of {', '.join(PROCESSES)}")
    if name in CATALOG:
        raise ValueError(f"metric {name!r} is declared twice")
    spec = MetricSpec(process, name, kind, help_text, labels)
    CATALOG[name] = spec
    return spec


def new_registry() -> CollectorRegistry:
    """A registry with the process's own figures (``process_start_time_seconds``: restarts;
    CPU and memory) besides the metrics added to it."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    return registry


class MetricsPortError(CtrError, RuntimeError):
    """The metrics port could not be listened on (taken, or an address not this host's)."""


def serve(registry: CollectorRegistry, port: int, host: str, setting: str = "the port") -> int:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread; returns the
    port (0: one the system chose). A port that cannot be had is an error naming ``setting``."""
    from prometheus_client import start_http_server

    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise MetricsPortError(
            f"cannot serve metrics on {host}:{port} ({setting}, CTR_METRICS_HOST): "
            f"{exc.strerror or exc}; choose another port, or unset it for no metrics"
        ) from exc
    bound = int(server.server_address[1])
    log.info("metrics at http://%s:%d/metrics", host, bound)
    return bound


def push(registry: CollectorRegistry, settings: MetricsSettings, job: str, **group: str) -> bool:
    """Push ``registry`` to the Pushgateway (replacing the group's metrics of the same names,
    the others kept); False (and a warning) when it could not: a push never fails the work it
    reports."""
    if settings.pushgateway is None:
        return False
    from prometheus_client import pushadd_to_gateway

    try:
        pushadd_to_gateway(
            settings.pushgateway,
            job=job,
            grouping_key=group,
            registry=registry,
            timeout=settings.push_timeout_s,
        )
    except OSError as exc:
        log.warning("metrics: the push to %s failed: %s", settings.pushgateway, exc)
        return False
    return True
