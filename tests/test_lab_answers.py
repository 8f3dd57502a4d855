"""The simulated server's answers, in process: the book against the shipped prompt set, the
wrong answers against the judge, the `answers:` rules' checks and the shipped pairs."""

from __future__ import annotations

import json
import random
from itertools import combinations
from pathlib import Path

import pytest

from orchestrator.config.prompts import load_prompts
from orchestrator.diagnosis.answers import (
    Answer,
    AnswerSet,
    Rule,
    garbled,
    judge,
    score,
)
from orchestrator.lab import answering, cmdline
from orchestrator.lab import scenario as sc
from orchestrator.lab.scenario_model import draw

PROMPTS = load_prompts()
BOOK = answering.read_book([answering.DEFAULT_SET])
MODEL = "/models/m"


def _key(p) -> str:  # noqa: ANN001
    return answering.prompt_key(p.prompt, p.messages)


def _answers(effect=None, max_tokens: int = 24, only=None) -> AnswerSet:  # noqa: ANN001
    out = []
    for p in PROMPTS:
        e = effect if only is None or p.id in only else None
        g = answering.generate(
            _key(p), BOOK.get(_key(p)), MODEL, max_tokens=max_tokens, top_k=5, effect=e
        )
        out.append(Answer(p.id, "".join(g.tokens), tuple(g.tokens), tuple(map(tuple, g.top))))
    return AnswerSet(tuple(out))


def test_the_book_answers_every_shipped_prompt_right_and_its_wrong_answers_miss() -> None:
    assert {k.id for k in BOOK.values()} == {p.id for p in PROMPTS}
    assert score(_answers(), PROMPTS) == 1.0
    assert score(_answers(answering.Effect("wrong", 0)), PROMPTS) == 0.0
    for p in PROMPTS:
        assert p.met_by(BOOK[_key(p)].right) and not p.met_by(BOOK[_key(p)].wrong or "")


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 24, 300])
def test_garbled_answers_are_garbled_and_right_ones_read_as_text(max_tokens: int) -> None:
    for a in _answers(answering.Effect("garbled", 0), max_tokens).answers:
        assert garbled(a.text), a.text
    for a in _answers(None, max_tokens).answers:
        assert not garbled(a.text), a.text
    generic = answering.generate("text:tell me more", None, MODEL, max_tokens=max_tokens)
    assert not garbled("".join(generic.tokens))


def test_a_fraction_takes_exactly_that_share_of_a_known_set_whatever_the_start() -> None:
    for fraction, wrong in ((0.5, 5), (0.99, 9), (0.1, 1), (0.3, 3)):
        took = [
            p.id
            for p in PROMPTS
            if answering.selected(fraction, (0, "wrong"), _key(p), BOOK[_key(p)])
        ]
        assert len(took) == wrong
    other = [answering.selected(0.5, (0, "wrong"), f"text:q{i}", None) for i in range(400)]
    assert 150 < sum(other) < 250


def test_drift_changes_one_long_answer_late_within_logprobs_close() -> None:
    ref = _answers()
    takes = [
        p.id
        for p in PROMPTS
        if answering.selected(0.2, (0, "drift"), _key(p), BOOK[_key(p)], longer_than=16)
    ]
    assert len(takes) == 1
    got = []
    for p in PROMPTS:
        effect = answering.Effect("drift", 0, 16, flip=p.id in takes)
        g = answering.generate(_key(p), BOOK[_key(p)], MODEL, max_tokens=24, top_k=5, effect=effect)
        got.append(Answer(p.id, "".join(g.tokens), tuple(g.tokens), tuple(map(tuple, g.top))))
    drifted = AnswerSet(tuple(got))
    exact = judge(ref, drifted, PROMPTS, Rule("exact"))
    assert not exact.passed and [(d.prompt_id, d.first_diff) for d in exact.diffs] == [
        (takes[0], 16)
    ]
    assert judge(ref, drifted, PROMPTS, Rule("logprobs-close", top_k=2)).passed
    assert not judge(ref, drifted, PROMPTS, Rule("logprobs-close", top_k=1)).passed
    assert all(
        r.top != d.top for r, d in zip(ref.answers, drifted.answers, strict=True) if r.tokens
    )


