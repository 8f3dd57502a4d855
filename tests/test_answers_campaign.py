"""Bisections judged by their answers: the answers check wired through config, executor,
campaign and store, on the scripted host (tests/support/scripted.py: the real Bisection,
planner, store and judge; only the host and its answers are scripted). Fast tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import BisectOptions, Status
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import ConfigError
from orchestrator.events import Event, Notice
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


def answers_pair(root: Path, n: int, answers: dict[str, object] | None = None) -> tuple[Path, Path]:
    good, bad = write_pair(root, n)
    data = yaml.safe_load(good.read_text())
    data["answers"] = answers if answers is not None else {}
    good.write_text(yaml.safe_dump(data))
    return good, bad


def bisect(
    root: Path,
    oracle: Oracle,
    n: int = 6,
    answers: dict[str, object] | None = None,
    resume_id: str | None = None,
    **opts: object,
) -> tuple[object, Store, list[Event], list[ScriptedExecutor]]:
    good, bad = answers_pair(root / "exp", n, answers)
    plan = make_plan(good, bad)
    store = Store(root / "results")
    events: list[Event] = []
    made: list[ScriptedExecutor] = []

    def make(h, service, campaign, listener):  # type: ignore[no-untyped-def]
        made.append(ScriptedExecutor(h, oracle, Faults(), listener))
        return made[-1]

    outcome = Bisection(
        store,
        plan,
        [host("h1")],
        options=BisectOptions(**opts),  # type: ignore[arg-type]
        command="test",
        executor_factory=make,
        listener=events.append,
        resume_id=resume_id,
    ).run()
    return outcome, store, events, made


def test_a_culprit_that_answers_wrong_is_found_as_a_wrong_output(tmp_path: Path) -> None:
    oracle = Oracle([], answers=[(frozenset({3}), "garbled")])
    outcome, store, _, made = bisect(tmp_path, oracle)
    assert outcome.status is Status.FOUND, outcome.message
    assert [c.indices for c in outcome.culprits] == [[3]]
    assert outcome.target is not None
    assert outcome.target.error_class == "wrong_output"
    assert outcome.target.message == "garbled answers"
    rows = store.runs(outcome.campaign_id)
    good = next(r for r in rows if r.variant == ())
    bad = next(r for r in rows if r.variant == tuple(range(6)))
    # good asked twice on its start (the reference and its noise), the others once
    assert (good.id, True) in made[0].asked
    assert all(not twice for rid, twice in made[0].asked if rid != good.id)
    assert good.verdict is Verdict.PASS and good.answers is not None
    assert good.answers["noise"]["passed"] is True
    assert bad.verdict is Verdict.FAIL
    assert bad.answers is not None and bad.answers["judged"]["reference_run"] == good.id
    assert bad.answers["judged"]["kind"] == "garbled"
    assert "garbled" in bad.detail and good.id in bad.detail


def test_a_crash_and_a_wrong_answer_are_two_findings(tmp_path: Path) -> None:
    oracle = Oracle(
        [Rule(frozenset({1}), "cuda_graph", TARGET_ERROR)],
        answers=[(frozenset({4}), "different")],
    )
    outcome, store, _, _ = bisect(tmp_path, oracle)
    assert outcome.status is Status.FOUND, outcome.message
    sigs = {str(outcome.target)} | {str(f.signature) for f in outcome.findings}
    assert any("cublas" in s for s in sigs), sigs
    assert any("wrong_output" in s for s in sigs), sigs


def test_two_kinds_of_wrong_answer_are_two_signatures(tmp_path: Path) -> None:
    oracle = Oracle([], answers=[(frozenset({2}), "garbled"), (frozenset({5}), "different")])
    outcome, store, _, _ = bisect(tmp_path, oracle)
    rows = store.runs(outcome.campaign_id)
    sigs = {str(r.signature) for r in rows if r.signature is not None}
    assert "serving: wrong_output: garbled answers" in sigs
    assert "serving: wrong_output: answers differ from the reference" in sigs
    assert outcome.findings, outcome


def test_a_good_that_disagrees_with_itself_under_exact_is_said(tmp_path: Path) -> None:
    oracle = Oracle([], answers=[(frozenset({0}), "garbled")], repeat="drift")
    outcome, store, events, _ = bisect(tmp_path, oracle, answers={"rule": "exact"})
    said = [e.message for e in events if isinstance(e, Notice) and "disagrees" in e.message]
    assert said and "answers.rule: logprobs-close" in said[0], said
    good = next(r for r in store.runs(outcome.campaign_id) if r.variant == ())
    assert good.answers is not None and good.answers["noise"]["would_hold"] == "logprobs-close"
    # and the answer says it (reports list it with the flaky notes)
    assert any("disagrees with itself under exact" in f for f in outcome.flaky), outcome.flaky


def test_a_good_whose_second_pass_drifts_within_logprobs_close_says_nothing(
    tmp_path: Path,
) -> None:
    oracle = Oracle([], answers=[(frozenset({0}), "garbled")], repeat="drift")
    _, _, events, _ = bisect(tmp_path, oracle)
    assert not [e for e in events if isinstance(e, Notice) and "disagrees" in e.message]


def test_health_without_a_completion_is_no_pass(tmp_path: Path) -> None:
    oracle = Oracle([], answers=[(frozenset({1}), "silent")])
    outcome, store, _, _ = bisect(tmp_path, oracle)
    assert outcome.status is Status.FOUND, outcome.message
    assert [c.indices for c in outcome.culprits] == [[1]]
    assert outcome.target is not None and outcome.target.error_class == "no_completion"


def test_answers_checked_runs_are_never_reused_from_another_campaign(tmp_path: Path) -> None:
    oracle = Oracle([], answers=[(frozenset({3}), "garbled")])
    first, store, _, _ = bisect(tmp_path, oracle)
    # the same pair again, another campaign (the first one is finished), reuse allowed:
    # every run is executed again against this campaign's good
    second, store2, _, _ = bisect(tmp_path, oracle)
    assert second.campaign_id != first.campaign_id
    assert second.runs_reused == 0 and second.runs_executed > 0
    assert all(r.cached_from is None for r in store2.runs(second.campaign_id))


def test_without_answers_nothing_is_asked(tmp_path: Path) -> None:
    good, bad = write_pair(tmp_path / "exp", 4)
    plan = make_plan(good, bad)
    assert plan.good.answers is None
    oracle = Oracle([Rule(frozenset({2}), "cuda_graph", TARGET_ERROR)])
    made: list[ScriptedExecutor] = []

    def make(h, service, campaign, listener):  # type: ignore[no-untyped-def]
        made.append(ScriptedExecutor(h, oracle, Faults(), listener))
        return made[-1]

    store = Store(tmp_path / "results")
    outcome = Bisection(
        store, plan, [host("h1")], options=BisectOptions(), command="t", executor_factory=make
    ).run()
    assert outcome.status is Status.FOUND
    assert made[0].asked == []
    assert all(r.answers is None for r in store.runs(outcome.campaign_id))


@pytest.mark.parametrize(
    ("answers", "key", "words"),
    [
        ({"rule": "exactly"}, "answers.rule", "exact, logprobs-close, score"),
        ({"rul": "exact"}, "answers.rul", "rule"),
        ({"modes": ["parallel"]}, "answers.modes", "sequential, batch"),
        ({"endpoint": "chats"}, "answers.endpoint", "chat, completions"),
        ({"top_k": 0}, "answers.top_k", "1"),
        ({"pass_if": ">= good - 0.08"}, "answers.pass_if", "rule: score"),
        ({"rule": "score", "pass_if": "at least good"}, "answers.pass_if", "good"),
        ({"prompts": "missing.jsonl"}, "answers.prompts", "missing.jsonl"),
        ({"enabled": "yes"}, "answers.enabled", "bool"),
        ({"top_k": "5"}, "answers.top_k", "integer"),
        # bars that cannot judge a score in [0, 1] that is better higher
        ({"rule": "score", "pass_if": ">= good - 2"}, "answers.pass_if", "no score misses"),
        ({"rule": "score", "pass_if": ">= 0"}, "answers.pass_if", "no score misses"),
        ({"rule": "score", "pass_if": "> 1"}, "answers.pass_if", "no score meets"),
        ({"rule": "score", "pass_if": ">= good + 0.1"}, "answers.pass_if", "reference's own"),
        ({"rule": "score", "pass_if": "<= good"}, "answers.pass_if", "better higher"),
        ({"rule": "score", "pass_if": "== good"}, "answers.pass_if", "use >="),
        ({"rule": "score", "pass_if": ">= -0.5"}, "answers.pass_if", "no score misses"),
    ],
)
def test_config_errors_name_file_key_and_what_was_expected(
    tmp_path: Path, answers: dict[str, object], key: str, words: str
) -> None:
    good, _ = answers_pair(tmp_path, 2, answers)
    with pytest.raises(ConfigError) as err:
        load_experiment(good)
    text = str(err.value) + " " + str(getattr(err.value, "hint", "") or "")
    assert str(good) in text and key in text and words in text, text


@pytest.mark.parametrize("bar", [">= good - 0.08", "> good - 0.5", ">= 0.75", ">= 1"])
def test_score_bars_that_judge_load(tmp_path: Path, bar: str) -> None:
    good, _ = answers_pair(tmp_path, 2, {"rule": "score", "pass_if": bar})
    assert load_experiment(good).answers.pass_if == bar  # type: ignore[union-attr]


def test_a_prompt_file_is_read_beside_the_experiment(tmp_path: Path) -> None:
    (tmp_path / "mine.jsonl").write_text('{"id": "q", "prompt": "2+2=", "expect": "4"}\n')
    good, _ = answers_pair(tmp_path, 2, {"prompts": "mine.jsonl", "rule": "score"})
    exp = load_experiment(good)
    assert exp.answers is not None and exp.answers.rule == "score"
    assert [p.id for p in exp.answers.load()] == ["q"]
    assert exp.answers.pass_if == ">= good - 0.08"
    assert exp.answers.ready_completion is True
    # the recorded config reads back with its digest, its fingerprint unchanged
    again = type(exp).from_dict(exp.to_dict(), source="run x.1")
    assert again.fingerprint() == exp.fingerprint()
    # another prompt set is another run
    (tmp_path / "mine.jsonl").write_text('{"id": "q", "prompt": "3+3=", "expect": "6"}\n')
    assert load_experiment(good).fingerprint() != exp.fingerprint()
    # and the recorded config (a rerun, a resumed campaign) refuses it: its reference
    # answered "2+2=", and an answer to "3+3=" is no answer to judge by it
    with pytest.raises(ConfigError) as err:
        again.answers.load()  # type: ignore[union-attr]
    text = str(err.value)
    assert "mine.jsonl" in text and "answers.prompts" in text and "changed since" in text


def test_show_reports_and_issue_put_the_answers_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main
    from orchestrator.reports.issue_report import issue_markdown
    from orchestrator.reports.report import html_page, markdown

    oracle = Oracle([], answers=[(frozenset({3}), "different")])
    outcome, store, _, _ = bisect(tmp_path, oracle)
    rows = store.runs(outcome.campaign_id)
    good = next(r for r in rows if r.variant == ())
    culprit = outcome.culprits[0]
    repro = next(r for r in rows if r.id == culprit.reproduced_by)
    results = str(tmp_path / "results")

    assert main(["show", repro.id, "--results", results]) == 0
    shown = capsys.readouterr().out
    assert f"judged WRONG (different) under logprobs-close against good's run {good.id}" in shown
    assert "asked:    user: What is 2 + 3? Answer with the number only." in shown
    # the first differing token marked on both sides
    # (a server's token carries its leading space: the mark holds it)
    assert "good:     The answer[[ to]] this question is 5 and nothing else" in shown
    assert "this run: The answer[[ Bananas]] are yellow fruit" in shown
    assert "score (sequential): 0.00, good's 0.67" in shown

    assert main(["show", good.id, "--results", results]) == 0
    assert "it agrees with itself under logprobs-close" in capsys.readouterr().out

    assert main(["show", repro.id, "--json", "--results", results]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert as_json["answers"]["judged"]["kind"] == "different"

    camp = store.campaign(outcome.campaign_id)
    md, page = markdown(camp, rows), html_page(camp, rows)
    assert "[[ Bananas]]" in md and "[[ Bananas]]" in page
    issue = issue_markdown(camp, rows, log_of=lambda r: r.log_tail(), env_of=lambda r: None)
    assert "## Answers" in issue
    assert "What is 2 + 3?" in issue and "[[ Bananas]]" in issue and "[[ to]]" in issue
    working = issue.split("The working launch:")[1].split("```bash")[1].split("```")[0]
    assert "--model-path /models/m" in working and "--feature-3" not in working
    assert "wrong answers: answers differ from the reference" in issue


def test_a_sweep_judges_each_config_by_its_answers_against_the_reference(
    tmp_path: Path,
) -> None:
    from orchestrator.campaign.sweep import SweepCampaign
    from orchestrator.config.sweep import load_sweep
    from tests.support.scripted import factory

    # good (the reference) answers right; bad (with --feature-0, --feature-1) garbled
    answers_pair(tmp_path / "exp", 2, {"rule": "score", "pass_if": ">= good - 0.08"})
    bad = tmp_path / "exp" / "bad.yaml"
    path = tmp_path / "exp" / "sweep.yaml"
    path.write_text("name: s\nconfigs: [bad.yaml]\nreference: good.yaml\n")
    assert bad.exists()
    sweep = load_sweep(path)
    store = Store(tmp_path / "results")
    oracle = Oracle([], answers=[(frozenset({1}), "garbled")])
    outcome = SweepCampaign(
        store, sweep, [host("s1")], executor_factory=factory(oracle, Faults())
    ).run()
    by_label = {r.item.label: r.run for r in outcome.rows if r.run is not None}
    ref_row = next(r for r in by_label.values() if r.variant == (sweep.reference,))
    wrong = [r for r in by_label.values() if r.id != ref_row.id]
    assert ref_row.verdict is Verdict.PASS
    assert wrong and all(r.verdict is Verdict.FAIL for r in wrong)
    assert str(wrong[0].signature) == "serving: wrong_output: garbled answers"
    judged = wrong[0].answers["judged"]  # type: ignore[index]
    assert judged["reference_run"] == ref_row.id
    assert judged["modes"]["sequential"]["score"] < judged["modes"]["sequential"]["reference_score"]


def test_a_sweep_says_when_its_reference_got_no_answer(tmp_path: Path) -> None:
    from orchestrator.campaign.sweep import SweepCampaign
    from orchestrator.config.sweep import load_sweep
    from orchestrator.events import Notice
    from tests.support.scripted import factory

    # every config is ready without a completion and answers no prompt: nothing is judged
    answers_pair(tmp_path / "exp", 2, {"ready_completion": False})
    path = tmp_path / "exp" / "sweep.yaml"
    path.write_text("name: s\nconfigs: [bad.yaml]\nreference: good.yaml\nrepeat: 2\n")
    sweep = load_sweep(path)
    said: list[str] = []
    oracle = Oracle([], answers=[(frozenset(), "silent")])
    outcome = SweepCampaign(
        Store(tmp_path / "results"),
        sweep,
        [host("s1")],
        executor_factory=factory(oracle, Faults()),
        listener=lambda e: said.append(e.message) if isinstance(e, Notice) else None,
    ).run()
    assert all(r.run is not None and r.run.verdict is Verdict.PASS for r in outcome.rows)
    told = [m for m in said if "got no answer" in m]
    assert len(told) == 1, said  # once, not once per repeat
    assert told[0].startswith("the reference scripted-good got no answer to any prompt"), told
    assert "no run of this campaign is judged by its answers" in told[0]


def test_a_rerun_is_judged_against_the_good_answers_its_run_was_judged_against(
    tmp_path: Path,
) -> None:
    from orchestrator.campaign.rerun import recorded_reference
    from orchestrator.campaign.single import single_run
    from tests.support.scripted import factory

    oracle = Oracle([], answers=[(frozenset({3}), "garbled")])
    outcome, store, _, _ = bisect(tmp_path, oracle)
    rows = store.runs(outcome.campaign_id)
    good = next(r for r in rows if r.variant == ())
    old = next(r for r in rows if r.id == outcome.culprits[0].reproduced_by)
    camp = store.campaign(old.campaign)
    reference = recorded_reference(store, old, camp)
    assert reference is not None and reference.id == good.id
    # good itself is judged by its own recorded answers
    assert recorded_reference(store, good, camp) == good
    row = single_run(
        store,
        old.experiment(),
        host("h1"),
        kind="rerun",
        command="test",
        label="rerun",
        target=camp.target,
        executor_factory=factory(oracle, Faults()),
        reference=reference,
    )
    assert row.verdict is Verdict.FAIL and row.signature == camp.target
    assert row.answers is not None and row.answers["judged"]["reference_run"] == good.id


def test_a_resumed_campaign_judges_by_the_good_run_it_recorded(tmp_path: Path) -> None:
    oracle = Oracle([], answers=[(frozenset({4}), "garbled")])
    first, store, _, made = bisect(tmp_path, oracle, max_runs=3)
    assert first.status is Status.INCOMPLETE, first.message
    good = next(r for r in store.runs(first.campaign_id) if r.variant == ())
    store.close()
    # resumed in a new process: good is not run again, its recorded answers are the reference
    second, store2, _, made2 = bisect(tmp_path, oracle, resume_id=first.campaign_id)
    assert second.campaign_id == first.campaign_id
    assert made2 and made2[0].asked and not any(twice for _, twice in made2[0].asked)
    assert second.status is Status.FOUND and [c.indices for c in second.culprits] == [[4]]
    later = [r for r in store2.runs(second.campaign_id) if r.seq > 3 and r.answers]
    assert later and all(r.variant != () for r in later)
    assert all(r.answers["judged"]["reference_run"] == good.id for r in later)  # type: ignore[index]


def test_a_run_alone_says_its_answers_were_not_judged(tmp_path: Path) -> None:
    # `run` has no good config to compare with: a server answering garbage is no silent pass
    from orchestrator.campaign.single import single_run
    from tests.support.scripted import factory

    oracle = Oracle([], answers=[(frozenset({1}), "garbled")])
    _, bad = answers_pair(tmp_path / "exp", 3)
    store = Store(tmp_path / "results")
    row = single_run(
        store,
        load_experiment(bad),
        host("h1"),
        kind="run",
        command="test",
        label="bad",
        executor_factory=factory(oracle, Faults()),
    )
    assert row.verdict is Verdict.PASS  # nothing to judge it against: no verdict about it
    assert "answers not judged: no good config's answers to compare with" in row.detail
    assert "answer(s) garbled" in row.detail, row.detail
    assert row.answers is not None and row.answers["judged"]["passed"] is None
