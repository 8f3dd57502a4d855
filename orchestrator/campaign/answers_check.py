"""A run's answers judged against the good config's, in the same campaign.

The executor keeps what a ready server answered (orchestrator.execution.answers); whether
that is right is known only next to the reference: the good config's answers, recorded in
this campaign on the same host class and build. Like a probe bar relative to good, good
runs first, and every other run of the campaign is judged against its answers before it
is recorded: a run whose answers break the rule is `fail` with a signature of its own
class, `wrong_output`, whose message says which kind of wrong (garbled, different, a score
that dropped, no answer) and in which mode (one at a time, batched), so two kinds of wrong
answer are two findings, and a crash and a wrong answer are two findings.

Good's own answers are asked twice on its start (a second pass, the cheap way to measure
the host's own disagreement: GPU kernels are not batch invariant); a good that disagrees
with itself under `exact` is said, with the rule that would hold.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator.config.experiment import AnswersCheck, Experiment
from orchestrator.diagnosis.answers import (
    AnswersVerdict,
    Prompt,
    Rule,
    absolute_bar,
    garbled,
    judge,
    judge_alone,
)
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict, relative
from orchestrator.errors import ConfigError
from orchestrator.execution.answers import answer_set
from orchestrator.execution.contract import RunResult

WRONG_OUTPUT = "wrong_output"
#: the most telling kind first: a run whose answers are wrong in several ways is named by it
KIND_ORDER = ("stalled", "no_answer", "garbled", "score", "different")
_WHAT = {
    "no_answer": "prompts got no answer",
    "stalled": "the server stopped answering",
    "garbled": "garbled answers",
    "score": "the score dropped below the bar",
    "different": "answers differ from the reference",
}


def judged(exp: Experiment) -> bool:
    """True when the config's runs are judged by their answers against good's."""
    return exp.answers is not None and exp.answers.enabled


def signature(kind: str, modes: list[str], all_modes: tuple[str, ...]) -> Signature:
    """The `wrong_output` signature of a kind of wrong answer, in the modes it shows."""
    message = _WHAT.get(kind, kind)
    if len(all_modes) > 1 and len(modes) < len(all_modes):
        message += " when batched" if modes == ["batch"] else " one at a time"
    return Signature(Phase.SERVING, WRONG_OUTPUT, message)


def rule_of(check: AnswersCheck, name: str | None = None) -> Rule:
    return Rule(name=name or check.rule, top_k=check.top_k, pass_if=check.pass_if)  # type: ignore[arg-type]


def verdict_dict(v: AnswersVerdict, limit: int = 8) -> dict[str, Any]:
    """The JSON form of one mode's judgement, kept with the run (`show` reads it)."""
    return {
        "passed": v.passed,
        "kind": v.kind,
        "rule": v.rule.name,
        "detail": v.detail,
        "score": v.score,
        "reference_score": v.reference_score,
        "unjudged": list(v.unjudged),
        "broken": list(v.broken),
        "diffs": [
            {
                "prompt_id": d.prompt_id,
                "first_diff": d.first_diff,
                "reference": d.reference,
                "answer": d.answer,
                "garbled": list(d.garbled),
                "within_rule": d.within_rule,
                "error": d.error,
                "same_tokens": d.same_tokens,
            }
            for d in v.diffs[:limit]
        ],
    }


