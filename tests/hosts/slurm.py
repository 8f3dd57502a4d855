"""The real Slurm test cluster: the lab's own single-node cluster (orchestrator.lab.slurmlab),
started once per test session in a private directory named by the session's pid, reached
through the session's sshd as its login node.

A session killed before its teardown leaves daemons behind; the next session stops them
(their pid files are in a directory named by a pid that no longer runs).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.lab import slurmlab
from orchestrator.lab.sshd import SshdEndpoint, session_env
from tests.hosts.prereq import require_slurm

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "experiments" / "lab"
GOOD = LAB / "b300" / "good.yaml"

PREFIX = "orch-slurm-"
#: the lab server's startup, sped up for the tests (see orchestrator.lab.server)
TIME_SCALE = "0.1"


def _cleanup_stale() -> None:
    for state in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        m = re.match(rf"{PREFIX}(\d+)-", state.name)
        if not m or Path(f"/proc/{m.group(1)}").exists():
            continue
        slurmlab.SlurmCluster(state).stop()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[slurmlab.SlurmCluster]:
    """slurmctld + slurmd + munged of this session, with 8 placeholder GPUs; every job is
    cancelled and every daemon stopped at the end."""
    require_slurm()
    _cleanup_stale()
    state = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    cluster = slurmlab.SlurmCluster(state)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster2() -> Iterator[slurmlab.SlurmCluster]:
    """A cluster of two nodes on this machine (one slurmd each): a job of `--nodes 2` runs
    one task on each. Started on first use, stopped at the end like `slurm_cluster`."""
    require_slurm()
    _cleanup_stale()
    state = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-two-"))
    cluster = slurmlab.SlurmCluster(state)
    try:
        cluster.start(nodes=2)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


def slurm_hosts_file(
    sshd: SshdEndpoint, cluster: slurmlab.SlurmCluster, tmp: Path, **slurm: object
) -> Path:
    """A hosts.yaml whose `lab-slurm` is the cluster behind the session's sshd (the login
    node), and whose `lab` is the same sshd as a process host; `slurm` overrides options."""
    login = sshd.hosts_entry(env={"ORCH_LAB_TIME_SCALE": TIME_SCALE})
    entry = slurmlab.hosts_entry(
        {k: v for k, v in login.items() if k != "service_manager"},
        cluster,
        run_dir=str(tmp / "jobs"),
        **slurm,
    )
    path = tmp / "hosts.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "lab-slurm": entry,
                    "lab": {**login, "run_dir": str(tmp / "run")},
                }
            },
            sort_keys=False,
        )
    )
    return path


def local_slurm_hosts_file(cluster: slurmlab.SlurmCluster, tmp: Path, **slurm: object) -> Path:
    """A hosts.yaml whose `lab-slurm` is the cluster with this machine as its login node
    (the local transport: no sshd needed)."""
    login = {
        "address": "localhost",
        "transport": "local",
        "env": {**session_env(REPO), "ORCH_LAB_TIME_SCALE": TIME_SCALE},
    }
    entry = slurmlab.hosts_entry(login, cluster, run_dir=str(tmp / "jobs"), **slurm)
    path = tmp / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"lab-slurm": entry}}, sort_keys=False))
    return path


def hang_scenario(tmp: Path) -> Path:
    """The b300 scenario plus a rule that hangs in CUDA-graph capture at batch size 512."""
    scen = yaml.safe_load((LAB / "b300" / "scenario.yaml").read_text())
    scen["faults"].insert(
        0, {"when": {"cuda-graph-max-bs": 512}, "phase": "cuda_graph", "effect": "hang"}
    )
    path = tmp / "b300-hang.yaml"
    path.write_text(yaml.safe_dump(scen, sort_keys=False))
    return path


def hang_config(tmp: Path, *, health_timeout: str, flags: dict | None = None) -> Path:
    """An experiment of that scenario (b300 good otherwise) with this health deadline."""
    path = tmp / f"hang-{health_timeout}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "b300-hang",
                "extends": str(GOOD),
                "service": {
                    "exec": f"python3 -m orchestrator.lab.server --scenario {hang_scenario(tmp)}",
                    "flags": flags or {},
                },
                "health": {"timeout": health_timeout, "settle": "0.1s"},
            },
            sort_keys=False,
        )
    )
    return path
