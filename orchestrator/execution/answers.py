"""Ask a ready server a prompt set on its host, and read its answers as the judge's types.

The asking runs ON the host (orchestrator/execution/answers_asker.py, stdlib only, sent to
the host's `python3 -c` with the request on stdin), through the same transport as every
other command, so the server's port never needs to be open to the controller. Greedy:
temperature 0, a fixed seed, a stated max_tokens, top-k logprobs; each prompt goes to the
chat or the completions endpoint by its shape (messages or prompt).
"""

from __future__ import annotations

import json
import secrets
import shlex
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.config.experiment import AnswersCheck
from orchestrator.diagnosis.answers import (
    DEFAULT_TOP_K,
    AnswerSet,
    Prompt,
    answers_from,
    as_plain,
)
from orchestrator.diagnosis.verdicts import Phase, Signature
from orchestrator.errors import OrchestratorError, TransportError
from orchestrator.execution.transport.base import Transport

ASKER = Path(__file__).with_name("answers_asker.py")
MARK = "@@ANSWERS "
MODES = ("sequential", "batch")


class AskCancelled(Exception):
    """The answers check was stopped before it ended (its run was cancelled)."""


@dataclass(frozen=True)
class AskSettings:
    max_tokens: int = 24
    top_k: int = DEFAULT_TOP_K
    seed: int = 0
    timeout: float = 120.0  # per request
    modes: tuple[str, ...] = MODES
    token_ids: bool = True  # vLLM's `return_tokens_as_token_ids`
    model: str | None = None  # None: the server's first model


@dataclass(frozen=True)
class Asked:
    """What the server answered, per mode, with what it cost."""

    model: str | None
    sets: dict[str, AnswerSet]
    seconds: dict[str, float]
    requests: int
    error: str | None = None


def request(
    prompts: tuple[Prompt, ...], port: int, settings: AskSettings, host: str = "127.0.0.1"
) -> dict[str, object]:
    """The asker's request (JSON on its stdin)."""
    unknown = [m for m in settings.modes if m not in MODES]
    if unknown:
        raise ValueError(f"modes {unknown}: expected {', '.join(MODES)}")
    return {
        "base": f"http://{host}:{port}",
        "model": settings.model,
        "max_tokens": settings.max_tokens,
        "top_k": settings.top_k,
        "seed": settings.seed,
        "timeout": settings.timeout,
        "modes": list(settings.modes),
        "token_ids": settings.token_ids,
        "prompts": [
            {
                "id": p.id,
                "prompt": p.prompt,
                "messages": [list(m) for m in p.messages] if p.messages is not None else None,
            }
            for p in prompts
        ],
    }


def command(marker: str | None = None) -> str:
    """The shell command that runs the asker on the host (request on stdin); `marker`, an
    argument the asker ignores, names this asker among the host's processes."""
    tail = f" {shlex.quote(marker)}" if marker else ""
    return f"python3 -c {shlex.quote(ASKER.read_text())}{tail}"


def kill_command(marker: str) -> str:
    """Stop the asker named `marker` on the host (its `timeout` wrapper with it). The
    pattern's bracket keeps it from matching this command's own shell."""
    pattern = f"[{marker[0]}]{marker[1:]}"
    return f"pkill -f -- {shlex.quote(pattern)} || true"


@contextmanager
def stopped_on(
    transport: Transport, marker: str, cancel: threading.Event
) -> Iterator[threading.Event]:
    """While the asker named `marker` runs, a `cancel` (Ctrl-C, a decided round) stops it
    on the host at once, through a second command, so the run that waits for it ends now,
    not when the last prompt times out. Yields an event that is set when it was stopped."""
    done, stopped = threading.Event(), threading.Event()

    def watch() -> None:
        while not done.is_set():
            if cancel.wait(0.5):
                stopped.set()
                try:
                    transport.run(kill_command(marker), timeout=30)
                except OrchestratorError:
                    pass  # the host is unreachable: the asker's own timeout ends it
                return

    watcher = threading.Thread(target=watch, daemon=True, name=f"ask-stop-{marker}")
    watcher.start()
    try:
        yield stopped
    finally:
        done.set()
        watcher.join(35)


