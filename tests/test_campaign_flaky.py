"""A crash that shows up on about half of the starts, bisected end to end over SSH.

The lab's `flaky` pair (experiments/lab/flaky/): eight deltas, of which DP attention and
the bigger CUDA-graph batch size together crash graph capture with probability 0.5 per
start. Through OpenSSH's sshd on 127.0.0.1 (the process manager), `orchestrator bisect`
runs with no `--repeat` and no strategy given. The lab draws afresh on every start from a
replayable sequence (`ORCH_LAB_SEED=random:N`, see `orchestrator.lab.server`): N is the
first sequence whose second start (the bad endpoint, after good) passes, so the campaign
meets the flakiness on its own bad config, retries it, and must switch to the
noise-aware search by itself.

The second test kills the campaign (SIGKILL) once the noise-aware search is under way and
resumes it: the resumed search asks first for exactly the run that a planner built from
the recorded runs alone asks for (the posterior is a pure function of them), nothing
recorded runs again, and the answer is the pair.
"""

from __future__ import annotations

import re
import signal
import sqlite3
from pathlib import Path

import pytest

from orchestrator.campaign import flaky
from orchestrator.campaign.bisect import relative
from orchestrator.campaign.planning import Plan, make_plan
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab import cmdline
from orchestrator.lab import scenario as sc
from orchestrator.lab.server import replayed_seed
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.planner import Planner
from orchestrator.results.store import Store
from tests.campaign_lab import (
    TIME_SCALE,
    Pair,
    cli_json,
    lab_pair,
    lab_servers,
    popen_cli,
    read_runs,
    stop_child,
)
from tests.hosts.wait import wait_until

PAIR = ["--cuda-graph-max-bs 256", "--enable-dp-attention"]
COUNTS = re.compile(r"^fail \d+ of \d+$")


def bad_passes_first(plan: Plan) -> int:
    """The first replay sequence whose 2nd start (bad, after good) does not crash."""
    scen = sc.load("flaky")
    argv = plan.bad.argv()
    at = argv.index("--scenario")
    flags = cmdline.parse_strict(argv[at + 2:], scen.known_flags)
    for name in sc.LAB_ONLY_FLAGS:
        flags.pop(name, None)
    for base in range(1, 200):
        if scen.select_fault(flags, {}, replayed_seed(base, 2)) is None:
            return base
    raise AssertionError("no sequence starts with a pass of bad")


def flaky_hosts(sshd: SshdEndpoint, tmp: Path, base: int) -> Path:
    path = tmp / "hosts.yaml"
    path.write_text(sshd.hosts_yaml("lab", run_dir=str(tmp / "run"), env={
        "ORCH_LAB_TIME_SCALE": TIME_SCALE, "ORCH_LAB_SEED": f"random:{base}",
        "ORCH_LAB_DIR": str(tmp / "lab-state")}))  # fmt: skip
    return path


def command(pair: Pair, hosts: Path, results: Path) -> list[str | Path]:
    return ["bisect", "--good", pair.good, "--bad", pair.bad, "--host", "lab",
            "--hosts", hosts, "--results", results]  # fmt: skip


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


def test_flaky_pair_is_found_without_repeat_over_sshd(sshd: SshdEndpoint,
                                                      tmp_path: Path) -> None:  # fmt: skip
    pair = lab_pair(tmp_path, "flaky")
    plan = make_plan(pair.good, pair.bad)
    hosts = flaky_hosts(sshd, tmp_path, bad_passes_first(plan))
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
    md, html = (Path(p).read_text() for p in sorted(answer["reports"]) if p.endswith((".md",
                ".html")))  # fmt: skip
    for text in (md, html):
        assert "confidence" in text and "reproduction rate" in text
        assert "Counts per variant" in text and re.search(r"fail \d+ of \d+", text)
    assert lab_servers(pair.port) == []


def recorded(results: Path) -> tuple[str, int, int] | None:
    """(campaign, runs recorded, runs with a variant other than the endpoints)."""
    db = results / "orchestrator.db"
    if not db.exists():
        return None
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            rows = con.execute("SELECT campaign, variant FROM runs").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    if not rows:
        return None
    inner = [v for _, v in rows if v not in ("[]", "[0, 1, 2, 3, 4, 5, 6, 7]")]
    return rows[0][0], len(rows), len(inner)


def test_flaky_campaign_killed_midway_resumes_with_its_posterior(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    pair = lab_pair(tmp_path, "flaky")
    plan = make_plan(pair.good, pair.bad)
    hosts = flaky_hosts(sshd, tmp_path, bad_passes_first(plan))
    results = tmp_path / "results"
    svc = tmp_path / "run" / pair.unit
    log = tmp_path / "bisect.log"
    child = popen_cli(*command(pair, hosts, results), log=log)

    def mid_search() -> tuple[str, int] | None:
        assert child.poll() is None, f"bisect ended early:\n{log.read_text()}"
        got = recorded(results)
        if got is None or got[2] < 4:  # well into the noise-aware search
            return None
        cid, n, _ = got
        pid = (svc / "pid").read_text().strip() if (svc / "pid").exists() else ""
        running = (svc / f"run-{cid}.{n + 1}.log").exists() and pid.isdigit() and \
            Path(f"/proc/{pid}").exists()  # fmt: skip
        return (cid, n) if running else None

    try:
        cid, n = wait_until(mid_search, timeout=300, interval=0.05, what="the search under way",
                            describe=log.read_text)  # fmt: skip
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        stop_child(child)
    before = read_runs(results, cid)
    assert len(before) == n
    assert "flaky" in log.read_text()  # the live view said it switched
    # What the recorded runs alone ask for next: the posterior is a function of them.
    store = Store(results)
    try:
        target = store.campaign(cid).target
    finally:
        store.close()
    evidence = [(frozenset(r.variant), relative(r.verdict, r.signature, target))
                for r in before if r.verdict is not Verdict.INFRA]  # fmt: skip
    full = frozenset(range(plan.n))
    replay = Planner(plan.n, flaky.strategy_for("auto", 0.95, lambda v: ""),
                     known={frozenset(): Verdict.PASS, full: Verdict.FAIL},
                     closure=plan.closure(), evidence=evidence)  # fmt: skip
    assert replay.current_round is not None and replay.current_round.again
    expected_next = tuple(sorted(replay.pending()[0]))

    code, answer = cli_json(*command(pair, hosts, results))
    assert code == 0, answer
    assert answer["campaign"] == cid
    after = read_runs(results, cid)
    # the recorded runs are untouched and none was replaced; the resumed process ran only
    # new ones, starting with the run the recorded posterior asked for
    assert [r.id for r in after[:n]] == [r.id for r in before]
    assert [r.seq for r in after] == list(range(1, len(after) + 1))
    assert answer["runs_executed"] == len(after) - n
    assert after[n].variant == expected_next
    check_flaky_answer(answer, results)
    assert lab_servers(pair.port) == []
