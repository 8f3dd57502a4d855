"""The dispatch loop on its own: items that are not a bisection's variants, on a real pool.

`campaign/dispatch.py` knows tasks, hosts and budgets and asks its `Source` for the rest,
so a sweep's items can drive it as a bisection's variants do. The pool and the classifier
are the real ones; the hosts are scripted (tests/support/scripted.py): feature-1 crashes the
server, the other flags do not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.campaign.dispatch import Dispatch
from orchestrator.campaign.pool import Pool, Task
from orchestrator.config.experiment import Experiment
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.events import null_listener
from tests.support.scripted import (
    TARGET_ERROR,
    Faults,
    Oracle,
    Rule,
    factory,
    flag,
    host,
    write_pair,
)


class Items:
    """A sweep-like source: named items, each run until it has `runs` verdicts."""

    def __init__(
        self,
        exps: dict[str, Experiment],
        *,
        runs: int = 1,
        max_runs: int | None = None,
        at_hand: dict[str, Verdict] | None = None,
    ) -> None:
        self.exps = exps
        self.runs = runs
        self.max_runs = max_runs
        self.at_hand = dict(at_hand or {})
        self.verdicts: dict[str, list[Verdict]] = {k: [] for k in exps}
        self.started: list[str] = []

    def wanted(self) -> list[str]:
        return [k for k, got in self.verdicts.items() for _ in range(self.runs - len(got))]

    def obtain(self, key: Any) -> bool:
        if key not in self.at_hand:
            return False
        self.verdicts[key].append(self.at_hand.pop(key))
        return True

    def budget(self, in_flight: int) -> str | None:
        spent = self.max_runs is not None and len(self.started) >= self.max_runs
        return f"--max-runs {self.max_runs} reached" if spent else None

    def start(self, key: Any) -> Task:
        self.started.append(key)
        return Task(key=key, exp=self.exps[key], label=key, run_id=f"run-{len(self.started)}")

    def blocked(self, key: Any) -> bool:
        return False

    def known(self, key: Any) -> bool:
        return False

    def start_ahead(self, key: Any) -> Task:
        raise AssertionError("nothing runs ahead without `speculate`")

    def finished(self, task: Task, result: object) -> None:
        self.verdicts[task.key].append(result.verdict)  # type: ignore[attr-defined]


@pytest.fixture
def exps(tmp_path: Path) -> dict[str, Experiment]:
    good_path, _ = write_pair(tmp_path / "exp", 3)
    good = load_experiment(good_path)
    return {
        "plain": good,
        "crashing": good.with_changes(flags={flag(1): True}),
        "harmless": good.with_changes(flags={flag(2): True}),
    }


def drive(items: Items, hosts: int = 2) -> str | None:
    oracle = Oracle([Rule(frozenset({1}), "cuda_graph", TARGET_ERROR)])
    with Pool(
        [host(f"h{i}") for i in range(hosts)],
        service="scripted.service",
        campaign="c0",
        executor_factory=factory(oracle, Faults()),
        listener=null_listener,
    ) as pool:
        return Dispatch(pool, items).run(items.wanted)


def test_each_item_runs_once_and_its_verdict_comes_back(exps: dict[str, Experiment]) -> None:
    items = Items(exps)
    assert drive(items) is None
    assert sorted(items.started) == ["crashing", "harmless", "plain"]
    assert items.verdicts == {
        "plain": [Verdict.PASS],
        "crashing": [Verdict.FAIL],
        "harmless": [Verdict.PASS],
    }


def test_an_item_wanted_twice_runs_twice(exps: dict[str, Experiment]) -> None:
    items = Items({"crashing": exps["crashing"]}, runs=2)
    assert drive(items) is None
    assert items.started == ["crashing", "crashing"]
    assert items.verdicts == {"crashing": [Verdict.FAIL, Verdict.FAIL]}


def test_a_verdict_at_hand_starts_nothing(exps: dict[str, Experiment]) -> None:
    items = Items(exps, at_hand={"plain": Verdict.PASS, "harmless": Verdict.PASS})
    assert drive(items) is None
    assert items.started == ["crashing"]
    assert items.verdicts["plain"] == [Verdict.PASS]


def test_a_spent_budget_stops_the_loop_and_says_why(exps: dict[str, Experiment]) -> None:
    items = Items(exps, max_runs=1)
    assert drive(items, hosts=1) == "--max-runs 1 reached"
    assert items.started == ["plain"]  # the run in progress still hands its verdict back
    assert items.verdicts == {"plain": [Verdict.PASS], "crashing": [], "harmless": []}
