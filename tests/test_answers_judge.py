"""The answers judge (orchestrator/diagnosis/answers.py): the rules on hand-made answers and,
by property, their symmetry and edge cases; garbled text told from different text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.diagnosis.answers import (
    Answer,
    AnswerSet,
    Prompt,
    Rule,
    answers_from,
    as_plain,
    bar_problem,
    exact,
    first_difference,
    garbled,
    judge,
    judge_alone,
    logprobs_close,
    meets_bar,
    parse_bar,
    score,
)


def ans(
    pid: str, toks: list[int], tops: list[list[int]] | None = None, text: str | None = None
) -> Answer:
    """An answer whose tokens are ids; `tops` the ids in each position's top-k (best first)."""
    tops = tops if tops is not None else [[t] for t in toks]
    return Answer(
        prompt_id=pid,
        text=text if text is not None else " ".join(f"word{t}" for t in toks),
        tokens=tuple(f"token_id:{t}" for t in toks),
        top=tuple(tuple((f"token_id:{t}", -float(i)) for i, t in enumerate(pos)) for pos in tops),
        finish_reason="stop",
    )


def test_exact_is_equal_greedy_tokens() -> None:
    a = ans("p", [1, 2, 3])
    assert exact(a, ans("p", [1, 2, 3]))
    assert not exact(a, ans("p", [1, 2, 4]))
    assert first_difference(a, ans("p", [1, 5, 3])) == 1
    assert first_difference(a, ans("p", [1, 2])) == 2  # one ends where the other goes on
    assert a.token_ids == (1, 2, 3)


def test_logprobs_close_checks_the_first_difference_only() -> None:
    ref = ans("p", [1, 2, 3, 4], [[1], [2, 7], [3], [4]])
    # differs at 1: 7 is in ref's top-2 there, 2 in this one's: close, whatever follows
    got = ans("p", [1, 7, 9, 9], [[1], [7, 2], [9], [9]])
    assert logprobs_close(ref, got, top_k=2) and logprobs_close(got, ref, top_k=2)
    assert not logprobs_close(ref, got, top_k=1)
    # each side must hold the other's token: one-sided is not enough
    one_sided = ans("p", [1, 7, 9, 9], [[1], [7, 8], [9], [9]])
    assert not logprobs_close(ref, one_sided, top_k=2)
    # an answer that stops where the other goes on is never excused by a top-k
    assert not logprobs_close(ref, ans("p", [1, 2]), top_k=5)
    assert not logprobs_close(ref, ans("p", []), top_k=5)


def test_a_failed_request_passes_no_rule() -> None:
    err = Answer("p", error="HTTP 500: boom")
    assert not exact(err, err) and not logprobs_close(err, err)


# -- properties ----------------------------------------------------------------------------

tok = st.integers(min_value=0, max_value=6)


@st.composite
def answer_pairs(draw: st.DrawFn) -> tuple[Answer, Answer]:
    def one() -> Answer:
        toks = draw(st.lists(tok, max_size=6))
        tops = [draw(st.lists(tok, min_size=1, max_size=4, unique=True)) for _ in toks]
        return ans("p", toks, tops)

    return one(), one()


@settings(deadline=None)  # the machine's load is not the judge's fault
@given(answer_pairs(), st.integers(min_value=1, max_value=5))
def test_rules_are_symmetric(pair: tuple[Answer, Answer], k: int) -> None:
    a, b = pair
    assert exact(a, b) == exact(b, a)
    assert logprobs_close(a, b, k) == logprobs_close(b, a, k)
    assert first_difference(a, b) == first_difference(b, a)


@settings(deadline=None)
@given(answer_pairs(), st.integers(min_value=1, max_value=4))
def test_rules_are_ordered_exact_then_close_then_a_larger_k(
    pair: tuple[Answer, Answer], k: int
) -> None:
    a, b = pair
    assert exact(a, a) and logprobs_close(a, a, 1)  # an answer always matches itself
    if exact(a, b):
        assert logprobs_close(a, b, 1)
    if logprobs_close(a, b, k):
        assert logprobs_close(a, b, k + 1)


@settings(deadline=None)
@given(answer_pairs())
def test_a_difference_past_the_first_is_never_looked_at(pair: tuple[Answer, Answer]) -> None:
    a, b = pair
    i = first_difference(a, b)
    if i is None or i >= min(len(a.tokens), len(b.tokens)):
        return
    tail = ans("p", [9] * 3)  # anything after the first difference
    a2 = Answer("p", a.text, a.tokens[: i + 1] + tail.tokens, a.top[: i + 1] + tail.top)
    assert logprobs_close(a, b, 4) == logprobs_close(a2, b, 4)


