"""Lab scenarios: loading, validation messages, rule matching, draws, and the shipped files."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import pytest

from orchestrator.lab import cmdline
from orchestrator.lab import scenario as sc
from orchestrator.lab.scenario import ScenarioError


def write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load_text(tmp_path: Path, text: str) -> sc.Scenario:
    return sc.load(write(tmp_path, text))


# ---------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    ("cond", "flags", "expected"),
    [
        ("8", {"ep-size": 8}, True),
        ("8", {"ep-size": 4}, False),
        ("8", {}, False),
        ("0.92", {"mem-fraction-static": 0.92}, True),
        ("8.0", {"ep-size": 8}, True),  # numbers compare numerically
        ("flashinfer", {"moe-a2a-backend": "flashinfer"}, True),
        ("'8'", {"ep-size": 8}, True),  # text compares with the value's text: "8"
        ("'8.0'", {"ep-size": 8}, False),  # ... which is "8"
        ("'0.92'", {"mem-fraction-static": 0.92}, True),
        ("'true'", {"enable-nccl-nvls": True}, True),  # a switch's text
        ("{in: ['4', 8]}", {"ep-size": 4}, True),
        ("{ne: '8'}", {"ep-size": 8}, False),
        ("true", {"enable-nccl-nvls": True}, True),
        ("true", {"enable-nccl-nvls": "yes"}, True),  # present with any value
        ("true", {}, False),
        ("false", {}, True),
        ("false", {"enable-nccl-nvls": True}, False),
        ("{lt: 0.92}", {"mem-fraction-static": 0.9}, True),
        ("{lt: 0.92}", {"mem-fraction-static": 0.92}, False),
        ("{le: 0.92}", {"mem-fraction-static": 0.92}, True),
        ("{gt: 256}", {"max-running-requests": 512}, True),
        ("{gt: 256}", {"max-running-requests": 256}, False),
        ("{gt: 256}", {}, False),
        ("{gt: 256}", {"max-running-requests": "many"}, False),
        ("{ge: 256}", {"max-running-requests": 256}, True),
        ("{ne: 8}", {"ep-size": 4}, True),
        ("{ne: 8}", {"ep-size": 8}, False),
        ("{ne: 8}", {}, True),
        ("{in: [4, 8]}", {"ep-size": 8}, True),
        ("{in: [4, 8]}", {"ep-size": 2}, False),
        ("[1, 2, 4]", {"cuda-graph-bs": [1, 2, 4]}, True),
        ("[1, 2, 4]", {"cuda-graph-bs": [1, 2]}, False),
    ],
)
def test_condition_kinds(tmp_path: Path, cond: str, flags: dict, expected: bool) -> None:
    key = next(iter(flags), "ep-size")
    s = load_text(
        tmp_path,
        f"faults:\n  - when: {{{key}: {cond}}}\n    phase: init\n    error: 'RuntimeError: x'\n",
    )
    assert (s.select_fault(flags, {}, 0) is not None) is expected


@pytest.mark.parametrize(
    ("cond", "value", "expected"),
    [
        ("'1'", "1", True),  # quoted: the env value's text
        ("1", "1", True),  # a number: numerically
        ("1", "1.0", True),
        ("'1'", "1.0", False),  # text is text
        ("'1.0'", "1.0", True),
        ("'01'", "01", True),
        ("'01'", "1", False),
        ("Tree", "Tree", True),
        ("Tree", "tree", False),
        ("{ne: '1'}", "1", False),
        ("{ne: '1'}", "2", True),
        ("{in: ['1', 2]}", "1", True),
        ("{in: ['1', 2]}", "2", True),
        ("{in: ['1', 2]}", "3", False),
        ("{gt: 4}", "8", True),  # order: numbers only
        ("{gt: 4}", "many", False),
        ("true", "", True),  # set, even empty
    ],
)
def test_env_conditions_compare_the_same_way_whatever_the_quoting(
    tmp_path: Path, cond: str, value: str, expected: bool
) -> None:
    """An env value is text: a condition written as text ("1") compares with that text, one
    written as a number (1) compares numerically; before, "1" silently never matched the
    env value 1 (the value was read as a number, the condition was not)."""
    s = load_text(
        tmp_path,
        f"faults:\n  - when: {{env: {{NCCL_X: {cond}}}}}\n"
        "    phase: init\n    error: 'RuntimeError: x'\n",
    )
    assert (s.select_fault({}, {"NCCL_X": value}, 0) is not None) is expected
    # a flag's condition compares the same way (with the flag's text as the server read
    # it: `01` was read as 1, so its text is "1")
    s = load_text(
        tmp_path,
        f"faults:\n  - when: {{x: {cond}}}\n    phase: init\n    error: 'RuntimeError: x'\n",
    )
    flags = cmdline.parse_permissive(["--x", value] if value else ["--x"])
    if value and str(flags["x"]) == value:
        assert (s.select_fault(flags, {}, 0) is not None) is expected, flags


def test_a_quoted_default_is_read_as_the_command_line_would_be(tmp_path: Path) -> None:
    s = load_text(
        tmp_path,
        """
