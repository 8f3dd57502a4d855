"""Every answer is true: a property test over the planner and the campaign.

Random culprit sets (single flags, interacting sets, independent causes, a different
failure that masks the target) and random faults of the host (the server killed from
outside at any moment, port clashes, dropped SSH) drive whole campaigns through the real
`Bisection`, store, planner and classifier; only the host is scripted (`tests/support/scripted.py`).
Whatever happens, an answer reported as found is true of the oracle, and every evidence
line names a run of exactly the variant it describes with the verdict it claims.
Otherwise the campaign says it did not conclude. Fast tier: no real host.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.campaign.bisect import Bisection, BisectOptions, Outcome
from orchestrator.campaign.planning import Plan, make_plan
from orchestrator.cli import common
from orchestrator.diagnosis.verdicts import Verdict, relative
from orchestrator.errors import InfraError
from orchestrator.store.store import Store
from tests.support import scripted_restore
from tests.support.scripted import OTHER_ERROR, TARGET_ERROR, Faults, Oracle, Rule, factory, host
from tests.support.scripted import write_pair as scripted_pair

_SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


@st.composite
def cases(draw: st.DrawFn) -> tuple[int, Oracle, Faults]:
    n = draw(st.integers(2, 8))
    idx = st.integers(0, n - 1)
    terms = draw(st.lists(st.frozensets(idx, min_size=1, max_size=3), min_size=1, max_size=2))
    rules = [Rule(t, "cuda_graph", TARGET_ERROR) for t in terms]
    if draw(st.booleans()):  # a different failure, earlier in startup, that can mask the target
        rules.insert(
            draw(st.integers(0, len(rules))),
            Rule(draw(st.frozensets(idx, min_size=1, max_size=2)), "init", OTHER_ERROR),
        )
    every = frozenset(range(n))
    rules = [r for r in rules if r.needs]
    faulty = draw(st.booleans())
    faults = Faults(
        kill=draw(st.sampled_from([0.1, 0.2, 0.35])) if faulty else 0.0,
        port_clash=draw(st.sampled_from([0.0, 0.1])) if faulty else 0.0,
        ssh_drop=draw(st.sampled_from([0.0, 0.1])) if faulty else 0.0,
        seed=draw(st.integers(0, 2**31)),
    )
    del every
    return n, Oracle(rules), faults


def _verdict_of(oracle: Oracle, variant: frozenset[int], target_error: str | None) -> str:
    """What the oracle says of a variant: the target failure is whatever bad shows."""
    rule = oracle.outcome(variant)
    if rule is None:
        return "pass"
    return "target" if rule.error == target_error else "other"


_PLANS: dict[int, Plan] = {}
_CASE = itertools.count()


def _plan(root: Path, n: int) -> Plan:
    """One plan per n, made once: plans are immutable, campaigns differ by host name."""
    if n not in _PLANS:
        good, bad = scripted_pair(root / f"exp{n}", n)
        _PLANS[n] = make_plan(good, bad, "auto")
    return _PLANS[n]


@pytest.fixture(scope="module")
def shared_store() -> Iterator[tuple[Path, Store]]:
    tmp = Path(tempfile.mkdtemp(prefix="orch-truth-", dir=_SCRATCH))
    store = Store(tmp / "results")
    yield tmp, store
    store.close()
    shutil.rmtree(tmp, ignore_errors=True)


@settings(
    max_examples=240,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(case=cases())
def test_every_confirmed_answer_is_true_and_cites_the_right_runs(
    shared_store: tuple[Path, Store],
    case: tuple[int, Oracle, Faults],
) -> None:
    n, oracle, faults = case
    tmp, store = shared_store
    plan = _plan(tmp, n)
    # one campaign per case, on a host of its own name (so its own campaign key)
    try:
        outcome = Bisection(
            store,
            plan,
            [host(f"h{next(_CASE)}")],
            options=BisectOptions(fresh=True),
            command="test",
            executor_factory=factory(oracle, faults),
        ).run()
    except InfraError:
        return  # three infra runs in a row: the campaign stops, it answers nothing
    check_outcome(store, outcome, n, oracle, faults)


def check_outcome(store: Store, outcome: Outcome, n: int, oracle: Oracle, faults: Faults) -> None:
    full = frozenset(range(n))
    end = oracle.outcome(full)
    target_error = end.error if end else None
    runs = {r.id: r for r in store.runs(outcome.campaign_id)}
    for r in runs.values():  # nothing killed from outside is ever judged
        if r.verdict is not Verdict.INFRA:
            assert "from outside" not in r.detail and "port clash" not in r.detail
    for f in outcome.findings:  # findings are real failures of the config
        assert f.signature.error_class != "signal", f
        got = _verdict_of(oracle, frozenset(f.variant), target_error)
        assert got == "other", (f, faults.log)
    if outcome.status != "found":
        assert outcome.message  # it says why it did not conclude
        return
    target = outcome.target
    assert target is not None
    assert _verdict_of(oracle, full, target_error) == "target"
    for cul in outcome.culprits:
        c = frozenset(cul.indices)
        assert cul.confirmed
        rep = runs[cul.reproduced_by]
        assert frozenset(rep.variant) == c, (cul, rep)
        assert relative(rep.verdict, rep.signature, target) is Verdict.FAIL
        assert _verdict_of(oracle, c, target_error) == "target", (cul, oracle, faults.log)
        assert set(cul.cleared_by) == set(cul.flags)
        for fl, rid in cul.cleared_by.items():
            x = cul.indices[cul.flags.index(fl)]
            row = runs[rid]
            v = frozenset(row.variant)
            assert x not in v and c - {x} <= v, (cul, row)
            got = relative(row.verdict, row.signature, target)
            assert got in (Verdict.PASS, Verdict.OTHER, Verdict.TIMEOUT), (cul, row)
            truth = _verdict_of(oracle, v, target_error)
            assert truth != "target", (cul, row, oracle, faults.log)
            claim = cul.clearing[fl]
            assert ("does not fail" in claim) == (got is Verdict.PASS)
            assert claim.startswith("bad without") == (v == full - {x})
    if all(r.error == target_error for r in oracle.rules):
        # no masking failure: the answer is exactly the minimal target terms
        all_terms = oracle.target_terms(target_error)
        terms = {t for t in all_terms if not any(o < t for o in all_terms)}
        assert {frozenset(c.indices) for c in outcome.culprits} == terms, (
            outcome.culprits,
            oracle,
            faults.log,
        )


def test_fault_free_cases_conclude() -> None:
    """The property above is not vacuous: without faults the campaign finds the answer."""
    for n, terms in [(4, [{1}]), (6, [{0, 4}]), (8, [{2}, {5, 6}]), (3, [{0, 1, 2}])]:
        tmp = Path(tempfile.mkdtemp(prefix="orch-truth-", dir=_SCRATCH))
        try:
            good, bad = scripted_pair(tmp / "exp", n)
            store = Store(tmp / "results")
            oracle = Oracle([Rule(frozenset(t), "cuda_graph", TARGET_ERROR) for t in terms])
            outcome = Bisection(
                store,
                make_plan(good, bad),
                [host()],
                command="test",
                executor_factory=factory(oracle, Faults()),
            ).run()
            assert outcome.status == "found", outcome.message
            assert sorted(sorted(c.indices) for c in outcome.culprits) == sorted(
                sorted(t) for t in terms
            )
            store.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def test_a_kill_from_outside_is_retried_not_judged() -> None:
    """The row-1 incident: the server of 'good + --feature-0' is killed mid-startup; the run is
    infra, retried, and the answer is the true culprit with evidence of exact variants."""

    class KillOnce(Faults):
        def draw(self) -> str | None:
            self.calls = getattr(self, "calls", 0) + 1
            return "kill" if self.calls == 3 else None

        def moment(self, upto: int) -> int:
            return 1

    tmp = Path(tempfile.mkdtemp(prefix="orch-truth-", dir=_SCRATCH))
    try:
        good, bad = scripted_pair(tmp / "exp", 3)
        store = Store(tmp / "results")
        oracle = Oracle([Rule(frozenset({0}), "cuda_graph", TARGET_ERROR)])
        outcome = Bisection(
            store,
            make_plan(good, bad),
            [host()],
            command="test",
            executor_factory=factory(oracle, KillOnce()),
        ).run()
        runs = store.runs(outcome.campaign_id)
        killed = [r for r in runs if r.verdict is Verdict.INFRA]
        assert len(killed) == 1 and "killed by SIGKILL from outside" in killed[0].detail
        assert outcome.status == "found"
        assert [c.indices for c in outcome.culprits] == [[0]]
        assert not outcome.findings
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- the controller interrupted: every "restored" is true of the host read back ----------------

_SIGNALS = {"SIGINT": signal.SIGINT, "SIGHUP": signal.SIGHUP, "SIGTERM": signal.SIGTERM}


@st.composite
def interrupted_cases(draw: st.DrawFn) -> tuple[int, Oracle, list[str], dict[int, list[str]]]:
    """A campaign on one or two scripted hosts, and the signals its controller gets: a
    SIGHUP (a closed terminal: sent twice, as the kernel and the shell both send it), a
    double SIGINT (the second a few host steps later: during the run or its restore), or
    three (the third abandons the restore), each at a random step of the campaign."""
    n, oracle, _ = draw(cases())
    hosts = ["a", "b"][: draw(st.integers(1, 2))]
    kind = draw(st.sampled_from(["SIGHUP", "double SIGINT", "triple SIGINT", "SIGTERM"]))
    first = draw(st.integers(1, 40))
    gaps = draw(st.lists(st.integers(0, 6), min_size=2, max_size=2))
    names = {
        "SIGHUP": ["SIGHUP", "SIGHUP"],
        "double SIGINT": ["SIGINT", "SIGINT"],
        "triple SIGINT": ["SIGINT"] * 3,
        "SIGTERM": ["SIGTERM"],
    }[kind]
    at: dict[int, list[str]] = {}
    step = first
    for i, name in enumerate(names):
        step += gaps[i - 1] if i else 0
        at.setdefault(step, []).append(name)
    return n, oracle, hosts, at


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(case=interrupted_cases())
def test_a_signalled_controller_says_restored_only_of_hosts_read_back_as_found(
    shared_store: tuple[Path, Store],
    case: tuple[int, Oracle, list[str], dict[int, list[str]]],
) -> None:
    """SIGHUP, a double SIGINT or SIGTERM at any moment: the hosts are restored before the
    command returns (a second Ctrl-C does not cut the restore short), the campaign is
    recorded as interrupted with its resume line, and the message says so. A third Ctrl-C
    may abandon the restore: then no host is called restored unless the host itself shows
    it. Whatever happens, every line that calls a host restored is true of that host."""
    n, oracle, names, at = case
    tmp, store = shared_store
    plan = _plan(tmp, n)
    k = next(_CASE)
    truths = {f"{h}{k}": scripted_restore.HostTruth() for h in names}
    signals = scripted_restore.SignalPlan({s: [_SIGNALS[x] for x in xs] for s, xs in at.items()})
    bisection = Bisection(
        store,
        plan,
        [host(h) for h in truths],
        options=BisectOptions(fresh=True),
        command="test",
        executor_factory=scripted_restore.factory(oracle, truths, signals),
    )
    args = argparse.Namespace(
        hosts="h.yaml", results="results", json=False, verbose=False, host=next(iter(truths))
    )
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            got = common.run_campaign(bisection.run, lambda e: None, "campaign", args)
    except InfraError:
        got = None
    finally:
        signals.disarm()
    text = out.getvalue()
    sent = [s for s in signals.sent if s is not signal.SIGHUP] + [signal.SIGHUP] * (
        signal.SIGHUP in signals.sent
    )  # a hang-up counts once
    for line in text.splitlines():  # every "restored" is true of the host read back
        if "restored" in line and "NOT restored" not in line:
            named = [h for h in truths if h in line.replace(",", " ").replace(":", " ").split()]
            assert named, line
            for h in named:
                assert truths[h].as_found(), (line, h, truths[h].left(), text)
    if not sent:  # the campaign ended before the first signal was due
        assert got is not None or "interrupted" not in text
        return
    if got is not None:  # signalled only as the campaign was returning its answer
        return
    assert "interrupted" in text and "resume with: orchestrator bisect --resume" in text, text
    assert store.campaign(bisection.cid).status == "interrupted"
    if len(sent) < 3:  # no third Ctrl-C: the restore ran to its end, read back as found
        for h, truth in truths.items():
            assert truth.as_found(), (h, truth.left(), text)
        assert "NOT restored" not in text, text
        assert "restored (read back: as found)" in text or "no host had been changed" in text


# ---- the host's env changes between two campaigns on the same store ----------------------------

HOST_VARS = [
    (),
    (("NCCL_ALGO", "Tree"),),
    (("NCCL_ALGO", "Ring"),),
    (("NCCL_ALGO", "Tree"), ("HOSTVAR", "1")),
]


@st.composite
def env_cases(draw: st.DrawFn) -> tuple[int, Oracle, Faults, tuple, tuple]:
    """A case of `cases()` plus a rule that fires only under a host env:, and the host's
    env: in the first and the second campaign (equal, or changed in between)."""
    n, oracle, faults = draw(cases())
    needs = draw(st.frozensets(st.integers(0, n - 1), max_size=2))
    env = draw(st.sampled_from([frozenset({("NCCL_ALGO", "Tree")}), frozenset({("HOSTVAR", "1")})]))
    error = draw(st.sampled_from([TARGET_ERROR, OTHER_ERROR]))
    rules = list(oracle.rules)
    phase = "cuda_graph" if error == TARGET_ERROR else "init"  # a signature is phase + error
    rules.insert(draw(st.integers(0, len(rules))), Rule(needs, phase, error, env=env))
    first = draw(st.sampled_from(HOST_VARS))
    second = draw(st.sampled_from(HOST_VARS)) if draw(st.booleans()) else first
    return n, Oracle(rules), faults, first, second


def _under(oracle: Oracle, env: tuple) -> Oracle:
    """The oracle as a host with this env: sees it (the rules that need other env dropped)."""
    return Oracle([replace(r, env=frozenset()) for r in oracle.rules if r.env <= set(env)])


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(case=env_cases())
def test_no_reused_verdict_is_judged_under_other_inputs_than_its_own(
    shared_store: tuple[Path, Store],
    case: tuple[int, Oracle, Faults, tuple, tuple],
) -> None:
    """Two campaigns of one pair on one host and one store, the host's `env:` (which the
    server reads) changed in between or not: every verdict the second reuses was recorded
    under exactly the inputs the second runs under, and its answer is true of the oracle
    under its own env."""
    n, oracle, faults, env1, env2 = case
    tmp, store = shared_store
    plan = _plan(tmp, n)
    name = f"e{next(_CASE)}"
    outcomes = []
    for env in (env1, env2):
        h = replace(host(name), env=env)
        try:
            outcomes.append(
                Bisection(
                    store, plan, [h], command="test", executor_factory=factory(oracle, faults)
                ).run()
            )
        except InfraError:
            return  # three infra runs in a row: nothing answered, nothing to reuse from
    from tests.support.scripted import ScriptedExecutor

    second = outcomes[1]
    now = ScriptedExecutor(replace(host(name), env=env2), oracle, faults).inputs(plan.good)
    reused = [r for r in store.runs(second.campaign_id) if r.cached_from is not None]
    for r in reused:
        src = store.run(r.cached_from or "")
        assert src.cached_from is None and src.verdict is not Verdict.INFRA
        assert src.inputs == now == r.inputs, (src.inputs, now, faults.log)
        assert src.launch_key == r.launch_key == now.key(src.fingerprint)
    if env1 != env2:
        assert not reused, "a verdict recorded under another host env: was reused"
    check_outcome(store, second, n, _under(oracle, env2), faults)


def test_the_same_host_env_is_reused_by_the_second_campaign() -> None:
    """The property above is not vacuous: with the env: unchanged, the second campaign
    reuses the first one's verdicts."""
    tmp = Path(tempfile.mkdtemp(prefix="orch-truth-", dir=_SCRATCH))
    try:
        good, bad = scripted_pair(tmp / "exp", 4)
        store = Store(tmp / "results")
        oracle = Oracle([Rule(frozenset({1}), "cuda_graph", TARGET_ERROR)])
        h = replace(host(), env=(("NCCL_ALGO", "Tree"),))
        for _ in range(2):
            outcome = Bisection(
                store,
                make_plan(good, bad),
                [h],
                command="test",
                executor_factory=factory(oracle, Faults()),
            ).run()
        assert outcome.status == "found" and outcome.runs_executed == 0
        assert outcome.runs_reused > 0
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
