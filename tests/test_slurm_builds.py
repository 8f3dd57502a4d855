"""Builds on a real Slurm cluster (tests/hosts/slurm.py): the lab's six releases of the
simulated server, installed as prefixes on the login node's file system (the one node's
too), and the pair that fails only with release 0.5.23rc1 and --enable-nccl-nvls together,
bisected with `--builds` by jobs: each job runs its build's interpreter, the answer names
the release and the flag, and every run is recorded under the build it ran."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.campaign.planning import make_plan, with_order
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.scenario import load as load_scenario
from orchestrator.lab.slurmlab import SlurmCluster
from orchestrator.lab.sshd import SshdEndpoint
from tests.hosts.slurm import slurm_hosts_file
from tests.support.campaign_lab import bisect_in, install_lab_builds, lab_pair, load_host

RELEASES = load_scenario("releases").versions


def test_release_together_with_a_flag_by_slurm_jobs(
    slurm_cluster: SlurmCluster, sshd: SshdEndpoint, tmp_path: Path
) -> None:
    builds = install_lab_builds(tmp_path)
    # one job at a time: the search's own runs, held to the process host's bound (with
    # more, the search also starts what it may need next)
    hosts = slurm_hosts_file(sshd, slurm_cluster, tmp_path, max_jobs=1)
    data = yaml.safe_load(hosts.read_text())
    data["hosts"]["lab-slurm"]["builds"] = builds
    hosts.write_text(yaml.safe_dump(data, sort_keys=False))

    pair = lab_pair(tmp_path, "releases")
    plan = with_order(make_plan(pair.good, pair.bad), RELEASES[1:-1])
    done = bisect_in(tmp_path / "results", plan, [load_host(hosts, "lab-slurm")], builds=plan.order)
    outcome, runs = done.outcome, done.runs
    answer = outcome.to_dict()
    assert outcome.found, answer
    (cul,) = answer["culprits"]
    assert sorted(cul["deltas"]) == ["+ --enable-nccl-nvls", "~ build 0.5.22 -> 0.5.23rc1"]
    assert cul["confirmed"] and sorted(cul["whats"]) == ["build", "flag"]
    # the same bound as on the process host: the endpoints, then at most log2(6) + the
    # flag search's own + 2
    searched = [r for r in runs if r.purpose != "endpoint"]
    assert len(searched) <= 3 + 1 + 5, [r.label for r in runs]
    # each job ran its build: the failure fires by the release the server read from its
    # own path (0.5.23rc1 on) together with the flag, so every verdict shows which ran
    first_bad = RELEASES.index("0.5.23rc1")
    for r in runs:
        exp = r.experiment()
        assert exp.build in RELEASES, (r.id, exp.build)
        nvls = "--enable-nccl-nvls" in exp.argv()
        fails = nvls and RELEASES.index(exp.build) >= first_bad
        assert r.verdict is (Verdict.FAIL if fails else Verdict.PASS), (
            r.id,
            exp.build,
            nvls,
            r.verdict,
            r.detail,
            r.log_tail()[-800:],
        )
