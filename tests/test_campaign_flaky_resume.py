"""A noise-aware campaign killed midway resumes with its posterior (fast tier).

The controller is killed (as by SIGKILL) once the noise-aware search is under way: what
survives is what the store had committed at that moment, so the test takes exactly that,
a copy of the results directory made while the next run starts, and resumes from it with
a new campaign runner. The resumed search must first ask for the run that a planner built
from the recorded runs alone asks for (the posterior is a pure function of them), run
nothing recorded again, and answer the flaky pair. The host is scripted (tests/support/scripted.py):
the campaign, the planner, the store and the classifier are the real ones. That SIGKILL of
the real process leaves the host restorable and the same command resumes it is proven on
the real sshd and systemd hosts in test_campaign_resume.py.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from orchestrator.campaign import flaky
from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.diagnosis.verdicts import Verdict, relative
from orchestrator.planner import Planner
from orchestrator.store.store import Store
from tests.support.scripted import (
    TARGET_ERROR,
    Faults,
    Oracle,
    Rule,
    ScriptedExecutor,
    first_draw_passes,
    host,
    write_pair,
)

N = 6
PAIR = frozenset({1, 4})


def snapshot(results: Path, into: Path) -> None:
    """The results directory as a killed controller leaves it: committed rows only."""
    into.mkdir(parents=True)
    for p in results.iterdir():
        if p.is_dir():
            shutil.copytree(p, into / p.name)
    src = sqlite3.connect(results / "orchestrator.db")
    dst = sqlite3.connect(into / "orchestrator.db")
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def test_flaky_campaign_killed_midway_resumes_with_its_posterior(tmp_path: Path) -> None:
    good, bad = write_pair(tmp_path / "exp", N)
    plan = make_plan(good, bad, "auto")
    full = frozenset(range(N))
    results, killed = tmp_path / "results", tmp_path / "killed"
    oracle = Oracle(
        [Rule(PAIR, "cuda_graph", TARGET_ERROR, probability=0.5)], seed=first_draw_passes()
    )
    store = Store(results)

    class KilledMidway(ScriptedExecutor):
        """Copies the store as it stands when a run starts well into the noisy search."""

        def run(self, exp, **kw):  # noqa: ANN001, ANN003, ANN201
            # (runs on a pool worker's thread: a connection of its own, like another process)
            con = sqlite3.connect(results / "orchestrator.db")
            try:
                variants = [v for (v,) in con.execute("SELECT variant FROM runs")]
            finally:
                con.close()
            inner = [v for v in variants if v not in ("[]", str(sorted(full)))]
            if not killed.exists() and len(inner) >= 4:
                snapshot(results, killed)
            return super().run(exp, **kw)

    first = Bisection(
        store,
        plan,
        [host()],
        command="test",
        executor_factory=lambda h, *_: KilledMidway(h, oracle, Faults()),
    )
    first.run()  # the copy is what the killed process left; this run's end is not used
    store.close()
    assert killed.exists(), "the search never got under way"

    store = Store(killed)
    try:
        [camp] = store.campaigns()
        before = store.runs(camp.id)
        assert any(r.label == "bad" and r.verdict is Verdict.PASS for r in before)
        # What the recorded runs alone ask for next: the posterior is a function of them.
        evidence = [
            (frozenset(r.variant), relative(r.verdict, r.signature, camp.target))
            for r in before
            if r.verdict is not Verdict.INFRA
        ]
        replay = Planner(
            plan.n,
            flaky.strategy_for("auto", 0.95, lambda v: ""),
            known={frozenset(): Verdict.PASS, full: Verdict.FAIL},
            closure=plan.closure(),
            evidence=evidence,
        )
        assert replay.current_round is not None and replay.current_round.again
        expected_next = tuple(sorted(replay.pending()[0]))

        resumed = Bisection(
            store,
            plan,
            [host()],
            command="test",
            executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
        ).run()
        assert resumed.campaign_id == camp.id
        after = store.runs(camp.id)
    finally:
        store.close()
    n = len(before)
    # the recorded runs are untouched and none was replaced; the resumed runner ran only
    # new ones, starting with the run the recorded posterior asked for
    assert [r.id for r in after[:n]] == [r.id for r in before]
    assert [r.seq for r in after] == list(range(1, len(after) + 1))
    assert resumed.runs_executed == len(after) - n > 0
    assert after[n].variant == expected_next
    answer = resumed.to_dict()
    assert answer["status"] == "found", answer
    [culprit] = answer["culprits"]
    assert frozenset(culprit["indices"]) == PAIR and culprit["interacting"] is True
    assert answer["confidence"] >= 0.95 and 0 < answer["reproduction_rate"] < 1
    # a target failure is proof: none without both flags of the pair
    for r in after:
        if r.verdict is Verdict.FAIL:
            assert PAIR <= set(r.variant), r
