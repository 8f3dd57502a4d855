"""Time in hours where a person decides (fast tier): a start's time declared, learned from
the store or unknown; `plan`'s forecast; the live line's revised estimate and the cost the
switch to the noise-aware search announces; the noise-aware estimate itself."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from orchestrator.campaign import timing
from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan
from orchestrator.cli import main
from orchestrator.cli.live import LiveView
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import ConfigError
from orchestrator.events import CampaignStarted, RunRecorded, SearchSwitched
from orchestrator.planner.noise_estimate import flaky_runs, observed_rate
from orchestrator.store.store import Store
from tests.support.scripted import (
    TARGET_ERROR,
    Faults,
    Oracle,
    Rule,
    ScriptedExecutor,
    host,
    write_pair,
)


def declare(path: Path, **keys: object) -> None:
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump(data | keys))


def test_run_time_declared_learned_or_unknown(tmp_path: Path) -> None:
    good, bad = write_pair(tmp_path / "exp", 4)
    plan = make_plan(good, bad)
    rt = timing.run_time(plan)
    assert rt.seconds is None and rt.worst == 60.0  # the pair's health timeout
    store = Store(tmp_path / "results")
    oracle = Oracle([Rule(frozenset({1}), "cuda_graph", TARGET_ERROR)])
    Bisection(
        store,
        plan,
        [host()],
        command="t",
        executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
    ).run()
    store.db.execute("UPDATE runs SET duration = 600")  # as a 10-minute start would record
    learned = timing.run_time(plan, store, "scripted")
    assert learned.seconds == 600 and learned.source.startswith("learned from ")
    assert learned.worst == 600  # longer than the health deadline
    assert timing.run_time(plan, store, "elsewhere").seconds is None  # another host
    declare(bad, expect={"run_time": "14m"})
    plan = make_plan(good, bad)
    rt = timing.run_time(plan, store, "scripted")  # declared wins over learned
    assert rt.seconds == 840 and "expect.run_time" in rt.source


def test_expect_run_time_is_validated(tmp_path: Path) -> None:
    good, bad = write_pair(tmp_path / "exp", 2)
    declare(bad, expect={"run_time": "soon"})
    with pytest.raises(ConfigError) as exc:
        load_experiment(bad)
    assert "expect.run_time" in str(exc.value) and "duration" in str(exc.value)
    declare(bad, expect={"run_time": "14m"}, rehearse="yes")
    with pytest.raises(ConfigError) as exc:
        load_experiment(bad)
    assert "rehearse" in str(exc.value) and "dummy-weights" in str(exc.value)


def test_plan_prints_hours_and_its_range(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good, bad = write_pair(tmp_path / "exp", 8)
    declare(bad, expect={"run_time": "14m"})
    capsys.readouterr()
    assert (
        main(
            [
                "plan",
                "--good",
                str(good),
                "--bad",
                str(bad),
                "--results",
                str(tmp_path / "none"),
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["run_time"]["seconds"] == 840
    one, pair, flaky = data["forecast"]
    assert one["hours"] == pytest.approx(one["runs"] * 840 / 3600, abs=0.03)
    assert one["runs"] < pair["runs"] < flaky["runs"] < flaky["worst_runs"]
    assert data["hours_range"][0] == one["hours"]
    assert data["hours_range"][1] == pytest.approx(flaky["worst_runs"] * 840 / 3600, abs=0.01)
    assert not (tmp_path / "none").exists()  # plan creates no results directory
    assert (
        main(["plan", "--good", str(good), "--bad", str(bad), "--results", str(tmp_path / "none")])
        == 0
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "at 14 min a start (declared in" in out and " h to " in out


def test_noise_estimate_grows_with_rarer_failures() -> None:
    det = 12.7  # the default search on an AND-pair of 8, p = 1 (the table of docs/search.md)
    assert flaky_runs(det, 1.0) == (det, det)
    means = [flaky_runs(det, p)[0] for p in (0.8, 0.5, 0.3)]
    # within 10 % of the table's 26.4, 50.5, 94.1
    for got, table in zip(means, (26.4, 50.5, 94.1), strict=True):
        assert abs(got - table) / table < 0.1
    assert flaky_runs(det, 0.5)[1] > means[1]
    assert observed_rate(1, 2) == 0.5 and observed_rate(0, 0) == 0.5


def test_live_view_revises_the_estimate_and_prices_the_switch() -> None:
    buf = io.StringIO()
    view = LiveView(Console(file=buf, width=200, force_terminal=False))
    view(
        CampaignStarted(
            host="h",
            campaign_id="c1",
            n_deltas=8,
            strategy="auto",
            expected_runs=12.0,
            run_time_s=840.0,
        )
    )
    assert "about 12 runs expected (about 2.8 h at 14 min a start)" in buf.getvalue()
    for i in range(1, 5):
        view(
            RunRecorded(
                host="h",
                run_id=f"c1.{i}",
                label="x",
                purpose="search",
                verdict=Verdict.PASS,
                duration_s=600.0,
                done=i,
            )
        )
    assert view.per_start() == 600.0  # what the starts took, not what was declared
    assert view.to_answer() == f"~{timing.duration_text(8 * 600)} to the answer"
    view(
        SearchSwitched(
            campaign_id="c1", reason="the failure is flaky: bad passed", expected_runs=40.0, done=4
        )
    )
    out = " ".join(buf.getvalue().split())
    assert (
        "the noise-aware search costs about 36 more runs, about 6.0 h (about 40 in all, "
        "was 12)" in out
    )
    assert view.to_answer() == "~6.0 h to the answer"


def test_campaign_switch_carries_a_revised_estimate(tmp_path: Path) -> None:
    good, bad = write_pair(tmp_path / "exp", 6)
    seen: list[SearchSwitched] = []
    oracle = Oracle([Rule(frozenset({1, 4}), "cuda_graph", TARGET_ERROR, probability=0.5)], seed=3)
    out = Bisection(
        Store(tmp_path / "r"),
        make_plan(good, bad),
        [host()],
        command="t",
        listener=lambda e: seen.append(e) if isinstance(e, SearchSwitched) else None,
        executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
    ).run()
    [switch] = seen
    assert switch.expected_runs is not None and switch.expected_runs > switch.done + 1
    assert switch.expected_runs > 2 + make_plan(good, bad).estimates()["pair_mean"]
    assert out.noise["expected_runs_at_switch"] == round(switch.expected_runs, 1)


@pytest.mark.parametrize(
    "strategy, n, needs",
    [
        ("auto", 3, {0}),
        ("auto", 3, {1, 2}),
        ("auto", 5, {1, 3}),
        ("auto", 8, {2, 6}),
        ("noisy", 3, {1, 2}),
        ("noisy", 6, {4}),
    ],
)
def test_plan_estimates_what_the_search_costs_when_nothing_is_flaky(
    tmp_path: Path, strategy: str, n: int, needs: set[int]
) -> None:
    """`plan`'s runs for one flag and an interacting pair are those of the search a
    campaign runs: by default `auto`, then runs until the answer is sure; with `noisy`, the
    noise-aware search from the start. They were `auto`'s alone, so a pair among 3 changes
    was said to take 7 runs at worst, and took 12."""
    good, bad = write_pair(tmp_path / "exp", n)
    oracle = Oracle([Rule(frozenset(needs), "cuda_graph", TARGET_ERROR)])
    store = Store(tmp_path / "r")
    plan = make_plan(good, bad, strategy)
    out = Bisection(
        store,
        plan,
        [host()],
        command="t",
        options=BisectOptions(strategy=strategy),
        executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
    ).run()
    assert out.found
    spent = len(store.runs(out.campaign_id)) - 2  # after the endpoints
    est = plan.estimates()
    shape = "single" if len(needs) == 1 else "pair"
    assert spent <= est[f"{shape}_worst"], (spent, est)
    assert abs(spent - est[f"{shape}_mean"]) <= 3, (spent, est)


def test_plan_of_one_delta_speaks_of_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 35, row 11: one delta was "1 deltas", a first round announced by "then:" with
    nothing after it, and an interacting pair of 0.0 runs among a single change."""
    good, bad = write_pair(tmp_path / "exp", 1)
    declare(bad, expect={"run_time": "10m"})
    capsys.readouterr()
    assert (
        main(["plan", "--good", str(good), "--bad", str(bad), "--results", str(tmp_path / "none")])
        == 0
    )
    out = capsys.readouterr().out
    assert "1 delta\n" in out and "1 deltas" not in out
    assert "then:" not in out and "with one change they are the answer" in out
    assert "pair" not in out, out
    assert (
        main(
            [
                "plan",
                "--good",
                str(good),
                "--bad",
                str(bad),
                "--results",
                str(tmp_path / "none"),
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    shapes = [f["shape"] for f in data["forecast"]]
    assert shapes == ["one flag", "one flag, flaky (fails on 50% of the starts)"]
    assert data["forecast"][0]["runs"] == 2  # the two endpoints are the search


@pytest.mark.parametrize("size", [1, 2])
def test_plan_prices_a_rehearsal_as_the_campaign_runs_it(tmp_path: Path, size: int) -> None:
    """Issue 35, row 10: `plan` ignored `rehearse: dummy-weights` and priced the search
    alone. Every placement of one flag and of a pair among 4 changes, bisected with a
    rehearsal over the scripted host: the forecast's runs are their mean, its worst their
    most, and each took the forecast's starts on real weights."""
    import itertools

    n = 4
    good, bad = write_pair(tmp_path / "exp", n)
    declare(bad, rehearse="dummy-weights")
    plan = make_plan(good, bad)
    casts = timing.forecasts(plan.estimates(), timing.run_time(plan), n, rehearse=True)
    cast = casts[size - 1]
    took, real = [], []
    for i, needs in enumerate(itertools.combinations(range(n), size)):
        store = Store(tmp_path / f"r{i}")
        oracle = Oracle([Rule(frozenset(needs), "cuda_graph", TARGET_ERROR)])
        out = Bisection(
            store,
            plan,
            [host()],
            command="t",
            options=BisectOptions(rehearse=True),
            executor_factory=lambda h, *_, o=oracle: ScriptedExecutor(h, o, Faults()),
        ).run()
        assert out.found and out.weights["rehearsal"] == "confirmed"
        runs = store.runs(out.campaign_id)
        took.append(len(runs))
        real.append(sum(r.weights == "real" for r in runs))
        store.close()
    assert sum(took) / len(took) == pytest.approx(cast.runs, abs=0.05), (took, cast)
    assert max(took) <= cast.worst_runs
    assert set(real) == {cast.real_runs} == {2}


def test_plan_says_what_a_rehearsal_costs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good, bad = write_pair(tmp_path / "exp", 4)
    declare(bad, rehearse="dummy-weights")
    capsys.readouterr()
    args = ["plan", "--good", str(good), "--bad", str(bad), "--results", str(tmp_path / "r")]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rehearse"] is True
    one, pair, flaky = data["forecast"]
    assert one["real_weight_runs"] == pair["real_weight_runs"] == 2
    assert flaky["real_weight_runs"] == 4  # at a rate of 0.5, each failure takes 2 starts
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "rehearsal on dummy weights" in out and "(2 on real weights)" in out


def test_the_switch_prices_the_runs_still_to_come(tmp_path: Path) -> None:
    """Issue 35, row 10: the switch to the noise-aware search said "about 1 more run" and
    took 16 (its fit priced the search from its start, 2 more than the runs so far at
    least). Now the runs still to come are measured on simulated runs from the recorded
    ones: here the switch comes after 18 runs and the search takes 20 more."""
    good, bad = write_pair(tmp_path / "exp", 6)
    seen: list[SearchSwitched] = []
    oracle = Oracle([Rule(frozenset({1, 4}), "cuda_graph", TARGET_ERROR, probability=0.5)], seed=8)
    store = Store(tmp_path / "r")
    out = Bisection(
        store,
        make_plan(good, bad),
        [host()],
        command="t",
        listener=lambda e: seen.append(e) if isinstance(e, SearchSwitched) else None,
        executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
    ).run()
    [switch] = seen
    took = len(store.runs(out.campaign_id)) - switch.done
    said = switch.expected_runs - switch.done
    assert out.found and took >= 10
    assert took / 2 <= said <= took * 2, (said, took)