defaults: {mem-fraction-static: "0.85"}
faults:
  - when: {mem-fraction-static: {lt: 0.9}}
    phase: kv_cache
    error: "RuntimeError: Not enough memory."
""",
    )
    assert s.select_fault({}, {}, 0) is not None
    assert s.select_fault({"mem-fraction-static": 0.95}, {}, 0) is None


def test_first_matching_rule_wins_and_all_conditions_must_hold(tmp_path: Path) -> None:
    s = load_text(
        tmp_path,
        """
faults:
  - when: {ep-size: 8, enable-nccl-nvls: true}
    phase: cuda_graph
    error: "RuntimeError: CUBLAS"
  - when: {ep-size: 8}
    phase: init
    error: "AttributeError: dtype"
""",
    )
    both = s.select_fault({"ep-size": 8, "enable-nccl-nvls": True}, {}, 0)
    assert both is not None and both.phase == "cuda_graph"
    alone = s.select_fault({"ep-size": 8}, {}, 0)
    assert alone is not None and alone.phase == "init"
    assert s.select_fault({"enable-nccl-nvls": True}, {}, 0) is None


def test_env_conditions_and_defaults(tmp_path: Path) -> None:
    s = load_text(
        tmp_path,
        """
defaults: {mem-fraction-static: 0.88}
faults:
  - when: {env: {NCCL_ALGO: Tree}}
    phase: warmup
    error: "RuntimeError: NCCL"
  - when: {mem-fraction-static: {lt: 0.9}}
    phase: kv_cache
    error: "RuntimeError: Not enough memory."
""",
    )
    assert s.select_fault({"mem-fraction-static": 0.95}, {"NCCL_ALGO": "Tree"}, 0).phase == "warmup"
    assert s.select_fault({"mem-fraction-static": 0.95}, {"NCCL_ALGO": "Ring"}, 0) is None
    # absent flag: the scenario's default (0.88) is what the server would use
    assert s.select_fault({}, {}, 0).phase == "kv_cache"


def test_probability_is_deterministic_per_seed_and_varies_across_seeds(tmp_path: Path) -> None:
    s = load_text(
        tmp_path,
        """
faults:
  - when: {}
    phase: warmup
    probability: 0.5
    error: "RuntimeError: flaky"
""",
    )
    flags = {"tp-size": 8}
    outcomes = [s.select_fault(flags, {}, seed) is not None for seed in range(40)]
    again = [s.select_fault(flags, {}, seed) is not None for seed in range(40)]
    assert outcomes == again
    assert any(outcomes) and not all(outcomes)
    # the lab's own flags and the port do not change the draw
    with_port = [
        s.select_fault({**flags, "port": 1234}, {}, seed) is not None for seed in range(40)
    ]
    assert with_port == outcomes


def test_throughput_factors_multiply(tmp_path: Path) -> None:
    s = load_text(
        tmp_path,
        """
throughput:
  base: 2400
  factors:
    - when: {cuda-graph-max-bs: 512}
      multiply: 0.9
    - when: {enable-torch-compile: true}
      multiply: 1.1
