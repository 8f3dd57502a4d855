"""Ask an OpenAI-compatible server a prompt set, greedily; runs ON the host.

Stdlib only, imports nothing of the orchestrator: orchestrator/execution/answers.py sends
this file's text to the host's `python3 -c` (through the same session as every other
command, so the server's port stays private to the host) with the request as JSON on
stdin, and reads back one line: MARK followed by JSON. Also runnable by hand:

    python3 answers_asker.py < request.json

The request: base (http://127.0.0.1:PORT), model (None: the first of /v1/models),
max_tokens, top_k, seed, timeout (seconds per request), modes (`sequential`: one prompt
at a time; `batch`: every prompt at once, each on its own connection), token_ids (ask vLLM
to name tokens `token_id:N`), prompts ({id, prompt} to /v1/completions or {id, messages}
to /v1/chat/completions). Every request is greedy: temperature 0, the fixed seed, the
stated max_tokens, top-k logprobs. The reply: model, per mode a list of answers ({prompt_id,
text, tokens, top, finish_reason, error}) in the prompts' order, per mode its seconds, and
the number of requests made. A request that fails is an answer with `error` set, never a
crash of this script.
"""

import json
import sys
import threading
import time
import urllib.error
import urllib.request

MARK = "@@ANSWERS "


def _post(url, body, timeout):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8", "replace"))


def _model(base, timeout):
    with urllib.request.urlopen(base + "/v1/models", timeout=timeout) as resp:
        data = json.loads(resp.read().decode("utf-8", "replace"))
    return data["data"][0]["id"]


def _body(req, prompt):
    body = {
        "model": req["model"],
        "temperature": 0,
        "seed": req["seed"],
        "max_tokens": req["max_tokens"],
    }
    if req.get("token_ids"):
        body["return_tokens_as_token_ids"] = True
    if prompt.get("messages") is not None:
        body["messages"] = [{"role": r, "content": c} for r, c in prompt["messages"]]
        body["logprobs"] = True
        body["top_logprobs"] = req["top_k"]
        return "/v1/chat/completions", body
    body["prompt"] = prompt["prompt"]
    body["logprobs"] = req["top_k"]
    return "/v1/completions", body


def _read(choice):
    """(text, tokens, top) of one choice, chat or completions shaped."""
    lp = choice.get("logprobs") or {}
    if "message" in choice:
        text = (choice["message"] or {}).get("content") or ""
        content = lp.get("content") or []
        tokens = [c["token"] for c in content]
        top = [[[t["token"], t["logprob"]] for t in c.get("top_logprobs") or []] for c in content]
        return text, tokens, top
    tokens = list(lp.get("tokens") or [])
    top = [[[t, v] for t, v in (pos or {}).items()] for pos in lp.get("top_logprobs") or []]
    return choice.get("text") or "", tokens, top


def ask_one(req, prompt):
    answer = {"prompt_id": prompt["id"], "text": "", "tokens": [], "top": []}
    answer.update(finish_reason=None, error=None)
    path, body = _body(req, prompt)
    try:
        data = _post(req["base"] + path, body, req["timeout"])
        choice = data["choices"][0]
        answer["text"], answer["tokens"], answer["top"] = _read(choice)
        answer["finish_reason"] = choice.get("finish_reason")
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:300]
        answer["error"] = f"HTTP {exc.code}: {detail}"
    except Exception as exc:  # noqa: BLE001 - any failure is this prompt's answer
        answer["error"] = f"{type(exc).__name__}: {exc}"
    return answer


def ask_batch(req, prompts):
    answers = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def one(i):
        try:
            start.wait(timeout=req["timeout"])
        except threading.BrokenBarrierError:
            pass
        answers[i] = ask_one(req, prompts[i])

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def main(req):
    reply = {"model": req.get("model"), "sets": {}, "seconds": {}, "requests": 0, "error": None}
    try:
        if not req.get("model"):
            req["model"] = reply["model"] = _model(req["base"], req["timeout"])
            reply["requests"] += 1
    except Exception as exc:  # noqa: BLE001
        reply["error"] = f"cannot list the models: {type(exc).__name__}: {exc}"
        return reply
    prompts = req["prompts"]
    # Once a request timed out, the server is taken to answer nothing (a dead rank behind
    # a live API server hangs every request): the prompts after it are not asked, so such
    # a server costs the timeout once, not once per prompt.
    silent = None
    for mode in req["modes"]:
        began = time.monotonic()
        if silent is None and mode == "batch" and len(prompts) > 1:
            answers = ask_batch(req, prompts)
            reply["requests"] += len(prompts)
            if all(_timed_out(a["error"]) for a in answers):
                silent = answers[0]["error"]
        else:
            answers = []
            for p in prompts:
                if silent is not None:
                    answers.append(_unasked(p, silent))
                    continue
                answers.append(ask_one(req, p))
                reply["requests"] += 1
                if _timed_out(answers[-1]["error"]):
                    silent = answers[-1]["error"]
        reply["sets"][mode] = answers
        reply["seconds"][mode] = round(time.monotonic() - began, 3)
    return reply


def _timed_out(error):
    return error is not None and "timed out" in error.lower()


def _unasked(prompt, timed_out):
    why = f"not asked: an earlier request got no answer ({timed_out})"
    return {
        "prompt_id": prompt["id"],
        "text": "",
        "tokens": [],
        "top": [],
        "finish_reason": None,
        "error": why,
    }


if __name__ == "__main__":
    sys.stdout.write(MARK + json.dumps(main(json.loads(sys.stdin.read()))) + "\n")
