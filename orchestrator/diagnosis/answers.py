"""What a server answered to a set of prompts, and whether it answered as the reference did.

Pure: no I/O. A server's answers (greedy text, the tokens it chose, the top-k logprobs at
each position) are compared with a reference's (good's, in the same campaign and host)
under one rule:

- `exact`: the same tokens and the same text (vLLM's `check_outputs_equal`);
- `logprobs-close`: at the first position where the two runs chose different tokens, each
  run's token is among the other run's top-k there; the comparison stops at that position,
  since the texts diverge after it (vLLM's `check_logprobs_close`, `top_k` settable). Unlike
  vLLM's, an answer that stops where the other goes on differs at that position and no
  top-k excuses it (an API may leave out the stop token: an empty answer would pass), and
  the same tokens with another text fail where vLLM's only warns;
- `score`: the fraction of prompts with an expected answer (`expect`, `regex`) that were
  met, held to a bar such as `>= good - 0.08` or `>= 0.75`. An absolute bar needs no
  reference: `judge_alone` holds a run alone to it.

Under every rule the text is compared as well as the tokens: the same tokens with another
text (a detokenizer or chat-template regression, or a server that rewrites the text after
choosing the tokens) are not the same answer.

Whatever the rule, an answer that is garbled where the reference's is not (empty, invalid
characters, repetitive, mostly non-words) fails: the verdict's `kind` then says `garbled`,
which is a different bug from a `different` answer or a `score` drop.
"""

from __future__ import annotations

import operator
import re
import unicodedata
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

RuleName = Literal["exact", "logprobs-close", "score"]
RULES: tuple[RuleName, ...] = ("exact", "logprobs-close", "score")
Kind = Literal["same", "different", "garbled", "score", "no_answer"]
DEFAULT_TOP_K = 5
DEFAULT_SCORE_BAR = ">= good - 0.08"


@dataclass(frozen=True)
class Prompt:
    """One question: a completion `prompt` or chat `messages` ((role, content) pairs), and
    optionally what a right answer holds: `expect` (the answer contains this text,
    case-insensitive, at word boundaries) or `regex` (searched in the answer)."""

    id: str
    prompt: str | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    expect: str | None = None
    regex: str | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError(f"prompt {self.id!r}: exactly one of prompt, messages")
        if self.expect is not None and self.regex is not None:
            raise ValueError(f"prompt {self.id!r}: at most one of expect, regex")

    @property
    def scored(self) -> bool:
        return self.expect is not None or self.regex is not None

    def met_by(self, text: str) -> bool:
        """True if `text` is a right answer (False for a prompt without expectation)."""
        return bool(meets(text, self.expect, self.regex))


def meets(text: str, expect: str | None, regex: str | None) -> bool | None:
    """Whether `text` meets a prompt's expectation: its `regex` found in it, else its
    `expect` as whole words (case and spacing aside); None when it states neither."""
    if regex is not None:
        return re.search(regex, text) is not None
    if expect is not None:
        want = r"\s+".join(re.escape(w) for w in expect.split())
        return re.search(rf"(?<!\w){want}(?!\w)", text, re.IGNORECASE) is not None
    return None


@dataclass(frozen=True)
class Answer:
    """One prompt's answer. `tokens` are the server's names of the chosen tokens (vLLM's
    `token_id:N` when asked for ids), `top` the top-k (token, logprob) pairs at each
    position, best first; `error` is set (and the rest empty) when no answer came."""

    prompt_id: str
    text: str = ""
    tokens: tuple[str, ...] = ()
    top: tuple[tuple[tuple[str, float], ...], ...] = ()
    finish_reason: str | None = None
    error: str | None = None

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        """The token ids, when the server named its tokens by id (`token_id:N`)."""
        ids = []
        for tok in self.tokens:
            m = re.fullmatch(r"token_id:(-?\d+)", tok)
            if m is None:
                return None
            ids.append(int(m[1]))
        return tuple(ids)

    def top_k(self, index: int, k: int) -> frozenset[str]:
        if index >= len(self.top):
            return frozenset()
        ranked = sorted(self.top[index], key=lambda p: -p[1])
        return frozenset(tok for tok, _ in ranked[:k])


