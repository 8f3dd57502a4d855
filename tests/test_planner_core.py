"""The planner's driver and deltas: caching, infra retries, couplings, rounds, variants."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.campaign.planning import make_plan
from orchestrator.cli import main
from orchestrator.config import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import PlanError
from orchestrator.planner import Planner, apply_deltas, coupling_closure, diff
from orchestrator.planner.deltas import check_differ
from orchestrator.planner.strategies import auto, dd, linear
from tests.support.planner_drive import drive, endpoints

REPO = Path(__file__).resolve().parents[1]
P, F = Verdict.PASS, Verdict.FAIL


def test_no_variant_is_proposed_twice() -> None:
    for strategy in (auto, dd, linear):
        for n in (3, 6, 9):
            planner = Planner(n, strategy, known=endpoints(n))
            asked = drive(planner, lambda v, n=n: F if {1, n - 1} <= v else P)
            assert len(asked) == len(set(asked)), strategy.__name__
            assert frozenset() not in asked and frozenset(range(n)) not in asked


def test_infra_is_retried_then_unresolved() -> None:
    n = 4
    planner = Planner(n, auto, known=endpoints(n), max_infra_retries=2)
    first = planner.pending()[0]
    planner.record(first, Verdict.INFRA)
    assert planner.pending()[0] == first  # run again
    planner.record(first, Verdict.INFRA)
    assert planner.pending()[0] == first
    planner.record(first, Verdict.INFRA)  # third strike: given up, treated as unresolved
    assert planner.verdict(first) is Verdict.INFRA
    assert planner.pending()[:1] != [first]
    assert planner.runs == 3


def test_other_and_invalid_are_never_the_target() -> None:
    # delta 0 alone crashes differently (other); deltas {0, 2} together hit the target
    def oracle(v: frozenset[int]) -> Verdict:
        if {0, 2} <= v:
            return F
        if 0 in v:
            return Verdict.OTHER
        if 3 in v and 0 not in v and len(v) == 1:
            return Verdict.INVALID
        return P

    for n in (3, 4, 6):
        planner = Planner(n, auto, known=endpoints(n))
        drive(planner, oracle)
        assert planner.answer.culprit_sets == [frozenset({0, 2})]


def test_preload_counts_nothing_and_skips_known_runs() -> None:
    n = 8
    oracle = lambda v: F if 5 in v else P  # noqa: E731
    first = Planner(n, auto, known=endpoints(n))
    asked = drive(first, oracle)
    again = Planner(n, auto, known=endpoints(n))
    again.preload((v, oracle(v)) for v in asked)
    assert again.done and again.runs == 0
    assert again.answer.culprit_sets == first.answer.culprit_sets


def test_stop_on_fail_round_is_decided_by_the_first_failure() -> None:
    n = 8
    planner = Planner(n, dd, known=endpoints(n))
    rnd = planner.current_round
    assert rnd is not None and rnd.stop_on_fail and len(rnd.variants) == 2
    first = planner.pending()[0]
    planner.record(first, F)  # the other half of the round is no longer needed
    assert first not in planner.pending()
    assert rnd.variants[1] not in planner.pending()


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


BASE = """\
service:
  exec: python -m sglang.launch_server
  flags: {model-path: /m, tp-size: 8, max-running-requests: 128, disable-radix-cache: true,
          port: 30000}
  env: {NCCL_DEBUG: WARN, KEEP: x}
"""


def test_diff_and_apply(tmp_path: Path) -> None:
    good = load_experiment(_write(tmp_path, "good.yaml", BASE))
    bad = load_experiment(
        _write(
            tmp_path,
            "bad.yaml",
            "extends: good.yaml\nservice:\n  flags: {max-running-requests: 256, ep-size: 8,"
            " disable-radix-cache: null}\n  env: {NCCL_DEBUG: null, NCCL_ALGO: Tree}\n",
        )
    )
    deltas = diff(good, bad)
    assert [(d.kind, d.key, d.change) for d in deltas] == [
        ("flag", "max-running-requests", "changed"),
        ("flag", "ep-size", "added"),
        ("flag", "disable-radix-cache", "removed"),
        ("env", "NCCL_ALGO", "added"),
        ("env", "NCCL_DEBUG", "removed"),
    ]
    assert deltas[0].describe() == "~ --max-running-requests 128 -> 256"
    assert deltas[2].describe() == "- --disable-radix-cache"
    full = apply_deltas(good, deltas)
    assert full.flag_map() == bad.flag_map() and full.env_map() == bad.env_map()
    assert full.fingerprint() == bad.fingerprint()
    assert apply_deltas(good, []).fingerprint() == good.fingerprint()
    with pytest.raises(PlanError, match="nothing to bisect"):
        check_differ(diff(good, good), good, good)


def test_coupling_rules_keep_impossible_variants_out(tmp_path: Path) -> None:
    good = load_experiment(
        _write(tmp_path, "good.yaml", "service: {exec: srv, flags: {port: 1}}\n")
    )
    bad = load_experiment(
        _write(
            tmp_path,
            "bad.yaml",
            "extends: good.yaml\nservice: {flags: {tp-size: 8, ep-size: 8, x: 1, y: 2}}\n"
            "requires: {ep-size: [tp-size]}\n",
        )
    )
    deltas = diff(good, bad)
    close = coupling_closure(deltas, good, bad)
    ep = next(i for i, d in enumerate(deltas) if d.key == "ep-size")
    tp = next(i for i, d in enumerate(deltas) if d.key == "tp-size")
    assert close(frozenset({ep})) == frozenset({ep, tp})
    n = len(deltas)
    planner = Planner(n, auto, known=endpoints(n), closure=close)
    asked = drive(planner, lambda v: F if ep in v else P)
    assert all(tp in v for v in asked if ep in v)


def test_plan_cli_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = str(REPO / "experiments/tp8.yaml"), str(REPO / "experiments/ep8_nvls.yaml")
    assert main(["plan", "--good", good, "--bad", bad]) == 0
    out = capsys.readouterr().out
    assert "+ --ep-size 8" in out and "+ --enable-nccl-nvls" in out
    assert "--max-running-requests 128 -> 256" in out and "endpoint" in out
    assert main(["plan", "--good", good, "--bad", bad, "--json", "--strategy", "linear"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["deltas"]) == 3 and data["endpoint_checks"] == 2
    assert len(data["first_round"]) == 6  # linear: 3 deltas x both directions
    assert data["estimated_runs"]["single_worst"] >= 1
    assert all(r["argv"][0] == "/opt/sglang/bin/python" for r in data["first_round"])


def test_plan_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = str(REPO / "experiments/tp8.yaml")
    assert main(["plan", "--good", good, "--bad", good]) == 2
    assert "nothing to bisect" in capsys.readouterr().err
    assert main(["plan", "--good", good, "--bad", str(tmp_path / "x.yaml")]) == 2
    assert "not found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--good", good])
    assert exit_.value.code == 2


def test_plan_variants_render() -> None:
    plan = make_plan(REPO / "experiments/tp8.yaml", REPO / "experiments/ep8_nvls.yaml")
    v = frozenset({1, 2})
    assert plan.describe(v) == "bad - --max-running-requests 256"
    argv = plan.variant(v).argv()
    assert "--ep-size" in argv and "--enable-nccl-nvls" in argv
    assert argv[argv.index("--max-running-requests") + 1] == "128"