def test_answers_depend_on_the_model_and_prompt_only() -> None:
    a = answering.generate("text:hello", None, MODEL, max_tokens=30, top_k=3)
    b = answering.generate("text:hello", None, MODEL, max_tokens=30, top_k=3, seed=9)
    c = answering.generate("text:hello", None, "/models/other", max_tokens=30)
    assert (a.tokens, a.top) == (b.tokens, b.top) and a.tokens != c.tokens
    assert "".join(a.tokens) == "".join(answering.tokenize("".join(a.tokens)))


# ---------------------------------------------------------------------------- scenario


def _load(tmp_path: Path, text: str) -> sc.Scenario:
    path = tmp_path / "scenario.yaml"
    path.write_text(text, encoding="utf-8")
    return sc.load(path)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("answers:\n  - when: {a: 1}\n    effect: garbeld\n", "answers[0].effect: expected one of"),
        ("answers:\n  - effect: wrong\n", "answers[0].when: missing"),
        ("answers:\n  - when: {}\n    effect: wrong\n    fraction: 0\n", "answers[0].fraction"),
        ("answers:\n  - when: {}\n    effect: wrong\n    concurrency: 1\n", "from 2 to"),
        (
            "answers:\n  - when: {}\n    effect: wrong\n    from_token: 3\n",
            "answers[0].from_token: only a 'drift' rule",
        ),
        (
            "answers:\n  - when: {}\n    effect: wrong\n    fracton: 0.5\n",
            "answers[0].fracton: unknown key (did you mean 'fraction'?)",
        ),
        (
            "answers:\n  - when: {}\n    effect: wrong\n    probability: 2\n",
            "answers[0].probability: expected a number in (0, 1]",
        ),
        ("answers: {when: {}}\n", "answers: expected a list of rules"),
        ("prompt_sets: [missing.jsonl]\n", "prompt_sets[0]: no such file"),
    ],
)
def test_bad_answer_rules_name_file_key_and_expectation(
    tmp_path: Path, text: str, fragment: str
) -> None:
    with pytest.raises(sc.ScenarioError) as info:
        _load(tmp_path, text)
    assert fragment in str(info.value) and str(tmp_path) in str(info.value)


def test_answer_rules_in_force_and_their_flaky_draw(tmp_path: Path) -> None:
    scen = _load(
        tmp_path,
        "answers:\n"
        "  - {when: {ep-size: 8, enable-dp-attention: true}, effect: garbled}\n"
        "  - {when: {x: true}, effect: wrong, probability: 0.5, min_prompt_chars: 10}\n",
    )
    assert scen.answer_rules({"ep-size": 8}, {}, 0) == ()
    (rule,) = scen.answer_rules({"ep-size": 8, "enable-dp-attention": True}, {}, 0)
    assert rule.effect == "garbled" and rule.fraction == 1.0
    fired = [bool(scen.answer_rules({"x": True}, {}, seed)) for seed in range(200)]
    assert 70 < sum(fired) < 130
    assert fired == [bool(scen.answer_rules({"x": True}, {}, seed)) for seed in range(200)]
    flaky = scen.answers[1]
    assert flaky.takes(1, 5, 10) and not flaky.takes(1, 5, 9)
    # a fault rule's draw keeps the key it always had (recorded flaky histories replay)
    key = json.dumps({"seed": 4, "rule": 1, "flags": {"x": True}, "env": {}}, sort_keys=True)
    assert draw(4, flaky, {"x": True}, {}) == random.Random(key).random()


def test_another_prompt_set_is_answered_by_its_expectations(tmp_path: Path) -> None:
    (tmp_path / "mine.jsonl").write_text(
        '{"id": "q", "prompt": "Largest ocean?", "expect": "Pacific"}\n'
        '{"id": "r", "prompt": "Smallest ocean?", "regex": "Arctic"}\n',
        encoding="utf-8",
    )
    scen = _load(tmp_path, "prompt_sets: [mine.jsonl]\n")
    book = answering.read_book([answering.DEFAULT_SET, *scen.prompt_sets])
    right = answering.generate(
        "text:Largest ocean?", book["text:Largest ocean?"], MODEL, max_tokens=9
    )
    assert "".join(right.tokens).startswith("The answer is Pacific.")
    wrong = answering.generate(
        "text:Largest ocean?",
        book["text:Largest ocean?"],
        MODEL,
        max_tokens=40,
        effect=answering.Effect("wrong", 0),
    )
    assert "pacific" not in "".join(wrong.tokens).lower()
    assert "text:Smallest ocean?" not in book  # a regex the lab cannot answer to


