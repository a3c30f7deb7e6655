"""An alert's state over successive evaluations: it fires after ``fire_after`` significant
evaluations in a row and resolves after ``resolve_after`` in a row without a significant
change, so a measure at the edge of significance does not page every minute. An evaluation on
too little data says nothing either way. Pure: the evaluator keeps one per rule and group,
and rebuilds them from alerts/events at start; the truth benchmark runs the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Transition = Literal["fired", "resolved"]


@dataclass
class Hysteresis:
    """One rule and group's alert state."""

    fire_after: int = 2
    resolve_after: int = 5
    firing: bool = False
    significant_streak: int = 0
    clear_streak: int = 0

    def count(self, significant: bool) -> None:
        """An evaluation that was tested, significant or not (no transition)."""
        if significant:
            self.significant_streak += 1
            self.clear_streak = 0
        else:
            self.clear_streak += 1
            self.significant_streak = 0

    def update(self, tested: bool, significant: bool) -> Transition | None:
        """The transition this evaluation makes, if any."""
        if not tested:
            return None
        self.count(significant)
        if not self.firing and self.significant_streak >= self.fire_after:
            self.firing = True
            return "fired"
        if self.firing and self.clear_streak >= self.resolve_after:
            self.firing = False
            return "resolved"
        return None
