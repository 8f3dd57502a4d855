"""A run's answers beside the reference's, as text: `show`, the reports, the issue.

Pure: it reads a run's answers record (orchestrator.execution.answers.ask_check, with the
campaign's judgement under `judged` and, for good, its self-comparison under `noise`)
and, when the caller has it, the reference run's record. For each prompt whose answer
differs, good's answer and the run's side by side, the first differing token marked
`[[...]]` (by its position when the server named its tokens by id), and the score.
"""

from __future__ import annotations

from typing import Any

#: prompts shown per run: the first few that differ say what kind of wrong it is
SHOWN = 3
WIDTH = 160


def _answer(record: dict[str, Any] | None, mode: str, prompt_id: str) -> dict[str, Any] | None:
    if not record:
        return None
    for a in (record.get("sets") or {}).get(mode) or ():
        if a.get("prompt_id") == prompt_id:
            return dict(a)
    return None


def marked(answer: dict[str, Any] | None, at: int | None, fallback: str = "") -> str:
    """The answer's text with the token at position `at` marked `[[...]]` (its tokens
    joined when they are text; the text as it is, position named, when they are ids)."""
    if answer is None:
        return _clip(fallback)
    if answer.get("error"):
        return f"(no answer: {answer['error']})"
    tokens = [str(t) for t in answer.get("tokens") or ()]
    text = str(answer.get("text") or "")
    if at is None or not tokens or any(t.startswith("token_id:") for t in tokens):
        where = "" if at is None else f"  (differs from token {at})"
        return _clip(text) + where
    if at >= len(tokens):
        return _clip("".join(_spaced(tokens)) + " [[(ends here)]]")
    words = _spaced(tokens)
    return _clip("".join(words[:at]) + "[[" + words[at] + "]]" + "".join(words[at + 1 :]))


def _spaced(tokens: list[str]) -> list[str]:
    """Tokens as text: a BPE server's own leading space is kept; tokens without any
    (words, as some servers name them) get one between them."""
    if any(t[:1] in (" ", "Ġ", "▁") for t in tokens[1:]):
        return [t.replace("Ġ", " ").replace("▁", " ") for t in tokens]
    return [t if i == 0 else " " + t for i, t in enumerate(tokens)]


