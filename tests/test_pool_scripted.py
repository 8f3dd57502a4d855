"""Pools of hosts in the fast tier: a campaign on several scripted hosts at once.

The campaign, the pool, the planner, the store and the classifier are the real ones; only
the hosts are scripted (tests/scripted.py). What the real systemd pool tests prove on
booted containers (tests/test_pool.py: cancelling a run on a real unit, Ctrl-C restoring
every real host, a host that really goes away) is not repeated here; here is the logic:
runs spread over the hosts, a host with host trouble run after run leaves the pool and
its runs move to the others, every host is closed and restored at the end, and the
answer is the one a single host gives.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import Status
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.results.store import Store
from tests.scripted import TARGET_ERROR, Faults, Oracle, Rule, ScriptedExecutor, host, write_pair

N = 8
CULPRITS = [frozenset({2}), frozenset({5, 6})]


def oracle() -> Oracle:
    return Oracle([Rule(c, "cuda_graph", TARGET_ERROR) for c in CULPRITS])


class Recorded(ScriptedExecutor):
    """A scripted host that notes which runs it ran, and whether it was restored."""

    ran: Counter[str] = Counter()
    restored: list[str] = []
    lock = threading.Lock()

    def run(self, exp, **kw):  # noqa: ANN001, ANN003, ANN201
        with self.lock:
            self.ran[self.host.name] += 1
        return super().run(exp, **kw)

    def close(self, *, restore: bool = True) -> list[str]:
        if restore:
            with self.lock:
                self.restored.append(self.host.name)
        return super().close(restore=restore)


def bisect(tmp: Path, names: list[str], broken: str | None = None):  # noqa: ANN201
    good, bad = write_pair(tmp / "exp", N)
    plan = make_plan(good, bad, "auto")
    Recorded.ran, Recorded.restored = Counter(), []

    def make(h, *_):  # noqa: ANN001, ANN202
        # the broken host drops its SSH connection on every run: host trouble, never a verdict
        faults = Faults(ssh_drop=1.0) if h.name == broken else Faults()
        return Recorded(h, oracle(), faults)

    store = Store(tmp / "results")
    try:
        outcome = Bisection(store, plan, [host(n) for n in names], command="test",
                            executor_factory=make).run()  # fmt: skip
        runs = store.runs(outcome.campaign_id)
    finally:
        store.close()
    return outcome, runs


def culprit_sets(outcome) -> list[frozenset[int]]:  # noqa: ANN001
    return sorted((frozenset(c.indices) for c in outcome.culprits), key=sorted)


def test_a_pool_gives_the_single_hosts_answer_with_runs_on_every_host(tmp_path: Path) -> None:
    one, _ = bisect(tmp_path / "one", ["h1"])
    pool, runs = bisect(tmp_path / "pool", ["h1", "h2", "h3"])
    assert one.status is Status.FOUND and pool.status is Status.FOUND, pool.message
    assert culprit_sets(pool) == culprit_sets(one) == sorted(CULPRITS, key=sorted)
    assert set(Recorded.ran) == {"h1", "h2", "h3"}  # the pool used every host
    assert {r.host for r in runs} == {"h1", "h2", "h3"}
    assert sorted(Recorded.restored) == ["h1", "h2", "h3"]  # each closed with restore
    # no variant judged twice, but by the posterior search that makes the answer sure
    judged = [r.variant for r in runs if r.verdict is not Verdict.INFRA
              and not r.purpose.startswith("noise-")]  # fmt: skip
    assert len(judged) == len(set(judged))


def test_a_host_with_trouble_on_every_run_leaves_the_pool_and_its_runs_move(
    tmp_path: Path,
) -> None:
    outcome, runs = bisect(tmp_path, ["h1", "bad-host", "h3"], broken="bad-host")
    assert outcome.status is Status.FOUND, outcome.message
    assert culprit_sets(outcome) == sorted(CULPRITS, key=sorted)
    assert [name for name, _ in outcome.removed_hosts] == ["bad-host"]
    on_bad = [r for r in runs if r.host == "bad-host"]
    assert on_bad and all(r.verdict is Verdict.INFRA for r in on_bad)
    assert len(on_bad) <= 2  # taken out after two in a row (pool.UNHEALTHY_AFTER)
    # each run it lost was run again, and judged, on another host
    judged = {r.variant for r in runs if r.verdict is not Verdict.INFRA}
    assert {r.variant for r in on_bad} <= judged
    assert "bad-host" in Recorded.restored  # it is restored all the same