@settings(deadline=None)
@given(st.text(max_size=80))
def test_judging_answers_against_themselves_passes_every_rule(text: str) -> None:
    p = Prompt("p", prompt="q", expect="x")
    s = AnswerSet((Answer("p", text=text),))
    for rule in ("exact", "logprobs-close", "score"):
        v = judge(s, s, [p], Rule(rule))  # type: ignore[arg-type]
        assert v.passed and v.kind == "same" and not v.diffs


@settings(deadline=None)
@given(
    st.lists(st.booleans(), min_size=1, max_size=8), st.lists(st.booleans(), min_size=1, max_size=8)
)
def test_score_is_the_fraction_met(ref_right: list[bool], got_right: list[bool]) -> None:
    n = min(len(ref_right), len(got_right))
    prompts = [Prompt(f"p{i}", prompt="q", expect="yes") for i in range(n)]
    ref = AnswerSet(
        tuple(Answer(f"p{i}", text="yes" if r else "no") for i, r in enumerate(ref_right[:n]))
    )
    got = AnswerSet(
        tuple(Answer(f"p{i}", text="yes" if r else "no") for i, r in enumerate(got_right[:n]))
    )
    assert score(got, prompts) == sum(got_right[:n]) / n
    v = judge(ref, got, prompts, Rule("score", pass_if=">= good - 0.08"))
    assert v.passed == (sum(got_right[:n]) / n >= sum(ref_right[:n]) / n - 0.08 - 1e-9)
    if not v.passed:
        assert v.kind == "score" and "misses" in v.detail


# -- the bar, the expectations -------------------------------------------------------------


def test_score_bars() -> None:
    assert parse_bar(">= good - 0.08") == (">=", True, -0.08)
    assert parse_bar(">=0.75") == (">=", False, 0.75)
    assert parse_bar("> good") == (">", True, 0.0)
    assert meets_bar(0.72, ">= good - 0.08", 0.8)
    assert not meets_bar(0.71, ">= good - 0.08", 0.8)
    for bad in ("good - 0.08", ">= bad", ">= good * 2", ""):
        with pytest.raises(ValueError, match="expected '>= good - NUMBER' or '>= NUMBER'"):
            parse_bar(bad)
    with pytest.raises(ValueError):
        Rule("score", pass_if="at least 0.5")
    with pytest.raises(ValueError, match="expected one of exact"):
        Rule("close")  # type: ignore[arg-type]


def test_expect_is_a_whole_word_match_and_regex_a_search() -> None:
    p = Prompt("p", prompt="q", expect="Paris")
    assert p.met_by("The capital of France is paris.")
    assert not p.met_by("Parisian cafes")
    assert Prompt("p", prompt="q", expect="New  York").met_by("It is new york city")
    assert Prompt("p", prompt="q", regex=r"(?<!\d)5(?!\d)").met_by("2 + 3 = 5")
    assert not Prompt("p", prompt="q").met_by("anything")
    with pytest.raises(ValueError, match="exactly one of prompt, messages"):
        Prompt("p")


# -- garbled -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, reason",
    [
        ("", "empty"),
        ("  \n ", "empty"),
        ("- - - -\n\n- - -\n--\n- - - - - -\n\n- - - -\n- -", "non-words"),
        ("the the the the the the the the", "repetitive"),
        ("Paris Paris Paris Paris Paris Paris Paris Paris Paris Paris Paris", "repetitive"),
        ("\ufffd\ufffd abc \ufffd", "invalid"),
        ("xkcdq zrtpl mnbvc qwrtz plkjh", "non-words"),
        ("1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1", "repetitive"),
    ],
)
def test_garbled_text_says_why(text: str, reason: str) -> None:
    assert reason in garbled(text)


@pytest.mark.parametrize(
    "text",
    [
        "The capital of France is Paris.",
        "2 + 3 = 5",
        "A week is approximately 7 days.",
        "The three colors are: blue, red, and green.",
        "Die Hauptstadt von Frankreich ist Paris.",
        "東京は日本の首都です。",
        "yes",
        'The password for the north gate is "PELICAN".',
    ],
)
def test_text_is_not_garbled(text: str) -> None:
    assert garbled(text) == ()


