"""`ctr alerts run`: the evaluator, one long-running process. Each minute, once the minute has
settled, it evaluates every rule over the window ending then (:func:`alerts.evaluate.evaluate`
over one snapshot of the lake), holds each alert steady (fires after ``fire_after`` significant
evaluations in a row, resolves after ``resolve_after`` without), re-checks an alert raised on
the speed layer's counts once the batch layer has covered its window (confirmed or withdrawn),
appends what it found to alerts/events in one commit per minute, and delivers the alerts to
their rules' webhooks in the background.

One evaluation per minute, restarts included: the commit carries the application transaction
(``ctr-alerts``, the minute), a minute already committed is skipped, and the streaks and open
alerts are rebuilt from alerts/events at start.

A webhook's delivery is checked against the operator's policy at each try
(:mod:`alerts.webhooks`), and an owner's deliveries are capped per minute
(``ALERTS_MAX_DELIVERIES_PER_MINUTE``): what the owner reads of each is one word (delivered,
refused, throttled, failed); why is in this process's log."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from alerts import store, webhooks
from alerts.evaluate import CountSource, Finding, evaluate, evaluate_settled
from alerts.hysteresis import Hysteresis
from alerts.rules import Rule
from alerts.settings import AlertSettings
from lake.settings import LakeSettings

if TYPE_CHECKING:
    from alerts.metrics import AlertMetrics

log = logging.getLogger("ctr.alerts")

APP_ID: Final = "ctr-alerts"
Key = tuple[str, str | None]  # a rule's id (owner/name) and group
Deliver = Callable[..., webhooks.Delivery]


def minute_index(end: dt.datetime) -> int:
    """The application-transaction version of the window ending at ``end``: its epoch minute."""
    return int(end.timestamp() // 60)


def due_end(now: dt.datetime, settle_s: float) -> dt.datetime:
    """The end of the last minute that has settled at ``now``."""
    settled = now - dt.timedelta(seconds=settle_s)
    return settled.replace(second=0, microsecond=0)


@dataclass
class State(Hysteresis):
    """An alert's state for one rule and group, and the window end it fired at while its
    evidence was the speed layer's (re-checked until the batch layer covers it)."""

    unconfirmed: dt.datetime | None = None


@dataclass
class Tick:
    """What one evaluation did."""

    end: dt.datetime
    rules: int = 0
    tests: int = 0
    rows: list[dict[str, object]] = field(default_factory=list)
    alerts: list[dict[str, object]] = field(default_factory=list)
    committed: bool = False
    held: str | None = None  # why the speed layer's counts went untested
    deliveries: list[dict[str, object]] = field(default_factory=list)  # finished since the last

    def __str__(self) -> str:
        kinds = [f"{a['event']} {a['owner']}/{a['rule']}"
                 + (f"[{a['group_value']}]" if a["group_value"] else "")
                 for a in self.alerts]  # fmt: skip
        said = f": {', '.join(kinds)}" if kinds else ""
        done = "" if self.committed else " (evaluated already: skipped)"
        said += f"; untested on the speed layer's counts: {self.held}" if self.held else ""
        return (
            f"alerts: window ending {self.end:%Y-%m-%d %H:%M} UTC, {self.rules} rules, "
            f"{self.tests} tests, {len(self.alerts)} alerts{said}{done}"
        )