@dataclass(frozen=True)
class AnswerSet:
    """A server's answers to a prompt set, in the set's order; `mode` says how they were
    asked (`sequential`: one at a time; `batch`: all at once)."""

    answers: tuple[Answer, ...]
    mode: str = "sequential"

    def by_id(self) -> dict[str, Answer]:
        return {a.prompt_id: a for a in self.answers}


@dataclass(frozen=True)
class Rule:
    name: RuleName = "logprobs-close"
    top_k: int = DEFAULT_TOP_K
    pass_if: str = DEFAULT_SCORE_BAR

    def __post_init__(self) -> None:
        if self.name not in RULES:
            raise ValueError(f"rule {self.name!r}: expected one of {', '.join(RULES)}")
        if self.top_k < 1:
            raise ValueError(f"top_k {self.top_k}: expected at least 1")
        parse_bar(self.pass_if)


# -- the rules on one answer pair ----------------------------------------------------------


def first_difference(a: Answer, b: Answer) -> int | None:
    """The first position where the two answers' tokens differ (an answer that ends first
    differs at its length), or None when they are the same. Without tokens, the texts'
    first differing character."""
    if not a.tokens and not b.tokens:
        if a.text == b.text:
            return None
        return next(
            (i for i, (x, y) in enumerate(zip(a.text, b.text, strict=False)) if x != y),
            min(len(a.text), len(b.text)),
        )
    for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)):
        if x != y:
            return i
    return None if len(a.tokens) == len(b.tokens) else min(len(a.tokens), len(b.tokens))


def exact(a: Answer, b: Answer) -> bool:
    """vLLM's check_outputs_equal: the same greedy tokens and the same text."""
    return (
        a.error is None and b.error is None and first_difference(a, b) is None and a.text == b.text
    )


def logprobs_close(a: Answer, b: Answer, top_k: int = DEFAULT_TOP_K) -> bool:
    """vLLM's check_logprobs_close: at the first differing position, each answer's token is
    among the other's top-k; nothing after it is compared."""
    if a.error is not None or b.error is not None:
        return False
    i = first_difference(a, b)
    if i is None:
        # vLLM's only warns on the same tokens with another text; here it fails (a
        # detokenizer regression answers so)
        return a.text == b.text
    if i >= len(a.tokens) or i >= len(b.tokens):
        return False
    return a.tokens[i] in b.top_k(i, top_k) and b.tokens[i] in a.top_k(i, top_k)


# -- garbled text --------------------------------------------------------------------------

_VOWELS = set("aeiouyAEIOUY")


def garbled(text: str) -> tuple[str, ...]:
    """Why `text` is not language at all (empty when it reads as text): `empty`, `invalid`
    (replacement or control characters), `repetitive`, `non-words`."""
    reasons: list[str] = []
    body = text.strip()
    if not body:
        return ("empty",)
    bad = sum(
        1
        for ch in body
        if ch == "\ufffd" or (unicodedata.category(ch)[0] == "C" and ch not in "\n\t\r")
    )
    if bad and bad * 20 >= len(body):
        reasons.append("invalid")
    words = body.split()
    if _repetitive(body, words):
        reasons.append("repetitive")
    wordlike = sum(1 for w in words if _wordlike(w))
    if wordlike * 2 < len(words):
        reasons.append("non-words")
    return tuple(reasons)


def _repetitive(body: str, words: list[str]) -> bool:
    """A short unit repeated over most of the text, one word over half the words, one run
    of marks glued to over half the words (`word!! other!! more!!`: a model whose logits
    went to NaN or zero picks token 0, `!` in GPT-2, Llama 3 and Qwen vocabularies), or text
    that compresses to under a quarter of its size."""
    looped = sum(len(m[0]) for m in _LOOP.finditer(body))
    if len(body) >= 20 and looped * 2 > len(body):
        return True
    if len(words) >= 6 and Counter(words).most_common(1)[0][1] * 2 > len(words):
        return True
    tails = Counter(m[0] for w in words if (m := _GLUED_TAIL.search(w)) is not None)
    if len(words) >= 3 and tails and tails.most_common(1)[0][1] * 2 > len(words):
        return True
    raw = body.encode()
    return len(raw) >= 40 and len(zlib.compress(raw)) * 4 < len(raw)


