"""A Slurm job killed by its time limit is a `timeout`, on the real cluster.

Slurm counts time limits in whole minutes and checks them every half minute, so this run
takes 60-90 s of waiting (no CPU): it has a module of its own, so that the suite's
workers run it beside other files. Against a target or not (the endpoints and `run` judge
without one), a job Slurm ended at its time limit is `timeout`, never a `hang` failure.
The login node is this machine (local transport).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from orchestrator.config.hosts import load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.execution.backends import executor_for
from orchestrator.lab.slurmlab import SlurmCluster
from tests.hosts.slurm import GOOD, hang_config, local_slurm_hosts_file


def test_a_job_killed_by_its_time_limit_is_a_timeout(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # a server that hangs in CUDA-graph capture, a health deadline far beyond the job's
    # 1-minute limit: Slurm ends the job (state TIMEOUT), not the job script
    hosts = local_slurm_hosts_file(slurm_cluster, tmp_path, time="1", gres=None, max_jobs=1)
    host = load_inventory(hosts).host("lab-slurm")
    exp = load_experiment(
        hang_config(tmp_path, health_timeout="10m", flags={"cuda-graph-max-bs": 512})
    )
    # against a bisection's target (another failure), a hang is `timeout`
    target = Signature(Phase.CUDA_GRAPH, "cublas", "CUBLAS_STATUS_EXECUTION_FAILED")
    with executor_for(host, service="b300-hang", campaign="timelimit") as ex:
        result = ex.run(exp, run_id="timelimit.1", label="hangs", target=target)
    assert result.verdict is Verdict.TIMEOUT, (result.verdict, result.detail)
    assert "killed by its time limit (--time 1); last phase: cuda_graph" in result.detail
    assert result.signature is not None and result.signature.error_class == "hang"
    assert result.host_record is not None and result.host_record["state"] == "TIMEOUT"
    # the server was stopped with its job: nothing of it listens any more
    assert "cuda graph" in result.log_tail.lower() or "capture" in result.log_tail.lower()
    left = slurm_cluster.client("squeue", "-h", "-o", "%i")
    assert left.stdout.strip() == ""


def test_a_slow_start_cut_by_the_time_limit_is_a_timeout_without_a_target(
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
) -> None:
    # a good config that starts slowly (the lab's startup 50 times as long), judged as
    # `run` and a bisection's endpoint judge it (no target): Slurm's time limit said
    # nothing about whether it would have started, so no hang is a finding
    hosts = local_slurm_hosts_file(slurm_cluster, tmp_path, time="1", gres=None, max_jobs=1)
    host = load_inventory(hosts).host("lab-slurm")
    exp = load_experiment(GOOD).with_changes(env={"ORCH_LAB_TIME_SCALE": "50"})
    exp = replace(exp, health=replace(exp.health, timeout=600))
    with executor_for(host, service="b300-slow", campaign="timelimit-slow") as ex:
        result = ex.run(exp, run_id="timelimit-slow.1", label="slow")
    assert result.verdict is Verdict.TIMEOUT, (result.verdict, result.detail)
    assert "killed by its time limit (--time 1)" in result.detail
    assert result.host_record is not None and result.host_record["state"] == "TIMEOUT"
