"""How sure a ratio is: a 95 % confidence interval for the median of the per-pair ratios, and the
verdict a `ratio >= X` / `ratio <= X` goal gets from it.

The interval is the sign test's (scipy.stats.quantile_test): distribution-free, it needs only the
pairs to be independent of each other. Why the median and not a mean with a t-interval: on a shared
2-core machine one round can be 2-4x off its neighbours (another job, a stall), which drags a mean
and widens its interval for all. The price: at least 6 pairs for any 95 % interval (with 6 it is
[min, max]), about 20 for one that leaves out the two extremes on each side; resolving a 1 %
difference takes pairs whose spread is itself a few %.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from dataclasses import dataclass

LEVEL = 0.95
GOAL = re.compile(r"^ratio\s*(>=|<=)\s*([0-9.]+)$")


@dataclass(frozen=True)
class Interval:
    median: float
    low: float | None  # None: too few pairs for an interval at LEVEL
    high: float | None
    n: int

    @property
    def resolved(self) -> bool:
        return self.low is not None

    def contains(self, x: float) -> bool:
        return not self.resolved or self.low <= x <= self.high

    def text(self) -> str:
        if not self.resolved:
            return f"n={self.n}: too few pairs for a {LEVEL:.0%} interval"
        out = f"[{self.low:.3f}, {self.high:.3f}] n={self.n}"
        return out + (": not distinguishable from 1" if self.contains(1.0) else "")


def interval(ratios: list[float]) -> Interval | None:
    """The median of `ratios` and its LEVEL confidence interval; None without numeric ratios."""
    values = [float(r) for r in ratios if isinstance(r, (int, float)) and not isinstance(r, bool)]
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return None
    from scipy.stats import quantile_test

    ci = quantile_test(values, q=statistics.median(values), p=0.5).confidence_interval(LEVEL)
    low, high = float(ci.low), float(ci.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        low = high = None
    return Interval(statistics.median(values), low, high, len(values))


def as_dict(iv: Interval | None) -> dict | None:
    return None if iv is None else {**dataclasses.asdict(iv), "level": LEVEL}


def verdict(goal: str, iv: Interval | None) -> bool | str | None:
    """For a goal `ratio >= X` or `ratio <= X`: True when the whole interval meets it, False when
    none of it does, "not resolved" when the interval straddles X (or there is none). None for
    any other goal (the section judges it)."""
    m = GOAL.match(goal.strip())
    if m is None or iv is None:
        return None
    op, x = m.group(1), float(m.group(2))
    if not iv.resolved:
        return "not resolved"
    if op == ">=":
        return True if iv.low >= x else False if iv.high < x else "not resolved"
    return True if iv.high <= x else False if iv.low > x else "not resolved"
