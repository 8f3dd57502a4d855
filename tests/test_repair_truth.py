"""A repair never hides the target: a property test over random scenarios (fast tier).

Each scenario has a target failure needing a random set of deltas and a resource failure
(out of memory while loading, below a random `--mem-fraction-static` limit) needing
another random set: the same deltas, overlapping ones, or others. Sometimes the memory
fraction is itself a delta under test. Whole campaigns run through the real `Bisection`,
store, planner and classifier over the scripted host. Whatever the draw: no answer names
a repair move as a culprit, no repaired start's move touched a delta, and when the repair
can reach the limit the answer is the target's set, as if the resource failure were not
there.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import Plan, make_plan
from orchestrator.planner.repair import delta_knobs
from orchestrator.store.store import Store
from tests.support.scripted import TARGET_ERROR, Faults, Oracle, Rule, factory, host
from tests.test_campaign_repair import MEM, OOM, pair

_SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
_PLANS: dict[tuple[int, bool], Plan] = {}
_CASE = itertools.count()


@st.composite
def cases(draw: st.DrawFn) -> tuple[int, bool, frozenset[int], frozenset[int], float]:
    n = draw(st.integers(2, 6))
    idx = st.integers(0, n - 1)
    target = draw(st.frozensets(idx, min_size=1, max_size=2))
    resource = draw(st.sampled_from(["same", "other"]))
    needs = target if resource == "same" else draw(st.frozensets(idx, min_size=1, max_size=2))
    limit = draw(st.sampled_from([0.87, 0.9, 0.93]))
    mem_is_a_delta = draw(st.booleans())
    return n, mem_is_a_delta, target, needs, limit


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[Path, Store]]:
    tmp = Path(tempfile.mkdtemp(prefix="orch-repair-", dir=_SCRATCH))
    store = Store(tmp / "results")
    yield tmp, store
    store.close()
    shutil.rmtree(tmp, ignore_errors=True)


def _plan(root: Path, n: int, mem_is_a_delta: bool) -> Plan:
    if (n, mem_is_a_delta) not in _PLANS:
        good, bad = pair(
            root / f"exp{n}-{mem_is_a_delta}", n, bad_flags={MEM: 0.9} if mem_is_a_delta else None
        )
        _PLANS[(n, mem_is_a_delta)] = make_plan(good, bad, "auto")
    return _PLANS[(n, mem_is_a_delta)]


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=cases())
def test_a_repair_never_hides_the_target(
    shared: tuple[Path, Store], case: tuple[int, bool, frozenset[int], frozenset[int], float]
) -> None:
    n, mem_is_a_delta, target, needs, limit = case
    tmp, store = shared
    plan = _plan(tmp, n, mem_is_a_delta)
    rules = [
        Rule(needs, "load_weights", OOM, below=((MEM, limit),)),
        Rule(target, "cuda_graph", TARGET_ERROR),
    ]
    outcome = Bisection(
        store,
        plan,
        [host(f"h{next(_CASE)}")],
        options=BisectOptions(fresh=True),
        command="test",
        executor_factory=factory(Oracle(rules), Faults()),
    ).run()
    runs = store.runs(outcome.campaign_id)
    busy = delta_knobs(plan.deltas)
    for r in runs:  # no move ever touched a delta
        if r.repair:
            assert (bool(r.repair["env"]), r.repair["knob"]) not in busy, r.repair
    shorts = [d.short() for d in plan.deltas]
    for cul in outcome.culprits:  # a culprit is deltas, never a move
        assert cul.flags == [shorts[i] for i in cul.indices], cul
    if mem_is_a_delta:
        assert not any(r.repair for r in runs)
        return
    # the built-in ladder (0.85 -> 0.89 -> 0.93) reaches every limit drawn: the answer is
    # the target's set, whether the resource failure came from the same deltas or others
    assert outcome.status == "found", outcome.to_dict()
    assert [frozenset(c.indices) for c in outcome.culprits] == [target], outcome.to_dict()
    assert str(outcome.target).startswith("cuda_graph: cublas")
