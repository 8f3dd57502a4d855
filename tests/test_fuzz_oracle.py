"""The truth fuzzer's own parts, without a host: the oracle gives every shipped lab pair
its documented answer (experiments/lab/README.md) and every generated incident the answer
its generator meant; incidents repeat from their seed; the judge tells a wrong answer from
a right one; the shrinker keeps what still fails; a regression case round-trips.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.fuzz import cases, generate, judge, oracle, shrink
from tests.support.fuzz.incident import Incident
from tests.support.fuzz.runner import Result

LAB = Path(__file__).resolve().parents[1] / "experiments" / "lab"

#: pair -> (culprit sets, other failures' minimal sets, the target's phase)
DOCUMENTED = {
    "b300": ([{"ep-size", "enable-nccl-nvls"}], [{"ep-size"}], "cuda_graph"),
    "b300-v0523": ([{"ep-size", "enable-nccl-nvls"}], [{"ep-size"}], "cuda_graph"),
    "b300-any": ([{"ep-size", "enable-nccl-nvls"}], [{"ep-size"}], "cuda_graph"),
    "rtx6000": (
        [{"ep-size", "moe-a2a-backend", "mem-fraction-static"}],
        [{"ep-size", "moe-a2a-backend"}],
        "cuda_graph",
    ),
    "flaky": ([{"enable-dp-attention", "cuda-graph-max-bs"}], [], "cuda_graph"),
    "flaky-load": ([{"env:NCCL_NVLS_ENABLE"}], [], "serving"),
    "decoy": ([{"moe-runner-backend"}], [{"enable-metrics"}], "cuda_graph"),
    "glm5": ([{"max-running-requests"}], [], "serving"),
    "k26-dp-ep": ([{"enable-dp-attention", "ep-size"}], [], "serving"),
    "crash-wrong": ([{"moe-runner-backend"}], [{"kv-cache-dtype"}], "cuda_graph"),
    "flaky-answers": ([{"speculative-algorithm"}], [], "serving"),
    "b300-checkpoint": ([{"quantization"}], [], "load_weights"),
    "compile": (
        [{"compilation-config.cudagraph_mode", "compilation-config.pass_config.enable_fusion"}],
        [{"compilation-config.max_capture_size"}],  # refused by the parser: invalid
        "cuda_graph",
    ),
}


@pytest.mark.parametrize("pair", sorted(DOCUMENTED))
def test_oracle_gives_each_shipped_pair_its_documented_answer(pair: str) -> None:
    d = LAB / pair
    exp = oracle.expected(d / "scenario.yaml", d / "good.yaml", d / "bad.yaml")
    culprits, others, phase = DOCUMENTED[pair]
    assert [set(s) for s in exp.culprits] == culprits
    assert sorted(sorted(s) for sets in exp.findings.values() for s in sets) == sorted(
        sorted(s) for s in others
    )
    assert exp.target.phase == phase
    assert exp.never_named == set(exp.deltas) - set().union(*culprits)


def test_oracle_sees_a_flaky_target_and_the_invalid_variant_as_such() -> None:
    flaky = oracle.expected(
        *(LAB / "flaky" / n for n in ("scenario.yaml", "good.yaml", "bad.yaml"))
    )
    assert flaky.flaky_target
    compile_ = oracle.expected(
        *(LAB / "compile" / n for n in ("scenario.yaml", "good.yaml", "bad.yaml"))
    )
    assert not compile_.flaky_target
    assert [f.kind for f in compile_.findings] == ["invalid"]


def _files(inc: Incident, tmp: Path) -> tuple[Path, Path, Path]:
    return inc.write(tmp / str(inc.seed), 30000, f"fuzz-{inc.seed}.service")


def _intended(inc: Incident) -> set[frozenset[str]]:
    sets = [frozenset(c.key for c in f.conds) for f in inc.faults if f.role == "target"]
    return {s for s in sets if not any(o < s for o in sets)}


def test_generated_incidents_repeat_and_stay_in_bounds() -> None:
    kinds = set()
    for seed in range(1, 301):
        inc = generate.incident(seed)
        assert inc == generate.incident(seed)
        assert 4 <= len(inc.deltas) <= 30, seed
        assert len({d.key for d in inc.deltas}) == len(inc.deltas)
        assert Incident.from_dict(inc.to_dict()) == inc
        kinds.add(bench_group(inc))
    # every failure and cause is drawn
    assert {k.split(",")[0] for k in kinds} == {"crash", "hang", "load", "answers"}
    assert {k.split(", ")[1] for k in kinds} == {"single", "interacting", "independent"}


def bench_group(inc: Incident) -> str:
    kind = next(f for f in inc.features if f in ("crash", "hang", "load", "answers"))
    cause = next(f for f in inc.features if f in ("single", "interacting", "independent"))
    return f"{kind}, {cause}"


def test_the_oracle_finds_what_the_generator_meant(tmp_path: Path) -> None:
    """The generator's target rules, minimal, are the oracle's culprit sets, and its first
    target rule's failure the target: the masking of decoys holds on every seed."""
    for seed in range(1, 161):
        inc = generate.incident(seed)
        exp = oracle.expected(*_files(inc, tmp_path))
        assert set(exp.culprits) == _intended(inc), seed
        first = inc.faults[0]
        assert exp.target.phase == first.phase and exp.target.kind == first.effect, seed
        assert exp.flaky_target == (first.probability is not None), seed


