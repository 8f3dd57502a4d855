"""What the simulated server answers: tokens, top-k logprobs, and the wrong answers of a scenario.

Stdlib only (the lab runs on hosts with python3 and PyYAML). A right answer is the same on
every start of the same model: it depends on the served model (`--model-path`) and the
prompt, never on the start's seed (which only draws flaky rules). For the prompts of the
shipped prompt set (`orchestrator/config/answers_default.jsonl`, read here as plain JSON,
and any `prompt_sets:` a scenario names) the server knows the right answer: the book below
for the shipped ids, `The answer is X.` for another set's `expect: X`; any other prompt
gets deterministic readable sentences. The top-1 logprob at each position is the chosen
token; its alternatives are plausible tokens with lower logprobs.

Wrong answers (a scenario's `answers:` rules, `orchestrator.lab.scenario`):
- `garbled`: a short unit of dashes, newlines or consonant clusters repeated up to
  max_tokens (what a broken rope or KV cache prints);
- `wrong`: readable, but a wrong answer (the book's wrong answer, else other sentences);
- `drift`: every logprob moves a little, and in the answers it picks the top two tokens
  swap at one position past the answer itself (`from_token` on), so the greedy text differs
  from there on while each side's token stays in the other's top-k: `exact` tells them
  apart, `logprobs-close` does not (float32 against bfloat16 does this to real models).
"""

from __future__ import annotations

import json
import math
import random
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

#: the shipped prompt set, beside the lab package (the checkout is on every lab host)
DEFAULT_SET = Path(__file__).resolve().parent.parent / "config" / "answers_default.jsonl"
EOS_ID = 2
VOCAB = 128_000
#: a chat template's tokens around each message (usage.prompt_tokens counts them)
CHAT_OVERHEAD = 4

_TOKEN = re.compile(r"\s*[A-Za-z]+|\s*\d|\s*[^\sA-Za-z\d]|\s+")


def tokenize(text: str) -> list[str]:
    """The lab tokenizer: words with their leading space, single digits, single marks."""
    return _TOKEN.findall(text)


def token_id(token: str) -> int:
    return 3 + zlib.crc32(token.encode("utf-8")) % VOCAB


def _unit(*parts: object) -> float:
    """A number in [0, 1) fixed by `parts` (the same in every process)."""
    return random.Random(json.dumps(parts, default=str)).random()


# ---------------------------------------------------------------------------- the book

#: the shipped set's right and wrong answers by id (a test checks they meet / miss the
#: set's expectations); `tail`: the answer goes on with a sentence, as chat models do
BOOK: dict[str, tuple[str, str, bool]] = {
    "arith-add": ("5", "6", False),
    "arith-mul": ("10 times 10 is 100.", "10 times 10 is 1000.", True),
    "fact-france": ("The capital of France is Paris.", "The capital of France is Lyon.", True),
    "fact-planet": (
        "Jupiter is the largest planet in our solar system.",
        "Saturn is the largest planet in our solar system.",
        True,
    ),
    "fact-week": ("There are 7 days in a week.", "There are 5 days in a week.", True),
    "format-yesno": ("Yes", "No", False),
    "format-list": ("Red, green, blue", "Red and green", False),
    "complete-italy": (" Rome.", " Milan.", True),
    "long-context": (
        "The password for the north gate is PELICAN.",
        "The password for the north gate is HARBOR.",
        True,
    ),
}


@dataclass(frozen=True)
class Known:
    """A prompt whose right answer the server knows: its set, id and expectation."""

    set_name: str
    id: str
    right: str
    wrong: str | None
    tail: bool
    expect: str | None
    regex: str | None
    #: the scored ids of its set, in file order, with the natural length of each answer
    scored: tuple[tuple[str, int], ...]

    def met_by(self, text: str) -> bool:
        # the orchestrator's judge reads expectations alike (diagnosis.answers.meets); the
        # lab server imports nothing of the orchestrator's beyond the lab (it runs on a
        # host's system Python with only PyYAML)
        if self.regex is not None:
            return re.search(self.regex, text) is not None
        if self.expect is not None:
            want = r"\s+".join(re.escape(w) for w in self.expect.split())
            return re.search(rf"(?<!\w){want}(?!\w)", text, re.IGNORECASE) is not None
        return True


def prompt_key(prompt: str | None, messages: Sequence[tuple[str, str]] | None) -> str:
    if messages is not None:
        return "chat:" + json.dumps([list(m) for m in messages])
    return "text:" + (prompt or "")


