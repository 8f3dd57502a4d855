"""The answers check on what the tokens alone do not show, and on an absolute score bar,
through the real Bisection, single run, store and judge on the scripted host (fast tier):

- a variant whose server keeps the right tokens but scrambles the text (the lab's
  prefill/decode pair whose roles disagree on the KV cache dtype) answers wrong under every
  rule, and is bisected to its flag;
- an absolute bar (`pass_if: ">= 0.75"`) needs no reference: a run alone is judged by it,
  and a good config whose own score misses it ends the bisection at its endpoints.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import BisectOptions, Status
from orchestrator.campaign.single import single_run
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.store.store import Store
from tests.support.scripted import Faults, Oracle, factory, host, write_pair

#: two scored prompts: the scripted server meets the first (`expect` is the word it names)
#: and never the second, so its own score is 0.50
HALF = (
    '{"id": "q1", "prompt": "2 + 2 =", "expect": "4"}\n'
    '{"id": "q2", "prompt": "the password is", "regex": "^PELICAN$"}\n'
)


def pair(root: Path, n: int, answers: dict[str, object], prompts: str | None = None) -> tuple:
    good, bad = write_pair(root, n)
    if prompts is not None:
        (root / "half.jsonl").write_text(prompts)
        answers = {**answers, "prompts": "half.jsonl"}
    data = yaml.safe_load(good.read_text())
    data["answers"] = answers
    good.write_text(yaml.safe_dump(data))
    return good, bad


def bisect(root: Path, oracle: Oracle, answers: dict[str, object], prompts: str | None = None):  # type: ignore[no-untyped-def]
    good, bad = pair(root / "exp", 4, answers, prompts)
    store = Store(root / "results")
    outcome = Bisection(
        store,
        make_plan(good, bad),
        [host("h1")],
        options=BisectOptions(),
        command="test",
        executor_factory=factory(oracle, Faults()),
    ).run()
    return outcome, store


@pytest.mark.parametrize("rule", ["exact", "logprobs-close", "score"])
def test_the_right_tokens_with_scrambled_text_are_bisected_to_their_flag(
    tmp_path: Path, rule: str
) -> None:
    oracle = Oracle([], answers=[(frozenset({2}), "retext")])
    outcome, store = bisect(tmp_path, oracle, {"rule": rule})
    assert outcome.status is Status.FOUND, outcome.message
    assert [c.indices for c in outcome.culprits] == [[2]]
    assert str(outcome.target) == "serving: wrong_output: garbled answers"
    bad = next(r for r in store.runs(outcome.campaign_id) if r.variant == (0, 1, 2, 3))
    judged = bad.answers["judged"]  # type: ignore[index]
    assert judged["kind"] == "garbled" and "garbled" in judged["detail"], judged
    diffs = judged["modes"]["sequential"]["diffs"]
    assert diffs and all(d["same_tokens"] and d["first_diff"] is None for d in diffs), diffs


def test_a_good_whose_own_score_misses_an_absolute_bar_ends_at_the_endpoints(
    tmp_path: Path,
) -> None:
    outcome, store = bisect(
        tmp_path, Oracle([]), {"rule": "score", "pass_if": ">= 0.75"}, prompts=HALF
    )
    assert outcome.status is Status.ENDPOINTS, outcome.message
    assert outcome.message.startswith(
        "the good config's own score 0.50 misses the bar '>= 0.75' on h1 (sequential; wrong: 'q2')"
    ), outcome.message
    good = next(r for r in store.runs(outcome.campaign_id) if r.variant == ())
    assert good.verdict is Verdict.FAIL
    assert str(good.signature) == "serving: wrong_output: the score dropped below the bar"
    # bad was never started: good's answers judge nothing
    assert [r.variant for r in store.runs(outcome.campaign_id)] == [()]


def run_alone(tmp_path: Path, bar: str, prompts: str | None) -> object:
    good, _ = pair(tmp_path / "exp", 1, {"rule": "score", "pass_if": bar}, prompts)
    store = Store(tmp_path / "results")
    return single_run(
        store,
        load_experiment(good),
        host("h1"),
        kind="run",
        command="test",
        label="good",
        executor_factory=factory(Oracle([]), Faults()),
    )


def test_a_run_alone_is_judged_by_an_absolute_bar(tmp_path: Path) -> None:
    row = run_alone(tmp_path / "half", ">= 0.75", HALF)
    assert row.verdict is Verdict.FAIL, row.detail  # type: ignore[attr-defined]
    assert str(row.signature) == "serving: wrong_output: the score dropped below the bar"  # type: ignore[attr-defined]
    assert "score 0.50 misses '>= 0.75'; wrong: 'q2'" in row.detail  # type: ignore[attr-defined]
    judged = row.answers["judged"]  # type: ignore[attr-defined]
    assert (judged["passed"], judged["reference_run"], judged["kind"]) == (False, None, "score")
    # met: a pass that says it was judged, not "not judged"
    row = run_alone(tmp_path / "met", ">= 0.5", HALF)
    assert row.verdict is Verdict.PASS  # type: ignore[attr-defined]
    assert row.answers["judged"]["passed"] is True, row.answers["judged"]  # type: ignore[attr-defined]
    assert "not judged" not in row.detail  # type: ignore[attr-defined]
    # a bar relative to good still needs good's answers
    row = run_alone(tmp_path / "rel", ">= good - 0.08", HALF)
    assert row.answers["judged"]["passed"] is None  # type: ignore[attr-defined]


def test_a_wrong_answer_finding_names_the_one_prompt_it_hit(tmp_path: Path) -> None:
    from tests.support.scripted import TARGET_ERROR
    from tests.support.scripted import Rule as Crash

    oracle = Oracle(
        [Crash(frozenset({1}), "cuda_graph", TARGET_ERROR)],
        answers=[(frozenset({3}), "different@fact-france")],
    )
    outcome, _ = bisect(tmp_path, oracle, {})
    assert outcome.status is Status.FOUND, outcome.message
    (finding,) = [f for f in outcome.findings if f.signature.error_class == "wrong_output"]
    assert finding.prompts == ("fact-france",)
    assert finding.seen().endswith("; on prompt 'fact-france' only"), finding.seen()
    assert outcome.to_dict()["findings"][0]["prompts"] == ["fact-france"]


def test_show_and_the_issue_say_what_a_pass_and_a_retext_mean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main
    from orchestrator.reports.issue_report import issue_markdown

    oracle = Oracle([], answers=[(frozenset({2}), "retext@fact-france")])
    outcome, store = bisect(tmp_path, oracle, {"rule": "exact"})
    assert outcome.status is Status.FOUND, outcome.message
    rows = store.runs(outcome.campaign_id)
    repro = next(r for r in rows if r.id == outcome.culprits[0].reproduced_by)
    assert main(["show", repro.id, "--results", str(tmp_path / "results")]) == 0
    shown = capsys.readouterr().out
    assert "prompt 'fact-france' (the same tokens, another text; breaks the rule" in shown
    issue = issue_markdown(
        store.campaign(outcome.campaign_id),
        rows,
        log_of=lambda r: r.log_tail(),
        env_of=lambda r: None,
    )
    assert "Working launch answers (the same tokens, another text):" in issue, issue
    assert (
        "| the failing launch without `--feature-2` | starts, serves and answers right (passes) |"
        in issue
    )
    assert (
        "| the working launch (none of these flags) | starts and serves; its answers are "
        "the reference (passes) |" in issue
    )
    assert "starts and serves (passes)" not in issue


def test_show_of_a_run_judged_by_its_absolute_bar_names_no_good_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    row = run_alone(tmp_path, ">= 0.75", HALF)
    assert main(["show", row.id, "--results", str(tmp_path / "results")]) == 0  # type: ignore[attr-defined]
    shown = capsys.readouterr().out
    assert "judged WRONG (score) under score by its absolute bar, no reference needed" in shown
    assert "score (sequential): 0.50\n" in shown and "good's" not in shown, shown
