"""Wall time of one 8-config sweep on one SSH host, two SSH hosts, and a Slurm cluster with
1, 2 and 4 jobs at once.

The SSH hosts are the lab's systemd hosts (`orchestrator lab up --systemd`: the Debian
rootfs booted with systemd-nspawn, each in its own network namespace, reached over SSH,
the server run through a drop-in of a real unit); the cluster is the lab's single-node
Slurm (`orchestrator lab up --slurm`: slurmctld, slurmd and munged on this machine, 8
placeholder GPUs, `gpu:2` per job, each job in its own network namespace). Every backend
runs the same sweep, `experiments/lab/rtx6000/perf_good.yaml` over cuda-graph-max-bs x
mem-fraction-static with its throughput probe, the lab server sped up by the same
ORCH_LAB_TIME_SCALE (set in the experiment, so every backend gets it), each into a fresh
results directory.

    sudo .venv/bin/python bench/slurm_pool.py [--time-scale 0.1]

Needs root, systemd-nspawn, the cached rootfs (scripts/build-rootfs) and Debian's Slurm
and munge (scripts/bootstrap). Imports only the package.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pool import MATRIX, sweep  # noqa: E402  (bench/pool.py: one sweep, one matrix)

from orchestrator.lab import sdlab, slurmlab  # noqa: E402
from orchestrator.lab.hostctl import LabSettings  # noqa: E402
from orchestrator.lab.sshd import free_port, session_env  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-scale", default="0.1", help="ORCH_LAB_TIME_SCALE of the servers")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp_name:
        tmp = Path(tmp_name)
        boxes = [
            sdlab.SdLabSettings(
                lab=LabSettings(state_dir=tmp / f"lab{i}", port=free_port()),
                name=f"orch-bench-{os.getpid()}-{i}",
            )
            for i in (1, 2)
        ]
        cluster = slurmlab.SlurmCluster(tmp / "slurm")
        try:
            hosts: dict[str, object] = {}
            for i, box in enumerate(boxes, 1):
                hosts[f"ssh{i}"] = sdlab.up(box).status.hosts_entry()
            cluster.start()
            login = {"address": "localhost", "transport": "local", "env": session_env(REPO)}
            for k in (1, 2, 4):
                hosts[f"slurm{k}"] = slurmlab.hosts_entry(
                    login, cluster, run_dir=str(tmp / f"jobs{k}"), max_jobs=k
                )
            hosts_file = tmp / "hosts.yaml"
            hosts_file.write_text(
                yaml.safe_dump({"hosts": hosts, "pools": {"ssh1+ssh2": ["ssh1", "ssh2"]}})
            )
            base = tmp / "base.yaml"
            base.write_text(
                yaml.safe_dump(
                    {
                        "name": "bench-slurm-base",
                        "extends": str(REPO / "experiments/lab/rtx6000/perf_good.yaml"),
                        "service": {
                            "unit": sdlab.UNIT,  # the unit the lab's systemd hosts have
                            "env": {"ORCH_LAB_TIME_SCALE": args.time_scale},
                        },
                    }
                )
            )
            sweep_file = tmp / "sweep.yaml"
            sweep_file.write_text(
                yaml.safe_dump({"name": "bench-slurm", "matrix": MATRIX, "base": str(base)})
            )
            rows = []
            for where, label in (
                ("ssh1", "1 SSH host (systemd)"),
                ("ssh1+ssh2", "2 SSH hosts (systemd)"),
                ("slurm1", "Slurm, max_jobs 1"),
                ("slurm2", "Slurm, max_jobs 2"),
                ("slurm4", "Slurm, max_jobs 4"),
            ):
                wall, runs = sweep(
                    where,
                    hosts_file,
                    sweep_file,
                    tmp / f"results-{where}",
                    command="bench/slurm_pool.py",
                )
                rows.append((label, wall, len(runs)))
        finally:
            cluster.stop()
            for box in boxes:
                sdlab.down(box)
    first = rows[0][1]
    print(
        f"the same sweep of {rows[0][2]} configs (rtx6000 perf, lab time scale "
        f"{args.time_scale}), fresh results each"
    )
    print("| where | wall time | vs 1 SSH host |")
    print("|---|---|---|")
    for label, wall, _n in rows:
        print(f"| {label} | {wall:.1f} s | {wall / first:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
