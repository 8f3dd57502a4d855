"""The answers check at a campaign's ends, on the scripted host (fast tier): a good that
stops answering on its second pass is no noise, a rerun of the reference is judged by the
reference's answers, a pair whose answers sections differ is refused before a start, and
an answer judged by answers names its rule and what a stricter one says.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.records import Status
from orchestrator.campaign.rerun import recorded_reference
from orchestrator.campaign.single import single_runs
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import ConfigError
from orchestrator.events import Notice
from orchestrator.store.store import Store
from tests.support.scripted import Faults, Oracle, factory, host, write_pair
from tests.test_answers_campaign import bisect


def test_a_rerun_of_the_reference_is_judged_by_the_reference_answers(tmp_path: Path) -> None:
    outcome, store, _, _ = bisect(tmp_path, Oracle([], answers=[(frozenset({3}), "garbled")]))
    good = next(r for r in store.runs(outcome.campaign_id) if r.variant == ())
    camp = store.campaign(good.campaign)
    reference = recorded_reference(store, good, camp)
    assert reference is not None and reference.id == good.id
    # a start of good that answers otherwise than good's recorded run did
    drifted = Oracle([], answers=[(frozenset(), "different")])
    rows = single_runs(
        store,
        good.experiment(),
        host("h1"),
        kind="rerun",
        command="test",
        label="rerun",
        starts=2,
        target=camp.target,
        executor_factory=factory(drifted, Faults()),
        reference=reference,
        spec_extra={"rerun_of": good.id, "answers_reference": reference.id},
    )
    assert all(r.verdict is not Verdict.PASS for r in rows), [r.verdict for r in rows]
    assert all(str(r.signature).startswith("serving: wrong_output: answers differ") for r in rows)
    assert all(r.answers["judged"]["reference_run"] == good.id for r in rows)  # type: ignore[index]
    # a rerun of that rerun is judged by the same reference
    again = recorded_reference(store, rows[0], store.campaign(rows[0].campaign))
    assert again is not None and again.id == good.id


def test_a_good_that_stops_answering_when_asked_again_fails_and_is_no_noise(
    tmp_path: Path,
) -> None:
    # good answers its first pass, then nothing (a server dying or stalled after N requests)
    oracle = Oracle([], answers=[(frozenset({3}), "garbled")], repeat="silent")
    outcome, store, events, made = bisect(tmp_path, oracle, answers={"rule": "exact"})
    assert outcome.status is Status.ENDPOINTS, outcome.message
    rows = store.runs(outcome.campaign_id)
    good = next(r for r in rows if r.variant == ())
    assert good.verdict is Verdict.FAIL
    assert str(good.signature) == "serving: wrong_output: the server stopped answering"
    assert "after 18 answers when asked again" in good.detail, good.detail
    assert "the good config does not pass" in outcome.message and good.id in outcome.message
    # bad is not started on a good that failed; no looser rule is advised for it
    assert [r.variant for r in rows] == [()]
    said = [e.message for e in events if isinstance(e, Notice)] + list(outcome.flaky)
    assert not any("answers.rule" in m or "disagrees" in m for m in said), said
    assert outcome.answers.endswith("under exact: no good run passed, nothing was judged by it")


def test_a_stall_is_named_as_one_with_the_answers_before_it(tmp_path: Path) -> None:
    from orchestrator.campaign.answers_check import stopped_after

    ok = {"prompt_id": "a", "error": None}
    lost = {"prompt_id": "b", "error": "timed out"}
    seq = ("sequential", "batch")
    assert stopped_after({"sets": {"sequential": [ok, ok, lost], "batch": [lost]}}, seq) == 2
    assert stopped_after({"sets": {"sequential": [ok, lost, ok]}}, seq) is None
    assert stopped_after({"sets": {"sequential": [lost, lost]}}, seq) is None
    assert stopped_after({"sets": {"sequential": [ok]}, "repeat": [ok, lost]}, seq) == 2
    # the executor looks whether the server still lives when the second pass went unanswered
    from orchestrator.execution.answers import unanswered

    assert unanswered({"sets": {"sequential": [ok]}, "repeat": [ok, lost]})
    assert not unanswered({"sets": {"sequential": [ok]}, "repeat": [ok]})


@pytest.mark.parametrize(
    ("good_answers", "bad_answers", "words"),
    [
        (None, {}, "judges the answers"),
        ({}, {"enabled": False}, "answers.enabled: false"),
        ({"rule": "exact"}, {"rule": "logprobs-close"}, "rule 'exact' in good, 'logprobs-close'"),
    ],
)
def test_a_pair_whose_answers_sections_differ_is_refused_before_a_start(
    tmp_path: Path, good_answers: dict | None, bad_answers: dict, words: str
) -> None:
    good, bad = write_pair(tmp_path, 3)
    for path, answers in ((good, good_answers), (bad, bad_answers)):
        data = yaml.safe_load(path.read_text())
        if answers is not None:
            data["answers"] = answers
        path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        make_plan(good, bad)
    text = str(err.value)
    assert words in text and "answers" in text, text
    assert str(good) in text or str(bad) in text, text
    # the same section on both sides is one check
    data = yaml.safe_load(bad.read_text())
    data["answers"] = good_answers
    bad.write_text(yaml.safe_dump(data))
    assert make_plan(good, bad).n == 3


def test_a_bad_that_passes_the_rule_the_same_way_twice_is_not_started_again(
    tmp_path: Path,
) -> None:
    # bad's answers differ from good's within logprobs-close, the same on every start
    oracle = Oracle([], answers=[(frozenset({0}), "drift")])
    outcome, store, _, _ = bisect(tmp_path, oracle, n=3)
    assert outcome.status is Status.ENDPOINTS, outcome.message
    bad = [r for r in store.runs(outcome.campaign_id) if r.variant == (0, 1, 2)]
    assert len(bad) == 2 and all(r.verdict is Verdict.PASS for r in bad)
    assert "the same on its last two starts" in outcome.message, outcome.message
    # the answer names the rule, good's run, and what the stricter rule says
    said = outcome.to_dict()["answers"]
    assert said.startswith("answers judged under logprobs-close against good's run"), said
    assert "under exact they would fail" in said and "answers.rule: exact" in said, said
    judged = bad[-1].answers["judged"]  # type: ignore[index]
    assert judged["stricter"]["rule"] == "exact" and judged["stricter"]["passed"] is False
    # and so do the reports made from the campaign's record
    from orchestrator.reports.issue_report import issue_markdown
    from orchestrator.reports.report import html_page, markdown

    camp, rows = store.campaign(outcome.campaign_id), store.runs(outcome.campaign_id)
    assert f"- answers: {said}" in markdown(camp, rows)
    assert "Answers: answers judged under logprobs-close" in html_page(camp, rows)
    issue = issue_markdown(camp, rows, log_of=lambda r: r.log_tail(), env_of=lambda r: None)
    assert "**Answers:** answers judged under logprobs-close" in issue


def test_a_bad_that_answers_as_good_did_is_started_again_for_a_flaky_wrong_answer(
    tmp_path: Path,
) -> None:
    oracle = Oracle([], answers=[(frozenset({0}), "garbled")])
    outcome, store, _, _ = bisect(tmp_path, oracle, n=3, answers={"enabled": True})
    assert outcome.status is Status.FOUND, outcome.message
    # and a found answer names its rule too
    assert outcome.answers.startswith("answers judged under logprobs-close"), outcome.answers
    assert "bad's failed" in outcome.answers
    right = Oracle([], answers=[])
    outcome, store, _, _ = bisect(tmp_path / "right", right, n=3)
    bad = [r for r in store.runs(outcome.campaign_id) if r.variant == (0, 1, 2)]
    assert len(bad) > 2, len(bad)  # the same right answers prove nothing about a flaky one
    assert "under exact too" in outcome.answers, outcome.answers


def test_a_flag_whose_wrong_answer_is_a_finding_is_not_listed_as_cleared(
    tmp_path: Path,
) -> None:
    from orchestrator.cli.bisect import cleared_deltas
    from tests.support.scripted import TARGET_ERROR, Rule

    oracle = Oracle(
        [Rule(frozenset({1}), "cuda_graph", TARGET_ERROR)],
        answers=[(frozenset({4}), "different")],
    )
    outcome, _, _, _ = bisect(tmp_path, oracle)
    assert outcome.status is Status.FOUND, outcome.message
    [finding] = [f for f in outcome.findings if "wrong_output" in str(f.signature)]
    assert finding.variant == (4,)
    plan = make_plan(tmp_path / "exp" / "good.yaml", tmp_path / "exp" / "bad.yaml")
    cleared = [d.short() for d in cleared_deltas(outcome, plan)]
    assert "--feature-4" not in cleared and "--feature-1" not in cleared, cleared
    assert "--feature-0" in cleared


def test_a_sweep_judged_by_answers_alone_names_its_rule_not_probe_bars(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.campaign.sweep import SweepCampaign
    from orchestrator.cli.sweep import print_table
    from orchestrator.config.sweep import load_sweep
    from tests.test_answers_campaign import answers_pair

    answers_pair(tmp_path / "exp", 2, {"rule": "exact"})
    path = tmp_path / "exp" / "sweep.yaml"
    path.write_text("name: s\nconfigs: [bad.yaml]\nreference: good.yaml\n")
    outcome = SweepCampaign(
        Store(tmp_path / "results"),
        load_sweep(path),
        [host("s1")],
        executor_factory=factory(Oracle([]), Faults()),
    ).run()
    capsys.readouterr()
    print_table(outcome, [])
    out = capsys.readouterr().out
    assert "answers (rule exact) judged against the reference" in out, out
    assert "probe bars" not in out, out


def test_a_run_that_stalls_after_some_answers_is_named_a_stall(tmp_path: Path) -> None:
    from dataclasses import replace

    from orchestrator.campaign.answers_check import judge_result
    from orchestrator.config.loading import load_experiment
    from tests.support.scripted import ScriptedExecutor
    from tests.test_answers_campaign import answers_pair

    good_path, bad_path = answers_pair(tmp_path, 2)
    ex = ScriptedExecutor(host("h1"), Oracle([]), Faults())
    good = ex.run(load_experiment(good_path), run_id="g.1")
    bad = ex.run(load_experiment(bad_path), run_id="b.1")
    assert good.answers is not None and bad.answers is not None
    # the 9th request hung: it and every prompt after it got no answer
    sets = {m: [dict(a) for a in s] for m, s in bad.answers["sets"].items()}
    asked = [a for m in ("sequential", "batch") for a in sets[m]]
    for a in asked[8:]:
        a["error"] = "timed out after 120s"
    bad = replace(bad, answers={**bad.answers, "sets": sets})
    judged = judge_result(bad, good, None)
    assert judged.verdict is Verdict.FAIL
    assert str(judged.signature) == "serving: wrong_output: the server stopped answering"
    assert "stopped answering after 8 answers" in judged.detail, judged.detail


def test_a_prompt_good_never_answers_is_no_stop_on_its_second_pass(tmp_path: Path) -> None:
    from dataclasses import replace

    from orchestrator.campaign.answers_check import noise
    from orchestrator.config.loading import load_experiment
    from tests.support.scripted import ScriptedExecutor
    from tests.test_answers_campaign import answers_pair

    good_path, _ = answers_pair(tmp_path, 2)
    ex = ScriptedExecutor(host("h1"), Oracle([]), Faults())
    good = ex.run(load_experiment(good_path), run_id="g.1", ask_twice=True)
    assert good.answers is not None

    def first_lost(answers: list[dict]) -> list[dict]:
        return [a if i else {**a, "error": "HTTP 404"} for i, a in enumerate(answers)]

    # one prompt the server never answers, in every pass (a chat-only server)
    record = {
        **good.answers,
        "sets": {m: first_lost(s) for m, s in good.answers["sets"].items()},
        "repeat": first_lost(good.answers["repeat"]),
    }
    measured = noise(replace(good, answers=record))
    assert measured is not None and not measured.get("no_answer"), measured


def test_a_pair_that_judges_no_answers_may_differ_in_readiness(tmp_path: Path) -> None:
    good, bad = write_pair(tmp_path, 2)
    data = yaml.safe_load(good.read_text())
    data["answers"] = {"enabled": False, "ready_completion": True}
    good.write_text(yaml.safe_dump(data))
    data = yaml.safe_load(bad.read_text())
    data["answers"] = {"enabled": False, "ready_completion": False}
    bad.write_text(yaml.safe_dump(data))
    assert make_plan(good, bad).n == 2
