"""A campaign reads its recorded runs back a bounded number of times per run.

Every run recorded used to read (and decode) all the campaign's runs again, two or three
times: to check the host's environment against the first run's, and to refresh the
search's copy of its runs. The cost of a campaign grew with the square of its runs (a
real one has hundreds). These count the runs decoded from the store over whole scripted
campaigns, so the square shows as a count, whatever the machine's speed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import orchestrator.store.store as store_mod
from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan
from orchestrator.store.store import Store
from tests.support.scripted import TARGET_ERROR, Faults, Oracle, Rule, factory, host, write_pair


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter of the runs the store decodes (`run_row`: one per row read back)."""
    count = [0]
    real = store_mod.run_row

    def counted(r: object) -> store_mod.RunRow:
        count[0] += 1
        return real(r)  # type: ignore[arg-type]

    monkeypatch.setattr(store_mod, "run_row", counted)
    return count


def test_a_bisection_decodes_each_of_its_runs_a_bounded_number_of_times(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # two causes and kills from outside (infra runs, retried): a long campaign
    good, bad = write_pair(tmp_path / "exp", 12)
    plan = make_plan(good, bad, "auto")
    oracle = Oracle(
        [
            Rule(frozenset({1, 5}), "cuda_graph", TARGET_ERROR),
            Rule(frozenset({9}), "cuda_graph", TARGET_ERROR),
        ]
    )
    store = Store(tmp_path / "results")
    decoded = _count_decodes(monkeypatch)
    outcome = Bisection(
        store,
        plan,
        [host("h")],
        options=BisectOptions(fresh=True),
        command="test",
        executor_factory=factory(oracle, Faults(kill=0.2, seed=7)),
    ).run()
    monkeypatch.undo()
    runs = store.runs(outcome.campaign_id)
    assert len(runs) >= 25, len(runs)  # long enough for the square to show
    # one read of the campaign's runs, plus each run read back once as it is recorded;
    # reading them all at every run decoded about len(runs)**2 (here several hundred)
    assert decoded[0] <= 3 * len(runs) + 10, (decoded[0], len(runs))
