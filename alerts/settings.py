"""``AlertSettings``: the alert evaluator's configuration (`ctr alerts run`), from ``ALERTS_*``
environment variables."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from alerts.destinations import WebhookPolicy


class AlertSettings(BaseSettings):
    """How often the evaluator looks, how it holds an alert steady, how it delivers."""

    model_config = SettingsConfigDict(env_prefix="ALERTS_", extra="ignore")

    # The port the alerts runner serves its Prometheus metrics on (http://CTR_METRICS_HOST:port/metrics;
    # docs/reference/metrics.md); unset: none. 0: a port the system chooses (logged).
    metrics_port: int | None = Field(default=None, ge=0, le=65535)

    # Seconds between two looks at the clock: a minute is evaluated within this after it is due.
    poll_s: float = Field(default=5.0, gt=0)
    # Seconds after a minute ends before it is evaluated: the speed layer has committed it by
    # then (its micro-batches commit every second; its watermark is not waited for).
    settle_s: float = Field(default=60.0, ge=0)
    # Seconds the speed layer may trail its own clock (at its last report: the report's time
    # less the newest event it had read) before a window it has not read through goes
    # untested: while it catches up on a backlog (a restart, a burst), a window's counts are
    # still coming in, and a drop there is the pipeline's, not the ads'.
    max_speed_lag_s: float = Field(default=120.0, gt=0)
    # Consecutive significant evaluations (one a minute) before an alert fires: one more
    # minute of evidence against a single unlucky window.
    fire_after: int = Field(default=2, ge=1)
    # Consecutive evaluations without a significant change before a firing alert resolves (the
    # hysteresis that keeps a CTR at the edge from paging every minute).
    resolve_after: int = Field(default=5, ge=1)
    # Hours of alerts/events read at start to pick up where the last run stopped: the streaks,
    # the firing alerts and those awaiting the batch layer's confirmation.
    history_hours: float = Field(default=6.0, gt=0)
    # Tries of a webhook delivery before it is recorded as a dead letter.
    webhook_attempts: int = Field(default=5, ge=1)
    # Seconds before a delivery's second try, doubling after each.
    webhook_first_delay_s: float = Field(default=1.0, ge=0)
    # Seconds a webhook may take to answer one try.
    webhook_timeout_s: float = Field(default=5.0, gt=0)
    # Internal destinations webhooks may reach besides public addresses: host names and
    # addresses or CIDRs, comma-separated (10.1.2.0/24,hooks.internal). Loopback, private,
    # link-local and other non-public addresses are refused otherwise, when a rule is created
    # and again at each delivery.
    webhook_allow: str = ""
    # Rules one key (their owner) may have at once.
    max_rules_per_owner: int = Field(default=100, ge=1)
    # Webhook deliveries per owner and minute; the alerts past it are recorded "throttled",
    # not sent.
    max_deliveries_per_minute: int = Field(default=60, ge=1)

    @field_validator("webhook_allow")
    @classmethod
    def _allow_list(cls, value: str) -> str:
        WebhookPolicy.parse(value.split(","))  # ValueError naming the entry
        return value

    @property
    def webhook_policy(self) -> WebhookPolicy:
        """The destinations webhooks may reach (:mod:`alerts.destinations`)."""
        return WebhookPolicy.parse(self.webhook_allow.split(","))