class Evaluator:
    """The rules' evaluation over ``lake`` (counts from ``source_of()``, a fresh snapshot each
    minute), its alerts' states and their deliveries."""

    def __init__(
        self,
        lake: LakeSettings,
        settings: AlertSettings,
        source_of: Callable[[], CountSource],
        *,
        deliver: Deliver = webhooks.deliver,
    ) -> None:
        self.lake = lake
        self.settings = settings
        self.source_of = source_of
        self.deliver = deliver
        self.states: dict[Key, State] = {}
        self.outcomes: list[Future[dict[str, object]]] = []
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook")
        self._restored = False
        # Deliveries per owner in the minute being evaluated (the per-minute cap).
        self._sent: Counter[str] = Counter()
        self._sent_minute: dt.datetime | None = None

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def restore(self, end: dt.datetime, rules: Iterable[Rule] = ()) -> None:
        """Streaks and open alerts as alerts/events left them (the last ``history_hours``);
        ``rules`` name the owners of rows written before rules were named per owner."""
        since = end - dt.timedelta(hours=self.settings.history_hours)
        by_name: dict[str, list[str]] = {}
        for rule in rules:
            by_name.setdefault(rule.name, []).append(rule.id)
        for row in store.read_events(self.lake, since=since):
            owner = row.get("owner")
            if owner is not None:
                self._replay(f"{owner}/{row['rule']}", row)
            elif len(ids := by_name.get(str(row["rule"]), [])) == 1:
                self._replay(ids[0], row)
        self._restored = True

    def _state(self, key: Key) -> State:
        if key not in self.states:
            self.states[key] = State(self.settings.fire_after, self.settings.resolve_after)
        return self.states[key]

    def _replay(self, rule_id: str, row: Mapping[str, object]) -> None:
        key: Key = (rule_id, row["group_value"])  # type: ignore[assignment]
        state = self._state(key)
        event = row["event"]
        if event == "evaluated" and row["evidence"] != "too little data":
            state.count(bool(row["significant"]))
        elif event == "fired":
            state.firing = True
            end = row["window_end"]
            state.unconfirmed = end if row["evidence"] == "approximate" else None  # type: ignore[assignment]
        elif event in ("resolved", "withdrawn"):
            state.firing, state.unconfirmed = False, None
        elif event == "confirmed":
            state.unconfirmed = None

    def tick(self, end: dt.datetime) -> Tick:
        """Evaluate the window ending at ``end`` (once: a minute committed already is skipped)."""
        rules = list(store.read_rules(self.lake).values())
        if not self._restored:
            self.restore(end, rules)
        tick = Tick(end)
        done = store.last_version(self.lake, APP_ID)
        if done is not None and done >= minute_index(end):
            return tick
        source = self.source_of()
        lag = dt.timedelta(seconds=self.settings.max_speed_lag_s)
        findings, tick.held = evaluate_settled(rules, source, end, lag)
        tick.rules, tick.tests = len(rules), sum(f.result.tested for f in findings)
        tick.rows = [_row(f, "evaluated", end) for f in findings]
        tick.alerts = self._transitions(findings, end) + self._confirmations(rules, source, end)
        delivered = tick.deliveries = self._finished_deliveries()
        tick.committed = store.append_events(
            self.lake,
            [*tick.rows, *tick.alerts, *delivered],
            app_id=APP_ID,
            version=minute_index(end),
        )
        if tick.committed:
            by_id = {r.id: r for r in rules}
            for alert in tick.alerts:
                self._send(by_id[f"{alert['owner']}/{alert['rule']}"], alert, end)
        return tick

    def _transitions(
        self, findings: Iterable[Finding], end: dt.datetime
    ) -> list[dict[str, object]]:
        alerts = []
        for finding in findings:
            state = self._state((finding.rule.id, finding.group))
            transition = state.update(finding.result.tested, finding.significant)
            if transition == "fired":
                state.unconfirmed = end if finding.evidence == "approximate" else None
            elif transition == "resolved":
                state.unconfirmed = None
            if transition is not None:
                alerts.append(_row(finding, transition, end))
        return alerts

    def _confirmations(
        self, rules: Sequence[Rule], source: CountSource, end: dt.datetime
    ) -> list[dict[str, object]]:
        """Alerts fired on the speed layer's counts whose window the batch layer now covers:
        confirmed if the exact counts are still significant, else withdrawn."""
        by_id = {r.id: r for r in rules}
        alerts = []
        for (rule_id, group), state in self.states.items():
            rule = by_id.get(rule_id)
            if state.unconfirmed is None or rule is None:
                continue
            again = [f for f in evaluate([rule], source, state.unconfirmed) if f.group == group]
            if not again or again[0].evidence != "exact":
                continue
            finding = again[0]
            event = "confirmed" if finding.significant else "withdrawn"
            if event == "withdrawn":
                state.firing = False
            state.unconfirmed = None
            alerts.append(_row(finding, event, end))
        return alerts

    def _send(self, rule: Rule, alert: dict[str, object], end: dt.datetime) -> None:
        if rule.webhook_url is None:
            return
        url = rule.webhook_url
        payload = _payload(rule, alert)
        settings = self.settings
        if self._sent_minute != end:
            self._sent_minute, self._sent = end, Counter()
        self._sent[rule.owner] += 1
        if self._sent[rule.owner] > settings.max_deliveries_per_minute:
            throttled: Future[dict[str, object]] = Future()
            detail = f"over {settings.max_deliveries_per_minute} deliveries a minute"
            throttled.set_result(
                _outcome(rule, alert, webhooks.Delivery("throttled", 0, None, detail))
            )
            self.outcomes.append(throttled)
            return

        def send() -> dict[str, object]:
            outcome = self.deliver(
                url,
                rule.secret,
                payload,
                policy=settings.webhook_policy,
                attempts=settings.webhook_attempts,
                first_delay_s=settings.webhook_first_delay_s,
                timeout_s=settings.webhook_timeout_s,
            )
            return _outcome(rule, alert, outcome)

        self.outcomes.append(self._pool.submit(send))

    def _finished_deliveries(self) -> list[dict[str, object]]:
        """The outcomes of the deliveries done since the last commit (recorded with the next)."""
        done = [f for f in self.outcomes if f.done()]
        self.outcomes = [f for f in self.outcomes if not f.done()]
        return [f.result() for f in done]

    def run(
        self,
        stop: threading.Event,
        *,
        now: Callable[[], dt.datetime],
        metrics: AlertMetrics | None = None,
    ) -> None:
        """Evaluate each minute as it settles until ``stop`` is set (each counted in
        ``metrics``)."""
        last: dt.datetime | None = None
        while not stop.is_set():
            end = due_end(now(), self.settings.settle_s)
            if end != last:
                try:
                    tick = self.tick(end)
                    log.info("%s", tick)
                    last = end
                    if metrics is not None:
                        metrics.record(tick)
                except Exception:  # one bad minute must not end the evaluator: retried
                    log.exception("alerts: the window ending %s failed; retried", end)
                    if metrics is not None:
                        metrics.failed()
            stop.wait(self.settings.poll_s)


