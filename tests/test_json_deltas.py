"""Flags whose values are JSON objects: each changed key path is a delta of its own, a
variant's value is rebuilt as JSON in the original key order, the cache key reads the
canonical JSON, and the lab's scenarios take conditions on key paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.campaign.planning import make_plan
from orchestrator.config import jsonvalue
from orchestrator.config.experiment import Experiment
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import PlanError
from orchestrator.lab import cmdline
from orchestrator.lab import scenario as sc
from orchestrator.planner import Planner, make_strategy
from orchestrator.planner.deltas import Delta, apply_deltas, check_differ, diff
from tests.support.planner_drive import drive

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "experiments" / "real" / "vllm-cpu"
LAB = REPO / "experiments" / "lab"


def _exp(flags: dict, env: dict | None = None) -> Experiment:
    return Experiment.from_dict(
        {
            "name": "x",
            "service": {
                "exec": "vllm serve /m",
                "flags": {**flags, "port": 8000},
                "env": env or {},
            },
        }
    )


def _value(exp: Experiment, flag: str) -> object:
    return exp.flag_map().get(flag)


# ---- deltas -------------------------------------------------------------------------------


def test_each_changed_key_is_a_delta_named_by_its_key_path() -> None:
    good = _exp({"hf-overrides": '{"max_position_embeddings": 2048}'})
    bad = _exp({"hf-overrides": '{"max_position_embeddings": 4096, "head_dim": 16}', "seed": 7})
    deltas = diff(good, bad)
    assert [d.describe() for d in deltas] == [
        "~ --hf-overrides.max_position_embeddings 2048 -> 4096",
        "+ --hf-overrides.head_dim 16",
        "+ --seed 7",
    ]
    assert [d.short() for d in deltas] == [
        "--hf-overrides.max_position_embeddings 4096",
        "--hf-overrides.head_dim 16",
        "--seed 7",
    ]
    assert deltas[1].to_dict() == {
        "kind": "json",
        "key": "hf-overrides",
        "old": None,
        "new": "16",
        "path": ["head_dim"],
        "name": "hf-overrides.head_dim",
    }
    # as recorded (a report rebuilds the labels from the campaign's spec)
    assert Delta.from_dict(deltas[1].to_dict()).describe() == "+ --hf-overrides.head_dim 16"


def test_variants_are_rebuilt_as_json_in_the_original_key_order() -> None:
    good = _exp({"hf-overrides": '{"max_position_embeddings": 2048}'})
    bad = _exp({"hf-overrides": '{"max_position_embeddings": 4096,  "head_dim": 16}'})
    size, head = diff(good, bad)
    assert (
        _value(apply_deltas(good, [head]), "hf-overrides")
        == '{"max_position_embeddings": 2048, "head_dim": 16}'
    )
    assert _value(apply_deltas(good, [size]), "hf-overrides") == '{"max_position_embeddings": 4096}'
    # all of them: bad's own text, spacing included, so the bad endpoint is bad exactly
    assert (
        _value(apply_deltas(good, [size, head]), "hf-overrides")
        == '{"max_position_embeddings": 4096,  "head_dim": 16}'
    )
    assert apply_deltas(good, []).argv() == good.argv()


def test_nested_keys_removed_keys_and_their_order() -> None:
    good = _exp(
        {
            "compilation-config": json.dumps(
                {
                    "level": 3,
                    "cudagraph_mode": "PIECEWISE",
                    "pass_config": {"enable_fusion": False, "enable_noop": True},
                    "splitting_ops": ["a"],
                }
            )
        }
    )
    bad = _exp(
        {
            "compilation-config": json.dumps(
                {
                    "cudagraph_mode": "FULL",
                    "pass_config": {
                        "enable_fusion": True,
                        "enable_noop": True,
                        "enable_attn_fusion": True,
                    },
                    "splitting_ops": ["a", "b"],
                    "max_capture_size": 32,
                }
            )
        }
    )
    deltas = diff(good, bad)
    assert [d.name for d in deltas] == [
        "compilation-config.cudagraph_mode",
        "compilation-config.pass_config.enable_fusion",
        "compilation-config.pass_config.enable_attn_fusion",
        "compilation-config.splitting_ops",
        "compilation-config.max_capture_size",
        "compilation-config.level",
    ]
    assert deltas[0].describe() == "~ --compilation-config.cudagraph_mode PIECEWISE -> FULL"
    assert (
        deltas[3].describe() == '~ --compilation-config.splitting_ops ["a"] -> ["a", "b"]'
    )  # a list: one value
    assert deltas[5].describe() == "- --compilation-config.level (was 3)"
    fusion, attn, level = deltas[1], deltas[2], deltas[5]
    # a removed key leaves its place; an added nested key goes where bad has it
    v = json.loads(_value(apply_deltas(good, [level, attn]), "compilation-config"))
    assert list(v) == ["cudagraph_mode", "pass_config", "splitting_ops"]
    assert list(v["pass_config"]) == ["enable_fusion", "enable_noop", "enable_attn_fusion"]
    assert v["pass_config"]["enable_fusion"] is False
    v = json.loads(_value(apply_deltas(good, [fusion]), "compilation-config"))
    assert list(v) == ["level", "cudagraph_mode", "pass_config", "splitting_ops"]
    assert v["pass_config"] == {"enable_fusion": True, "enable_noop": True}


def test_an_option_absent_on_one_side_is_split_against_an_empty_object() -> None:
    good = _exp({})
    bad = _exp({"speculative-config": '{"method": "eagle3", "num_speculative_tokens": 4}'})
    method, tokens = diff(good, bad)
    assert (method.describe(), tokens.describe()) == (
        "+ --speculative-config.method eagle3",
        "+ --speculative-config.num_speculative_tokens 4",
    )
    assert (
        _value(apply_deltas(good, [tokens]), "speculative-config")
        == '{"num_speculative_tokens": 4}'
    )
    # nothing of it applied: absent, as in good; all of it: bad's text
    assert "speculative-config" not in apply_deltas(good, [_other_delta()]).flag_map()
    assert (
        _value(apply_deltas(good, [method, tokens]), "speculative-config")
        == bad.flag_map()["speculative-config"]
    )
    # removed in bad: each key is removed on its own; all removed is the option absent
    back = diff(bad, good)
    assert [d.describe() for d in back] == [
        "- --speculative-config.method (was eagle3)",
        "- --speculative-config.num_speculative_tokens (was 4)",
    ]
    assert (
        _value(apply_deltas(bad, back[:1]), "speculative-config") == '{"num_speculative_tokens": 4}'
    )
    assert "speculative-config" not in apply_deltas(bad, back).flag_map()


def _other_delta() -> Delta:
    return Delta("env", "X", None, "1")


def test_one_delta_when_not_json_when_no_split_or_when_secret(monkeypatch) -> None:
    good = _exp({"hf-overrides": '{"a": 1}', "model-impl": "auto"})
    bad = _exp({"hf-overrides": "/etc/overrides.json", "model-impl": "vllm"})
    assert [d.kind for d in diff(good, bad)] == ["flag", "flag"]  # one side is no JSON object
    lists = diff(_exp({"x": "[1, 2]"}), _exp({"x": "[1, 2, 4]"}))
    assert [d.kind for d in lists] == ["flag"]  # a list is one value
    bad = _exp({"hf-overrides": '{"a": 2, "b": 3}'})
    assert [d.kind for d in diff(good, bad, split=False)] == ["flag", "flag"]
    assert [d.kind for d in diff(good, bad)] == ["json", "json", "flag"]
    # a secret value is never taken apart: its keys would end up in labels
    monkeypatch.setenv("OVERRIDES", '{"api_key": "hunter2", "b": 1}')
    secret = Experiment.from_dict(
        {
            "name": "s",
            "service": {
                "exec": "vllm serve /m",
                "flags": {"hf-overrides": "${OVERRIDES}", "port": 8000},
            },
        },
        resolve_secrets=False,
    )
    assert secret.flag_map()["hf-overrides"].startswith("{")
    [d] = diff(_exp({"hf-overrides": '{"a": 1}'}), secret)
    assert d.kind == "flag" and d.key == "hf-overrides"


def test_key_order_and_spacing_are_no_change() -> None:
    good = _exp({"compilation-config": '{"level": 3, "cudagraph_mode": "FULL"}'})
    bad = _exp({"compilation-config": '{ "cudagraph_mode":"FULL",\n "level":3 }'})
    assert diff(good, bad) == [] and diff(good, bad, split=False) == []
    with pytest.raises(PlanError, match="launch the same server"):
        check_differ(diff(good, bad), good, bad)
    # ... and the cache key holds the canonical JSON, while the argv keeps the text
    assert good.fingerprint() == bad.fingerprint()
    assert good.argv() != bad.argv()
    assert _exp({"compilation-config": '{"level": 2}'}).fingerprint() != good.fingerprint()
    # values that are no JSON are compared as text, as always
    assert _exp({"x": "a b"}).fingerprint() != _exp({"x": "a  b"}).fingerprint()
    assert (
        jsonvalue.canonical('{"b": [1, {"d": 1, "c": 2}], "a": null}')
        == '{"a":null,"b":[1,{"c":2,"d":1}]}'
    )
    assert jsonvalue.canonical("8") is None and jsonvalue.canonical("{not json") is None


def test_json_null_is_a_value_not_an_absence() -> None:
    good = _exp({"hf-overrides": '{"rope_scaling": {"type": "yarn"}}'})
    bad = _exp({"hf-overrides": '{"rope_scaling": null}'})
    [d] = diff(good, bad)
    assert (d.name, d.old, d.new) == ("hf-overrides.rope_scaling", '{"type": "yarn"}', "null")
    assert _value(apply_deltas(good, [d]), "hf-overrides") == '{"rope_scaling": null}'


def test_plan_of_the_real_pair_names_the_sub_keys_and_no_split_keeps_one() -> None:
    plan = make_plan(REAL / "hf_overrides_good.yaml", REAL / "hf_overrides_subkey.yaml")
    assert [d.short() for d in plan.deltas] == [
        "--hf-overrides.max_position_embeddings 4096",
        "--hf-overrides.head_dim 16",
        "--seed 7",
        "--max-logprobs 10",
    ]
    whole = make_plan(
        REAL / "hf_overrides_good.yaml", REAL / "hf_overrides_subkey.yaml", split=False
    )
    assert [d.key for d in whole.deltas] == ["hf-overrides", "seed", "max-logprobs"]
    # the variant with head_dim alone is the good launch plus that key
    v = plan.variant(frozenset({1}))
    assert json.loads(v.flag_map()["hf-overrides"]) == {
        "max_position_embeddings": 2048,
        "head_dim": 16,
    }
    assert plan.variant(frozenset(range(4))) == plan.bad


def test_plan_cli_shows_sub_key_deltas_and_no_split(capsys) -> None:
    from orchestrator.cli import main

    args = [
        "plan",
        "--good",
        str(REAL / "hf_overrides_good.yaml"),
        "--bad",
        str(REAL / "hf_overrides_subkey.yaml"),
        "--json",
    ]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [d.get("name", d["key"]) for d in out["deltas"]] == [
        "hf-overrides.max_position_embeddings",
        "hf-overrides.head_dim",
        "seed",
        "max-logprobs",
    ]
    assert main([*args, "--no-split"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [d["key"] for d in out["deltas"]] == ["hf-overrides", "seed", "max-logprobs"]


# ---- the lab: conditions on key paths ------------------------------------------------------


def _scenario(tmp_path: Path, text: str) -> sc.Scenario:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return sc.load(path)


def test_scenario_conditions_on_key_paths(tmp_path: Path) -> None:
    s = _scenario(
        tmp_path,
        """
