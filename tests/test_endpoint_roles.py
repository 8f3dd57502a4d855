"""An endpoint that contradicts its role stops the bisection at once, saying so (issue 35).

The good config must pass: a failure of it is proof that it carries a failure (never
noise), so the bad config is not started (again) and the campaign ends `endpoints`, also
when a budget ran out meanwhile. The bad config that passes is retried, as a flaky
failure may need several starts; a budget that ends those retries says how many passed.
Fast tier: the scripted host.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan
from orchestrator.config.hosts import Host
from orchestrator.execution.contract import RunCancelled
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

BROKEN = "AttributeError: 'NoneType' object has no attribute 'dtype'"


class GoodOnly(Oracle):
    """The good config fails at init; every variant with a change passes (the bad one too)."""

    def outcome(self, variant: frozenset[int], *a: object, **kw: object) -> Rule | None:
        return None if variant else self.rules[0]


def _bisect(tmp: Path, oracle: Oracle, hosts: int = 1, **opts: object) -> tuple:
    good, bad = write_pair(tmp / "exp", 3)
    store = Store(tmp / "results")
    b = Bisection(
        store,
        make_plan(good, bad),
        [host(f"h{i}") for i in range(hosts)],
        command="t",
        options=BisectOptions(**opts),  # type: ignore[arg-type]
        executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
    )
    outcome = b.run()
    runs = store.runs(b.cid)
    store.close()
    return outcome, runs


@pytest.mark.parametrize("max_runs", [None, 5])
def test_a_failing_good_config_stops_the_campaign_before_bad_starts(
    tmp_path: Path, max_runs: int | None
) -> None:
    outcome, runs = _bisect(
        tmp_path, GoodOnly([Rule(frozenset(), "init", BROKEN)]), max_runs=max_runs
    )
    assert outcome.status == "endpoints", outcome.message
    assert "the good config does not pass" in outcome.message
    assert "AttributeError" in outcome.message and runs[0].id in outcome.message
    # one start: the bad config is not started 16 times before the answer
    assert [r.variant for r in runs] == [()]
    assert outcome.runs_executed == 1
    assert outcome.to_dict()["status"] == "endpoints"


class BadWaitsForCancel(ScriptedExecutor):
    """The bad config's start runs until the campaign cancels it (at most 30 s), and the
    good config's start ends only once bad's has begun (at most 30 s): good's failure comes
    while bad is in progress, whatever the machine's speed. (Without that wait a loaded
    machine could end good before the second host's worker began bad at all.)"""

    bad_starts: list[str] = []
    cancelled: list[str] = []
    bad_began = threading.Event()

    def run(self, exp, *, run_id: str, **kw):  # type: ignore[no-untyped-def]
        if present(exp):
            BadWaitsForCancel.bad_starts.append(run_id)
            BadWaitsForCancel.bad_began.set()
            if self.cancel_event.wait(timeout=30):
                BadWaitsForCancel.cancelled.append(run_id)
                raise RunCancelled(f"run cancelled on {self.host.name}")
        else:
            BadWaitsForCancel.bad_began.wait(timeout=30)
        return super().run(exp, run_id=run_id, **kw)


@pytest.mark.parametrize("second_worker_late", [0.0, 0.5])
def test_a_failing_good_config_cancels_the_bad_start_in_progress(
    tmp_path: Path, second_worker_late: float
) -> None:
    """Two hosts: both endpoints start side by side; good fails while bad is still starting:
    the start of bad in progress is stopped, bad is not started again, and the campaign ends
    at once (not after the 30 s the bad start would take). `second_worker_late`: the second
    host's executor comes that late, as on a loaded machine (the race this test had)."""
    BadWaitsForCancel.bad_starts, BadWaitsForCancel.cancelled = [], []
    BadWaitsForCancel.bad_began.clear()
    oracle = GoodOnly([Rule(frozenset(), "init", BROKEN)])
    good, bad = write_pair(tmp_path / "exp", 3)

    def late(h: Host, wait: float) -> BadWaitsForCancel:
        if h.name == "h1":
            time.sleep(wait)
        return BadWaitsForCancel(h, oracle, Faults())

    store = Store(tmp_path / "results")
    b = Bisection(
        store,
        make_plan(good, bad),
        [host("h0"), host("h1")],
        command="t",
        options=BisectOptions(),
        executor_factory=lambda h, *_: late(h, second_worker_late),
    )
    began = time.monotonic()
    outcome = b.run()
    store.close()
    assert outcome.status == "endpoints" and "the good config does not pass" in outcome.message
    assert len(BadWaitsForCancel.bad_starts) == 1, BadWaitsForCancel.bad_starts
    assert BadWaitsForCancel.cancelled == BadWaitsForCancel.bad_starts
    assert time.monotonic() - began < 25


def test_good_failing_with_the_target_is_proof(tmp_path: Path) -> None:
    """Good shows the very failure bad shows: one start of it ends the campaign."""
    outcome, runs = _bisect(tmp_path, Oracle([Rule(frozenset(), "cuda_graph", TARGET_ERROR)]))
    assert outcome.status == "endpoints" and "the good config does not pass" in outcome.message
    assert [r.variant for r in runs] == [()]


def test_a_budget_that_ends_the_bad_retries_says_bad_passed(tmp_path: Path) -> None:
    outcome, runs = _bisect(tmp_path, Oracle([]), max_runs=5)
    assert outcome.status == "incomplete"
    assert "the bad config passed on all 4 start(s)" in outcome.message, outcome.message
    assert len(runs) == 5


def test_the_cli_says_it_in_json_with_exit_code_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import common, main

    good, bad = write_pair(tmp_path / "exp", 3)
    hosts = tmp_path / "hosts.yaml"
    (tmp_path / "known_hosts").write_text("")
    hosts.write_text(
        "hosts:\n  h0: {address: 192.0.2.1, service_manager: process, known_hosts: known_hosts}\n"
    )
    oracle = GoodOnly([Rule(frozenset(), "init", BROKEN)])
    monkeypatch.setattr(
        common, "executor_factory", lambda args: lambda h, *_: ScriptedExecutor(h, oracle, Faults())
    )
    code = main(
        [
            "bisect",
            "--good",
            str(good),
            "--bad",
            str(bad),
            "--host",
            "h0",
            "--hosts",
            str(hosts),
            "--results",
            str(tmp_path / "results"),
            "--max-runs",
            "5",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 1, out
    assert out["status"] == "endpoints" and "the good config does not pass" in out["message"]
    assert out["runs_executed"] == 1
