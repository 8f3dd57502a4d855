"""The simulated server's answers, asked by the real asker and judged by the real judge.

Each test starts `python -m orchestrator.lab.server` on a free 127.0.0.1 port and runs
`orchestrator/execution/answers_asker.py` as its own process (`python3 -c`, through the
local transport, as on a host) against it; the answers are judged with
`orchestrator.diagnosis.answers` against a reference start of the same model.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from orchestrator.config.hosts import Host
from orchestrator.config.prompts import load_prompts
from orchestrator.diagnosis.answers import Rule, garbled, judge, score
from orchestrator.execution.answers import Asked, AskSettings, ask
from orchestrator.execution.transport.local import LocalTransport
from tests.hosts.procs import free_port, scenario_file

pytestmark = pytest.mark.slow

WAIT = 15.0
PROMPTS = load_prompts()
LONG = "long-context"

SCENARIO = """
name: answers-zoo
seed: 3
faults:
  - when: {crash: true}
    phase: init
    error: "RuntimeError: crashed"
answers:
  - when: {garble: true}
    effect: garbled
  - when: {drop: true}
    effect: wrong
    fraction: 0.5
  - when: {batch-bug: true}
    effect: wrong
    concurrency: 3
  - when: {long-bug: true}
    effect: garbled
    min_prompt_tokens: 1000
  - when: {fp32: true}
    effect: drift
    fraction: 0.2
  - when: {flaky-drop: true}
    effect: wrong
    fraction: 0.6
    probability: 0.5
