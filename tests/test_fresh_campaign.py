"""`bisect --fresh` starts a new campaign, also beside an interrupted one (issue 35, row 11).

The same command resumes an interrupted campaign; with `--fresh` it used to resume it too
(the campaign's key does not depend on --fresh), so "fresh" went on with the old runs.
Fast tier: the scripted host.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan
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


def test_fresh_starts_anew_where_the_same_command_resumes(tmp_path: Path) -> None:
    good, bad = write_pair(tmp_path / "exp", 4)
    store = Store(tmp_path / "results")
    oracle = Oracle([Rule(frozenset({2}), "cuda_graph", TARGET_ERROR)])

    def bisect(**opts: object) -> Bisection:
        return Bisection(
            store,
            make_plan(good, bad),
            [host()],
            command="t",
            options=BisectOptions(**opts),  # type: ignore[arg-type]
            executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
        )

    first = bisect(max_runs=2)
    first.run()
    store.update_campaign(first.cid, status="interrupted")  # as a Ctrl-C leaves it
    fresh = bisect(fresh=True)
    assert fresh.cid != first.cid and not fresh.resumed
    out = fresh.run()
    assert out.found and out.runs_reused == 0
    assert store.campaign(first.cid).status == "interrupted"  # still there to resume
    again = bisect()  # the same command without --fresh: the interrupted one goes on
    assert again.cid == first.cid and again.resumed
    named = bisect(fresh=True)  # nothing interrupted left of it: a new one, as asked
    assert named.cid not in (first.cid, fresh.cid)
    store.close()