def judge_result(result: RunResult, reference: Any, target: Signature | None) -> RunResult:
    """`result` judged against the reference run's answers (a RunRow of good in this
    campaign). A run that did not pass (a crash, a hang) keeps its verdict: its failure
    came first. The judgement joins the run's answers record (`judged`)."""
    record = result.answers
    check = result.experiment.answers
    if record is None or check is None or not check.enabled or record.get("sets") is None:
        return result
    ref_record = getattr(reference, "answers", None) if reference is not None else None
    if not ref_record or not ref_record.get("sets"):
        alone = judged_alone(result, target)
        if alone is not None:  # an absolute score bar needs no reference
            return alone
        return unjudged(
            result,
            "no good config's answers to compare with (a bisection, or a sweep with a "
            "reference, judges them)",
        )
    prompts = check.load()
    rule = rule_of(check)
    modes: dict[str, Any] = {}
    failing: list[tuple[str, AnswersVerdict]] = []
    for mode in check.modes:
        ref, got = answer_set(ref_record, mode), answer_set(record, mode)
        if ref is None or got is None:
            continue
        v = judge(ref, got, prompts, rule)
        if len(v.unjudged) == len(prompts):
            continue  # the reference answered nothing in this mode: nothing to judge by
        modes[mode] = verdict_dict(v)
        if not v.passed:
            failing.append((mode, v))
    if not modes:
        why = "the reference answered no prompt: nothing to judge by"
        return replace(result, answers={**record, "judged": {"passed": None, "detail": why}})
    out: dict[str, Any] = {
        "reference_run": getattr(reference, "id", None),
        "rule": rule.name,
        "modes": modes,
        "passed": not failing,
    }
    if not failing:
        first = next(iter(modes.values()), None)
        out["detail"] = first["detail"] if first else "nothing to compare"
        out["differs"] = any(m.get("kind") == "different" for m in modes.values())
        stricter = _stricter(rule.name, check, ref_record, record, prompts)
        if stricter is not None:
            out["stricter"] = stricter
        return replace(result, answers={**record, "judged": out})
    kind = min((v.kind for _, v in failing), key=lambda k: KIND_ORDER.index(k))
    shown = [m for m, v in failing if v.kind == kind]
    mode, v = next((m, v) for m, v in failing if v.kind == kind)
    after = stopped_after(record, check.modes) if kind == "no_answer" else None
    if after is not None:  # answered, then nothing more: a stall (or a crash), not a few misses
        sig = Signature(Phase.SERVING, WRONG_OUTPUT, _WHAT["stalled"])
        detail = f"{_WHAT['stalled']} after {after} answers (rule {rule.name}): {v.detail}"
        kind = "stalled"
    else:
        sig = signature(kind, [m for m, _ in failing], check.modes)
        detail = f"{_WHAT[kind]} ({', '.join(shown)}, rule {rule.name}): {v.detail}"
    detail += f" [reference: run {out['reference_run']}]"
    out |= {"kind": kind, "detail": detail, "mode": mode}
    if result.verdict is not Verdict.PASS:
        return replace(result, answers={**record, "judged": out})
    return replace(
        result,
        verdict=relative(Verdict.FAIL, sig, target),
        signature=sig,
        detail=detail,
        answers={**record, "judged": out},
    )


def judged_alone(result: RunResult, target: Signature | None) -> RunResult | None:
    """`result` held alone to its absolute score bar (`pass_if: ">= 0.75"`), in each mode
    it was asked in (None: the rule needs a reference, or nothing was answered to judge).
    A run that passed and misses the bar is `fail` with a `wrong_output` score signature;
    its judgement (`reference_run` None) joins its answers record."""
    record = result.answers
    check = result.experiment.answers
    if record is None or check is None or not check.enabled or not record.get("sets"):
        return None
    rule = rule_of(check)
    if not absolute_bar(rule):
        return None
    prompts = check.load()
    modes: dict[str, Any] = {}
    failing: list[str] = []
    for mode in check.modes:
        got = answer_set(record, mode)
        v = judge_alone(got, prompts, rule) if got is not None else None
        if v is None:
            continue
        modes[mode] = verdict_dict(v)
        if not v.passed:
            failing.append(mode)
    if not modes:
        return None
    out: dict[str, Any] = {"reference_run": None, "rule": rule.name, "modes": modes}
    out["passed"] = not failing
    if not failing:
        out["detail"] = next(iter(modes.values()))["detail"]
        return replace(result, answers={**record, "judged": out})
    mode = failing[0]
    detail = f"{_WHAT['score']} ({', '.join(failing)}, rule score): {modes[mode]['detail']}"
    out |= {"kind": "score", "detail": detail, "mode": mode}
    if result.verdict is not Verdict.PASS:
        return replace(result, answers={**record, "judged": out})
    sig = signature("score", failing, check.modes)
    return replace(
        result,
        verdict=relative(Verdict.FAIL, sig, target),
        signature=sig,
        detail=detail,
        answers={**record, "judged": out},
    )


def wrong_prompts(record: dict[str, Any] | None) -> tuple[str, ...]:
    """The prompts a run's answers were judged wrong on, in the mode that named its
    verdict (empty: judged right, not judged, or recorded before they were kept)."""
    judged = (record or {}).get("judged") or {}
    if judged.get("passed") is not False:
        return ()
    v = (judged.get("modes") or {}).get(judged.get("mode")) or {}
    return tuple(str(i) for i in v.get("broken") or ())