# ---------------------------------------------------------------------------- shipped pairs

EXPERIMENTS = sc.repo_root() / "experiments" / "lab"


def _subsets(pair: str, certain: bool = False):  # noqa: ANN202
    """(deltas, outcome of each subset applied to good): (fault index, answer rule indexes)."""
    from orchestrator.config.loading import load_experiment

    good = load_experiment(EXPERIMENTS / pair / "good.yaml")
    bad = load_experiment(EXPERIMENTS / pair / "bad.yaml")
    scen = sc.load(EXPERIMENTS / pair / "scenario.yaml")
    gf, bf = good.flag_map(), bad.flag_map()
    deltas = sorted(k for k in gf.keys() | bf.keys() if gf.get(k) != bf.get(k))

    def outcome(subset: tuple[str, ...]) -> tuple[object, tuple[int, ...]]:
        flags = dict(gf)
        for d in subset:
            if d in bf:
                flags[d] = bf[d]
            else:
                flags.pop(d, None)
        argv = []
        for name, value in flags.items():
            argv.append(f"--{name}")
            if value is not True:
                argv.append(str(value))
        parsed = cmdline.parse_strict(argv, scen.known_flags)
        fault = scen.select_fault(parsed, {}, 0)
        rules = scen.answer_rules(parsed, {}, 0)
        if certain:
            rules = tuple(r for r in scen.answers if r.when.holds(parsed, {}, scen.defaults))
        return (fault.index if fault else None), tuple(r.index for r in rules)

    return deltas, {s: outcome(s) for n in range(len(deltas) + 1) for s in combinations(deltas, n)}


def _minimal(outcomes: dict, hit) -> list[set[str]]:  # noqa: ANN001
    hits = [set(s) for s, o in outcomes.items() if hit(o)]
    return [s for s in hits if not any(o < s for o in hits)]


@pytest.mark.slow  # 256 subsets, each parsed by the server's parser
def test_k26_pair_answers_wrong_only_with_dp_attention_and_ep8_together() -> None:
    deltas, outcomes = _subsets("k26-dp-ep")
    assert len(deltas) == 8
    assert all(fault is None for fault, _ in outcomes.values())  # it never crashes
    assert _minimal(outcomes, lambda o: o[1]) == [{"enable-dp-attention", "ep-size"}]
    rule = sc.load("k26-dp-ep").answers[0]
    assert rule.effect == "garbled" and rule.fraction >= 0.99


def test_crash_wrong_pair_has_a_crash_and_a_wrong_answer_from_two_flags() -> None:
    _, outcomes = _subsets("crash-wrong")
    assert _minimal(outcomes, lambda o: o[0] is not None) == [{"moe-runner-backend"}]
    answers_only = _minimal(outcomes, lambda o: o[0] is None and o[1])
    assert answers_only == [{"kv-cache-dtype"}]


def test_flaky_answers_pair_drops_accuracy_on_about_half_the_starts() -> None:
    _, outcomes = _subsets("flaky-answers", certain=True)
    assert _minimal(outcomes, lambda o: o[1]) == [{"speculative-algorithm"}]
    scen = sc.load("flaky-answers")
    (rule,) = scen.answers
    assert scen.seed is None and rule.probability == 0.5 and rule.effect == "wrong"
    flags = {"speculative-algorithm": "NEXTN", "tp-size": 8}
    fired = sum(bool(scen.answer_rules(flags, {}, seed)) for seed in range(400))
    assert 160 < fired < 240


def test_drift_pair_changes_numbers_with_the_dtype_only() -> None:
    _, outcomes = _subsets("drift")
    assert _minimal(outcomes, lambda o: o[1]) == [{"dtype"}]


def test_each_request_keeps_its_own_peak_of_requests_in_flight() -> None:
    """Two requests' peaks may be equal: leaving must drop the leaver's, not an equal one."""
    import io

    from orchestrator.lab.server import Engine, Log

    eng = Engine(1000.0, None, Log(io.StringIO()))
    first, second = eng.enter(), eng.enter()
    eng.leave(second)
    third, fourth = eng.enter(), eng.enter()
    assert first == [3] and third == [3] and fourth == [3]
    eng.leave(first)
    eng.leave(third)
    eng.leave(fourth)
    assert eng.in_flight == 0 and eng.live == []
