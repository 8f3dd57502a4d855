"""The OpenAI-compatible surface of the simulated server, in the shape vLLM and SGLang give.

`/v1/completions` (`prompt`, `logprobs: K`) and `/v1/chat/completions` (`messages`,
`logprobs: true`, `top_logprobs: K`), plus SGLang's `/generate` (`text`,
`sampling_params`): `max_tokens` (`max_completion_tokens`, `max_new_tokens`),
`temperature`, `seed`, `n` (1 only), `ignore_eos`, and vLLM's `return_tokens_as_token_ids`
(every token, chosen and top-k, written `token_id:N`). The answers come from
`orchestrator.lab.answering`; `usage` counts the lab tokenizer's tokens. Stdlib only.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.lab import answering

MAX_TOP = 20  # vLLM's and OpenAI's largest top-k


class BadRequest(ValueError):
    """A request the real server would refuse with 400; the message says why."""


@dataclass(frozen=True)
class Ask:
    path: str
    key: str
    prompt_tokens: int
    prompt_chars: int
    max_tokens: int
    top_k: int | None  # None: no logprobs asked
    token_ids: bool
    temperature: float
    seed: int | None
    ignore_eos: bool
    model: str


def _int(req: Mapping[str, Any], name: str, default: int | None, lo: int, hi: int) -> int | None:
    v = req.get(name, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadRequest(f"{name} must be a whole number from {lo} to {hi}, got {v!r}")
    return v


def parse(path: str, req: Mapping[str, Any], served: str) -> Ask:
    """A request's body, checked, as what to answer."""
    model = str(req.get("model") or served)
    if path == "/generate":
        params = req.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        text = req.get("text", req.get("input_ids", ""))
        if isinstance(text, list):
            text = " ".join(str(t) for t in text)
        return _ask(path, answering.prompt_key(str(text), None), str(text), 0, params, model)
    n = _int(req, "n", 1, 1, 1_000_000)
    if n != 1:
        raise BadRequest(f"n must be 1 on the lab server, got {n}")
    if path == "/v1/completions":
        prompt = req.get("prompt", "")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            prompt = " ".join(str(t) for t in prompt)
        if not isinstance(prompt, str):
            raise BadRequest("prompt must be a string (or a list of one string, or token ids)")
        ask = _ask(path, answering.prompt_key(prompt, None), prompt, 0, req, model)
        top = _int(req, "logprobs", None, 0, MAX_TOP)
        return _with_top(ask, top)
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    pairs = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise BadRequest("each message must be an object with a string content")
        pairs.append((str(m.get("role", "user")), m["content"]))
    text = "".join(c for _, c in pairs)
    ask = _ask(
        path,
        answering.prompt_key(None, pairs),
        text,
        answering.CHAT_OVERHEAD * len(pairs),
        req,
        model,
    )
    top = None
    if req.get("logprobs"):
        top = _int(req, "top_logprobs", 0, 0, MAX_TOP)
    return _with_top(ask, top)


def _ask(path: str, key: str, text: str, overhead: int, req: Mapping[str, Any], model: str) -> Ask:
    default = 16 if path == "/v1/completions" else 128
    names = ("max_new_tokens",) if path == "/generate" else ("max_tokens", "max_completion_tokens")
    raw = next((req[k] for k in names if req.get(k) is not None), default)
    max_tokens = _int({"max_tokens": raw}, "max_tokens", default, 1, 1_000_000)
    temp = req.get("temperature", 0.0)
    if temp is None:
        temp = 0.0
    if isinstance(temp, bool) or not isinstance(temp, int | float) or temp < 0:
        raise BadRequest(f"temperature must be a number >= 0, got {temp!r}")
    seed = req.get("seed", req.get("sampling_seed"))
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"seed must be a whole number, got {seed!r}")
    return Ask(
        path=path,
        key=key,
        prompt_tokens=max(len(answering.tokenize(text)) + overhead, 1),
        prompt_chars=len(text),
        max_tokens=int(max_tokens or default),
        top_k=None,
        token_ids=bool(req.get("return_tokens_as_token_ids")),
        temperature=float(temp),
        seed=seed,
        # SGLang's own /generate here always runs to max_new_tokens (the lab bench and the
        # health and load tests count on its length); the OpenAI routes stop at the answer's end
        ignore_eos=bool(req.get("ignore_eos", path == "/generate")),
        model=model,
    )


def _with_top(ask: Ask, top: int | None) -> Ask:
    return Ask(**{**ask.__dict__, "top_k": top})


def _name(ask: Ask, token: str) -> str:
    return f"token_id:{answering.token_id(token)}" if ask.token_ids else token


def response(ask: Ask, gen: answering.Generated, meta: Mapping[str, Any], serial: int) -> object:
    """The body a real server sends for this answer."""
    text = "".join(gen.tokens)
    if ask.path == "/generate":
        return {
            "text": text,
            "meta_info": {
                "id": f"lab-{serial}",
                "finish_reason": {"type": gen.finish_reason},
                "prompt_tokens": ask.prompt_tokens,
                "completion_tokens": len(gen.tokens),
                **meta,
            },
        }
    usage = {
        "prompt_tokens": ask.prompt_tokens,
        "completion_tokens": len(gen.tokens),
        "total_tokens": ask.prompt_tokens + len(gen.tokens),
    }
    k = ask.top_k
    if ask.path == "/v1/completions":
        logprobs = None
        if k is not None:
            offsets, at = [], 0
            for t in gen.tokens:
                offsets.append(at)
                at += len(t)
            logprobs = {
                "text_offset": offsets,
                "token_logprobs": [pos[0][1] for pos in gen.top],
                "tokens": [_name(ask, t) for t in gen.tokens],
                # vLLM gives the chosen token beside the top-k (k + 1 when it is not in them)
                "top_logprobs": [
                    {_name(ask, t): lp for t, lp in pos[: max(k, 1)]} for pos in gen.top
                ],
            }
        choice: dict[str, Any] = {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": gen.finish_reason,
        }
        return _body("cmpl", "text_completion", ask, choice, usage, serial)
    content = None
    if k is not None:
        content = [
            {
                "token": _name(ask, t),
                "logprob": pos[0][1],
                "bytes": list(t.encode("utf-8")),
                "top_logprobs": [
                    {"token": _name(ask, a), "logprob": lp, "bytes": list(a.encode("utf-8"))}
                    for a, lp in pos[:k]
                ],
            }
            for t, pos in zip(gen.tokens, gen.top, strict=True)
        ]
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None if content is None else {"content": content},
        "finish_reason": gen.finish_reason,
    }
    return _body("chatcmpl", "chat.completion", ask, choice, usage, serial)


def _body(
    prefix: str, kind: str, ask: Ask, choice: dict[str, Any], usage: dict[str, int], serial: int
) -> dict[str, Any]:
    return {
        "id": f"{prefix}-lab-{serial}",
        "object": kind,
        "created": int(time.time()),
        "model": ask.model,
        "choices": [choice],
        "usage": usage,
    }