def own_bar_message(row: Any, where: str) -> str | None:
    """What a bisection says of a good config whose own answers miss an absolute score bar
    (None: its run failed otherwise): no run can be judged against such a reference."""
    judged = (getattr(row, "answers", None) or {}).get("judged") or {}
    if judged.get("passed") is not False or judged.get("reference_run") is not None:
        return None
    mode = judged.get("mode")
    v = (judged.get("modes") or {}).get(mode) or {}
    if v.get("score") is None:
        return None
    broken = [repr(str(b)) for b in v.get("broken") or ()]
    wrong = f"; wrong: {', '.join(broken[:3])}{', ...' if len(broken) > 3 else ''}"
    return (
        f"the good config's own score {v['score']:.2f} misses the bar "
        f"{row.experiment().answers.pass_if!r} on {where} ({mode}{wrong if broken else ''})"
        f" [run {row.id}]: its answers cannot judge any other run (lower the bar, or make "
        "it relative: '>= good - 0.08'); nothing to bisect"
    )


def stopped_after(record: dict[str, Any], modes: tuple[str, ...]) -> int | None:
    """How many answers the server gave before it stopped answering for good (every
    request after the first unanswered one unanswered too, in the order they were asked:
    each mode, then good's second pass); None when it never answered, answered to the
    end, or missed prompts here and there."""
    asked = [a for m in modes for a in (record.get("sets") or {}).get(m) or []]
    asked += record.get("repeat") or []
    first = next((i for i, a in enumerate(asked) if a.get("error")), None)
    if not first or not all(a.get("error") for a in asked[first:]):
        return None
    return first


def stopped_answering(
    result: RunResult, measured: dict[str, Any] | None, target: Signature | None
) -> RunResult:
    """Good's run when its server stopped answering on the second pass of its start (a
    crash the executor did not see end, a stall): `fail`, never noise to loosen a rule for."""
    if result.verdict is not Verdict.PASS or not measured or not measured.get("no_answer"):
        return result
    check = result.experiment.answers
    after = stopped_after(result.answers or {}, check.modes) if check is not None else None
    what = _WHAT["stalled"] if after is not None else _WHAT["no_answer"]
    sig = Signature(Phase.SERVING, WRONG_OUTPUT, what)
    detail = (
        f"{what}{f' after {after} answers' if after is not None else ''} when asked again "
        f"on its start: {measured['no_answer']} of {measured.get('asked', '?')} prompts got "
        f"no answer ({measured['detail']})"
    )
    verdict = relative(Verdict.FAIL, sig, target)
    return replace(result, verdict=verdict, signature=sig, detail=detail)


#: the rule one step stricter than each: what a passing run would say under it
STRICTER = {"score": "logprobs-close", "logprobs-close": "exact"}


def _stricter(
    rule: str,
    check: AnswersCheck,
    ref_record: dict[str, Any],
    record: dict[str, Any],
    prompts: tuple[Prompt, ...],
) -> dict[str, Any] | None:
    """A passing run's answers judged once more under the next stricter rule (None under
    `exact`): the answer says what the rule let through."""
    name = STRICTER.get(rule)
    if name is None:
        return None
    for mode in check.modes:
        ref, got = answer_set(ref_record, mode), answer_set(record, mode)
        if ref is None or got is None:
            continue
        v = judge(ref, got, prompts, rule_of(check, name))
        if not v.passed:
            return {"rule": name, "passed": False, "mode": mode, "detail": v.detail}
    return {"rule": name, "passed": True}


