"""The answers bench's placements: the flaky accuracy drop of the lab answered right and
sure, by the campaign's default search against the scenario's own rules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _bench():  # noqa: ANN202
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_answers", BENCH / "answers.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_flaky_accuracy_drop_answered_in_19_of_20_placements() -> None:
    bench = _bench()
    got = bench.placements("flaky-answers", 20)
    sure = [right and conf is not None and conf >= 0.95 for right, _, conf in got]
    assert len(got) == 20 and sum(sure) >= 19, got


def test_the_scripted_host_follows_the_scenarios_rules() -> None:
    bench = _bench()
    oracle, n = bench.oracle_for("crash-wrong", [0, 1, 2], 0)
    # the crash (faults:) is the target, the garbled answers (answers:) the other failure
    assert n == 3 and len(oracle.terms) == 1 and oracle.other is not None
    assert oracle.terms[0] != oracle.other and oracle.p == 1.0
    flaky, _ = bench.oracle_for("flaky-answers", list(range(7)), 0)
    assert flaky.p == 0.5 and flaky.other is None


def test_the_real_lab_placements_are_the_shipped_pair_reordered(tmp_path: Path) -> None:
    from orchestrator.campaign.planning import make_plan

    bench = _bench()
    lab = BENCH.parent / "experiments" / "lab" / "flaky-answers"
    shipped = make_plan(lab / "good.yaml", lab / "bad.yaml")
    orders = set()
    for seed in range(4):
        good, bad = bench._placement_pair(tmp_path, seed, 31999)
        plan = make_plan(good, bad)
        assert sorted(map(str, plan.deltas)) == sorted(map(str, shipped.deltas))
        assert plan.good.port == 31999 and plan.bad.port == 31999
        orders.add(tuple(map(str, plan.deltas)))
    assert len(orders) > 1  # the culprit sits at other places