"""


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario_file(tmp_path_factory, SCENARIO)


def _local() -> LocalTransport:
    return LocalTransport(Host(name="here", address="localhost", transport="local"))  # type: ignore[arg-type]


def _args(zoo: Path, port: int) -> list[str]:
    """The lab server of these tests: the scenario, a port, a model path, no startup time."""
    return [
        "--scenario",
        str(zoo),
        "--port",
        str(port),
        "--model-path",
        "/models/m",
        "--time-scale",
        "0",
    ]


def _asked(spawn, zoo: Path, *flags: str, seed: str = "3", **kw: object) -> Asked:
    port = free_port()
    proc = spawn(*_args(zoo, port), "--seed", seed, *flags)
    assert proc.wait_healthy(port, WAIT), proc.out + proc.err
    asked = ask(_local(), PROMPTS, port, AskSettings(**kw))  # type: ignore[arg-type]
    proc.stop()
    assert asked.error is None
    return asked


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, zoo: Path) -> Asked:
    from tests.hosts.procs import LabProcess

    port = free_port()
    proc = LabProcess.server(_args(zoo, port)).start()
    try:
        assert proc.wait_healthy(port, WAIT), proc.out + proc.err
        return ask(_local(), PROMPTS, port, AskSettings())
    finally:
        proc.stop()


def _judge(ref: Asked, got: Asked, rule: Rule, mode: str = "sequential"):
    return judge(ref.sets[mode], got.sets[mode], PROMPTS, rule)


def test_default_answers_right_and_the_same_on_two_starts(spawn, zoo: Path, reference) -> None:
    other = _asked(spawn, zoo, seed="99")  # another start's seed: the same answers
    for mode in ("sequential", "batch"):
        assert score(reference.sets[mode], PROMPTS) == 1.0
        verdict = _judge(reference, other, Rule("exact"), mode)
        assert verdict.passed and verdict.kind == "same", verdict.detail
    # the batch answers as one at a time does (no rule asks for concurrency)
    assert _judge(reference, other, Rule("exact"), "sequential").passed
    seq, batch = reference.sets["sequential"], reference.sets["batch"]
    assert [a.tokens for a in seq.answers] == [a.tokens for a in batch.answers]
    for a in seq.answers:
        assert a.error is None and a.token_ids is not None and a.tokens
        assert len(a.top) == len(a.tokens)
        assert a.finish_reason in ("stop", "length")
        for i, tok in enumerate(a.tokens):
            assert a.top_k(i, 1) == {tok}  # the top-1 is the chosen token
            assert len(a.top[i]) == 5 and len({t for t, _ in a.top[i]}) == 5
        assert not garbled(a.text)


def test_garbled_rule(spawn, zoo: Path, reference) -> None:
    got = _asked(spawn, zoo, "--garble")
    verdict = _judge(reference, got, Rule("logprobs-close"))
    assert not verdict.passed and verdict.kind == "garbled", verdict.detail
    assert score(got.sets["sequential"], PROMPTS) == 0.0


def test_accuracy_drop_by_a_fraction(spawn, zoo: Path, reference) -> None:
    got = _asked(spawn, zoo, "--drop")
    verdict = _judge(reference, got, Rule("score"))
    assert not verdict.passed and verdict.kind == "score", verdict.detail
    # exactly round(0.5 * 9) = 5 of the 9 scored prompts answered wrong, readable
    assert verdict.score == pytest.approx(4 / 9)
    assert not any(garbled(a.text) for a in got.sets["sequential"].answers)
    again = _asked(spawn, zoo, "--drop", seed="5")  # chosen by prompt, not by start
    assert _judge(got, again, Rule("exact")).passed


def test_wrong_only_under_concurrency(spawn, zoo: Path, reference) -> None:
    got = _asked(spawn, zoo, "--batch-bug")
    assert _judge(reference, got, Rule("exact"), "sequential").passed
    verdict = _judge(reference, got, Rule("score"), "batch")
    assert not verdict.passed and verdict.kind == "score", verdict.detail
    assert verdict.score == 0.0


def test_wrong_only_past_a_prompt_length(spawn, zoo: Path, reference) -> None:
    got = _asked(spawn, zoo, "--long-bug")
    verdict = _judge(reference, got, Rule("exact"))
    assert not verdict.passed and verdict.kind == "garbled"
    assert [d.prompt_id for d in verdict.diffs] == [LONG]


def test_drift_breaks_exact_but_not_logprobs_close(spawn, zoo: Path, reference) -> None:
    got = _asked(spawn, zoo, "--fp32")
    exact = _judge(reference, got, Rule("exact"))
    close = _judge(reference, got, Rule("logprobs-close"))
    assert not exact.passed and exact.kind == "different", exact.detail
    assert close.passed, close.detail
    # round(0.2 * 5 answers longer than 16 tokens) = 1 answer changes, late (from its 17th token)
    assert len(exact.diffs) == 1 and exact.diffs[0].first_diff == 16
    assert _judge(reference, got, Rule("score")).passed
    # every logprob moved a little
    ref_top = reference.sets["sequential"].answers[0].top[0][0][1]
    assert got.sets["sequential"].answers[0].top[0][0][1] != ref_top


def test_flaky_accuracy_drop_in_about_half_the_starts(spawn, zoo: Path, reference) -> None:
    outcomes = set()
    for seed in ("1", "2", "3", "4", "5", "6"):
        got = _asked(spawn, zoo, "--flaky-drop", seed=seed, modes=("sequential",))
        outcomes.add(_judge(reference, got, Rule("score")).passed)
    assert outcomes == {True, False}


def test_a_crash_rule_still_crashes(spawn, zoo: Path) -> None:
    port = free_port()
    proc = spawn("--scenario", str(zoo), "--port", str(port), "--time-scale", "0", "--crash")
    assert proc.wait_exit(WAIT) == 1
    assert "RuntimeError: crashed" in proc.out


def _post(port: int, path: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=WAIT) as resp:
        return json.loads(resp.read())


def test_openai_shapes_tokens_usage_and_sampling(spawn, zoo: Path) -> None:
    port = free_port()
    proc = spawn("--scenario", str(zoo), "--port", str(port), "--time-scale", "0")
    assert proc.wait_healthy(port, WAIT)
    models = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models").read())
    model = models["data"][0]["id"]
    cmpl = _post(
        port,
        "/v1/completions",
        {
            "model": model,
            "prompt": "The capital of Italy is",
            "max_tokens": 3,
            "logprobs": 2,
            "temperature": 0,
        },
    )
    choice = cmpl["choices"][0]
    assert choice["text"].startswith(" Rome. ") and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert lp["tokens"][:2] == [" Rome", "."] and len(lp["tokens"]) == 3
    assert "".join(lp["tokens"]) == choice["text"] and lp["text_offset"] == [0, 5, 6]
    assert all(len(t) == 2 for t in lp["top_logprobs"])
    assert cmpl["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    chat = _post(
        port,
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "user", "content": "Is the sun a star? Reply with yes or no only."}
            ],
            "logprobs": True,
            "top_logprobs": 3,
            "return_tokens_as_token_ids": True,
            "seed": 1,
        },
    )
    msg = chat["choices"][0]
    assert msg["message"]["content"] == "Yes" and msg["finish_reason"] == "stop"
    (pos,) = msg["logprobs"]["content"]
    assert pos["token"].startswith("token_id:") and pos["top_logprobs"][0]["token"] == pos["token"]
    assert len(pos["top_logprobs"]) == 3
    # sampling: a seed fixes the draw; greedy ignores it
    body = {"prompt": "Tell me a story", "max_tokens": 30, "temperature": 1.5}
    one = _post(port, "/v1/completions", {**body, "seed": 7})["choices"][0]["text"]
    assert _post(port, "/v1/completions", {**body, "seed": 7})["choices"][0]["text"] == one
    greedy = {**body, "temperature": 0}
    assert (
        _post(port, "/v1/completions", {**greedy, "seed": 1})["choices"][0]["text"]
        == (_post(port, "/v1/completions", {**greedy, "seed": 2})["choices"][0]["text"])
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        _post(port, "/v1/completions", {"prompt": "x", "n": 2})
    assert info.value.code == 400
