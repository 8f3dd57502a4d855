"""`executor_for`: the executor a host's service manager asks for, both under one contract."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.config.hosts import load_inventory
from orchestrator.execution.backends import executor_for
from orchestrator.execution.contract import HostExecutor
from orchestrator.execution.executor import Executor
from orchestrator.execution.slurm.executor import SlurmExecutor


def test_executor_for_picks_the_backend_a_host_asks_for(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.yaml"
    local = {"address": "localhost", "transport": "local", "run_dir": str(tmp_path / "run")}
    hosts.write_text(
        yaml.safe_dump(
            {
                "hosts": {
                    "box": {**local, "service_manager": "process"},
                    "cluster": {**local, "service_manager": "slurm", "slurm": {"partition": "gpu"}},
                }
            }
        )
    )
    inv = load_inventory(hosts)
    box = executor_for(inv.host("box"), service="sglang", campaign="c")
    cluster = executor_for(inv.host("cluster"), service="sglang", campaign="c")
    assert type(box) is Executor and type(cluster) is SlurmExecutor
    assert isinstance(box, HostExecutor) and isinstance(cluster, HostExecutor)
    # neither is the other: a Slurm host never gets the unit-and-lock executor
    assert not isinstance(cluster, Executor)
    assert (box.host.name, cluster.host.name) == ("box", "cluster")
