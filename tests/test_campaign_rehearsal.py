"""Rehearsal on dummy weights (fast tier): the search on `--load-format dummy`, the answer
confirmed on real weights, and a failure of the checkpoint's values that falls back.

The host is scripted (tests/support/scripted.py): a rule with `real_weights` fires only when the
server loads the checkpoint, as a missing tensor or a NaN from real values does. The
campaign, planner, store and classifier are the real ones. The lab's own server does the
same end to end in test_lab_rehearsal.py.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import BisectOptions, Status
from orchestrator.campaign.rehearsal import confirm_attempts
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.reports.report import write_reports
from orchestrator.store.store import Store
from tests.support.scripted import (
    OTHER_ERROR,
    TARGET_ERROR,
    Faults,
    Oracle,
    Rule,
    ScriptedExecutor,
    host,
    write_pair,
)

N = 6
PAIR = frozenset({1, 4})


def campaign(tmp: Path, rules: list[Rule], *, rehearse: bool, seed: int = 0):  # noqa: ANN201
    good, bad = write_pair(tmp / "exp", N)
    store = Store(tmp / "results")
    oracle = Oracle(rules, seed=seed)
    out = Bisection(
        store,
        make_plan(good, bad),
        [host()],
        command="test",
        options=BisectOptions(rehearse=rehearse),
        executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
    ).run()
    md, page = write_reports(store, out.campaign_id)
    REPORTS[tmp] = (md.read_text(), page.read_text())
    return out, store.runs(out.campaign_id)


#: each campaign's reports (Markdown, HTML), by its directory
REPORTS: dict[Path, tuple[str, str]] = {}


def test_the_reports_say_which_weights_each_step_loaded_when_some_were_dummy(
    tmp_path: Path,
) -> None:
    rules = [Rule(PAIR, "cuda_graph", TARGET_ERROR)]
    campaign(tmp_path / "plain", rules, rehearse=False)
    campaign(tmp_path / "rehearsed", rules, rehearse=True)
    plain_md, plain_html = REPORTS[tmp_path / "plain"]
    md, page = REPORTS[tmp_path / "rehearsed"]
    assert "| run | variant | purpose | weights | verdict |" in md
    assert "| dummy |" in md and "| real |" in md
    assert "<th>weights</th>" in page and "<td>dummy</td>" in page
    # nothing was rehearsed: no column that says "real" on every row
    assert "| run | variant | purpose | verdict |" in plain_md
    assert "<th>weights</th>" not in plain_html


def test_pair_found_on_dummy_weights_and_confirmed_on_real(tmp_path: Path) -> None:
    rules = [Rule(PAIR, "cuda_graph", TARGET_ERROR), Rule(frozenset({1}), "init", OTHER_ERROR)]
    plain, plain_runs = campaign(tmp_path / "plain", rules, rehearse=False)
    out, runs = campaign(tmp_path / "rehearsed", rules, rehearse=True)
    assert out.status is Status.FOUND and plain.status is Status.FOUND
    assert [c.indices for c in out.culprits] == [c.indices for c in plain.culprits] == [[1, 4]]
    assert out.target == plain.target and "CUBLAS_STATUS_EXECUTION_FAILED" in str(out.target)
    real = [r for r in runs if r.weights == "real"]
    # the target seen on real weights (bad) and the answer confirmed on them: two starts
    assert [(r.variant, r.verdict) for r in real] == [
        (tuple(range(N)), Verdict.FAIL),
        ((1, 4), Verdict.FAIL),
    ]
    assert all(r.weights == "real" for r in plain_runs)
    dummy = [r for r in runs if r.weights == "dummy"]
    assert dummy and all("--load-format" in r.argv and "dummy" in r.argv for r in dummy)
    assert all(r.label.endswith("[dummy weights]") for r in dummy)
    assert not any("--load-format" in r.argv for r in real)
    w = out.weights
    assert w["rehearsal"] == "confirmed" and w["search"] == "dummy"
    assert w["real_starts"] == 2 and w["dummy_starts"] == len(dummy)
    assert w["confirmed_by"] == {" + ".join(out.culprits[0].flags): real[1].id}
    # the `other` finding on the way is still reported (seen on dummy weights)
    assert any("dtype" in str(f.signature) for f in out.findings)
    assert len(real) < len(plain_runs)


def test_weight_dependent_failure_falls_back_to_real_weights(tmp_path: Path) -> None:
    rules = [
        Rule(PAIR, "load_weights", "KeyError: 'model.layers.3.mlp.gate.weight'", real_weights=True)
    ]
    out, runs = campaign(tmp_path, rules, rehearse=True)
    assert out.status is Status.FOUND and [c.indices for c in out.culprits] == [[1, 4]]
    dummy = [r for r in runs if r.weights == "dummy"]
    # only the bad config was tried on dummy weights, and it passed every time
    assert dummy and all(r.variant == tuple(range(N)) and r.verdict is Verdict.PASS for r in dummy)
    assert out.weights["rehearsal"] == "not reproduced" and out.weights["search"] == "real"
    assert "needs the real weights" in out.weights["note"]
    assert out.to_dict()["weights"]["dummy_starts"] == len(dummy)


def test_flaky_pair_rehearsed_is_confirmed_on_real_weights(tmp_path: Path) -> None:
    rules = [Rule(PAIR, "cuda_graph", TARGET_ERROR, probability=0.5)]
    out, runs = campaign(tmp_path, rules, rehearse=True, seed=3)
    assert out.status is Status.FOUND and [c.indices for c in out.culprits] == [[1, 4]]
    real = [r for r in runs if r.weights == "real"]
    assert {r.variant for r in real} <= {tuple(range(N)), (1, 4)}
    assert real[-1].variant == (1, 4) and real[-1].verdict is Verdict.FAIL
    assert out.weights["rehearsal"] == "confirmed"


def test_confirm_attempts_follow_the_rate() -> None:
    assert confirm_attempts(1, 1, 0.95) == 3 and confirm_attempts(1, 1) == 5
    assert confirm_attempts(5, 10, 0.95) == 5
    assert confirm_attempts(1, 10, 0.95) == 12  # capped


def test_a_pair_on_dummy_weights_already_is_not_rehearsed(tmp_path: Path) -> None:
    good, bad = write_pair(tmp_path / "exp", 3)
    for path in (good, bad):
        text = path.read_text()
        path.write_text(text.replace("tp-size: 8", "tp-size: 8\n    load-format: dummy"))
    store = Store(tmp_path / "results")
    oracle = Oracle([Rule(frozenset({2}), "cuda_graph", TARGET_ERROR)])
    out = Bisection(
        store,
        make_plan(good, bad),
        [host()],
        command="test",
        options=BisectOptions(rehearse=True),
        executor_factory=lambda h, *_: ScriptedExecutor(h, oracle, Faults()),
    ).run()
    assert out.status is Status.FOUND and [c.indices for c in out.culprits] == [[2]]
    assert out.weights["rehearsal"] == "refused" and "already load dummy" in out.weights["note"]
    assert out.weights["real_starts"] == 0 and out.weights["search"] == "dummy"


def test_the_dummy_check_reads_a_few_real_starts_as_a_rate_of_at_most_0_4() -> None:
    from orchestrator.campaign.rehearsal import check_attempts

    assert check_attempts(1, 1) == 10  # 0.6 ** 10 < 0.01
    assert check_attempts(1, 3) == confirm_attempts(1, 3)  # (1+1)/(3+2) = 0.4 already