B300 = [LAB / "b300" / n for n in ("scenario.yaml", "good.yaml", "bad.yaml")]
B300_DELTAS = ["~ --max-running-requests 128 -> 256", "+ --ep-size 8", "+ --enable-nccl-nvls"]
TARGET = "cuda_graph: cublas: CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemm..."


def _answer(status: str, indices: list[int], target: str = TARGET) -> dict:
    return {
        "status": status,
        "target": target,
        "deltas": B300_DELTAS,
        "culprits": [{"indices": indices}],
        "findings": [],
        "confidence": 0.99,
    }


def _judge(answer: dict, output: str = "") -> judge.Judgement:
    truth = oracle.Oracle(*B300)
    return judge.judge(
        truth, truth.expected(), answer, exit_code=0, output=output, runs=[], left=[]
    )


def test_delta_labels_read_as_the_oracles_keys() -> None:
    assert [judge.delta_key(x) for x in B300_DELTAS] == [
        "max-running-requests",
        "ep-size",
        "enable-nccl-nvls",
    ]
    assert judge.delta_key("+ env NCCL_ALGO=Tree") == "env:NCCL_ALGO"
    assert judge.delta_key("- env NCCL_DEBUG (was WARN)") == "env:NCCL_DEBUG"
    assert judge.delta_key("~ --compilation-config.level 2 -> 3") == "compilation-config.level"


def test_the_judge_tells_a_wrong_answer_from_a_right_one() -> None:
    assert _judge(_answer("found", [1, 2])).kind == "right"
    wrong = _judge(_answer("found", [0]))
    assert wrong.kind == "wrong"
    assert "named what must never be: max-running-requests" in wrong.problems[0]
    assert _judge(_answer("found", [1, 2], target="init: AttributeError: x")).kind == "wrong"
    # below the confidence: counted, not wrong, and the best answer is said
    unsure = _judge(_answer("unsure", [0]))
    assert unsure.kind == "unsure" and unsure.problems[0].startswith("best answer: culprits")
    assert _judge(_answer("found", [1, 2]), output="Traceback (most recent call last):").kind == (
        "wrong"
    )
    assert _judge({"status": "error", "error": "boom"}).kind == "wrong"
    # stopped before it listed its deltas (Ctrl-C, SIGTERM): not concluded, not wrong
    stopped = _judge({"status": "interrupted", "message": "interrupted", "deltas": []})
    assert stopped.kind == "unconcluded" and stopped.problems == ["status interrupted: interrupted"]


def test_the_shrinker_keeps_what_still_fails(tmp_path: Path) -> None:
    """Shrunk against a predicate of the oracle alone (its culprit sets unchanged), an
    incident with decoys and idle deltas keeps only its cause and its target rule."""
    inc = next(
        i
        for i in map(generate.incident, range(1, 500))
        if "decoy" in i.features and "single" in i.features and len(i.deltas) > 10
    )
    want = oracle.expected(*_files(inc, tmp_path)).culprits
    calls = []

    def same_culprits(candidate: Incident) -> bool:
        calls.append(candidate)
        try:
            return oracle.expected(*_files(candidate, tmp_path)).culprits == want
        except oracle.OracleError:
            return False

    small = shrink.minimize(inc, same_culprits, budget=100)
    assert [d.key for d in small.deltas] == sorted(want[0])
    assert len(small.faults) == 1 and small.faults[0].role == "target"
    assert shrink.minimize(inc, same_culprits, budget=2) != small  # the budget holds
    assert len(calls) <= 102


def test_a_regression_case_round_trips(tmp_path: Path) -> None:
    inc = generate.incident(7)
    res = Result(inc, "wrong", ["culprits {a}, expected {b}"], expected={"x": 1})
    path = cases.save(res, tmp_path, xfail="sglang#0: not fixed")
    [case] = cases.load_all(tmp_path)
    assert path.name == "seed-7.yaml" and case.incident == inc
    assert case.xfail == "sglang#0: not fixed" and case.found == res.problems
    assert shrink.category(case.found[0]) == "culprits"
