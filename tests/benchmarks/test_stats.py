"""bench/stats.py: the interval every ratio of `make bench` gets, and the verdict of its goal."""

from __future__ import annotations

import argparse
import math

import pytest

from bench import stats
from bench.__main__ import table
from bench.common import Row


def order_statistic_interval(values: list[float]) -> tuple[float, float] | None:
    """The textbook sign-test interval, computed here without scipy: [x(k), x(n-k+1)] for the
    largest k with P(Binomial(n, 1/2) < k) <= (1 - LEVEL) / 2."""
    n, xs = len(values), sorted(values)
    tail = (1 - stats.LEVEL) / 2
    k = 0
    while sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= tail:
        k += 1
    return None if k == 0 else (xs[k - 1], xs[n - k])


@pytest.mark.parametrize("n", [6, 8, 12, 20, 33])
def test_interval_is_the_sign_tests(n):
    values = [1 + 0.01 * ((i * 7) % n - n / 2) for i in range(n)]
    iv = stats.interval(values)
    assert (iv.low, iv.high) == order_statistic_interval(values)


def test_noise_around_one_is_not_distinguishable_and_leaves_the_goal_open():
    iv = stats.interval([0.95, 1.02, 0.99, 1.05, 0.97, 1.01, 1.0, 0.98])
    assert iv.contains(1.0) and "not distinguishable from 1" in iv.text()
    assert stats.verdict("ratio >= 0.99", iv) == "not resolved"


def test_a_steady_gain_is_resolved_and_one_wild_round_does_not_hide_it():
    steady = [1.04, 1.05, 1.06, 1.05, 1.04, 1.06, 1.05, 1.07, 1.05, 1.04, 1.06]
    for values in (steady, steady + [3.0], steady + [0.2]):
        iv = stats.interval(values)
        assert iv.low > 1 and not iv.contains(1.0), values
        assert stats.verdict("ratio >= 0.99", iv) is True
        assert stats.verdict("ratio <= 1.03", iv) is False
        assert "not distinguishable" not in iv.text()


def test_too_few_pairs_give_no_interval_and_no_verdict_either_way():
    iv = stats.interval([1.2, 1.3, 1.25, 1.22, 1.28])
    assert not iv.resolved and "n=5: too few pairs" in iv.text()
    assert stats.verdict("ratio >= 0.99", iv) == "not resolved"
    assert stats.interval([]) is None and stats.interval(["no", None]) is None


def test_only_ratio_goals_are_judged_by_the_interval():
    iv = stats.interval([1.0] * 8)
    assert stats.verdict("ours <= 3 s", iv) is None
    assert stats.verdict("ratio <= 1.03", iv) is True


def test_table_shows_the_interval_and_the_judged_goal():
    rows = [
        Row("s", "noisy", "x", [1] * 8, [1] * 8, [0.9, 1.1] * 4, "ratio >= 0.99", "not resolved"),
        Row("s", "few", "x", [1], [1], [1.5], "", None),
    ]
    info = {"date": "d", "nproc": 2, "cpu": "c", "loadavg_at_start": (0, 0, 0), "vllm": "v"}
    text = table(rows, info, argparse.Namespace(repeat=1, quick=False))
    assert (
        "| [0.900, 1.100] n=8: not distinguishable from 1 | ratio >= 0.99 | not resolved |" in text
    )
    assert "n=1: too few pairs for a 95% interval" in text