#: a unit of 1-10 characters repeated at least five times in a row
_LOOP = re.compile(r"(.{1,10}?)\1{4,}", re.DOTALL)
#: two or more marks glued to the end of a word's letters or digits (`si!!`, `word--`)
_GLUED_TAIL = re.compile(r"(?<=\w)[^\w\s]{2,}$")
#: a sentence mark glued before a word's letters (`.siraP`, `,deR`): language puts them after
_LEADING_MARK = re.compile(r"^[.,;:!?][^\W\d_]")


def _control(ch: str) -> bool:
    return unicodedata.category(ch)[0] == "C" and ch not in "\n\t\r"


def _wordlike(word: str) -> bool:
    if _LEADING_MARK.match(word):
        return False
    core = word.strip(".,;:!?\"'()[]{}*-_`")
    if not core:
        return False
    if any(ch.isdigit() for ch in core):
        return sum(ch.isalnum() for ch in core) * 2 >= len(core)
    letters = [ch for ch in core if ch.isalpha()]
    if len(letters) * 2 < len(core):
        return False
    latin = [ch for ch in letters if ch.isascii()]
    if (
        len(latin) == len(letters) >= 3
        and letters[-1].isupper()
        and "".join(letters[:-1]).islower()
    ):
        return False  # a capital that ends a lowercase word (`ehT`, `ecnarF`): written backwards
    # a Latin-script word has a vowel; other scripts are taken as words
    return len(latin) < len(letters) or any(ch in _VOWELS for ch in latin) or len(latin) == 1


# -- the score -----------------------------------------------------------------------------

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
}
_BAR = re.compile(
    r"^\s*(>=|<=|==|>|<)\s*(?:(good)\s*(?:([-+])\s*(\d+(?:\.\d+)?))?|([-+]?\d+(?:\.\d+)?))\s*$"
)


def parse_bar(text: str) -> tuple[str, bool, float]:
    """`>= good - 0.08` -> ('>=', True, -0.08); `>= 0.75` -> ('>=', False, 0.75)."""
    m = _BAR.match(text)
    if m is None:
        # only the comparisons a bar may use are offered (<, <= and == parse, to be refused
        # by bar_problem with their reason)
        raise ValueError(
            f"score bar {text!r}: expected '>= good - NUMBER' or '>= NUMBER' (> also "
            "works), e.g. '>= good - 0.08' or '>= 0.75'"
        )
    op, good, sign, delta, number = m.groups()
    if good:
        value = float(delta or 0) * (-1 if sign == "-" else 1)
        return op, True, value
    return op, False, float(number)


def bar_problem(text: str) -> str | None:
    """Why a score bar cannot judge a score, which lies in [0, 1] and is better higher
    (None: it can): a bar that passes a drop and fails a rise, one the reference itself
    would miss, one no score misses, or one no score meets."""
    op, relative, number = parse_bar(text)
    if op in ("<", "<="):
        return "it passes a lower score and fails a higher one (a score is better higher)"
    if op == "==":
        return "it fails a higher score as well as a lower one (a score is better higher: use >=)"
    if relative:
        if (op == ">=" and number > 0) or (op == ">" and number >= 0):
            return "the reference's own score misses it"
        if number <= -1:
            return "no score misses it (a score lies between 0 and 1)"
        return None
    if (op == ">=" and number > 1) or (op == ">" and number >= 1):
        return "no score meets it (a score lies between 0 and 1)"
    if (op == ">=" and number <= 0) or (op == ">" and number < 0):
        return "no score misses it (a score lies between 0 and 1)"
    return None


def score(answers: AnswerSet, prompts: Iterable[Prompt]) -> float | None:
    """The fraction of the scored prompts whose answer is right (None: nothing scored)."""
    got = answers.by_id()
    scored = [p for p in prompts if p.scored]
    if not scored:
        return None
    right = sum(1 for p in scored if p.id in got and p.met_by(got[p.id].text))
    return right / len(scored)


def absolute_bar(rule: Rule) -> bool:
    """True when the rule is `score` with a bar that names no reference (`>= 0.75`): a
    run's answers are judged alone, good's own included."""
    return rule.name == "score" and not parse_bar(rule.pass_if)[1]