def parse(stdout: str) -> Asked:
    """The asker's reply, from its output."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(MARK)), None)
    if line is None:
        raise TransportError(f"the answers check printed no reply: {stdout.strip()[-300:]!r}")
    raw = json.loads(line[len(MARK) :])
    return Asked(
        model=raw.get("model"),
        sets={
            mode: AnswerSet(tuple(answers_from(a) for a in answers), mode=mode)
            for mode, answers in raw["sets"].items()
        },
        seconds={k: float(v) for k, v in raw["seconds"].items()},
        requests=int(raw["requests"]),
        error=raw.get("error"),
    )


def ask(
    transport: Transport,
    prompts: tuple[Prompt, ...],
    port: int,
    settings: AskSettings | None = None,
    host: str = "127.0.0.1",
    *,
    cancel: threading.Event | None = None,
) -> Asked:
    """Ask the server on `port` of the transport's host every prompt, in every mode.
    `cancel`: once set, the asker is stopped on the host and `AskCancelled` raised."""
    settings = settings or AskSettings()
    req = request(prompts, port, settings, host)
    budget = settings.timeout * len(prompts) * len(settings.modes) + 30
    if cancel is None:
        res = transport.run(command(), timeout=budget, stdin=json.dumps(req))
    else:
        marker = f"orchestrator-ask-{secrets.token_hex(6)}"
        with stopped_on(transport, marker, cancel) as stopped:
            try:
                res = transport.run(command(marker), timeout=budget, stdin=json.dumps(req))
            except TransportError:
                if stopped.is_set():
                    raise AskCancelled("the answers check was stopped") from None
                raise
        if stopped.is_set():
            raise AskCancelled("the answers check was stopped")
    if not res.ok and MARK not in res.stdout:
        raise TransportError(
            f"the answers check failed on the host (exit {res.exit_code}): "
            f"{res.stderr.strip()[-300:]}"
        )
    return parse(res.stdout)


# -- the answers check of a run (`answers:` of an experiment) ------------------------------

#: a server whose /health passes while no real completion returns is not ready (vLLM's
#: rank 0 dead behind a live API server answers 200): a failure of its own
NO_COMPLETION = Signature(Phase.SERVING, "no_completion", "health passes but no completion returns")


def ask_check(
    transport: Transport,
    check: AnswersCheck,
    port: int,
    *,
    twice: bool = False,
    cancel: threading.Event | None = None,
) -> dict[str, Any]:
    """Ask a ready server the check's prompts (every mode; `twice`: the first mode once
    more on the same start, good's second pass) and return the run's answers record:
    `sets` (mode -> plain answers), `repeat` (the second pass), `seconds`, `requests`,
    `model`, `error`, and `ready` (a real completion returned: None when not checked)."""
    prompts = check.load()
    settings = AskSettings(
        max_tokens=check.max_tokens, top_k=check.top_k, timeout=check.timeout, modes=check.modes
    )
    if not check.enabled:  # readiness alone: one real completion, one token
        settings = replace(settings, modes=("sequential",), max_tokens=1)
        prompts = prompts[:1]
    asked = ask(transport, prompts, port, settings, cancel=cancel)
    record: dict[str, Any] = {
        "model": asked.model,
        "rule": check.rule,
        "prompts": prompt_texts(prompts),
        "sets": {m: [as_plain(a) for a in s.answers] for m, s in asked.sets.items()},
        "seconds": dict(asked.seconds),
        "requests": asked.requests,
        "error": asked.error,
    }
    if twice and check.enabled and asked.error is None:
        again = ask(
            transport, prompts, port, replace(settings, modes=check.modes[:1]), cancel=cancel
        )
        first = again.sets.get(check.modes[0])
        if first is not None:
            record["repeat"] = [as_plain(a) for a in first.answers]
            record["requests"] += again.requests
            record["seconds"]["repeat"] = again.seconds.get(check.modes[0], 0.0)
    if check.ready_completion:
        answered = [a for s in asked.sets.values() for a in s.answers if a.error is None]
        record["ready"] = asked.error is None and bool(answered)
    else:
        record["ready"] = None
    return record


def prompt_texts(prompts: tuple[Prompt, ...]) -> dict[str, object]:
    """What each prompt asked (a completion prompt's text, or chat messages), by id: kept
    with the answers, so a report quotes the question beside both answers."""
    return {
        p.id: p.prompt if p.prompt is not None else [list(m) for m in p.messages or ()]
        for p in prompts
    }


def not_ready(record: dict[str, Any]) -> str | None:
    """Why a server that passed /health is not ready by its answers (None: it is)."""
    if record.get("ready") is not False:
        return None
    why = record.get("error")
    if not why:
        errors = [a.get("error") for s in record.get("sets", {}).values() for a in s]
        why = next((e for e in errors if e), "no answer")
    return f"/health passed but no completion returned: {why}"


def unanswered(record: dict[str, Any]) -> bool:
    """True when the check failed or some prompt got no answer (good's second pass
    included: a server that dies while asked again died all the same)."""
    if record.get("error"):
        return True
    asked = [*record.get("sets", {}).values(), record.get("repeat") or []]
    return any(a.get("error") for s in asked for a in s)


def answer_set(record: dict[str, Any], mode: str) -> AnswerSet | None:
    """One mode's answers of a run's answers record (`repeat`: good's second pass)."""
    raw = record.get("repeat") if mode == "repeat" else record.get("sets", {}).get(mode)
    if raw is None:
        return None
    return AnswerSet(tuple(answers_from(a) for a in raw), mode=mode)


def summary(record: dict[str, Any]) -> str:
    sets = record.get("sets", {})
    n = sum(len(s) for s in sets.values())
    secs = sum(float(v) for v in record.get("seconds", {}).values())
    if record.get("error"):
        return f"no answers: {record['error']}"
    return f"{n} answers in {secs:.1f}s ({record.get('requests', 0)} requests)"
