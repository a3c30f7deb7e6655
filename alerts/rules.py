"""An alert rule: what to watch (a view's rows, all of them or one dimension's value, optionally
one test per value of another dimension), which measure, against which baseline, and how sure
and how large a change must be before it is news. Built with :meth:`Rule.create`, which checks
every field and names the one that is wrong."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, cast, get_args

from access.roles import Scope
from runtime.errors import BadArgumentError
from views.columns import DIMENSIONS

Measure = Literal["ctr", "impressions", "clicks", "orphan_share"]
Baseline = Literal["days", "previous"]
Direction = Literal["drop", "rise", "any"]

NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")
MEASURES: Final = cast(tuple[Measure, ...], get_args(Measure))
BASELINES: Final = cast(tuple[Baseline, ...], get_args(Baseline))
DIRECTIONS: Final = cast(tuple[Direction, ...], get_args(Direction))
# Windows are whole minutes the speed layer has closed; a day's at most.
MAX_WINDOW_MINUTES: Final = 24 * 60
MAX_BASELINE_DAYS: Final = 28
_CHANGE: Final = {"drop": "a drop", "rise": "a rise", "any": "a change either way"}


class RuleError(BadArgumentError):
    """A rule that cannot be: ``parameter`` names the field that is wrong."""


@dataclass(frozen=True)
class Rule:
    """A rule as stored in ``alerts/rules``.

    - ``where``: the rows watched, ``(dimension, value)`` or None for every row;
    - ``per``: a dimension whose every value is tested on its own (one alert each), with the
      false-alarm rate held over them all (Holm), or None for one test over the rows;
    - ``measure``: ``ctr`` (clicks / impressions), ``impressions``, ``clicks`` (per minute), or
      ``orphan_share`` (orphan clicks / raw clicks; views with click attribution);
    - the window: the last ``window_minutes`` closed minutes;
    - ``baseline``: ``days``, the same window on each of the ``baseline_days`` days before, or
      ``previous``, the ``baseline_minutes`` right before the window;
    - ``alpha``: the false-alarm rate per group and day (it is tested every minute: see
      :func:`alerts.evaluate.per_day`); ``min_effect``: the smallest relative
      change worth telling (0.2: 20 %), in ``direction``; ``min_trials``: impressions (or raw
      clicks for the orphan share) the window needs before a rate is tested;
    - ``webhook_url``: where its alerts are posted (signed with ``secret``); ``owner`` and
      ``scope``: the key that made it and, for an advertiser's, the rows it may watch (its
      campaigns and, when the key names ads, those ads): the rule counts those rows only,
      whatever ``where`` and ``per`` say.

    A rule is named within its owner's rules (:attr:`id`: ``owner/name``).
    """

    name: str
    measure: Measure
    where: tuple[str, str] | None = None
    per: str | None = None
    window_minutes: int = 15
    baseline: Baseline = "days"
    baseline_days: int = 7
    baseline_minutes: int = 60
    alpha: float = 0.01
    min_effect: float = 0.2
    direction: Direction = "any"
    min_trials: int = 1000
    webhook_url: str | None = None
    secret: str = ""
    owner: str = ""
    scope: Scope | None = None
    created_at: dt.datetime | None = None

    @classmethod
    def create(cls, **fields: object) -> Rule:
        """The rule, every field checked (RuleError names the first that is wrong)."""
        rule = cls(**fields)  # type: ignore[arg-type]
        rule.check()
        return rule

    def check(self) -> None:  # noqa: PLR0912 - one check per field, each with its message
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise RuleError("name", f"1 to 64 letters, digits or . _ -, got {self.name!r}")
        if self.measure not in MEASURES:
            raise RuleError("measure", f"one of {', '.join(MEASURES)}, got {self.measure!r}")
        if self.where is not None:
            dimension, value = self.where
            if dimension not in DIMENSIONS:
                raise RuleError("where", f"a dimension of {', '.join(DIMENSIONS)}: {dimension!r}")
            if not value:
                raise RuleError("where", "the value must not be empty")
        if self.per is not None and self.per not in DIMENSIONS:
            raise RuleError("per", f"one of {', '.join(DIMENSIONS)}, got {self.per!r}")
        if self.where is not None and self.per == self.where[0]:
            raise RuleError("per", f"{self.per} is the dimension `where` fixes already")
        if not 1 <= self.window_minutes <= MAX_WINDOW_MINUTES:
            raise RuleError("window_minutes", f"1 to {MAX_WINDOW_MINUTES}")
        if self.baseline not in BASELINES:
            raise RuleError("baseline", f"one of {', '.join(BASELINES)}, got {self.baseline!r}")
        if not 1 <= self.baseline_days <= MAX_BASELINE_DAYS:
            raise RuleError("baseline_days", f"1 to {MAX_BASELINE_DAYS}")
        if not self.window_minutes <= self.baseline_minutes <= 7 * MAX_WINDOW_MINUTES:
            raise RuleError("baseline_minutes", "at least the window, at most 7 days")
        if not 0 < self.alpha < 0.5:
            raise RuleError("alpha", f"between 0 and 0.5, got {self.alpha}")
        if not 0 <= self.min_effect < 10:
            raise RuleError(
                "min_effect", f"a relative change from 0 (any) to 10, got {self.min_effect}"
            )
        if self.direction not in DIRECTIONS:
            raise RuleError("direction", f"one of {', '.join(DIRECTIONS)}, got {self.direction!r}")
        if self.min_trials < 0:
            raise RuleError("min_trials", "0 or more")
        if self.webhook_url is not None and not re.fullmatch(r"https?://\S+", self.webhook_url):
            raise RuleError("webhook_url", f"an http(s) URL, got {self.webhook_url!r}")
        if self.scope is not None:
            self._check_scope(self.scope)

    def _check_scope(self, scope: Scope) -> None:
        """An advertiser's rule watches one of its campaigns or ads (of a key that names ads,
        one of those); its counts are narrowed to the scope's rows all the same."""
        if self.where is None or self.where[0] not in ("campaign_id", "ad_id"):
            raise RuleError(
                "where",
                "an advertiser's rule watches one of its campaigns or ads: campaign_id=… or "
                "ad_id=…",
            )
        dimension, value = self.where
        if dimension == "campaign_id" and value not in scope.campaigns:
            raise RuleError("where", f"campaign_id {value!r} is not in this key's scope")
        if dimension == "ad_id" and scope.ads and value not in scope.ads:
            raise RuleError("where", f"ad_id {value!r} is not in this key's scope")

    @property
    def id(self) -> str:
        """``owner/name``: names are the owner's (neither may hold a ``/``)."""
        return f"{self.owner}/{self.name}"

    @property
    def scoped_dimensions(self) -> tuple[str, ...]:
        """The dimensions its scope filters on (none for an admin's or analyst's rule)."""
        if self.scope is None:
            return ()
        return ("campaign_id", "ad_id") if self.scope.ads else ("campaign_id",)

    def admits(self, dimensions: Mapping[str, object]) -> bool:
        """Whether a row with these dimension values is one the rule may count: its scope's
        (every row for a rule without one)."""
        return self.scope is None or self.scope.admits(dimensions)

    @property
    def rate(self) -> bool:
        return self.measure in ("ctr", "orphan_share")

    def windows(
        self, end: dt.datetime
    ) -> tuple[tuple[dt.datetime, dt.datetime], list[tuple[dt.datetime, dt.datetime]]]:
        """The window ending at ``end`` and its baseline windows."""
        size = dt.timedelta(minutes=self.window_minutes)
        window = (end - size, end)
        if self.baseline == "previous":
            before = dt.timedelta(minutes=self.baseline_minutes)
            return window, [(end - size - before, end - size)]
        day = dt.timedelta(days=1)
        return window, [
            (end - size - n * day, end - n * day) for n in range(1, self.baseline_days + 1)
        ]

    def describe(self) -> str:
        """One line: what it watches and when it fires."""
        rows = f"{self.where[0]}={self.where[1]}" if self.where else "every row"
        per = f", per {self.per}" if self.per else ""
        base = (
            f"the same {self.window_minutes} min on each of the {self.baseline_days} days before"
            if self.baseline == "days"
            else f"the {self.baseline_minutes} min before"
        )
        return (
            f"{self.measure} of {rows}{per} over the last {self.window_minutes} min "
            f"against {base}; fires on {_CHANGE[self.direction]} of at least "
            f"{self.min_effect:.0%} "
            f"at p < {self.alpha:g}"
        )