def test_garbled_different_and_score_are_three_kinds() -> None:
    prompts = [Prompt("a", prompt="q", expect="Paris"), Prompt("b", prompt="q", expect="Rome")]
    ref = AnswerSet((ans("a", [1, 2], text="Paris it is"), ans("b", [3, 4], text="Rome it is")))
    different = AnswerSet(
        (ans("a", [1, 2], text="Paris it is"), ans("b", [3, 5], text="Rome, surely"))
    )
    wrong = AnswerSet(
        (ans("a", [1, 2], text="Paris it is"), ans("b", [3, 5], text="Milan, surely"))
    )
    junk = AnswerSet(
        (ans("a", [6, 6], text="- - - - - - - -"), ans("b", [3, 4], text="Rome it is"))
    )
    v = judge(ref, different, prompts, Rule("exact"))
    assert (v.passed, v.kind, v.diffs[0].first_diff) == (False, "different", 1)
    assert "'b' from token 1" in v.detail
    assert judge(ref, different, prompts, Rule("score")).passed
    v = judge(ref, wrong, prompts, Rule("score"))
    assert (v.passed, v.kind, v.score, v.reference_score) == (False, "score", 0.5, 1.0)
    for rule in ("exact", "logprobs-close", "score"):
        v = judge(ref, junk, prompts, Rule(rule))  # type: ignore[arg-type]
        assert (v.passed, v.kind) == (False, "garbled"), rule
        assert "non-words" in v.diffs[0].garbled and "1 of 2 answers garbled" in v.detail
    # garbled only counts where the reference's own answer reads as text
    assert judge(junk, junk, prompts, Rule("exact")).kind == "same"


def test_a_missing_answer_is_no_answer() -> None:
    prompts = [Prompt("a", prompt="q")]
    ref = AnswerSet((ans("a", [1]),))
    v = judge(ref, AnswerSet((Answer("a", error="HTTP 500: engine dead"),)), prompts, Rule("score"))
    assert (v.passed, v.kind) == (False, "no_answer") and "engine dead" in v.detail
    assert judge(ref, AnswerSet(()), prompts, Rule("exact")).kind == "no_answer"


def test_plain_form_round_trips() -> None:
    a = ans("p", [1, 2], [[1, 3], [2]], text="hi")
    assert answers_from(as_plain(a)) == a


def test_a_prompt_the_reference_got_no_answer_to_is_not_judged() -> None:
    # a chat-only server: the completion prompt gets a 404 on good and on every variant;
    # that says nothing about any variant's answers
    prompts = [Prompt("a", prompt="q", expect="word1"), Prompt("b", prompt="q", expect="word2")]
    err = Answer("a", error='HTTP 404: {"detail": "Not Found"}')
    ref = AnswerSet((err, ans("b", [2])))
    for rule in (Rule("exact"), Rule("logprobs-close"), Rule("score")):
        v = judge(ref, AnswerSet((err, ans("b", [2]))), prompts, rule)
        assert v.passed, (rule, v.detail)
        assert (v.passed, v.kind, v.unjudged) == (True, "same", ("a",)), v.detail
        assert "1 prompt(s) not judged" in v.detail and "'a'" in v.detail
        assert (v.score, v.reference_score) == (1.0, 1.0)  # over the judged prompts
    # what the variant answers to it is not judged either
    assert judge(ref, AnswerSet((ans("a", [9]), ans("b", [2]))), prompts, Rule("exact")).passed
    # the prompts the reference answered are judged as ever
    v = judge(ref, AnswerSet((err, Answer("b", error="HTTP 500"))), prompts, Rule("exact"))
    assert (v.passed, v.kind) == (False, "no_answer")
    v = judge(ref, AnswerSet((err, ans("b", [3]))), prompts, Rule("exact"))
    assert (v.passed, v.kind) == (False, "different")


# -- the same tokens, another text -----------------------------------------------------------

#: the lab's prefill/decode router when its roles disagree on the KV cache dtype
#: (orchestrator/lab/pd.py): decode's tokens, each word reversed and marked
SCRAMBLED = {
    "a": ("The capital of France is Paris.", "ehT!! latipac!! fo!! ecnarF!! si!! .siraP!!"),
    "b": ("Yes", "seY!!"),
    "c": ("Red, green, blue", ",deR!! ,neerg!! eulb!!"),
    "d": (" Rome.", ".emoR!!"),
}


def scrambled_pair() -> tuple[list[Prompt], AnswerSet, AnswerSet]:
    prompts = [
        Prompt(k, prompt="q", expect=ref.split()[-1].strip("."))
        for k, (ref, _) in SCRAMBLED.items()
    ]
    ref = AnswerSet(tuple(ans(k, [1, 2, 3], text=r) for k, (r, _) in SCRAMBLED.items()))
    got = AnswerSet(tuple(ans(k, [1, 2, 3], text=g) for k, (_, g) in SCRAMBLED.items()))
    return prompts, ref, got