def _clip(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= WIDTH else text[: WIDTH - 1] + "…"


def _prompt(record: dict[str, Any] | None, prompt_id: str) -> str:
    asked = ((record or {}).get("prompts") or {}).get(prompt_id)
    if isinstance(asked, list):
        return " / ".join(f"{role}: {content}" for role, content in asked)
    return "" if asked is None else str(asked)


def lines(record: dict[str, Any] | None, reference: dict[str, Any] | None = None) -> list[str]:
    """What `show` prints of a run's answers (nothing when it was not asked)."""
    if not record:
        return []
    out: list[str] = []
    asked = sum(len(v) for v in (record.get("sets") or {}).values())
    secs = sum(float(v) for v in (record.get("seconds") or {}).values())
    modes = ", ".join(record.get("sets") or {}) or "none"
    out.append(
        f"answers: {asked} asked ({modes}) in {secs:.1f}s, {record.get('requests', 0)} "
        f"requests" + (f"; model {record['model']}" if record.get("model") else "")
    )
    if record.get("error"):
        out.append(f"  no answers: {record['error']}")
    if record.get("ready") is False:
        out.append("  /health passed but no completion returned: the server was not ready")
    noise = record.get("noise")
    if isinstance(noise, dict):
        said = "agrees" if noise.get("passed") else "DISAGREES"
        out.append(
            f"  reference of its campaign; asked twice on this start, it {said} with itself "
            f"under {noise.get('rule')}: {noise.get('detail')}"
            + (f" ({noise['would_hold']} would hold)" if noise.get("would_hold") else "")
        )
    judged = record.get("judged")
    if not isinstance(judged, dict):
        return out
    if judged.get("passed") is None:
        out.append(f"  not judged: {judged.get('detail')}")
        return out
    verdict = "right" if judged["passed"] else f"WRONG ({judged.get('kind')})"
    against = (
        f"against good's run {judged['reference_run']}"
        if judged.get("reference_run")
        else "by its absolute bar, no reference needed"
    )
    out.append(f"  judged {verdict} under {judged.get('rule')} {against}: {judged.get('detail')}")
    shown = judged.get("mode") or next(iter(judged.get("modes") or {}), None)
    for mode, v in (judged.get("modes") or {}).items():
        if v.get("score") is not None:
            ref_score = v.get("reference_score")
            out.append(
                f"  score ({mode}): {v['score']:.2f}"
                + (f", good's {ref_score:.2f}" if ref_score is not None else "")
            )
        if mode != shown:  # the prompts side by side once: the mode that named the verdict
            out.append(f"  [{mode}] {v.get('detail')}")
            continue
        for d in (v.get("diffs") or [])[:SHOWN]:
            at = d.get("first_diff")
            rule = "within the rule" if d.get("within_rule") else "breaks the rule"
            if d.get("same_tokens"):  # what the tokens became changed, not the tokens
                rule = f"the same tokens, another text; {rule}"
            out.append(
                f"  [{mode}] prompt {d['prompt_id']!r}"
                + (f" from token {at}" if at is not None else "")
                + f" ({rule}"
                + (f"; garbled: {', '.join(d['garbled'])}" if d.get("garbled") else "")
                + ")"
            )
            question = _prompt(record, d["prompt_id"])
            if question:
                out.append(f"    asked:    {_clip(question)}")
            ref = _answer(reference, mode, d["prompt_id"])
            out.append(f"    good:     {marked(ref, at, d.get('reference', ''))}")
            mine = _answer(record, mode, d["prompt_id"])
            out.append(f"    this run: {marked(mine, at, d.get('answer', ''))}")
    return out


def issue_lines(
    record: dict[str, Any] | None,
    reference: dict[str, Any] | None,
    good_command: str | None,
) -> list[str]:
    """The `## Answers` section of an issue: the prompt, both answers, good's command line
    (the failing one is the reproduction above)."""
    judged = (record or {}).get("judged") or {}
    if not judged or judged.get("passed") is not False:
        return []
    mode = judged.get("mode") or next(iter(judged.get("modes") or {}), "sequential")
    v = (judged.get("modes") or {}).get(mode) or {}
    out = ["## Answers", ""]
    out.append(
        f"Greedy answers (temperature 0, fixed seed) to the same prompts, asked "
        f"{'all at once' if mode == 'batch' else 'one at a time'}; rule "
        f"`{judged.get('rule')}`: {judged.get('detail')}"
    )
    out.append("")
    for d in (v.get("diffs") or [])[:2]:
        if d.get("within_rule"):
            continue
        at = d.get("first_diff")
        out += [
            f"Prompt `{d['prompt_id']}`:",
            "",
            "```text",
            _prompt(record, d["prompt_id"]),
            "```",
        ]
        ref = _answer(reference, mode, d["prompt_id"])
        out += [
            "Working launch answers" + _where(d) + ":",
            "```text",
            marked(ref, at, d.get("reference", "")),
            "```",
            "Failing launch answers:",
            "```text",
            marked(_answer(record, mode, d["prompt_id"]), at, d.get("answer", "")),
            "```",
            "",
        ]
    if v.get("score") is not None:
        ref_score = v.get("reference_score")
        working = f" (working launch: {ref_score:.2f})" if ref_score is not None else ""
        out += [f"Score: {v['score']:.2f}{working}", ""]
    if good_command:
        out += ["The working launch:", "", "```bash", good_command, "```", ""]
    return out


def _where(diff: dict[str, Any]) -> str:
    """Where an answer first differs, for the issue: a token, or its text alone."""
    if diff.get("same_tokens"):
        return " (the same tokens, another text)"
    at = diff.get("first_diff")
    return f" (first difference at token {at})" if at is not None else ""


__all__ = ["issue_lines", "lines", "marked"]
