"""A flaky pair bisected on the real Slurm cluster: the noise-aware search keeps the
cluster's `max_jobs: 4` slots busy.

The lab's flaky pair (DP attention + the bigger CUDA-graph batch size crash graph capture
on about half of the starts), cut to those two deltas, on the single-node cluster, the
login node this machine (local transport). The replay sequence is one whose first two
starts pass for the bad config and whose third fails (good and bad start side by side, in
either order, then bad again): bad passes its first start and the search is noise-aware
from its first run. Each time a job ends, its verdict reaches the posterior before the
freed slot gets the next variant (planner.batch): over the noise-aware phase, measured
from the run records' start and end times, at least 3 jobs ran on average. The runs are
made long (the lab's startup at TIME_SCALE times its time) because each job's own start
and end on the lab cluster cost about 2 s of its slot that no search can fill; about
2 minutes. How much wall time the slots save is measured by bench/parallel_noisy.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from orchestrator.campaign.planning import make_plan
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab import cmdline, slurmlab
from orchestrator.lab import scenario as sc
from orchestrator.lab.scenario_model import LAB_ONLY_FLAGS
from orchestrator.lab.server import replayed_seed
from orchestrator.lab.slurmlab import SlurmCluster
from orchestrator.lab.sshd import session_env
from tests.support.campaign_lab import REPO, Pair, cli_json, lab_pair, read_runs
from tests.test_campaign_flaky import PAIR

#: the lab's startup at this multiple of its time (a run of about 12 s): a job's own start
#: and end on the lab cluster (the scheduler's pass, the job reading its node, the
#: controller's poll) take about 2 s of each slot's time, which no search can fill
TIME_SCALE = "5.0"


def pair_only(tmp: Path) -> Pair:
    """The lab's flaky pair cut to the two deltas that crash together: the fewest runs
    that still make a noise-aware search (which of the two, or both)."""
    pair = lab_pair(tmp, "flaky")
    bad = tmp / "experiments" / "flaky-bad-pair.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "name": "test-flaky-bad-pair",
                "extends": str(pair.good),
                "service": {"flags": {"enable-dp-attention": True, "cuda-graph-max-bs": 256}},
            },
            sort_keys=False,
        )
    )
    return replace(pair, bad=bad)


def bad_passes_then_fails(plan: object) -> int:
    """The first replay sequence whose starts 1 and 2 pass for the bad config and whose
    start 3 fails: good and bad start first (in either order), bad's second start is the
    third."""
    scen = sc.load("flaky")
    argv = plan.bad.argv()  # type: ignore[attr-defined]
    at = argv.index("--scenario")
    flags = cmdline.parse_strict(argv[at + 2 :], scen.known_flags)
    for name in LAB_ONLY_FLAGS:
        flags.pop(name, None)
    for base in range(1, 500):
        if (
            all(scen.select_fault(flags, {}, replayed_seed(base, k)) is None for k in (1, 2))
            and scen.select_fault(flags, {}, replayed_seed(base, 3)) is not None
        ):
            return base
    raise AssertionError("no sequence starts with two passes of bad")


def average_running(runs: list, start: float, end: float) -> float:
    """Mean number of runs in progress over [start, end], from their records."""
    busy = sum(max(0.0, min(end, r.started + r.duration) - max(start, r.started)) for r in runs)
    return busy / (end - start)


def test_noise_aware_phase_keeps_max_jobs_running(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    pair = pair_only(tmp_path)
    base = bad_passes_then_fails(make_plan(pair.good, pair.bad))
    login = {
        "address": "localhost",
        "transport": "local",
        "env": {
            **session_env(REPO),
            "ORCH_LAB_TIME_SCALE": TIME_SCALE,
            "ORCH_LAB_SEED": f"random:{base}",
            "ORCH_LAB_DIR": str(tmp_path / "lab-state"),
        },
    }
    entry = slurmlab.hosts_entry(
        login, slurm_cluster, run_dir=str(tmp_path / "jobs"), gres=None, max_jobs=4
    )
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": {"lab-slurm": entry}}, sort_keys=False))
    results = tmp_path / "results"
    code, answer = cli_json(
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab-slurm",
        "--hosts",
        hosts,
        "--results",
        results,
        timeout=600,
    )
    assert code == 0, answer
    assert answer["status"] == "found", answer
    [cul] = answer["culprits"]
    assert sorted(cul["flags"]) == PAIR
    assert answer["confidence"] >= 0.95
    runs = [r for r in read_runs(results, answer["campaign"]) if r.cached_from is None]
    bad = [r for r in runs if r.label == "bad"]
    assert bad[0].verdict is Verdict.PASS, bad
    noisy = [r for r in runs if r.purpose.startswith("noise-")]
    assert len(noisy) >= 8, [(r.label, r.purpose) for r in runs]
    start = min(r.started for r in noisy)
    end = max(r.started + r.duration for r in noisy)
    mean = average_running(runs, start, end)
    print(
        f"noise-aware phase: {len(noisy)} runs over {end - start:.1f} s, "
        f"{mean:.2f} jobs running on average"
    )
    assert mean >= 3.0, mean
    # never more than max_jobs at once
    edges = sorted([(r.started, 1) for r in runs] + [(r.started + r.duration, -1) for r in runs])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    assert most <= 4
