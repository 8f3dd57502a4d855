"""Pools of hosts in the fast tier: a campaign on several scripted hosts at once.

The campaign, the pool, the planner, the store and the classifier are the real ones; only
the hosts are scripted (tests/support/scripted.py). What the real systemd pool tests prove on
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
from orchestrator.store.store import Store
from tests.support.scripted import (
    TARGET_ERROR,
    Faults,
    Oracle,
    Rule,
    ScriptedExecutor,
    host,
    present,
    write_pair,
)

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
        outcome = Bisection(
            store, plan, [host(n) for n in names], command="test", executor_factory=make
        ).run()
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
    judged = [
        r.variant
        for r in runs
        if r.verdict is not Verdict.INFRA and not r.purpose.startswith("noise-")
    ]
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


class Gate(ScriptedExecutor):
    """A scripted host whose search runs (not the endpoints) wait, bounded, until every
    host of the pool has a run in progress; each notes whether that moment came (4) or
    how many were in progress when it gave up waiting."""

    n = 4  # deltas of the pair (the endpoints do not wait)
    running = 0
    full = 0  # how many times every host had a run in progress
    seen: dict[str, int] = {}
    cond = threading.Condition()

    def run(self, exp, *, run_id: str, **kw):  # noqa: ANN001, ANN003, ANN201
        cls = Gate
        endpoint = present(exp) in (frozenset(), frozenset(range(cls.n)))
        with cls.cond:
            before = cls.full
            cls.running += 1
            if cls.running >= 4:
                cls.full += 1
                cls.cond.notify_all()
            for _ in range(100):  # bounded (1 s: the runs read after the answer is sure
                # wait for no new one); a cancel is seen within 10 ms
                if endpoint or cls.full > before or self.cancel_event.is_set():
                    break
                cls.cond.wait(0.01)
            cls.seen[run_id] = 4 if cls.full > before else cls.running
        try:
            return super().run(exp, run_id=run_id, **kw)
        finally:
            with cls.cond:
                cls.running -= 1


class EveryOther(Oracle):
    """Flaky rules that fire on every second start of a variant (the 2nd, 4th, ...): a
    reproduction rate of one half, and the same verdicts whatever order the hosts start
    the runs in (a seeded draw per start would depend on it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.starts: Counter[frozenset[int]] = Counter()

    def outcome(self, variant: frozenset[int], env=()):  # noqa: ANN001, ANN201
        with self.lock:
            self.starts[variant] += 1
            second = self.starts[variant] % 2 == 0
        for rule in self.rules:
            if rule.needs <= variant and (rule.probability >= 1.0 or second):
                return rule
        return None


def test_a_flaky_pair_on_four_hosts_keeps_every_host_busy(tmp_path: Path) -> None:
    # the pair fails on half of the starts; bad passes its first start, so the search is
    # noise-aware from its first run and names 4 runs at a time (planner.batch)
    good, bad = write_pair(tmp_path / "exp", Gate.n)
    plan = make_plan(good, bad, "auto")
    pair = frozenset({1, 3})
    flaky = EveryOther([Rule(pair, "cuda_graph", TARGET_ERROR, probability=0.5)])
    Gate.running, Gate.full, Gate.seen = 0, 0, {}
    store = Store(tmp_path / "results")
    try:
        outcome = Bisection(
            store,
            plan,
            [host(f"h{i}") for i in range(4)],
            command="test",
            executor_factory=lambda h, *_: Gate(h, flaky, Faults()),
        ).run()
        runs = store.runs(outcome.campaign_id)
    finally:
        store.close()
    assert outcome.status is Status.FOUND, outcome.message
    assert culprit_sets(outcome) == [pair]
    assert "flaky" in (outcome.noise or {}).get("switched", "")
    # (a set's confirmation runs alone until it fails: one run at a time, not counted)
    noisy = [r for r in runs if r.purpose.startswith("noise-") and r.purpose != "noise-confirm"]
    assert len(noisy) >= 8 and {r.host for r in noisy} == {f"h{i}" for i in range(4)}
    # every noise-aware run found the other hosts busy too, but the last ones (once the
    # answer is sure, the runs in progress are read and nothing new starts)
    full = [r for r in noisy if Gate.seen[r.id] == 4]
    assert len(full) >= len(noisy) - 3, [Gate.seen[r.id] for r in noisy]