def test_the_same_tokens_with_another_text_are_not_the_same_answer() -> None:
    prompts, ref, got = scrambled_pair()
    a, b = ref.answers[0], got.answers[0]
    assert first_difference(a, b) is None  # the tokens agree
    assert not exact(a, b) and not logprobs_close(a, b, 5)
    for rule in ("exact", "logprobs-close"):
        v = judge(ref, got, prompts, Rule(rule))  # type: ignore[arg-type]
        assert not v.passed, (rule, v.detail)
        assert [d.prompt_id for d in v.diffs] == ["a", "b", "c", "d"]
        assert all(d.same_tokens and d.first_diff is None for d in v.diffs)
    # a detokenizer regression that reads as text is `different`, named as such
    plain = AnswerSet((ans("a", [1, 2, 3], text="The capital of France is Lyon."),))
    v = judge(AnswerSet(ref.answers[:1]), plain, prompts[:1], Rule("exact"))
    assert (v.passed, v.kind) == (False, "different")
    assert "'a': the same tokens, another text" in v.detail, v.detail


def test_the_lab_routers_scrambled_words_read_as_garbled() -> None:
    for ref, scrambled in SCRAMBLED.values():
        assert garbled(ref) == (), ref
        assert garbled(scrambled), scrambled
    prompts, ref, got = scrambled_pair()
    for rule in ("exact", "logprobs-close", "score"):
        v = judge(ref, got, prompts, Rule(rule))  # type: ignore[arg-type]
        assert (v.passed, v.kind) == (False, "garbled"), (rule, v.detail)
        assert "4 of 4 answers garbled" in v.detail, v.detail


@pytest.mark.parametrize(
    "text",
    [
        "Wow! That is great, really great.",
        "Use the .env file, not .gitignore, for this.",
        "The file is 4 GiB and the pH is 7.",
        "Note -- this is fine.",
        "Step 1... step 2... done.",
    ],
)
def test_marks_and_capitals_of_ordinary_text_are_not_garbled(text: str) -> None:
    assert garbled(text) == ()


# -- a score that drops with no token differing, an absolute bar ----------------------------


def test_a_score_drop_with_no_answer_beyond_its_rule_says_so() -> None:
    """(a) under `score` every text is within the rule: the drop alone fails, by name."""
    prompts = [Prompt("a", prompt="q", expect="Paris"), Prompt("b", prompt="q", expect="7")]
    ref = AnswerSet((ans("a", [1], text="Paris"), ans("b", [2], text="7 days")))
    got = AnswerSet((ans("a", [1], text="Lyon"), ans("b", [2], text="7 days")))
    v = judge(ref, got, prompts, Rule("score", pass_if=">= good - 0.08"))
    assert (v.passed, v.kind) == (False, "score"), v.detail
    assert "score 0.50 misses '>= good - 0.08' (reference 1.00); wrong: 'a'" == v.detail


def test_good_missing_an_absolute_bar_against_itself_is_a_score_miss() -> None:
    """(b) good asked twice, both passes at 0.50 under `>= 0.75`: no token differs."""
    prompts = [Prompt("a", prompt="q", expect="Paris"), Prompt("b", prompt="q", expect="7")]
    half = AnswerSet((ans("a", [1], text="Paris"), ans("b", [2], text="5 days")))
    rule = Rule("score", pass_if=">= 0.75")
    v = judge(half, half, prompts, rule)
    assert (v.passed, v.kind) == (False, "score")
    assert v.detail.startswith("score 0.50 misses '>= 0.75'"), v.detail
    alone = judge_alone(half, prompts, rule)
    assert alone is not None and (alone.passed, alone.kind, alone.score) == (False, "score", 0.5)
    assert alone.detail == "score 0.50 misses '>= 0.75'; wrong: 'b'"
    full = AnswerSet((ans("a", [1], text="Paris"), ans("b", [2], text="7 days")))
    assert judge_alone(full, prompts, rule).passed  # type: ignore[union-attr]
    # a bar relative to good, or a rule on tokens, needs the reference
    assert judge_alone(half, prompts, Rule("score", pass_if=">= good - 0.08")) is None
    assert judge_alone(half, prompts, Rule("exact")) is None
    assert judge_alone(half, [Prompt("a", prompt="q")], rule) is None  # nothing scored


def test_score_bar_errors_name_only_what_a_bar_may_say() -> None:
    # a negative number parses, to be refused for what it is
    assert parse_bar(">= -0.5") == (">=", False, -0.5)
    assert bar_problem(">= -0.5") == "no score misses it (a score lies between 0 and 1)"
    # a bar that fails a higher score is refused, == included
    for bar in ("== good", "== good - 0.1", "== 0.5", "<= good", "< 0.9"):
        why = bar_problem(bar)
        assert why is not None and "higher" in why, (bar, why)
    for bar in (">= good - 0.08", "> good - 0.1", ">= 0.75", "> 0.5"):
        assert bar_problem(bar) is None, bar
    # the syntax error offers only the comparisons a bar may use
    with pytest.raises(ValueError) as err:
        parse_bar("at least 0.5")
    assert "<" not in str(err.value) and "==" not in str(err.value), err.value
