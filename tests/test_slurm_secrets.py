"""The run's `secret.env` never stays on the cluster's shared disk, on the real Slurm lab.

- sbatch refuses the job (a memory request no node has): the run ends with Slurm's words
  and exit 3, and the secrets file it had written beside the job script is gone.
- `orchestrator restore` removes the secrets files that no job will read (written by a
  controller of this machine that is gone, or by an older version that did not say who
  wrote it) and keeps those a queued job or a live controller still needs.

The login node is this machine (local transport); the run directory is the test's own.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import yaml

from orchestrator.execution.slurm.jobscript import SECRETS_HEADER
from orchestrator.lab.slurmlab import SlurmCluster
from tests.hosts.slurm import local_slurm_hosts_file
from tests.support.campaign_lab import LAB, cli

SECRET = "hf_" + "Q" * 32
ME = socket.gethostname().split(".")[0]


def _secret_config(tmp_path: Path) -> Path:
    exp = tmp_path / "secret.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "b300-secret",
                "extends": str(LAB / "b300" / "good.yaml"),
                "service": {
                    "env": {"HF_TOKEN": "${ORCH_TEST_TOKEN}"},
                    "flags": {"api-key": "${ORCH_TEST_TOKEN}"},
                },
            }
        )
    )
    return exp


def test_a_refused_job_leaves_no_secrets_file(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    hosts = local_slurm_hosts_file(
        slurm_cluster, tmp_path, gres=None, max_jobs=1, options=["--mem=999999"]
    )
    res = cli(
        "run",
        _secret_config(tmp_path),
        "--host",
        "lab-slurm",
        "--hosts",
        hosts,
        "--results",
        tmp_path / "results",
        env={"ORCH_TEST_TOKEN": SECRET},
        timeout=120,
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert "sbatch refused the job" in res.stderr, res.stderr
    jobs = tmp_path / "jobs"
    assert list(jobs.rglob("job.sh")), "the run never reached sbatch"
    assert not list(jobs.rglob("secret.env"))
    for f in jobs.rglob("*"):
        assert not f.is_file() or SECRET not in f.read_text(errors="replace"), f


def _plant(jobs: Path, campaign: str, run: str, controller: str | None) -> Path:
    d = jobs / campaign / run
    d.mkdir(parents=True, mode=0o700)
    f = d / "secret.env"
    header = f"{SECRETS_HEADER}{controller}\n" if controller is not None else ""
    f.write_text(f"{header}HF_TOKEN='{SECRET}'\n")
    f.chmod(0o600)
    return f


def test_restore_removes_the_secrets_no_job_will_read(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    hosts = local_slurm_hosts_file(slurm_cluster, tmp_path, gres=None, max_jobs=1)
    jobs = tmp_path / "jobs"
    dead = f"{ME}:{2**22 + 4321}:dead"
    gone = [
        _plant(jobs, "c1", "c1.1", dead),  # its controller stopped, no job queued
        _plant(jobs, "c2", "c2.3", None),
    ]  # an older version's file: nobody says whose
    kept = [
        _plant(jobs, "c3", "c3.1", f"{ME}:{os.getpid()}:live"),  # a live controller's
        _plant(jobs, "c4", "c4.2", dead),  # a queued job of another machine reads it
        _plant(jobs, "c5", "c5.1", "elsewhere:77:x"),
    ]  # just written elsewhere
    r = slurm_cluster.client(
        "sbatch",
        "--parsable",
        "--job-name=orch-c4",
        f"--output={tmp_path}/%j.out",
        "--comment=orchestrator campaign=c4 run=c4.2 controller=elsewhere:12:y",
        "--begin=now+1hour",
        "--wrap",
        "sleep 60",
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    try:
        res = cli("restore", "--host", "lab-slurm", "--hosts", hosts, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        for f in gone:
            assert not f.exists(), f
            assert f"removed {f}" in res.stdout, res.stdout
        for f in kept:
            assert f.exists(), f
            assert str(f) not in res.stdout
        assert SECRET not in res.stdout + res.stderr
    finally:
        slurm_cluster.client("scancel", job)
