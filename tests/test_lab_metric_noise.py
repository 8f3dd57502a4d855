"""The lab's metric model: factors that multiply and that act only together, a seeded
noise within and between starts, the warm-up transient, a rare outlier, a latency, and
the old scenario form still read as before."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from orchestrator.lab import scenario as sc
from orchestrator.lab.scenario import ScenarioError

NOISY = """
name: noisy
throughput:
  base: 1000
  factors:
    - {when: {a: true}, multiply: 0.9}
    - {when: {b: true}, multiply: 0.9}
    - {when: {c: true, d: true}, multiply: 0.8}
  noise:
    within: 0.03
    between: 0.05
    warmup: {runs: 2, worse: 0.2}
    outlier: {probability: 0.02, worse: 0.5}
latency:
  base: 0.05
  factors: [{when: {a: true}, multiply: 1.2}]
  noise: {within: 0.02}
"""


def load(tmp_path: Path, text: str) -> sc.Scenario:
    path = tmp_path / "scenario.yaml"
    path.write_text(text, encoding="utf-8")
    return sc.load(path)


def test_factors_multiply_and_a_pair_acts_only_together(tmp_path: Path) -> None:
    m = load(tmp_path, NOISY).throughput_model()
    assert m.value({}, {}) == 1000
    assert m.value({"a": True, "b": True}, {}) == pytest.approx(810)
    assert m.value({"c": True}, {}) == 1000 and m.value({"d": True}, {}) == 1000
    assert m.value({"c": True, "d": True}, {}) == pytest.approx(800)


def test_noise_is_seeded_and_splits_within_and_between_starts(tmp_path: Path) -> None:
    m = load(tmp_path, NOISY).throughput_model()
    assert m.start({}, {}, random.Random(5), 6) == m.start({}, {}, random.Random(5), 6)
    rng = random.Random(11)
    starts = [m.start({}, {}, rng, 12)[2:] for _ in range(400)]
    levels = [statistics.median(s) for s in starts]
    between = statistics.stdev(levels) / statistics.mean(levels)
    within = statistics.mean(statistics.stdev(s) / statistics.mean(s) for s in starts)
    assert 0.04 < between < 0.06
    assert 0.02 < within < 0.045
    assert statistics.mean(levels) == pytest.approx(1000, rel=0.02)


def test_warmup_runs_are_slower_and_an_outlier_is_rare(tmp_path: Path) -> None:
    m = load(tmp_path, NOISY).throughput_model()
    rng = random.Random(3)
    runs = [m.start({}, {}, rng, 6) for _ in range(500)]
    first = statistics.mean(r[0] for r in runs)
    second = statistics.mean(r[1] for r in runs)
    later = statistics.mean(v for r in runs for v in r[2:])
    assert first < second < later
    assert first / later == pytest.approx(1 / 1.2, rel=0.02)
    slow = sum(v < 0.8 * later for r in runs for v in r[2:]) / (500 * 4)
    assert 0.005 < slow < 0.05


def test_latency_is_worse_when_later(tmp_path: Path) -> None:
    scen = load(tmp_path, NOISY)
    assert scen.latency is not None and not scen.latency.higher_is_better
    assert scen.latency.value({"a": True}, {}) == pytest.approx(0.06)
    noiseless = sc.MetricModel(0.05, (), False, sc.MetricNoise(warmup_runs=1, warmup_worse=0.5))
    assert noiseless.start({}, {}, random.Random(0), 2) == [pytest.approx(0.075), 0.05]


def test_the_old_forms_still_load_without_noise(tmp_path: Path) -> None:
    scen = load(tmp_path, "name: old\nthroughput: 89.5\n")
    assert scen.throughput_model().start({}, {}, random.Random(0), 3) == [89.5] * 3
    assert scen.latency is None
    scen = load(
        tmp_path,
        "name: old\nthroughput: {base: 10, factors: [{when: {x: 1}, multiply: 0.5}]}\n",
    )
    assert scen.tokens_per_second({"x": 1}, {}) == 5


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("throughput: {base: 1, noise: {within: -0.1}}", "throughput.noise.within"),
        ("throughput: {base: 1, noise: {jitter: 0.1}}", "throughput.noise"),
        ("latency: {factors: []}", "latency.base"),
        ("latency: {base: 1, noise: {outlier: {probability: 2}}}", "latency.noise.outlier"),
    ],
)
def test_bad_noise_names_the_key(tmp_path: Path, text: str, where: str) -> None:
    with pytest.raises(ScenarioError, match=where.replace(".", r"\.")):
        load(tmp_path, f"name: bad\n{text}\n")


def test_a_lognormal_start_keeps_the_mean() -> None:
    m = sc.MetricModel(100.0, (), True, sc.MetricNoise(between=0.1))
    rng = random.Random(9)
    mean = statistics.mean(m.start({}, {}, rng, 1)[0] for _ in range(4000))
    assert math.isclose(mean, 100.0, rel_tol=0.01)


def test_the_lab_bench_runs_named_back_to_back_are_bursts_of_their_own() -> None:
    # a probe's repeats follow each other with no idle gap: their run names, not the gap,
    # tell the engine a new run began (the gap alone merged them into one draw)
    from orchestrator.lab.server import Engine

    engine = Engine(100.0, None, None)  # type: ignore[arg-type]
    engine.pace = lambda i: (0.5, 1.0, 2.0)[i]
    rates = []
    for now, run in ((0.0, "a"), (0.0, "a"), (0.2, "b"), (0.4, "c")):
        engine.reserve(10, now=now, run=run)
        rates.append(engine.rate)
    assert rates == [50.0, 50.0, 100.0, 200.0]
    # a client without the header: the idle gap still starts a new burst, and only it
    other = Engine(100.0, None, None)  # type: ignore[arg-type]
    other.pace = lambda i: (0.5, 1.0, 2.0)[i]
    other.reserve(10, now=0.0)
    other.reserve(10, now=0.1)
    assert other.rate == 50.0
    other.reserve(10, now=5.0)
    assert other.rate == 100.0