def meets_bar(value: float, bar: str, good: float | None) -> bool:
    op, relative, number = parse_bar(bar)
    if relative:
        if good is None:
            raise ValueError(f"score bar {bar!r} needs the reference's score")
        number += good
    return _OPS[op](round(value, 9), round(number, 9))


# -- the verdict ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptDiff:
    """One prompt whose answer differs from the reference's."""

    prompt_id: str
    #: the first token that differs (None: the same tokens, see `same_tokens`)
    first_diff: int | None
    reference: str
    answer: str
    garbled: tuple[str, ...] = ()
    within_rule: bool = False
    error: str | None = None
    #: the same tokens as the reference's, another text
    same_tokens: bool = False


@dataclass(frozen=True)
class AnswersVerdict:
    passed: bool
    rule: Rule
    kind: Kind
    detail: str
    diffs: tuple[PromptDiff, ...] = field(default=())
    score: float | None = None
    reference_score: float | None = None
    #: prompts the reference got no answer to: nothing to judge them by
    unjudged: tuple[str, ...] = ()
    #: the prompts whose answers fail the verdict (of its `kind`), in the set's order
    broken: tuple[str, ...] = ()


def judge(
    reference: AnswerSet, answers: AnswerSet, prompts: Iterable[Prompt], rule: Rule
) -> AnswersVerdict:
    """`answers` against `reference` under `rule`. A prompt the reference got no answer to
    (an endpoint the server does not have, a request it refused) says nothing about the
    answers: it is left out (`unjudged`), the score included."""
    ref, got = reference.by_id(), answers.by_id()
    missing = Answer("", error="no reference answer")
    unjudged = tuple(p.id for p in prompts if ref.get(p.id, missing).error is not None)
    prompts = tuple(p for p in prompts if p.id not in unjudged)
    diffs: list[PromptDiff] = []
    for p in prompts:
        r = ref[p.id]
        a = got.get(p.id, Answer(p.id, error="not asked"))
        if a.error is not None:
            diffs.append(PromptDiff(p.id, 0, r.text, "", error=a.error))
            continue
        i = first_difference(r, a)
        if i is None and r.text == a.text:
            continue
        new_garble = () if garbled(r.text) else garbled(a.text)
        within = rule.name == "score" or (
            exact(r, a) if rule.name == "exact" else logprobs_close(r, a, rule.top_k)
        )
        diffs.append(
            PromptDiff(
                p.id,
                i,
                r.text,
                a.text,
                new_garble,
                within and not new_garble,
                same_tokens=i is None,
            )
        )
    ref_score, got_score = score(reference, prompts), score(answers, prompts)
    breaking = [d for d in diffs if not d.within_rule]
    score_ok = True
    if rule.name == "score" and got_score is not None:
        score_ok = meets_bar(got_score, rule.pass_if, ref_score)
    passed = not breaking and score_ok
    kind: Kind
    if any(d.error for d in breaking):
        kind = "no_answer"
    elif any(d.garbled for d in breaking):
        kind = "garbled"
    elif not score_ok:
        kind = "score"
    elif breaking or diffs:
        kind = "different"
    else:
        kind = "same"
    detail = _detail(kind, rule, breaking or diffs, len(prompts), got_score, ref_score)
    broken: tuple[str, ...] = ()
    if kind == "score":
        broken = _missed(reference, answers, prompts)
        detail += _named(broken)
    elif not passed:  # the answers of the verdict's kind (an error, a garble, a difference)
        broken = tuple(
            d.prompt_id
            for d in breaking
            if kind == "different" or bool(d.error if kind == "no_answer" else d.garbled)
        )
    if unjudged:
        detail += (
            f"; {len(unjudged)} prompt(s) not judged, the reference got no answer "
            f"({', '.join(repr(i) for i in unjudged[:3])}{', ...' if len(unjudged) > 3 else ''})"
        )
    return AnswersVerdict(
        passed=passed,
        rule=rule,
        kind=kind,
        detail=detail,
        diffs=tuple(diffs),
        score=got_score,
        reference_score=ref_score,
        unjudged=unjudged,
        broken=broken,
    )