def same_answers(a: Any, b: Any) -> bool:
    """True when two runs (results or stored runs) gave the very same answers, token for
    token, in every mode: a deterministic server that answers so again would again."""
    sa = (getattr(a, "answers", None) or {}).get("sets")
    sb = (getattr(b, "answers", None) or {}).get("sets")
    if not sa or not sb or sa.keys() != sb.keys():
        return False

    def key(answers: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [
            (x.get("prompt_id"), x.get("text"), tuple(x.get("tokens") or ()), x.get("error"))
            for x in answers
        ]

    return all(key(sa[m]) == key(sb[m]) for m in sa)


def rule_line(check: AnswersCheck, good: Any, bad: Any) -> str:
    """What an answer says of its answers check: the rule, good's run it judged by, and
    what bad's answers were under it and under the next stricter rule."""
    rule = check.rule + (f" ({check.pass_if})" if check.rule == "score" else "")
    text = f"answers judged under {rule}"
    if good is None:
        return text + ": no good run passed, nothing was judged by it"
    text += f" against good's run {good.id}"
    judged_bad = ((getattr(bad, "answers", None) or {}).get("judged") or {}) if bad else {}
    if judged_bad.get("passed") is True:
        text += f"; bad's passed [run {bad.id}]: {judged_bad.get('detail')}"
        stricter = judged_bad.get("stricter")
        if stricter and not stricter.get("passed"):
            text += (
                f"; under {stricter['rule']} they would fail: {stricter['detail']} "
                f"(answers.rule: {stricter['rule']} bisects that difference)"
            )
        elif stricter:
            text += f"; under {stricter['rule']} too"
    elif judged_bad.get("passed") is False:
        text += f"; bad's failed [run {bad.id}]"
    return text


def check_same(good: Experiment, bad: Experiment) -> None:
    """Refuse a pair whose `answers:` sections differ: every run of a bisection is judged
    by one check against good's answers, and a variant between the two takes good's,
    so bad judged by a rule of its own (or left unjudged) would be another question."""
    a, b = good.answers, bad.answers
    if a == b or not (judged(good) or judged(bad)):
        return  # (readiness alone, like a health check, may differ)
    if judged(good) != judged(bad):
        on, off = (bad, good) if judged(bad) else (good, bad)
        why = "has no answers: section" if off.answers is None else "sets answers.enabled: false"
        raise ConfigError(
            f"{on.source} judges the answers, {off.source} {why}: every run of a "
            "bisection is judged by one answers check",
            key="answers",
            hint="give both configs the same answers: section (the bad config can extend good's)",
        )
    ad, bd = (a.to_dict() if a else {}), (b.to_dict() if b else {})
    keys = sorted(k for k in ad.keys() | bd.keys() if ad.get(k) != bd.get(k))
    if not keys:
        return
    shown = ", ".join(f"{k} {ad.get(k)!r} in good, {bd.get(k)!r} in bad" for k in keys)
    raise ConfigError(
        f"the answers: sections of {good.source} and {bad.source} differ ({shown}): every "
        "run of a bisection is judged by one answers check",
        key="answers",
        hint="give both configs the same answers: section (the bad config can extend good's)",
    )


def judged_against(exp: Experiment, reference: Any, run_id: str) -> str:
    """What a rerun of `run_id` is judged against by its answers, in words ('' without
    an answers check)."""
    if not judged(exp) or exp.answers is None:
        return ""
    if reference is None:
        return "answers not judged: no reference answers are recorded for this run"
    rule = exp.answers.rule
    if getattr(reference, "id", None) == run_id:
        return f"answers judged under {rule} against the recorded run's own answers"
    return f"answers judged under {rule} against the reference's run {reference.id}"


def unjudged(result: RunResult, why: str) -> RunResult:
    """A run whose answers have nothing to be judged against (a run alone: `run`, or a
    rerun of a run that was never judged): it is not called right, and it says so, with
    the answers that read as no text at all (which no reference could make right)."""
    record = result.answers or {}
    bad = sorted(
        {
            str(a.get("prompt_id"))
            for answers in (record.get("sets") or {}).values()
            for a in answers
            if not a.get("error") and garbled(str(a.get("text", "")))
        }
    )
    if bad:
        why += f"; {len(bad)} answer(s) garbled ({', '.join(repr(b) for b in bad[:3])})"
    out = replace(result, answers={**record, "judged": {"passed": None, "detail": why}})
    if result.verdict is Verdict.PASS and not result.detail:
        out = replace(out, detail=f"answers not judged: {why}")
    return out


def noise(
    result: RunResult | Any, prompts: tuple[Prompt, ...] | None = None
) -> dict[str, Any] | None:
    """Good compared with itself (its first mode's answers and the second pass on the same
    start): None when there is no second pass. Under `exact` a disagreement names the rule
    that would hold (`logprobs-close`, else `score`)."""
    record = getattr(result, "answers", None)
    exp = result.experiment if isinstance(result, RunResult) else result.experiment()
    check = exp.answers
    if not record or check is None or not record.get("repeat") or not record.get("sets"):
        return None
    first = answer_set(record, check.modes[0])
    again = answer_set(record, "repeat")
    if first is None or again is None:
        return None
    prompts = prompts if prompts is not None else check.load()
    # prompts the first pass answered and the second did not (a prompt the server never
    # answers, a chat-only server's completion prompt, is said as such elsewhere)
    answered = {a.prompt_id for a in first.answers if not a.error}
    lost = [a for a in again.answers if a.error and a.prompt_id in answered]
    if lost:
        # a server that stops answering (a crash, a stall) is no noise of the host: no
        # rule, however loose, would make its answers agree
        return {
            "passed": False,
            "rule": check.rule,
            "no_answer": len(lost),
            "asked": len(again.answers),
            "detail": f"{lost[0].prompt_id!r}: {lost[0].error}",
            "differing": len(lost),
        }
    v = judge(first, again, prompts, rule_of(check))
    out: dict[str, Any] = {
        "passed": v.passed,
        "rule": check.rule,
        "detail": v.detail,
        "differing": len(v.diffs),  # a token, an error, or the text alone
    }
    if not v.passed and check.rule == "exact":
        close = judge(first, again, prompts, rule_of(check, "logprobs-close"))
        out["would_hold"] = "logprobs-close" if close.passed else "score"
    return out


def unanswered_message(result: RunResult, who: str = "the good config") -> str | None:
    """What the campaign says of a reference run (`who`: good's, a sweep's reference) that
    got no answer to some prompts (None: it answered every one): those prompts judge
    nothing, in any run."""
    record = result.answers or {}
    if record.get("error"):
        return f"{who}'s answers check failed [run {result.run_id}]: {record['error']}"
    missing, total = _unanswered(record)
    if not missing:
        return None
    first, error = next(iter(missing.items()))
    if len(missing) >= total:
        return (
            f"{who} got no answer to any prompt [run {result.run_id}] ({first!r}: "
            f"{error}): no run of this campaign is judged by its answers"
        )
    return (
        f"{who} got no answer to {len(missing)} of {total} prompts "
        f"[run {result.run_id}] ({first!r}: {error}): those prompts judge no run (a server "
        "with one endpoint: answers.endpoint sends every prompt to it)"
    )


def _unanswered(record: dict[str, Any]) -> tuple[dict[str, str], int]:
    """The prompts of an answers record that got no answer in some mode (prompt id ->
    its error), and how many prompts were asked."""
    missing: dict[str, str] = {}
    for answers in (record.get("sets") or {}).values():
        for a in answers:
            if a.get("error"):
                missing.setdefault(str(a.get("prompt_id")), str(a["error"]))
    return missing, len(record.get("prompts") or {}) or len(missing)


def answered_nothing(reference: Any) -> bool:
    """True when a reference run (a result or a stored run) has no answer to judge any
    run's by: its check failed, or no prompt got an answer."""
    record = getattr(reference, "answers", None)
    if not record:
        return False
    if record.get("error"):
        return True
    missing, total = _unanswered(record)
    return bool(missing) and len(missing) >= total


def with_noise(result: RunResult) -> tuple[RunResult, dict[str, Any] | None]:
    """Good's result with its self-comparison kept in its answers record."""
    measured = noise(result)
    if measured is None or result.answers is None:
        return result, measured
    return replace(result, answers={**result.answers, "noise": measured}), measured


def noise_message(measured: dict[str, Any], run_id: str) -> str | None:
    """What the campaign says of a good that disagrees with itself (None: it agrees)."""
    if measured.get("passed"):
        return None
    if measured.get("no_answer"):
        return (
            f"the good config got no answer to {measured['no_answer']} of "
            f"{measured.get('asked', '?')} prompts when asked again on its start "
            f"[run {run_id}] ({measured['detail']}): a server that stops answering fails, "
            "whatever the rule"
        )
    text = (
        f"the good config disagrees with itself under {measured['rule']} "
        f"[run {run_id}]: {measured['detail']}"
    )
    if measured.get("would_hold"):
        text += (
            f"; answers of this host differ from start to start: use "
            f"answers.rule: {measured['would_hold']}"
        )
    return text


__all__ = [
    "WRONG_OUTPUT",
    "answered_nothing",
    "check_same",
    "judge_result",
    "judged",
    "judged_against",
    "judged_alone",
    "noise",
    "noise_message",
    "own_bar_message",
    "rule_line",
    "same_answers",
    "signature",
    "stopped_after",
    "stopped_answering",
    "unanswered_message",
    "unjudged",
    "with_noise",
    "wrong_prompts",
]
