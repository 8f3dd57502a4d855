"""Repair moves as data and the ladder that uses them (pure: no host, no store)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.config.repair import BUILTIN_MOVES, Declared, Move, Trigger, policy
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.errors import ConfigError
from orchestrator.planner.deltas import Delta
from orchestrator.planner.repair import (
    Applied,
    Next,
    Rung,
    Settled,
    decide,
    is_resource,
    stepped,
    with_moves,
)

OOM_LOAD = Signature(Phase.LOAD_WEIGHTS, "cuda_oom", "CUDA out of memory.")
OOM_SERVING = Signature(Phase.SERVING, "cuda_oom", "CUDA out of memory.")
OOM_GRAPH = Signature(Phase.CUDA_GRAPH, "cuda_oom", "CUDA out of memory.")
NOT_ENOUGH = Signature(
    Phase.KV_CACHE,
    "not_enough_memory",
    "Not enough memory. Please try to increase --mem-fraction-static",
)
TOO_SMALL = Signature(
    Phase.KV_CACHE, "kv_cache_too_small", "the model's max seq len is larger than the KV cache"
)
ASSERT = Signature(Phase.CUDA_GRAPH, "AssertionError", "@ expert_location_dispatch.py:init_new")


def sglang(**flags: object) -> Experiment:
    base: dict[str, object] = {"model-path": "/m", "tp-size": 8, "port": 30000}
    return Experiment(
        name="v",
        exec=("python3", "-m", "sglang.launch_server"),
        flags=tuple((base | flags).items()),
    )


def first(sig: Signature | None, verdict: Verdict = Verdict.OTHER) -> Rung:
    return Rung("c.1", None, verdict, sig)


def then(
    step: Next | Settled,
    rid: str,
    sig: Signature | None,
    after: str,
    n: int,
    verdict: Verdict = Verdict.OTHER,
) -> Rung:
    assert isinstance(step, Next), step
    return Rung(rid, step.applied("x", after, n), verdict, sig)


def test_resource_failures_are_told_by_the_signature_class_never_by_a_flag() -> None:
    assert is_resource(OOM_LOAD, None) and is_resource(TOO_SMALL, None)
    # a message that names --mem-fraction-static is not a resource failure by that
    assert not is_resource(
        Signature(Phase.INIT, "ValueError", "--mem-fraction-static must be below 1"), None
    )
    assert not is_resource(ASSERT, None)
    # the target is never repaired away, whatever its class
    assert not is_resource(OOM_LOAD, OOM_LOAD)


def test_oom_at_load_raises_the_fraction_step_by_step_up_to_the_cap() -> None:
    pol = policy([])
    v = sglang(**{"mem-fraction-static": 0.85})
    rungs = [first(OOM_LOAD)]
    step = decide(rungs, pol, variant=v, deltas=[])
    assert isinstance(step, Next) and step.move.knob == "mem-fraction-static"
    assert (step.before, step.value, step.way) == (0.85, 0.89, 1)
    rungs.append(then(step, "c.2", OOM_LOAD, "c.1", 1))
    step = decide(rungs, pol, variant=v, deltas=[])
    assert isinstance(step, Next) and step.value == 0.93
    rungs.append(then(step, "c.3", None, "c.2", 2, Verdict.PASS))
    assert decide(rungs, pol, variant=v, deltas=[]) == Settled(2, "repaired")
    # the cap: 0.93 + 0.04 stops at 0.95, then nothing is left
    m = next(m for m in pol.moves if m.knob == "mem-fraction-static")
    assert stepped(m, 0.93, 1) == 0.95 and stepped(m, 0.95, 1) == 0.95


def test_the_steps_are_bounded_and_the_ladder_says_why_it_stopped() -> None:
    pol = policy([])
    v = sglang(**{"mem-fraction-static": 0.85})
    rungs = [first(OOM_LOAD)]
    for i in (1, 2):
        rungs.append(
            then(decide(rungs, pol, variant=v, deltas=[]), f"c.{i + 1}", OOM_LOAD, f"c.{i}", i)
        )
    got = decide(rungs, pol, variant=v, deltas=[])
    # the start as written speaks for the variant; the ladder ended at its last start
    assert isinstance(got, Settled) and got.state == "unrepaired" and got.final == 0
    assert got.last == 2
    assert "after 2 repaired start(s)" in got.why


def test_two_sided_no_working_window() -> None:
    """Out of memory at load wants more, out of memory while serving wants less: both
    sides failed, the ladder stops and says so."""
    pol = policy([])
    v = sglang(**{"mem-fraction-static": 0.85})
    rungs = [first(OOM_LOAD)]
    rungs.append(then(decide(rungs, pol, variant=v, deltas=[]), "c.2", OOM_SERVING, "c.1", 1))
    got = decide(rungs, pol, variant=v, deltas=[])
    assert isinstance(got, Settled) and got.state == "unrepaired"
    assert got.why.startswith(
        "no working window for --mem-fraction-static: at 0.85 it failed wanting more"
    )
    assert "at 0.89 wanting less" in got.why
    # serving alone points down
    step = decide([first(OOM_SERVING)], pol, variant=v, deltas=[])
    assert isinstance(step, Next) and (step.value, step.way) == (0.81, -1)


def test_graph_capture_oom_lowers_the_captured_batch_and_kv_space_is_raised() -> None:
    pol = policy([])
    v = sglang(**{"mem-fraction-static": 0.85, "cuda-graph-max-bs": 512})
    step = decide([first(OOM_GRAPH)], pol, variant=v, deltas=[])
    assert isinstance(step, Next) and (step.move.knob, step.value) == ("cuda-graph-max-bs", 256)
    cpu = Experiment(
        name="v",
        exec=("vllm", "serve"),
        flags=(("port", 8000),),
        env=(("VLLM_CPU_KVCACHE_SPACE", "1"),),
    )
    step = decide([first(TOO_SMALL)], pol, variant=cpu, deltas=[])
    assert isinstance(step, Next) and step.move.env and step.value == 2
    applied = step.applied(str(TOO_SMALL), "c.1", 1)
    assert with_moves(cpu, [applied]).env_map()["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert applied.describe() == "env VLLM_CPU_KVCACHE_SPACE 1 -> 2"


def test_a_move_never_turns_a_delta_under_test() -> None:
    pol = policy([])
    v = sglang(**{"mem-fraction-static": 0.85})
    under_test = [Delta("flag", "mem-fraction-static", 0.85, 0.92)]
    got = decide([first(NOT_ENOUGH)], pol, variant=v, deltas=under_test)
    assert got == Settled(0, "unrepaired", "--mem-fraction-static is a delta under test")
    env_delta = [Delta("env", "VLLM_CPU_KVCACHE_SPACE", "1", "2")]
    cpu = Experiment(name="v", exec=("vllm", "serve"), env=(("VLLM_CPU_KVCACHE_SPACE", "1"),))
    got = decide([first(TOO_SMALL)], pol, variant=cpu, deltas=env_delta)
    assert isinstance(got, Settled) and "env VLLM_CPU_KVCACHE_SPACE is a delta" in got.why


def test_a_refused_move_is_not_tried_again_and_an_unset_knob_is_not_guessed() -> None:
    pol = policy([])
    v = sglang(**{"mem-fraction-static": 0.85})
    step = decide([first(OOM_LOAD)], pol, variant=v, deltas=[])
    refused = then(step, "c.2", None, "c.1", 1, Verdict.INVALID)
    got = decide([first(OOM_LOAD), refused], pol, variant=v, deltas=[])
    assert got == Settled(0, "unrepaired", "the server refused --mem-fraction-static 0.89")
    again = decide(
        [first(OOM_LOAD)],
        pol,
        variant=v,
        deltas=[],
        refused=frozenset({(False, "mem-fraction-static")}),
    )
    assert isinstance(again, Settled) and "refused" in again.why
    unset = decide([first(OOM_LOAD)], pol, variant=sglang(), deltas=[])
    assert isinstance(unset, Settled) and "not set in the config" in unset.why


def test_no_repair_and_steps_zero_leave_the_run_as_it_was() -> None:
    v = sglang(**{"mem-fraction-static": 0.85})
    assert decide([first(OOM_LOAD)], policy([], enabled=False), variant=v, deltas=[]) == Settled(
        0, "none"
    )
    assert decide([first(OOM_LOAD)], policy([Declared(steps=0)]), variant=v, deltas=[]) == Settled(
        0, "none"
    )
    # a run that is no resource failure needs nothing
    assert decide([first(ASSERT, Verdict.FAIL)], policy([]), variant=v, deltas=[]) == Settled(
        0, "none"
    )


def test_declared_moves_replace_the_built_in_one_of_their_knob(tmp_path: Path) -> None:
    (tmp_path / "e.yaml").write_text(
        yaml.safe_dump(
            {
                "service": {
                    "exec": "python3 -m sglang.launch_server",
                    "flags": {"port": 30000, "mem-fraction-static": 0.85},
                },
                "repair": {
                    "steps": 1,
                    "moves": [
                        {
                            "flag": "mem-fraction-static",
                            "step": 0.07,
                            "max": 0.95,
                            "when": [{"class": "cuda_oom", "way": "up"}],
                        }
                    ],
                },
            }
        )
    )
    exp = load_experiment(tmp_path / "e.yaml")
    (tmp_path / "hosts.yaml").write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "h": {
                        "address": "x",
                        "known_hosts": "kh",
                        "repair": {
                            "steps": 3,
                            "moves": [
                                {
                                    "env": "VLLM_CPU_KVCACHE_SPACE",
                                    "factor": 4,
                                    "integer": True,
                                    "when": [{"class": "kv_cache_too_small", "way": "up"}],
                                }
                            ],
                        },
                    }
                }
            }
        )
    )
    host = load_inventory(tmp_path / "hosts.yaml").host("h")
    pol = policy([host.repair, exp.repair])
    assert pol.steps == 1  # the file's word after the host's
    knobs = {m.knob: m for m in pol.moves}
    assert knobs["mem-fraction-static"].step == 0.07
    assert knobs["VLLM_CPU_KVCACHE_SPACE"].factor == 4
    assert knobs["cuda-graph-max-bs"] in BUILTIN_MOVES
    # no cuda-graph-max-bs in that config: the declared move (any phase) takes it
    step = decide([first(OOM_GRAPH)], pol, variant=exp, deltas=[])
    assert isinstance(step, Next) and step.move.knob == "mem-fraction-static"
    step = decide([first(OOM_LOAD)], pol, variant=exp, deltas=[])
    assert isinstance(step, Next) and step.value == 0.92
    only = policy(
        [
            Declared(
                moves=(Move("x", False, (Trigger("cuda_oom", None, 1),), step=1.0),), builtin=False
            )
        ]
    )
    assert [m.knob for m in only.moves] == ["x"]


@pytest.mark.parametrize(
    ("repair", "key", "words"),
    [
        (
            {
                "moves": [
                    {
                        "flag": "x",
                        "env": "Y",
                        "step": 1,
                        "when": [{"class": "cuda_oom", "way": "up"}],
                    }
                ]
            },
            "repair.moves.0",
            "either flag: or env:",
        ),
        (
            {"moves": [{"flag": "x", "when": [{"class": "cuda_oom", "way": "up"}]}]},
            "repair.moves.0",
            "step: (added) or factor:",
        ),
        (
            {
                "moves": [
                    {"flag": "x", "step": 1, "when": [{"class": "AssertionError", "way": "up"}]}
                ]
            },
            "repair.moves.0.when.0.class",
            "resource failure's class",
        ),
        (
            {
                "moves": [
                    {"flag": "x", "step": 1, "when": [{"class": "cuda_oom", "way": "sideways"}]}
                ]
            },
            "repair.moves.0.when.0.way",
            "up",
        ),
        (
            {
                "moves": [
                    {
                        "flag": "x",
                        "step": 1,
                        "when": [{"class": "cuda_oom", "way": "up", "phases": ["boot"]}],
                    }
                ]
            },
            "repair.moves.0.when.0.phases",
            "expected phases among",
        ),
        (
            {"moves": [{"flag": "port", "step": 1, "when": [{"class": "cuda_oom", "way": "up"}]}]},
            "repair.moves.0",
            "a move cannot change --port: the health check",
        ),
        ({"steps": -1}, "repair.steps", "greater than or equal to 0"),
        ({"stepz": 2}, "repair.stepz", "did you mean 'steps'"),
    ],
)
def test_a_bad_repair_section_names_the_file_and_key(
    tmp_path: Path, repair: dict, key: str, words: str
) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(
        yaml.safe_dump({"service": {"exec": "x", "flags": {"port": 1}}, "repair": repair})
    )
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    text = str(err.value) + (err.value.hint or "")
    assert str(path) in text and key in text and words in text, text


def test_applied_round_trips() -> None:
    a = Applied("mem-fraction-static", False, 0.85, 0.92, 1, str(OOM_LOAD), "c.1", 1)
    assert Applied.from_dict(a.to_dict()) == a
    assert a.words() == ["--mem-fraction-static", "0.92"]


def test_a_recorded_config_keeps_its_repair_section(tmp_path: Path) -> None:
    """The campaign's spec records each config as `to_dict()`; `--resume` rebuilds them
    from it: the declared moves must come back the same, or the resumed ladder would
    step differently."""
    (tmp_path / "e.yaml").write_text(
        yaml.safe_dump(
            {
                "service": {"exec": "x", "flags": {"port": 1, "mem-fraction-static": 0.85}},
                "repair": {
                    "steps": 1,
                    "builtin": False,
                    "moves": [
                        {
                            "flag": "mem-fraction-static",
                            "step": 0.07,
                            "max": 0.95,
                            "when": [{"class": "cuda_oom", "phases": ["kv_cache"], "way": "up"}],
                        },
                        {
                            "env": "KV",
                            "factor": 2,
                            "integer": True,
                            "absent": 4,
                            "when": [{"class": "kv_cache_too_small", "way": "up"}],
                        },
                    ],
                },
            }
        )
    )
    exp = load_experiment(tmp_path / "e.yaml")
    back = Experiment.from_dict(exp.to_dict())
    assert back.repair is not None and exp.repair is not None
    strip = [replace(m, source="") for m in exp.repair.moves]
    assert [replace(m, source="") for m in back.repair.moves] == strip
    assert (back.repair.steps, back.repair.builtin) == (1, False)
    assert back.fingerprint() == exp.fingerprint()  # a hint, not part of the launch


def test_an_unset_knob_is_advised_only_for_the_server_that_has_it() -> None:
    # an SGLang launch whose log printed no arguments was told to set vLLM's
    # --gpu-memory-utilization too (SGLang refuses it), and a vLLM launch SGLang's knob
    why = decide([first(OOM_LOAD)], policy([]), variant=sglang(), deltas=[])
    assert isinstance(why, Settled) and "--mem-fraction-static" in why.why
    assert "gpu-memory-utilization" not in why.why, why.why
    vllm = Experiment(name="v", exec=("vllm", "serve", "/m"), flags=(("port", 8000),))
    why = decide([first(OOM_LOAD)], policy([]), variant=vllm, deltas=[])
    assert isinstance(why, Settled) and "--gpu-memory-utilization" in why.why
    assert "mem-fraction-static" not in why.why, why.why
    # a server the command does not name (a wrapper script): every knob may be its own
    other = Experiment(name="v", exec=("/opt/run-server",), flags=(("port", 8000),))
    why = decide([first(OOM_LOAD)], policy([]), variant=other, deltas=[])
    assert isinstance(why, Settled)
    assert "--mem-fraction-static" in why.why and "--gpu-memory-utilization" in why.why
    # the plan's list of moves says the same
    from orchestrator.planner.repair import may_run

    said = dict((m.name(), w) for m, w in may_run(policy([]), sglang(), sglang(), []))
    assert said["--gpu-memory-utilization"].startswith("not:"), said