def _outcome(
    rule: Rule, alert: Mapping[str, object], delivery: webhooks.Delivery
) -> dict[str, object]:
    """The alerts/events row of a delivery: its outcome in one word (the rule's owner reads
    it); the details go to this process's log, for the operator."""
    level = logging.INFO if delivery.delivered else logging.WARNING
    log.log(level, "alerts: %s of %s to its webhook: %s", alert["event"], rule.id, delivery)
    row = {
        k: alert[k]
        for k in ("rule", "owner", "window_start", "window_end", "group_value", "campaign_id")
    }
    return {
        **row,
        "event": "delivered" if delivery.delivered else "dead_letter",
        "measure": alert["measure"],
        "delivery": delivery.outcome,
        "reason": None,
        "at": dt.datetime.now(dt.UTC),
    }


def _row(finding: Finding, event: str, end: dt.datetime) -> dict[str, object]:
    rule = finding.rule
    result = finding.result
    return {
        "rule": rule.name,
        "owner": rule.owner,
        "event": event,
        "window_start": finding.window[0],
        "window_end": finding.window[1],
        "group_value": finding.group,
        "campaign_id": rule.where[1] if rule.where and rule.where[0] == "campaign_id" else None,
        "measure": rule.measure,
        "current": result.current,
        "baseline": result.baseline,
        "change": result.change,
        "p_value": finding.adjusted_p,
        "significant": finding.significant,
        "evidence": finding.evidence,
        "trials": finding.trials,
        "reason": result.reason,
        "delivery": None
        if event == "evaluated"
        else ("pending" if rule.webhook_url else "no webhook"),
        "at": end,
    }


def _payload(rule: Rule, alert: Mapping[str, object]) -> dict[str, object]:
    """The JSON a webhook receives."""

    def iso(value: object) -> object:
        return value.isoformat() if isinstance(value, dt.datetime) else value

    return {
        "alert": alert["event"],
        "rule": rule.name,
        "description": rule.describe(),
        "where": dict([rule.where]) if rule.where else {},
        "group": {rule.per: alert["group_value"]} if rule.per else {},
        "measure": rule.measure,
        "window": {"start": iso(alert["window_start"]), "end": iso(alert["window_end"])},
        "current": alert["current"],
        "baseline": alert["baseline"],
        "change": alert["change"],
        "p_value": alert["p_value"],
        "alpha": rule.alpha,
        "evidence": alert["evidence"],
        "trials": alert["trials"],
    }