def read_book(paths: Sequence[Path]) -> dict[str, Known]:
    """Prompt key -> what the server knows of it, from prompt-set files (JSONL, read
    leniently: a line the lab cannot use is skipped; the orchestrator checks the files)."""
    book: dict[str, Known] = {}
    for path in paths:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        rows = []
        for n, line in enumerate(lines, start=1):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and ("prompt" in row or "messages" in row):
                row.setdefault("id", f"line{n}")
                rows.append(row)
        shipped = path.resolve() == DEFAULT_SET
        entries: list[tuple[str, Known]] = []
        for row in rows:
            pid = str(row["id"])
            msgs = row.get("messages")
            try:
                key = prompt_key(
                    row.get("prompt"),
                    [(m["role"], m["content"]) for m in msgs] if msgs is not None else None,
                )
            except (TypeError, KeyError):
                continue
            entry = BOOK.get(pid) if shipped else None
            expect = row.get("expect")
            if entry is not None:
                right, wrong, tail = entry
            elif isinstance(expect, str):
                right, wrong, tail = f"The answer is {expect}.", None, True
            else:
                continue  # a regex the lab cannot answer to: a generic answer
            known = Known(path.name, pid, right, wrong, tail, expect, row.get("regex"), ())
            entries.append((key, known))
        scored = tuple(
            (k.id, len(tokenize(k.right)) + (TAIL_TOKENS if k.tail else 0))
            for _, k in entries
            if k.expect is not None or k.regex is not None
        )
        for key, known in entries:
            book.setdefault(key, replace(known, scored=scored))
    return book


def selected(
    fraction: float, salt: object, key: str, known: Known | None, longer_than: int = -1
) -> bool:
    """Whether a rule taking `fraction` of the answers takes this prompt's: for a prompt of
    a known set, exactly round(fraction * n) of its n scored prompts whose answers are
    longer than `longer_than` tokens, chosen by a fixed draw per prompt; for any other
    prompt, a draw below `fraction`."""
    if known is None or known.id not in dict(known.scored):
        return fraction >= 1 or _unit("pick", salt, key) < fraction
    ids = [i for i, n in known.scored if n > longer_than]
    if known.id not in ids:
        return False  # too short to be taken (a drift past the answer's end)
    ranked = sorted(ids, key=lambda i: _unit("pick", salt, known.set_name, i))
    return ranked.index(known.id) < math.floor(fraction * len(ranked) + 0.5)


# ---------------------------------------------------------------------------- sentences

_DET = ("the", "a", "this", "every", "that")
_ADJ = (
    "quiet quick bright simple careful early small large modern gentle clear open steady "
    "useful patient formal recent common"
).split()
_NOUN = (
    "garden river teacher window machine letter village answer engine market harbor "
    "painter bridge lantern question morning forest kitchen library signal traveler"
).split()
_VERB = (
    "follows reaches opens carries watches changes finds holds keeps leaves shows "
    "explains describes guides"
).split()
_PREP = ("near", "across", "beside", "under", "behind", "beyond", "through", "along")


TAIL_TOKENS = 11  # a sentence's tokens: ten words and its full stop


def sentence(rng: random.Random, first: bool) -> str:
    det, det2 = rng.choice(_DET), rng.choice(_DET)
    words = [
        det.capitalize(),
        rng.choice(_ADJ),
        rng.choice(_NOUN),
        rng.choice(_VERB),
        det2,
        rng.choice(_NOUN),
        rng.choice(_PREP),
        "the",
        rng.choice(_ADJ),
        rng.choice(_NOUN),
    ]
    return ("" if first else " ") + " ".join(words) + "."


def sentences(key: str, first: bool = True) -> Iterator[str]:
    """An endless stream of readable sentences, fixed by `key`."""
    rng = random.Random("sentences:" + key)
    while True:
        yield sentence(rng, first)
        first = False


def _stream(text: str, more: Iterator[str]) -> Iterator[str]:
    yield from tokenize(text)
    for s in more:
        yield from tokenize(s)


# ---------------------------------------------------------------------------- top-k

_ALTERNATIVES = tuple(
    " the| a| is| and| of| to| in| it| that| was| for| on|,|.| with| as| its| this| are"
    "| be| at| or|\n| one| which| so| an| not| but| by".split("|")
)


def top(key: str, index: int, token: str, k: int) -> list[tuple[str, float]]:
    """The top-k at one position, best first: the chosen `token` and plausible others."""
    rng = random.Random(f"top:{key}:{index}:{token}")
    p = 0.55 + 0.43 * rng.random()
    others = [t for t in _ALTERNATIVES if t != token]
    rng.shuffle(others)
    variant = token.strip().lower() if token.strip() != token else " " + token
    if variant and variant != token and variant not in others:
        others.insert(0, variant)
    out = [(token, math.log(p))]
    rest = 1 - p
    for alt in others[: max(k - 1, 0)]:
        rest /= 2
        out.append((alt, math.log(rest)))
    return out[:k] if k else out[:1]


