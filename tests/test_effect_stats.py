"""A metric sample against good's: the ratio of medians with its bootstrap interval, the
verdict against the bar in both directions, the budget, and the start's own value."""

from __future__ import annotations

import random

import pytest

from orchestrator.planner.effect_stats import (
    LATENCY,
    THROUGHPUT,
    MetricVerdict,
    compare,
    start_value,
    t_quantile,
)

GOOD = [100.0, 98.0, 102.0, 101.0, 99.0, 100.5]


def test_a_clearly_slower_variant_fails_the_bar() -> None:
    c = compare(GOOD, [88.0, 90.0, 89.0, 91.0], bar=0.05, rng=random.Random(1))
    assert c.verdict is MetricVerdict.FAIL
    assert c.high < 0.95 and c.low <= c.ratio <= c.high
    assert c.percent == pytest.approx(-10.5, abs=0.6)


def test_a_variant_like_good_passes() -> None:
    c = compare(GOOD, [99.5, 100.0, 101.0, 100.2], bar=0.05, rng=random.Random(1))
    assert c.verdict is MetricVerdict.PASS
    assert c.low >= 0.95


def test_a_speedup_passes_a_throughput_bar() -> None:
    c = compare(GOOD, [110.0, 111.0, 109.0], bar=0.05, rng=random.Random(2))
    assert c.verdict is MetricVerdict.PASS and c.ratio > 1.05


def test_latency_is_worse_when_higher() -> None:
    good = [0.100, 0.101, 0.099, 0.100, 0.102]
    slow = [0.111, 0.112, 0.110, 0.113]
    assert compare(good, slow, direction=LATENCY, rng=random.Random(3)).verdict is (
        MetricVerdict.FAIL
    )
    # the same numbers read as a throughput are a speedup, which meets the bar
    assert compare(good, slow, direction=THROUGHPUT, rng=random.Random(3)).verdict is (
        MetricVerdict.PASS
    )


def test_an_effect_near_the_bar_asks_for_more_then_is_unsure() -> None:
    noisy_good = [100.0, 90.0, 108.0, 97.0]
    near = [95.0, 104.0, 88.0]
    c = compare(noisy_good, near, bar=0.05, budget=6, rng=random.Random(4))
    assert c.verdict is MetricVerdict.MORE
    c = compare(noisy_good, near * 2, bar=0.05, budget=6, rng=random.Random(4))
    assert c.verdict is MetricVerdict.UNSURE


def test_the_interval_repeats_under_a_seed() -> None:
    a = compare(GOOD, [95.0, 97.0, 93.0], rng=random.Random(7))
    b = compare(GOOD, [95.0, 97.0, 93.0], rng=random.Random(7))
    assert (a.low, a.high) == (b.low, b.high)


def test_a_start_value_drops_the_warmup_and_resists_an_outlier() -> None:
    assert start_value([60.0, 100.0, 101.0, 99.0], warmup=1) == 100.0
    assert start_value([100.0, 40.0, 101.0, 99.0], warmup=0) == pytest.approx(99.5)
    assert start_value([70.0], warmup=1) == 70.0
    with pytest.raises(ValueError):
        start_value([])


@pytest.mark.parametrize(("df", "exact"), [(5, 2.5706), (10, 2.2281), (30, 2.0423)])
def test_t_quantile_is_close_to_the_table(df: int, exact: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(exact, rel=0.01)
