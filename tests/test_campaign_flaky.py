"""A crash that shows up on about half of the starts, bisected end to end over SSH.

The lab's `flaky` pair (experiments/lab/flaky/), cut to four deltas, of which DP attention
and the bigger CUDA-graph batch size together crash graph capture with probability 0.5 per
start. Through OpenSSH's sshd on 127.0.0.1 (the process manager), `orchestrator bisect`
runs with no `--repeat` and no strategy given. The lab draws afresh on every start from a
replayable sequence (`ORCH_LAB_SEED=random:N`, see `orchestrator.lab.server`): N is the
first sequence whose second start (the bad endpoint, after good) passes, so the campaign
meets the flakiness on its own bad config, retries it, and must switch to the
noise-aware search by itself.

That a noise-aware campaign killed midway resumes with its posterior is proven in the fast
tier (test_campaign_flaky_resume.py); that SIGKILL of the real process and the same command
resume a campaign over the real sshd, in test_campaign_resume.py.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.planning import make_plan
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.sshd import SshdEndpoint
from tests.support.campaign_lab import (
    Pair,
    bad_passes_first,
    cli_json,
    lab_pair,
    lab_servers,
    read_runs,
    replayed_hosts_file,
)

PAIR = ["--cuda-graph-max-bs 256", "--enable-dp-attention"]
COUNTS = re.compile(r"^fail \d+ of \d+$")


def command(pair: Pair, hosts: Path, results: Path) -> list[str | Path]:
    return [
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab",
        "--hosts",
        hosts,
        "--results",
        results,
    ]


def check_flaky_answer(answer: dict, results: Path) -> None:
    """The pair, at the confidence asked for, with a measured rate and run counts, backed
    by the store: every target failure carries both flags (a failure is proof)."""
    assert answer["status"] == "found", answer
    [cul] = answer["culprits"]
    assert sorted(cul["flags"]) == PAIR and cul["interacting"] is True
    assert answer["target"].startswith("cuda_graph: ")
    assert "operation not permitted when stream is capturing" in answer["target"]
    assert answer["confidence"] >= 0.95
    assert 0 < answer["reproduction_rate"] < 1
    assert answer["noise"]["confidence"] == answer["confidence"]
    assert COUNTS.match(answer["noise"]["reproduction_counts"])
    assert COUNTS.match(cul["reproduced_counts"])
    runs = read_runs(results, answer["campaign"])
    idx = set(cul["indices"])
    for r in runs:
        if r.verdict is Verdict.FAIL:
            assert idx <= set(r.variant), r  # no target failure without both flags
    # the measured rate is the share of target failures among the runs carrying the pair
    carrying = [r for r in runs if idx <= set(r.variant) and r.verdict.resolved]
    fails = sum(r.verdict is Verdict.FAIL for r in carrying)
    assert answer["reproduction_rate"] == pytest.approx(fails / len(carrying))
    # a variant ran more than once: the search repeats where a verdict decides
    assert len({r.variant for r in runs}) < len(runs)


def small_pair(tmp: Path) -> Pair:
    """The lab's flaky pair cut to four of its eight deltas: the crashing pair and two
    harmless ones. The search's cost over all eight, at several reproduction rates, is
    measured by bench/noise.py; here the point is the real host."""
    pair = lab_pair(tmp, "flaky")
    bad = tmp / "experiments" / "flaky-bad-small.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "name": "test-flaky-bad-small",
                "extends": str(pair.good),
                "service": {
                    "flags": {
                        "enable-dp-attention": True,
                        "cuda-graph-max-bs": 256,
                        "mem-fraction-static": 0.88,
                        "schedule-policy": "fcfs",
                    }
                },
            },
            sort_keys=False,
        )
    )
    return replace(pair, bad=bad)


def test_flaky_pair_is_found_without_repeat_over_sshd(sshd: SshdEndpoint, tmp_path: Path) -> None:
    pair = small_pair(tmp_path)
    plan = make_plan(pair.good, pair.bad)
    hosts = replayed_hosts_file(sshd, tmp_path, bad_passes_first(plan.bad, "flaky"))
    results = tmp_path / "results"
    code, answer = cli_json(*command(pair, hosts, results))
    assert code == 0, answer
    check_flaky_answer(answer, results)
    # bad passed on its first start, was started again, and the search said it switched
    runs = read_runs(results, answer["campaign"])
    bad = [r for r in runs if r.label == "bad"]
    assert bad[0].verdict is Verdict.PASS and any(r.verdict is Verdict.FAIL for r in bad)
    assert "flaky" in answer["noise"]["switched"] and "bad" in answer["noise"]["switched"]
    # the reports say how sure the answer is and show the counts per variant
    md, html = (
        Path(p).read_text() for p in sorted(answer["reports"]) if p.endswith((".md", ".html"))
    )
    for text in (md, html):
        assert "confidence" in text and "reproduction rate" in text
        assert "Counts per variant" in text and re.search(r"fail \d+ of \d+", text)
    assert lab_servers(pair.port) == []
    # the switch said what the noise-aware search would cost, in runs
    assert answer["noise"]["expected_runs_at_switch"] > len(bad)
    # `plan` prices this pair in hours: under a declared start time, its range holds what
    # the campaign cost (every start counted, at that time)
    declared = tmp_path / "experiments" / "flaky-bad-declared.yaml"
    declared.write_text(yaml.safe_dump({"extends": str(pair.bad), "expect": {"run_time": "14m"}}))
    code, planned = cli_json("plan", "--good", pair.good, "--bad", declared, "--results", results)
    assert code == 0, planned
    low, high = planned["hours_range"]
    cost = len([r for r in runs if r.cached_from is None]) * 14 * 60 / 3600
    assert low <= cost <= high, (low, cost, high)