# ---------------------------------------------------------------------------- answers


@dataclass(frozen=True)
class Effect:
    """What a scenario rule does to one answer (None in `Generated.effect`: right)."""

    kind: str  # garbled, wrong, drift
    salt: int  # the rule's index: draws of different rules differ
    from_token: int = 16
    #: drift: whether this answer's greedy token changes (else only its logprobs move)
    flip: bool = True


@dataclass
class Generated:
    tokens: list[str]
    top: list[list[tuple[str, float]]]
    finish_reason: str


def natural(key: str, known: Known | None, model: str) -> tuple[str, Iterator[str], int]:
    """(the answer's text, its endless continuation, its natural length in tokens)."""
    if known is not None:
        head = known.right
        n = len(tokenize(head))
        if not known.tail:
            return head, iter(()), n
        more = sentences(f"{model}:{key}", first=False)
        tail = next(more)
        return head + tail, more, n + len(tokenize(tail))
    more = sentences(f"{model}:{key}")
    text = next(more) + next(more)
    return text, more, len(tokenize(text))


def generate(
    key: str,
    known: Known | None,
    model: str,
    *,
    max_tokens: int,
    top_k: int = 0,
    effect: Effect | None = None,
    ignore_eos: bool = False,
    temperature: float = 0.0,
    seed: int | None = None,
) -> Generated:
    """One answer: greedy unless `temperature` > 0 (then drawn from the top-k, by `seed`)."""
    k = max(top_k, 1)
    kind = effect.kind if effect else None
    if kind == "garbled":
        return _garbled(key, max_tokens, k)
    text, more, length = natural(key, known, model)
    if kind == "wrong":
        text, more, length = _wrong(key, known, model)
    stream = _stream(text, more)
    head_len = len(tokenize(known.right)) if known is not None else 0
    flip = None
    if kind == "drift" and effect is not None and effect.flip:
        at = max(effect.from_token, head_len)
        flip = at if at < length else None
    rng = random.Random(f"sample:{seed}:{key}") if seed is not None else random.Random()
    tokens: list[str] = []
    tops: list[list[tuple[str, float]]] = []
    salt = key
    while len(tokens) < max_tokens:
        if len(tokens) >= length and not ignore_eos:
            return Generated(tokens, tops, "stop")
        tok = next(stream)
        pos = top(salt, len(tokens), tok, max(k, 2))
        if kind == "drift":
            scale = 1 + 0.04 * (_unit("drift", key, len(tokens)) - 0.5)
            pos = [(t, lp * scale) for t, lp in pos]
            if flip == len(tokens):
                (t0, l0), (t1, _) = pos[0], pos[1]
                pos = [(t1, l0 * 1.02), (t0, l0 * 1.05), *pos[2:]]
        if temperature > 0:
            weights = [math.exp(lp / temperature) for _, lp in pos]
            pick = rng.choices(range(len(pos)), weights)[0]
            if pick:
                pos = [pos[pick], *pos[:pick], *pos[pick + 1 :]]
        if pos[0][0] != tok:  # a different token from here on: the text goes elsewhere
            salt = f"{key}:after:{len(tokens)}:{pos[0][0]}"
            stream = _stream("", sentences(salt, first=False))
            length = max(length, len(tokens) + 1)
        tokens.append(pos[0][0])
        tops.append(pos[:k])
    return Generated(tokens, tops, "length")


def _wrong(key: str, known: Known | None, model: str) -> tuple[str, Iterator[str], int]:
    if known is not None and known.wrong is not None:
        more = sentences(f"{model}:wrong:{key}", first=False)
        tail = next(more) if known.tail else ""
        text = known.wrong + tail
        return text, (more if known.tail else iter(())), len(tokenize(text))
    for salt in range(50):
        more = sentences(f"{model}:wrong:{salt}:{key}")
        text = next(more) + next(more)
        if known is None or not known.met_by(text):
            break
    return text, more, len(tokenize(text))


_JUNK = ("-\n", " --", "\n-", " zzk", " qx-", "\n\n--")


def _garbled(key: str, max_tokens: int, k: int) -> Generated:
    unit = tokenize(_JUNK[int(_unit("garble", key) * len(_JUNK))])
    tokens = [unit[i % len(unit)] for i in range(max_tokens)]
    tops = [top(f"garbled:{key}", i, t, k) for i, t in enumerate(tokens)]
    return Generated(tokens, tops, "length")
