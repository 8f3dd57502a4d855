"""A bisection of a probe metric under benchmark noise (fast tier).

The probe's bar is relative to good (`pass_if: ">= 0.95 * good"`): the campaign measures
instead of judging one number against one. The scripted host (tests/support/scripted.py)
draws each start's probe figures from the lab's seeded noise model (CV 3 % between runs
and between starts, one flag costing 10 % among six); the campaign, the measured-effect
search, the store and the classifier are the real ones.
"""

from __future__ import annotations

import random
from pathlib import Path

import yaml

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import Status
from orchestrator.cli import effect_table
from orchestrator.lab.scenario_model import MetricModel, MetricNoise
from orchestrator.store.store import Store
from tests.support.scripted import Faults, Oracle, ScriptedExecutor, host, write_pair

N = 6
SLOW = 3  # --feature-3 costs 10 %
PROBE = {
    "run": "bench --port {port}",
    "metric": r"throughput: ([\d.]+)",
    "pass_if": ">= 0.95 * good",
}


def pair(root: Path, **probe: object) -> tuple[Path, Path]:
    good, bad = write_pair(root, N)
    data = yaml.safe_load(good.read_text())
    data["probe"] = PROBE | probe
    good.write_text(yaml.safe_dump(data))
    return good, bad


def noisy(costs: dict[int, float], cv: float = 0.03):  # noqa: ANN201
    """Each start's figures: 2400 tok/s times each present flag's factor, with the lab's
    log-normal noise between starts and between runs, and a slower first run."""
    noise = MetricNoise(within=cv, between=cv, warmup_runs=1, warmup_worse=0.2)
    model = MetricModel(2400.0, noise=noise)

    def draw(variant: frozenset[int], rng: random.Random, runs: int) -> list[float]:
        level = model.base * model.level(rng)
        for i, factor in costs.items():
            if i in variant:
                level *= factor
        return [level * model.run_factor(rng, k) for k in range(runs)]

    return draw


def campaign(tmp_path: Path, oracle: Oracle, **probe: object):  # noqa: ANN201
    good, bad = pair(tmp_path / "exp", **probe)
    plan = make_plan(good, bad, "auto")
    store = Store(tmp_path / "results")
    try:
        out = Bisection(
            store,
            plan,
            [host()],
            command="test",
            executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
        ).run()
        runs = store.runs(out.campaign_id)
        records = {r.id: store.host_record(r.id) for r in runs}
    finally:
        store.close()
    return out, runs, records


def test_one_flag_costing_ten_percent_is_named_with_its_interval(tmp_path: Path) -> None:
    oracle = Oracle([], seed=1, metric=noisy({SLOW: 0.90}))
    out, runs, records = campaign(tmp_path, oracle)
    assert out.status is Status.FOUND, out.message
    assert out.effects is not None
    [named] = out.effects["named"]
    assert named["flags"] == [f"--feature-{SLOW}"]
    assert named["low"] <= -10.0 * 0.5 and named["high"] >= -10.0 * 1.5  # about -10 %
    assert named["low"] <= named["change"] <= named["high"] < 0
    assert [c.flags for c in out.culprits] == [[f"--feature-{SLOW}"]]
    # every start ran the probe warm-up + 3 times, each figure kept with the run
    for r in runs:
        assert len(records[r.id]["probe"]["values"]) == 4
    total = out.effects["total"]
    assert total["low"] < -5.0 and out.effects["noise_within"] > 0
    assert out.to_dict()["effects"] == out.effects  # --json carries them


def test_no_flag_costs_anything_names_nothing(tmp_path: Path) -> None:
    oracle = Oracle([], seed=3, metric=noisy({}))
    out, _, _ = campaign(tmp_path, oracle)
    assert out.status in (Status.ENDPOINTS, Status.UNSURE), out.message
    assert out.culprits == []
    assert out.effects is not None and out.effects["named"] == []


def test_a_probe_that_fails_on_bad_is_its_own_failure(tmp_path: Path) -> None:
    """Bad's probe fails to run: that failure is bisected as itself (`probe_error`), no
    metric is measured and nothing is called slow."""
    oracle = Oracle([], seed=7, metric=noisy({SLOW: 0.90}), probe_fails=frozenset({SLOW}))
    out, _, _ = campaign(tmp_path, oracle)
    assert out.target is not None and out.target.error_class == "probe_error"
    assert out.effects is None


def test_a_probe_that_fails_midway_is_no_slowdown(tmp_path: Path) -> None:
    """The probe's own failure on a variant the search started ends the search naming that
    run, with no measured effect and no culprit."""
    oracle = Oracle(
        [],
        seed=7,
        metric=noisy({SLOW: 0.90}),
        probe_fails=frozenset({0, 1, 2}),
        probe_fails_exactly=True,
    )
    out, runs, _ = campaign(tmp_path, oracle)
    assert out.culprits == [] and out.effects is None
    assert out.status is Status.INCOMPLETE
    assert "could not be measured" in out.message and "probe_error" in out.message
    [failed] = [
        r for r in runs if r.signature is not None and r.signature.error_class != "probe_threshold"
    ]
    assert failed.variant == (0, 1, 2) and failed.signature.error_class == "probe_error"
    assert f"[run {failed.id}]" in out.message


def test_repeats_and_warmup_are_read_and_recorded(tmp_path: Path) -> None:
    oracle = Oracle([], seed=7, metric=noisy({SLOW: 0.90}))
    _, runs, records = campaign(tmp_path, oracle, repeats=5, warmup=2)
    assert runs and all(len(records[r.id]["probe"]["values"]) == 7 for r in runs)


def test_the_effect_table_names_the_flag_with_its_interval(tmp_path: Path) -> None:
    """What `bisect` prints: the named flag with its effect and interval, bad against
    good, the cleared flags and the noise."""
    oracle = Oracle([], seed=1, metric=noisy({SLOW: 0.90}))
    out, _, _ = campaign(tmp_path, oracle)
    assert out.effects is not None
    text = effect_table.lines(out.effects, out.message)
    [named] = out.effects["named"]
    row = f"--feature-{SLOW}  {named['change']:+.1f}% [{named['low']:+.1f}, {named['high']:+.1f}]"
    assert any(line.split() == row.split() for line in text), text  # (padded to align)
    assert text[0].startswith("throughput (") and "bad against good -" in text[0]
    assert any(line.startswith("named (they explain") for line in text)
    assert any(line.startswith("noise: ") for line in text)
    cleared = text[text.index("cleared (their effect lies inside the noise):") + 1 :]
    assert not any(f"--feature-{SLOW} " in line for line in cleared)


def test_a_benchmark_without_noise_is_bisected_by_its_bar(tmp_path: Path) -> None:
    """Good gives the very same figure on three starts: one figure against one is exact,
    so the bisection of the missed bar answers, with the runs that prove it."""
    oracle = Oracle([], seed=1, metric=noisy({SLOW: 0.90}, cv=0.0))
    out, runs, _ = campaign(tmp_path, oracle)
    assert out.status is Status.FOUND, out.message
    assert out.effects is None
    [culprit] = out.culprits
    assert culprit.flags == [f"--feature-{SLOW}"] and culprit.reproduced_by is not None
    assert sum(r.variant == () for r in runs) >= 3
