"""Scripted answers for the fast tier: what a scripted server answers to an answers check.

A right answer is a sentence of real words, one token per word, each position's top-k
holding the chosen word first and `perhaps` second. A wrong answer is made by kind:
`garbled` (repeated symbols), `different` (a word no top-k holds, from the third token on),
`drift` (the third token swapped for its runner-up, with top-k to match: within
`logprobs-close`, not `exact`: a host's own start-to-start noise), `retext` (the right
tokens, each word of the text reversed and marked, as the lab's prefill/decode router
answers when its roles disagree on the KV cache dtype), `silent` (no answer). `KIND@ID`
answers wrong that way to prompt ID only.
The record has the shape `orchestrator.execution.answers.ask_check` returns.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config.experiment import AnswersCheck
from orchestrator.diagnosis.answers import Prompt
from orchestrator.execution.answers import prompt_texts

RIGHT = "The answer to this question is {word} and nothing else"
_WORDS = {"arith-add": "5", "arith-mul": "100", "fact-france": "Paris"}


def _right_words(p: Prompt) -> list[str]:
    word = _WORDS.get(p.id) or (p.expect or "indeed")
    return RIGHT.format(word=word).split()


def answer(p: Prompt, kind: str | None) -> dict[str, Any]:
    if kind is not None and "@" in kind:
        kind, only = kind.split("@", 1)
        kind = kind if p.id == only else None
    words = _right_words(p)
    top = [[[w, -0.1], ["perhaps", -2.0]] for w in words]
    if kind == "garbled":
        words = ["#$%#$%"] * 10
        top = [[[w, -0.1]] for w in words]
    elif kind == "different":
        words = words[:2] + ["Bananas", "are", "yellow", "fruit"]
        top = [[[w, -0.1], ["perhaps", -2.0]] for w in words]
    elif kind == "drift":
        words = words[:2] + ["perhaps", *words[3:]]
        top = top[:2] + [[["perhaps", -0.1], [_right_words(p)[2], -0.15]]] + top[3:]
    elif kind == "retext":
        return {
            "prompt_id": p.id,
            "text": " ".join(w[::-1] + "!!" for w in words),
            "tokens": words,
            "top": top,
            "finish_reason": "length",
            "error": None,
        }
    elif kind == "silent":
        return {
            "prompt_id": p.id,
            "text": "",
            "tokens": [],
            "top": [],
            "finish_reason": None,
            "error": "HTTP 500: rank 0 is dead",
        }
    return {
        "prompt_id": p.id,
        "text": " ".join(words),
        "tokens": words,
        "top": top,
        "finish_reason": "length",
        "error": None,
    }


def record(
    check: AnswersCheck,
    kind: str | None,
    *,
    twice: bool = False,
    repeat_kind: str | None = None,
    modes_wrong: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The answers record of a ready scripted server answering `kind` (None: right) in the
    modes `modes_wrong` (None: every mode); `twice`: the second pass, answering
    `repeat_kind`."""
    prompts = check.load()
    if not check.enabled:
        prompts = prompts[:1]
    modes = check.modes if check.enabled else ("sequential",)
    sets = {
        m: [answer(p, kind if modes_wrong is None or m in modes_wrong else None) for p in prompts]
        for m in modes
    }
    out: dict[str, Any] = {
        "model": "scripted",
        "rule": check.rule,
        "prompts": prompt_texts(prompts),
        "sets": sets,
        "seconds": dict.fromkeys(modes, 0.1),
        "requests": len(prompts) * len(modes),
        "error": None,
        "ready": (kind != "silent") if check.ready_completion else None,
    }
    if twice and check.enabled:
        out["repeat"] = [answer(p, repeat_kind) for p in prompts]
    return out
