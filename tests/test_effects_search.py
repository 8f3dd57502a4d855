"""The measured-effect search against scripted hosts that draw each start's figures from
the lab's noise model: one flag, additive flags, flags that cost only together, a speedup,
a latency, an effect below the bar, and a host that drifts on its own."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from orchestrator.lab.scenario_model import Condition, Factor, MetricModel, MetricNoise, When
from orchestrator.planner.effect_stats import LATENCY, THROUGHPUT, Direction
from orchestrator.planner.effects import EffectAnswer, EffectSearch, EffectSettings, Measure, drive

N = 8
NOISE = MetricNoise(
    within=0.014, between=0.014, warmup_runs=1, warmup_worse=0.15, outlier_probability=0.01
)


def factor(flags: Sequence[int], multiply: float) -> Factor:
    return Factor(When(tuple(Condition(f"f{i}", "present") for i in flags)), multiply)


def search(
    factors: Sequence[Factor],
    seed: int,
    *,
    direction: Direction = THROUGHPUT,
    noise: MetricNoise = NOISE,
    drift_per_start: float = 0.0,
) -> EffectAnswer:
    rng = random.Random(seed)
    base = 4000.0 if direction.higher_is_better else 0.05
    model = MetricModel(base, tuple(factors), direction.higher_is_better, noise)
    starts = 0

    def oracle(req: Measure) -> list[float]:
        nonlocal starts
        starts += 1
        figures = model.start({f"f{i}": True for i in req.variant}, {}, rng, req.runs)
        slower = 1 - drift_per_start * starts  # the host slows down on its own
        return [x * slower if direction.higher_is_better else x / slower for x in figures]

    return drive(EffectSearch(N, EffectSettings(direction=direction)), oracle)


def named(a: EffectAnswer) -> set[frozenset[int]]:
    return {e.deltas for e in a.named}


@pytest.mark.parametrize("seed", range(4))
def test_one_flag_costing_ten_percent_is_named_with_its_interval(seed: int) -> None:
    a = search([factor([5], 0.90)], seed)
    assert a.status == "found" and named(a) == {frozenset({5})}
    change, low, high = a.named[0].percent(THROUGHPUT)
    # a 95 % interval misses the truth one time in twenty: within a point of it here
    assert low - 1 <= -10 <= high + 1 and -13 < change < -7
    assert a.confidence >= 0.95 and 0.8 < a.explained < 1.2
    assert a.starts >= 5 and a.runs > a.starts  # both counted, repeats inside starts
    # the noise it measured and states: about the host's (1.4 % inside and between starts)
    assert 0.007 < a.noise_within < 0.03 and a.noise_between < 0.04
    assert a.cleared and all(e.low <= e.effect <= e.high for e in a.cleared)
    assert all(not (e.deltas & {5}) for e in a.cleared if len(e.deltas) == 1)


@pytest.mark.parametrize("seed", range(3))
def test_two_flags_adding_up_are_both_named(seed: int) -> None:
    a = search([factor([1], 0.94), factor([6], 0.94)], seed)
    assert a.status == "found" and named(a) == {frozenset({1}), frozenset({6})}


@pytest.mark.parametrize("seed", range(3))
def test_flags_that_cost_only_together_are_named_as_a_set(seed: int) -> None:
    a = search([factor([2, 6], 0.85)], seed)
    assert a.status == "found" and named(a) == {frozenset({2, 6})}


def test_a_speedup_is_attributed() -> None:
    a = search([factor([3], 1.10)], 1)
    assert a.status == "found" and named(a) == {frozenset({3})}
    assert a.named[0].percent(THROUGHPUT)[0] > 5


def test_a_latency_is_worse_when_higher() -> None:
    a = search([factor([0], 1.10)], 2, direction=LATENCY)
    assert a.status == "found" and named(a) == {frozenset({0})}
    assert a.named[0].percent(LATENCY)[0] > 5


@pytest.mark.parametrize("seed", range(3))
def test_an_effect_below_the_bar_names_nothing(seed: int) -> None:
    a = search([factor([4], 0.98)], seed)
    assert a.status in ("none", "unsure") and not a.named


def test_a_drifting_host_is_not_read_as_an_effect() -> None:
    a = search([], 3, drift_per_start=0.004)
    assert not a.named and a.status in ("none", "unsure")
    assert a.drift > 0  # the host got slower: a positive cost, stated in the answer


@pytest.mark.parametrize("seed", range(2))
def test_a_flag_is_named_on_a_drifting_host_and_the_drift_stated(seed: int) -> None:
    a = search([factor([5], 0.90)], seed, drift_per_start=0.002)
    assert a.status == "found" and named(a) == {frozenset({5})}
    assert a.drift > 0