""",
    )
    assert s.tokens_per_second({"cuda-graph-max-bs": 128}, {}) == pytest.approx(2400)
    assert s.tokens_per_second({"cuda-graph-max-bs": 512}, {}) == pytest.approx(2160)
    both = {"cuda-graph-max-bs": 512, "enable-torch-compile": True}
    assert s.tokens_per_second(both, {}) == pytest.approx(2376)


def test_aliases_fold_onto_canonical_names(tmp_path: Path) -> None:
    s = load_text(
        tmp_path,
        "faults:\n  - when: {tensor-parallel-size: 8}\n    phase: init\n"
        "    error: 'RuntimeError: x'\n",
    )
    assert s.select_fault(cmdline.parse_permissive(["--tp-size", "8"]), {}, 0) is not None


def test_permissive_parsing() -> None:
    flags = cmdline.parse_permissive(
        [
            "--model-path",
            "/m",
            "--enable-nccl-nvls",
            "--tp",
            "8",
            "--mem-fraction-static=0.92",
            "--cuda-graph-bs",
            "1",
            "2",
            "4",
            "--trust-remote-code",
        ]
    )
    assert flags == {
        "model-path": "/m",
        "enable-nccl-nvls": True,
        "tp": 8,
        "mem-fraction-static": 0.92,
        "cuda-graph-bs": [1, 2, 4],
        "trust-remote-code": True,
    }
    with pytest.raises(cmdline.UsageError, match="unrecognized arguments: stray"):
        cmdline.parse_permissive(["stray", "--x"])


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            "faults:\n  - when: {ep-size: 8}\n    phase: cuda_grahp\n    error: x\n",
            "faults[0].phase: expected one of args, init",
        ),
        ("faults:\n  - when: {ep-size: 8}\n    phase: init\n", "faults[0].error: missing"),
        (
            "faults:\n  - when: {ep-size: 8}\n    phase: init\n    eror: x\n",
            "faults[0].eror: unknown key (did you mean 'error'?)",
        ),
        (
            "faults:\n  - when: {ep-size: {lt: 1, gt: 0}}\n    phase: init\n    error: x\n",
            "faults[0].when.ep-size: expected exactly one of",
        ),
        (
            "faults:\n  - when: {ep-size: {between: 1}}\n    phase: init\n    error: x\n",
            "faults[0].when.ep-size.between: unknown key",
        ),
        (
            "faults:\n  - when: {mem: {lt: low}}\n    phase: init\n    error: x\n",
            "faults[0].when.mem.lt: expected a number",
        ),
        (
            "faults:\n  - when: {a: 1}\n    phase: init\n    after_requests: 3\n    error: x\n",
            "faults[0].after_requests: only a 'serving' phase rule",
        ),
        (
            "faults:\n  - when: {a: 1}\n    phase: warmup\n    probability: 1.5\n    error: x\n",
            "faults[0].probability: expected a number in (0, 1]",
        ),
        (
            "faults:\n  - when: {a: 1}\n    phase: args\n    effect: hang\n",
            "faults[0].effect: an 'args' rule cannot hang",
        ),
        ("startup: {init: -1}\n", "startup.init: expected a number >= 0"),
        ("startup: {boot: 1}\n", "startup.boot: unknown key"),
        ("throughput: {factors: []}\n", "throughput.base: missing"),
        ("known_flags: sglang-9\n", "known_flags: unknown preset 'sglang-9'"),
        (
            "known_flags: [model-path, {enable-x: toggle}]\n",
            "known_flags[1].enable-x: expected one of value, switch, list",
        ),
        ("faults: {when: {}}\n", "faults: expected a list of rules"),
        ("seed: many\n", "seed: expected a whole number"),
        ("nmae: x\n", "nmae: unknown key (did you mean 'name'?)"),
        ("faults: [\n", "not valid YAML at line"),
        ("", "the file is empty"),
    ],
)
def test_bad_scenarios_name_file_key_and_expectation(
    tmp_path: Path, text: str, fragment: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        sc.load(path)
    message = str(info.value)
    assert str(path) in message
    assert fragment in message
    assert "\n" not in message


def test_resolve_bare_names_and_paths(tmp_path: Path) -> None:
    assert sc.resolve("b300") == sc.repo_root() / "experiments" / "lab" / "b300" / "scenario.yaml"
    path = write(tmp_path, "name: x\n")
    assert sc.resolve(str(path)) == path
    with pytest.raises(ScenarioError, match="no scenario named 'b30'.*did you mean 'b300'"):
        sc.resolve("b30")
    with pytest.raises(ScenarioError, match="scenario file not found"):
        sc.resolve(str(tmp_path / "missing.yaml"))


# ---------------------------------------------------------------------------- shipped files


@pytest.mark.parametrize(
    "name",
    [
        "b300",
        "b300-v0523",
        "rtx6000",
        "rtx6000-repair",
        "glm5",
        "flaky-load",
        "decoy",
        "k26-dp-ep",
        "crash-wrong",
        "flaky-answers",
        "drift",
    ],
)
def test_shipped_scenarios_load_and_start_in_2_to_3_seconds(name: str) -> None:
    s = sc.load(name)
    assert s.name == name
    assert 2.0 <= s.startup_total() <= 3.0
    assert s.known_flags is not None


def test_b300_rules_match_the_incident() -> None:
    s = sc.load("b300")
    good = {
        "model-path": "/models/Kimi-K2.6",
        "tp-size": 8,
        "max-running-requests": 128,
        "cuda-graph-max-bs": 128,
        "mem-fraction-static": 0.85,
        "trust-remote-code": True,
    }
    assert s.select_fault(good, {}, 0) is None
    bad = {**good, "ep-size": 8, "enable-nccl-nvls": True, "max-running-requests": 256}
    rule = s.select_fault(bad, {}, 0)
    assert rule.phase == "cuda_graph" and "CUBLAS_STATUS_EXECUTION_FAILED" in rule.error
    assert "cublasGemmStridedBatchedEx(" in rule.error
    ep8 = s.select_fault({**good, "ep-size": 8}, {}, 0)
    assert ep8.phase == "init"
    assert ep8.error == "AttributeError: 'NoneType' object has no attribute 'dtype'"
    assert s.select_fault({**good, "max-running-requests": 256}, {}, 0) is None
    assert s.select_fault({**good, "enable-nccl-nvls": True}, {}, 0) is None


def test_rtx6000_rules_match_the_incident() -> None:
    s = sc.load("rtx6000")
    ep = {"tp-size": 8, "ep-size": 8, "moe-a2a-backend": "flashinfer"}
    oom = s.select_fault({**ep, "mem-fraction-static": 0.85}, {}, 0)
    assert oom.phase == "kv_cache"
    assert oom.error == (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    )
    assert s.select_fault(ep, {}, 0).phase == "kv_cache"  # default 0.88 is below 0.92
    capture = s.select_fault({**ep, "mem-fraction-static": 0.92}, {}, 0)
    assert capture.phase == "cuda_graph" and capture.error == "AssertionError"
    assert (
        s.select_fault(
            {"tp-size": 8, "mem-fraction-static": 0.92, "moe-a2a-backend": "flashinfer"}, {}, 0
        )
        is None
    )
    slow = s.tokens_per_second({"cuda-graph-max-bs": 512}, {})
    assert slow == pytest.approx(0.9 * s.tokens_per_second({"cuda-graph-max-bs": 128}, {}))
    assert {f.name for f in s.known_flags} >= {"cuda-graph-max-bs", "moe-a2a-backend"}


def test_glm5_crashes_only_under_load_with_high_max_running_requests() -> None:
    s = sc.load("glm5")
    rule = s.select_fault({"max-running-requests": 512, "port": 8000}, {}, 0)
    assert rule.phase == "serving" and rule.after_requests == 40
    assert "an illegal memory access was encountered" in rule.error
    assert s.select_fault({"max-running-requests": 256, "port": 8000}, {}, 0) is None


def test_v0523_splits_cuda_graph_max_bs() -> None:
    names = {f.name for f in sc.load("b300-v0523").known_flags}
    assert {"cuda-graph-max-bs-decode", "cuda-graph-max-bs-prefill"} <= names
    assert "cuda-graph-max-bs" not in names


# ---------------------------------------------------------------------------- lab pairs
# The experiment YAMLs beside each scenario document the intended bisection answer. Check
# it exhaustively: apply every subset of the good->bad deltas to good, parse the command
# line with the scenario's real parser, and find the minimal subsets that reproduce bad's
# outcome. (The config loader is the main program's; the scenario side is the lab's.)

EXPERIMENTS = sc.repo_root() / "experiments" / "lab"


def _outcome(scen: sc.Scenario, argv: list[str], env: dict[str, str]) -> tuple[object, float]:
    assert argv[1:4] == ["-m", "orchestrator.lab.server", "--scenario"], argv
    assert sc.load(argv[4]).name == scen.name
    flags = (
        cmdline.parse_strict(argv[5:], scen.known_flags)
        if scen.known_flags is not None
        else cmdline.parse_permissive(argv[5:])
    )
    rule = scen.select_fault(flags, env, scen.seed)
    return (rule.index if rule else None), scen.tokens_per_second(flags, env)


Outcome = tuple[object, float]  # (index of the fault rule that fires or None, tok/s)


def _argv(exec_words: tuple[str, ...], flags: dict[str, object]) -> list[str]:
    argv = list(exec_words)
    for name, value in flags.items():
        argv.append(f"--{name}")
        if value is not True:
            argv.extend(str(v) for v in (value if isinstance(value, tuple) else (value,)))
    return argv


def _minimal_culprits(
    pair: str,
    good_file: str,
    bad_file: str,
    fails: Callable[[Outcome, Outcome], bool] | None = None,
    certain: bool = False,
) -> tuple[list[set[str]], Outcome]:
    """Minimal delta sets that make good fail like bad (by default: the same fault rule)."""
    from orchestrator.config.loading import load_experiment

    good = load_experiment(EXPERIMENTS / pair / good_file)
    bad = load_experiment(EXPERIMENTS / pair / bad_file)
    scen = sc.load(EXPERIMENTS / pair / "scenario.yaml")
    if certain:  # a flaky rule taken as firing whenever it holds: the subsets that can fail
        scen = replace(scen, faults=tuple(replace(r, probability=None) for r in scen.faults))
    gf, bf = good.flag_map(), bad.flag_map()
    ge, be = good.env_map(), bad.env_map()
    deltas = sorted(
        {k for k in gf.keys() | bf.keys() if gf.get(k) != bf.get(k)}
        | {f"env:{k}" for k in ge.keys() | be.keys() if ge.get(k) != be.get(k)}
    )

    def run(subset: tuple[str, ...]) -> Outcome:
        flags, env = dict(gf), dict(ge)
        for d in subset:
            src, dst, key = (be, env, d[4:]) if d.startswith("env:") else (bf, flags, d)
            if key in src:
                dst[key] = src[key]
            else:
                dst.pop(key, None)
        return _outcome(scen, _argv(good.exec, flags), env)

    base, target = run(()), run(tuple(deltas))
    if fails is None:

        def fails(o: Outcome, _base: Outcome) -> bool:
            return o[0] is not None and o[0] == target[0]

    hits = [
        set(s)
        for n in range(len(deltas) + 1)
        for s in combinations(deltas, n)
        if fails(run(s), base)
    ]
    return [s for s in hits if not any(o < s for o in hits)], target


def test_b300_pair_answer_is_the_interacting_pair() -> None:
    minimal, (rule, _) = _minimal_culprits("b300", "good.yaml", "bad.yaml")
    assert rule == 0
    assert minimal == [{"ep-size", "enable-nccl-nvls"}]


def test_b300_v0523_pair_has_the_same_answer() -> None:
    minimal, (rule, _) = _minimal_culprits("b300-v0523", "good.yaml", "bad.yaml")
    assert rule == 0
    assert minimal == [{"ep-size", "enable-nccl-nvls"}]


def test_b300_any_pair_without_known_flags_has_the_same_answer() -> None:
    assert sc.load("b300-any").known_flags is None  # any flag accepted, as its help says
    minimal, (rule, _) = _minimal_culprits("b300-any", "good.yaml", "bad.yaml")
    assert rule == 0
    assert minimal == [{"ep-size", "enable-nccl-nvls"}]


def test_rtx6000_pair_answer_needs_three_flags() -> None:
    minimal, (rule, _) = _minimal_culprits("rtx6000", "good.yaml", "bad.yaml")
    assert rule == 1  # the AssertionError in cuda_graph, not the kv_cache OOM
    assert minimal == [{"ep-size", "moe-a2a-backend", "mem-fraction-static"}]


def test_rtx6000_repair_pair_answer_shows_only_with_the_memory_repaired() -> None:
    """As shipped, every EP subset runs out of memory (rule 0) and the smallest cause is
    --ep-size alone; with the memory fraction repaired to 0.92 (what the pair's declared
    move reaches in one step) the target is the AssertionError (rule 1) and its cause is
    {ep-size, moe-a2a-backend}."""
    from orchestrator.config.loading import load_experiment

    minimal, (rule, _) = _minimal_culprits("rtx6000-repair", "good.yaml", "bad.yaml")
    assert rule == 0 and minimal == [{"ep-size"}]
    scen = sc.load("rtx6000-repair")
    good = load_experiment(EXPERIMENTS / "rtx6000-repair" / "good.yaml")
    bad = load_experiment(EXPERIMENTS / "rtx6000-repair" / "bad.yaml")
    gf, bf = good.flag_map(), bad.flag_map()
    deltas = sorted(k for k in gf.keys() | bf.keys() if gf.get(k) != bf.get(k))
    assert deltas == ["ep-size", "max-running-requests", "moe-a2a-backend"]

    def repaired(subset: tuple[str, ...]) -> object:
        flags = dict(gf) | {k: bf[k] for k in subset} | {"mem-fraction-static": 0.92}
        return _outcome(scen, _argv(good.exec, flags), {})[0]

    assert repaired(tuple(deltas)) == 1
    hits = [
        set(s) for n in range(len(deltas) + 1) for s in combinations(deltas, n) if repaired(s) == 1
    ]
    assert [s for s in hits if not any(o < s for o in hits)] == [{"ep-size", "moe-a2a-backend"}]


def test_rtx6000_perf_pair_answer_is_cuda_graph_max_bs() -> None:
    minimal, (rule, rate) = _minimal_culprits(
        "rtx6000",
        "perf_good.yaml",
        "perf_bad.yaml",
        fails=lambda o, base: o[0] is None and o[1] < 0.95 * base[1],
    )
    assert rule is None
    assert minimal == [{"cuda-graph-max-bs"}]


def test_glm5_pair_answer_is_max_running_requests() -> None:
    minimal, (rule, _) = _minimal_culprits("glm5", "good.yaml", "bad.yaml")
    assert sc.load("glm5").faults[rule].after_requests == 40
    assert minimal == [{"max-running-requests"}]


@pytest.mark.slow
def test_flaky_pair_answer_is_dp_attention_with_the_bigger_graph_batch() -> None:
    minimal, (rule, _) = _minimal_culprits("flaky", "good.yaml", "bad.yaml", certain=True)
    assert minimal == [{"enable-dp-attention", "cuda-graph-max-bs"}]
    scen = sc.load("flaky")
    assert scen.seed is None  # `seed: random`
    fault = scen.faults[rule]
    assert fault.phase == "cuda_graph" and fault.probability == 0.5
    assert "operation not permitted when stream is capturing" in fault.error


def test_flaky_load_pair_answer_is_one_environment_variable_under_load() -> None:
    minimal, (rule, _) = _minimal_culprits("flaky-load", "good.yaml", "bad.yaml", certain=True)
    assert minimal == [{"env:NCCL_NVLS_ENABLE"}]
    scen = sc.load("flaky-load")
    assert scen.seed is None  # `seed: random`
    fault = scen.faults[rule]
    assert fault.phase == "serving" and fault.after_requests == 40  # only the probe sees it
    assert fault.probability == 0.5


def test_decoy_pair_answer_is_the_moe_runner_and_the_decoy_fails_differently() -> None:
    minimal, (rule, _) = _minimal_culprits("decoy", "good.yaml", "bad.yaml")
    assert minimal == [{"moe-runner-backend"}]
    scen = sc.load("decoy")
    target, decoy = scen.faults
    assert rule == target.index and target.probability is None  # on every start
    assert decoy.probability == 0.5 and decoy.phase == "warmup"  # after the target's phase
    assert decoy.error != target.error
    assert {c.key for c in decoy.when.flags} == {"enable-metrics"}


def test_seed_random_is_accepted_and_other_words_are_refused(tmp_path: Path) -> None:
    assert load_text(tmp_path, "seed: random\n").seed is None
    assert load_text(tmp_path, "seed: 12\n").seed == 12
    assert load_text(tmp_path, "name: x\n").seed == 0
    with pytest.raises(sc.ScenarioError, match="seed: expected a whole number or 'random'"):
        load_text(tmp_path, "seed: sometimes\n")
