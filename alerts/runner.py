"""`ctr alerts run`: the evaluator, one long-running process. Each minute, once the minute has
settled, it evaluates every rule over the window ending then (:func:`alerts.evaluate.evaluate`
over one snapshot of the lake), holds each alert steady (fires after ``fire_after`` significant
evaluations in a row, resolves after ``resolve_after`` without), re-checks an alert raised on
the speed layer's counts once the batch layer has covered its window (confirmed or withdrawn),
appends what it found to alerts/events in one commit per minute, and delivers the alerts to
their rules' webhooks in the background.

One evaluation per minute, restarts included: the commit carries the application transaction
(``ctr-alerts``, the minute), a minute already committed is skipped, and the streaks and open
alerts are rebuilt from alerts/events at start."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

from alerts import store, webhooks
from alerts.evaluate import CountSource, Finding, evaluate, evaluate_settled
from alerts.hysteresis import Hysteresis
from alerts.rules import Rule
from alerts.settings import AlertSettings
from lake.settings import LakeSettings

log = logging.getLogger("ctr.alerts")

APP_ID: Final = "ctr-alerts"
Key = tuple[str, str | None]  # a rule's name and group
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

    def __str__(self) -> str:
        kinds = [f"{a['event']} {a['rule']}" + (f"[{a['group_value']}]" if a["group_value"] else "")
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

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def restore(self, end: dt.datetime) -> None:
        """Streaks and open alerts as alerts/events left them (the last ``history_hours``)."""
        since = end - dt.timedelta(hours=self.settings.history_hours)
        for row in store.read_events(self.lake, since=since):
            self._replay(row)
        self._restored = True

    def _state(self, key: Key) -> State:
        if key not in self.states:
            self.states[key] = State(self.settings.fire_after, self.settings.resolve_after)
        return self.states[key]

    def _replay(self, row: Mapping[str, object]) -> None:
        key: Key = (str(row["rule"]), row["group_value"])  # type: ignore[assignment]
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
        if not self._restored:
            self.restore(end)
        tick = Tick(end)
        done = store.last_version(self.lake, APP_ID)
        if done is not None and done >= minute_index(end):
            return tick
        rules = list(store.read_rules(self.lake).values())
        source = self.source_of()
        lag = dt.timedelta(seconds=self.settings.max_speed_lag_s)
        findings, tick.held = evaluate_settled(rules, source, end, lag)
        tick.rules, tick.tests = len(rules), sum(f.result.tested for f in findings)
        tick.rows = [_row(f, "evaluated", end) for f in findings]
        tick.alerts = self._transitions(findings, end) + self._confirmations(rules, source, end)
        delivered = self._finished_deliveries()
        tick.committed = store.append_events(
            self.lake,
            [*tick.rows, *tick.alerts, *delivered],
            app_id=APP_ID,
            version=minute_index(end),
        )
        if tick.committed:
            by_name = {r.name: r for r in rules}
            for alert in tick.alerts:
                self._send(by_name[str(alert["rule"])], alert)
        return tick

    def _transitions(
        self, findings: Iterable[Finding], end: dt.datetime
    ) -> list[dict[str, object]]:
        alerts = []
        for finding in findings:
            state = self._state((finding.rule.name, finding.group))
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
        by_name = {r.name: r for r in rules}
        alerts = []
        for (name, group), state in self.states.items():
            rule = by_name.get(name)
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

    def _send(self, rule: Rule, alert: dict[str, object]) -> None:
        if rule.webhook_url is None:
            return
        payload = _payload(rule, alert)
        settings = self.settings

        def send() -> dict[str, object]:
            outcome = self.deliver(
                rule.webhook_url,
                rule.secret,
                payload,
                attempts=settings.webhook_attempts,
                first_delay_s=settings.webhook_first_delay_s,
                timeout_s=settings.webhook_timeout_s,
            )
            row = {
                k: alert[k]
                for k in ("rule", "window_start", "window_end", "group_value", "campaign_id")
            }
            return {
                **row,
                "event": "delivered" if outcome.delivered else "dead_letter",
                "measure": alert["measure"],
                "delivery": f"{alert['event']}: {outcome}",
                "reason": outcome.error,
                "at": dt.datetime.now(dt.UTC),
            }

        self.outcomes.append(self._pool.submit(send))

    def _finished_deliveries(self) -> list[dict[str, object]]:
        """The outcomes of the deliveries done since the last commit (recorded with the next)."""
        done = [f for f in self.outcomes if f.done()]
        self.outcomes = [f for f in self.outcomes if not f.done()]
        return [f.result() for f in done]

    def run(self, stop: threading.Event, *, now: Callable[[], dt.datetime]) -> None:
        """Evaluate each minute as it settles until ``stop`` is set."""
        last: dt.datetime | None = None
        while not stop.is_set():
            end = due_end(now(), self.settings.settle_s)
            if end != last:
                try:
                    log.info("%s", self.tick(end))
                    last = end
                except Exception:  # one bad minute must not end the evaluator: retried
                    log.exception("alerts: the window ending %s failed; retried", end)
            stop.wait(self.settings.poll_s)


def _row(finding: Finding, event: str, end: dt.datetime) -> dict[str, object]:
    rule = finding.rule
    result = finding.result
    return {
        "rule": rule.name,
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
