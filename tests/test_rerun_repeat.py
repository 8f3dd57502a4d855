"""`rerun ID --repeat N` over a scripted host (fast tier): one campaign of N recorded starts,
the host opened once, and the reproduction rate with each start's signature. On the real
sshd host: test_cli_results.py."""

from __future__ import annotations

from pathlib import Path

from orchestrator.campaign.single import single_runs
from orchestrator.cli.run import reproduction
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
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


def test_repeat_counts_failures_and_signatures(tmp_path: Path) -> None:
    _, bad = write_pair(tmp_path / "exp", 3)
    exp = load_experiment(bad)
    oracle = Oracle([Rule(frozenset({0, 2}), "cuda_graph", TARGET_ERROR, probability=0.5)], seed=1)
    opened: list[ScriptedExecutor] = []

    def make(h, *_):  # noqa: ANN001, ANN202
        opened.append(ScriptedExecutor(h, oracle, Faults()))
        return opened[-1]

    store = Store(tmp_path / "results")
    rows = single_runs(
        store,
        exp,
        host(),
        kind="rerun",
        command="test",
        label="rerun of x",
        starts=8,
        executor_factory=make,
    )
    assert len(opened) == 1 and opened[0].runs == 8
    assert [r.id.rsplit(".", 1)[1] for r in rows] == [str(i) for i in range(1, 9)]
    assert len({r.campaign for r in rows}) == 1 and store.runs(rows[0].campaign) == rows
    fails = [r for r in rows if r.verdict is Verdict.FAIL]
    assert 0 < len(fails) < 8  # p = 0.5 over 8 starts with this seed: some of each
    target = fails[0].signature
    rep = reproduction(rows, target)
    assert (rep["starts"], rep["judged"], rep["infra"]) == (8, 8, 0)
    assert rep["failed"] == rep["target_failures"] == len(fails)
    assert rep["passed"] == 8 - len(fails)
    assert rep["signatures"] == {str(target): len(fails)}
    assert rep["rate"] == round(len(fails) / 8, 3)


def test_one_failure_raised_with_two_types_is_counted_once(tmp_path: Path) -> None:
    """Reports count signatures as they compare: one message raised as torch's older
    `RuntimeError` and its newer `DistNetworkError` is one failure (shown as first met)."""
    from dataclasses import replace

    from orchestrator.diagnosis.verdicts import Phase, Signature

    _, bad = write_pair(tmp_path / "exp", 3)
    exp = load_experiment(bad)
    oracle = Oracle([Rule(frozenset({0, 2}), "cuda_graph", TARGET_ERROR)], seed=1)
    store = Store(tmp_path / "results")
    rows = single_runs(
        store,
        exp,
        host(),
        kind="rerun",
        command="test",
        label="rerun of x",
        starts=2,
        executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
    )
    old = Signature(Phase.INIT, "RuntimeError", "The server socket has failed to listen")
    rows = [
        replace(rows[0], verdict=Verdict.FAIL, signature=old),
        replace(
            rows[1], verdict=Verdict.FAIL, signature=replace(old, error_class="DistNetworkError")
        ),
    ]
    rep = reproduction(rows, old)
    assert rep["target_failures"] == 2
    assert rep["signatures"] == {str(old): 2}