def _detail(
    kind: Kind,
    rule: Rule,
    diffs: list[PromptDiff],
    total: int,
    got: float | None,
    ref: float | None,
) -> str:
    scores = "" if got is None else f"; score {got:.2f} (reference {_fmt(ref)})"
    if kind == "same":
        return f"all {total} answers equal to the reference's{scores}"
    if kind == "score":  # a score can drop with no answer beyond its rule (score: any text)
        return f"score {_fmt(got)} misses {rule.pass_if!r} (reference {_fmt(ref)})"
    first = diffs[0]
    where = (
        f"{first.prompt_id!r}: the same tokens, another text"
        if first.same_tokens
        else f"{first.prompt_id!r} from token {first.first_diff}"
    )
    if kind == "no_answer":
        return f"{len(diffs)} of {total} prompts got no answer ({first.prompt_id!r}: {first.error})"
    if kind == "garbled":
        bad = [d for d in diffs if d.garbled]
        return (
            f"{len(bad)} of {total} answers garbled ({', '.join(bad[0].garbled)}), first "
            f"{bad[0].prompt_id!r}: {bad[0].answer[:60]!r}{scores}"
        )
    rule_says = (
        f"within {rule.name}" if all(d.within_rule for d in diffs) else f"breaks {rule.name}"
    )
    return f"{len(diffs)} of {total} answers differ ({rule_says}), first {where}{scores}"


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f}"


def _missed(
    reference: AnswerSet | None, answers: AnswerSet, prompts: Iterable[Prompt]
) -> tuple[str, ...]:
    """The scored prompts the answers miss (that the reference, when there is one, met)."""
    ref = reference.by_id() if reference is not None else None
    got = answers.by_id()
    return tuple(
        p.id
        for p in prompts
        if p.scored
        and (ref is None or (p.id in ref and p.met_by(ref[p.id].text)))
        and not (p.id in got and p.met_by(got[p.id].text))
    )


def _named(ids: tuple[str, ...], shown: int = 3) -> str:
    """`; wrong: 'a', 'b'`: the first few prompts by id ('' when none)."""
    if not ids:
        return ""
    more = f", ... ({len(ids)} in all)" if len(ids) > shown else ""
    return f"; wrong: {', '.join(repr(i) for i in ids[:shown])}{more}"


def judge_alone(answers: AnswerSet, prompts: Iterable[Prompt], rule: Rule) -> AnswersVerdict | None:
    """`answers` held to an absolute score bar (`>= 0.75`), with no reference: a run alone
    (`run`), or the good config's own run, which every other run is judged against and
    which must meet the bar itself. None when the rule needs a reference (`exact`,
    `logprobs-close`, a bar relative to good) or no prompt states an expected answer."""
    if not absolute_bar(rule):
        return None
    prompts = tuple(prompts)
    got = score(answers, prompts)
    if got is None:
        return None
    passed = meets_bar(got, rule.pass_if, None)
    broken = () if passed else _missed(None, answers, prompts)
    return AnswersVerdict(
        passed=passed,
        rule=rule,
        kind="same" if passed else "score",
        detail=f"score {got:.2f} {'meets' if passed else 'misses'} {rule.pass_if!r}"
        + _named(broken),
        score=got,
        broken=broken,
    )


def answers_from(raw: Mapping[str, object]) -> Answer:
    """An Answer from its plain form (`as_plain`), as kept with a run."""
    top = tuple(tuple((str(t), float(lp)) for t, lp in pos) for pos in raw.get("top", ()))  # type: ignore[union-attr]
    return Answer(
        prompt_id=str(raw["prompt_id"]),
        text=str(raw.get("text", "")),
        tokens=tuple(str(t) for t in raw.get("tokens", ())),  # type: ignore[union-attr]
        top=top,
        finish_reason=raw.get("finish_reason"),  # type: ignore[arg-type]
        error=raw.get("error"),  # type: ignore[arg-type]
    )


def as_plain(answer: Answer) -> dict[str, object]:
    """JSON-ready form of an answer (lists for tuples), read back by `answers_from`."""
    return {
        "prompt_id": answer.prompt_id,
        "text": answer.text,
        "tokens": list(answer.tokens),
        "top": [[list(p) for p in pos] for pos in answer.top],
        "finish_reason": answer.finish_reason,
        "error": answer.error,
    }