name: t
defaults: {compilation-config.cudagraph_mode: PIECEWISE}
faults:
  - when: {compilation-config.pass_config.enable_fusion: true,
           compilation-config.cudagraph_mode: FULL}
    phase: cuda_graph
    error: "RuntimeError: boom"
  - when: {compilation-config.level: {ge: 3}, compilation-config.splitting_ops: [a, b]}
    phase: init
    error: "RuntimeError: two"
  - when: {compilation-config.max_capture_size: {present: true}}
    phase: args
    error: "bad"
  - when: {compilation-config.cudagraph_mode: PIECEWISE, compilation-config.level: {present: false}}
    phase: warmup
    error: "RuntimeError: default"
""",
    )

    def rule(value: object) -> int | None:
        flags = {"compilation-config": value if isinstance(value, str) else json.dumps(value)}
        r = s.select_fault(flags, {}, 0)
        return r.index if r else None

    assert rule({"cudagraph_mode": "FULL", "pass_config": {"enable_fusion": True}}) == 0
    assert rule({"cudagraph_mode": "FULL", "pass_config": {"enable_fusion": False}}) is None
    assert rule({"pass_config": {"enable_fusion": True}}) == 3  # the default mode
    assert rule({"cudagraph_mode": "FULL", "pass_config": {"enable_fusion": "true"}}) is None
    assert rule({"level": 3, "splitting_ops": ["a", "b"], "cudagraph_mode": "X"}) == 1
    assert rule({"level": 3, "splitting_ops": ["a"], "cudagraph_mode": "X"}) is None
    assert rule({"max_capture_size": 8, "level": 1, "cudagraph_mode": "X"}) == 2
    assert rule("not json") is None or rule("not json") == 3  # absent keys, default mode
    assert s.select_fault({}, {}, 0).index == 3  # the flag absent: every key is


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "faults:\n  - when: {compilation-config.: 1}\n    phase: init\n    error: x\n",
            "faults[0].when.compilation-config.: expected a flag name or a key path",
        ),
        (
            "faults:\n  - when: {cc.x: {present: 1}}\n    phase: init\n    error: x\n",
            "faults[0].when.cc.x.present: expected true or false",
        ),
        ("defaults: {cc.x: [1]}\n", "defaults.cc.x: expected a number, string or boolean"),
    ],
)
def test_bad_key_path_conditions_are_named(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(sc.ScenarioError, match=said.replace(".", r"\.").replace("[", r"\[")):
        _scenario(tmp_path, "name: t\n" + text)


def _compile_outcome(plan, variant: frozenset[int]) -> int | None:
    scen = sc.load(LAB / "compile" / "scenario.yaml")
    argv = plan.variant(variant).argv()
    assert argv[:5] == ["python3", "-m", "orchestrator.lab.server", "--scenario", "compile"]
    flags = cmdline.parse_strict(argv[5:], scen.known_flags)
    rule = scen.select_fault(flags, {}, scen.seed)
    return rule.index if rule else None


def test_compile_pair_needs_two_keys_of_one_option_together() -> None:
    from itertools import combinations

    plan = make_plan(LAB / "compile" / "good.yaml", LAB / "compile" / "bad.yaml")
    names = [d.name for d in plan.deltas]
    assert names == [
        "max-running-requests",
        "compilation-config.cudagraph_mode",
        "compilation-config.pass_config.enable_fusion",
        "compilation-config.pass_config.enable_attn_fusion",
        "compilation-config.cudagraph_capture_sizes",
        "compilation-config.max_capture_size",
    ]
    n = plan.n
    assert _compile_outcome(plan, frozenset()) is None
    assert _compile_outcome(plan, frozenset(range(n))) == 1
    hits = [
        set(s)
        for k in range(n + 1)
        for s in combinations(range(n), k)
        if _compile_outcome(plan, frozenset(s)) == 1
    ]
    minimal = [s for s in hits if not any(o < s for o in hits)]
    assert [{names[i] for i in s} for s in minimal] == [
        {"compilation-config.cudagraph_mode", "compilation-config.pass_config.enable_fusion"}
    ]
    # max_capture_size without bad's longer sizes: the server's parser refuses the value
    assert _compile_outcome(plan, frozenset({5})) == 0
    assert sc.load(LAB / "compile" / "scenario.yaml").faults[0].phase == "args"


def test_compile_pair_answer_by_the_planner() -> None:
    plan = make_plan(LAB / "compile" / "good.yaml", LAB / "compile" / "bad.yaml")
    codes = {0: Verdict.INVALID, 1: Verdict.FAIL, None: Verdict.PASS}
    planner = Planner(
        plan.n,
        make_strategy("auto"),
        known={frozenset(): Verdict.PASS, frozenset(range(plan.n)): Verdict.FAIL},
    )
    drive(planner, lambda v: codes[_compile_outcome(plan, v)])
    [culprit] = planner.answer.culprits
    assert sorted(plan.deltas[i].short() for i in culprit.deltas) == [
        "--compilation-config.cudagraph_mode FULL",
        "--compilation-config.pass_config.enable_fusion true",
    ]
    assert culprit.confirmed


def test_lab_pair_files_load() -> None:
    for name in ("good.yaml", "bad.yaml"):
        load_experiment(LAB / "compile" / name)


# ---- lists documented as sets ---------------------------------------------------------------


def test_a_set_valued_list_gives_one_delta_per_member() -> None:
    good = _exp({"compilation-config": '{"cudagraph_capture_sizes": [1, 2, 4, 8], "level": 3}'})
    bad = _exp({"compilation-config": '{"cudagraph_capture_sizes": [1, 2, 4, 16, 32], "level": 3}'})
    deltas = diff(good, bad)
    assert [d.describe() for d in deltas] == [
        "+ --compilation-config.cudagraph_capture_sizes member 16",
        "+ --compilation-config.cudagraph_capture_sizes member 32",
        "- --compilation-config.cudagraph_capture_sizes member 8",
    ]
    assert [d.short() for d in deltas] == [
        "--compilation-config.cudagraph_capture_sizes with 16",
        "--compilation-config.cudagraph_capture_sizes with 32",
        "--compilation-config.cudagraph_capture_sizes without 8",
    ]
    add16, _, drop8 = deltas

    def sizes(ds: list[Delta]) -> list[int]:
        return json.loads(_value(apply_deltas(good, ds), "compilation-config"))[
            "cudagraph_capture_sizes"
        ]

    assert sizes([add16]) == [1, 2, 4, 8, 16]  # good's members where good had them
    assert sizes([drop8]) == [1, 2, 4]
    assert sizes([add16, drop8]) == [1, 2, 4, 16]
    assert (
        _value(apply_deltas(good, deltas), "compilation-config")
        == bad.flag_map()["compilation-config"]
    )
    assert Delta.from_dict(drop8.to_dict()).short() == drop8.short()
    # the same members in another order: the list changed as one value
    same = _exp({"compilation-config": '{"cudagraph_capture_sizes": [8, 4, 2, 1], "level": 3}'})
    [d] = diff(good, same)
    assert (d.name, d.member) == ("compilation-config.cudagraph_capture_sizes", False)


def test_a_multi_value_flag_documented_as_a_set() -> None:
    good = _exp({"cuda-graph-bs": [1, 2, 4, 8]})
    bad = _exp({"cuda-graph-bs": [1, 2, 4, 8, 160, 256]})
    deltas = diff(good, bad)
    assert [d.short() for d in deltas] == ["--cuda-graph-bs with 160", "--cuda-graph-bs with 256"]
    assert [d.describe() for d in deltas] == [
        "+ --cuda-graph-bs member 160",
        "+ --cuda-graph-bs member 256",
    ]
    argv = apply_deltas(good, deltas[1:]).argv()
    assert argv[argv.index("--cuda-graph-bs") :][:6] == [
        "--cuda-graph-bs",
        "1",
        "2",
        "4",
        "8",
        "256",
    ]
    assert _value(apply_deltas(good, deltas[1:]), "cuda-graph-bs") == (1, 2, 4, 8, 256)
    assert _value(apply_deltas(good, deltas), "cuda-graph-bs") == (1, 2, 4, 8, 160, 256)
    # absent on one side: the server's default set is not empty, so the option is one delta
    assert [d.kind for d in diff(_exp({}), bad)] == ["flag"]
    # another multi-value flag is one value, and so is everything with --no-split
    assert [d.kind for d in diff(_exp({"x": [1, 2]}), _exp({"x": [1, 2, 3]}))] == ["flag"]
    assert [d.kind for d in diff(good, bad, split=False)] == ["flag"]


def test_no_split_is_recorded_for_the_resume_and_keys_another_campaign() -> None:
    from orchestrator.campaign.bisect import campaign_key
    from orchestrator.campaign.records import BisectOptions, BisectSpec

    spec = BisectSpec(
        good={},
        bad={},
        good_source=None,
        bad_source=None,
        deltas=[],
        hosts=[],
        options=BisectOptions(split=False),
    )
    assert BisectSpec.from_dict(spec.to_dict()).options.split is False
    assert (
        "split"
        not in BisectSpec(
            good={}, bad={}, good_source=None, bad_source=None, deltas=[], hosts=[]
        ).to_dict()["options"]
    )
    assert BisectSpec.from_dict({"options": {}}).options.split is True  # recorded before
    split = make_plan(REAL / "hf_overrides_good.yaml", REAL / "hf_overrides_subkey.yaml")
    whole = make_plan(
        REAL / "hf_overrides_good.yaml", REAL / "hf_overrides_subkey.yaml", split=False
    )
    assert campaign_key(split, [], "auto") != campaign_key(whole, [], "auto")


def test_resume_refuses_no_split(tmp_path: Path, capsys) -> None:
    from orchestrator.cli import main

    code = main(["bisect", "--resume", "abc", "--no-split", "--results", str(tmp_path)])
    assert code == 2
    assert "--no-split cannot be given with it" in capsys.readouterr().err


def test_an_answer_words_each_kind_of_culprit_for_what_it_is() -> None:
    """A key of a JSON-valued option, a member of a set-valued one, an environment variable
    and a flag: each culprit is named as what it is, never all "single flag"."""
    from orchestrator.campaign.records import Culprit

    good = _exp(
        {"hf-overrides": '{"head_dim": 32}', "cuda-graph-bs": [1, 2], "seed": 0}, env={"A": "1"}
    )
    bad = _exp(
        {"hf-overrides": '{"head_dim": 16}', "cuda-graph-bs": [1, 2, 4], "seed": 7}, env={"A": "2"}
    )
    kinds = {}
    for d in diff(good, bad):
        cul = Culprit(
            deltas=[d.describe()],
            flags=[d.short()],
            indices=[0],
            interacting=False,
            reproduced_by=None,
            cleared_by={},
        )
        kinds[d.short()] = cul.kind
    assert kinds == {
        "--hf-overrides.head_dim 16": "JSON key",
        "--cuda-graph-bs with 4": "set member",
        "A=2": "environment variable",
        "--seed 7": "single flag",
    }


def test_a_culprits_kind_is_its_deltas_not_read_back_from_its_words() -> None:
    """The answer records each delta's kind: a flag whose value reads like a set member or
    a dotted name is still a flag; an answer stored before the kinds were recorded is read
    from its words as before."""
    from orchestrator.campaign.records import Culprit

    good = _exp({"served-model-name": "base", "load-format": "auto"})
    bad = _exp({"served-model-name": "team member 4", "load-format": "a.b"})
    for d in diff(good, bad):
        cul = Culprit(
            deltas=[d.describe()],
            flags=[d.short()],
            indices=[0],
            interacting=False,
            reproduced_by=None,
            cleared_by={},
            whats=[d.what],
        )
        assert cul.kind == "single flag", d.describe()
        assert Culprit.from_dict(cul.to_dict()).kind == "single flag"
    old = {
        "deltas": ["+ --cuda-graph-bs member 4"],
        "flags": ["--cuda-graph-bs with 4"],
        "indices": [0],
        "interacting": False,
    }  # an answer stored without `whats`
    assert Culprit.from_dict(old).kind == "set member"
