"""The Slurm backend's pure parts: the job script and sbatch command rendered from an
experiment (every value quoted, no secret in the text), what Slurm's clients print
(recorded from the lab's Slurm 22.05), and the hosts file's `slurm:` section."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.config.hosts import SlurmOptions, load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.errors import ConfigError
from orchestrator.execution.slurm import facts, jobscript

REPO = Path(__file__).resolve().parents[1]
SECRET = "hf_" + "Q" * 30


def _exp(tmp: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN202
    monkeypatch.setenv("ORCH_TEST_TOKEN", SECRET)
    path = tmp / "exp.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "quoting",
                "extends": str(REPO / "experiments/lab/b300/good.yaml"),
                "service": {
                    "flags": {
                        "served-model-name": 'it\'s a "model" $(rm -rf /)',
                        "api-key": "${ORCH_TEST_TOKEN}",
                    },
                    "env": {"HF_TOKEN": "${ORCH_TEST_TOKEN}", "NCCL_DEBUG": "WARN; echo x"},
                    "workdir": "/tmp/a dir",
                },
            }
        )
    )
    return load_experiment(path)


def test_the_job_script_quotes_every_value_and_holds_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = _exp(tmp_path, monkeypatch)
    files = jobscript.JobFiles("/shared/runs/c1/c1.3")
    script = jobscript.render(
        exp, files, run_id="c1.3", campaign="c1", env_keys=frozenset({"OLD_VAR"})
    )
    assert SECRET not in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # the argv: the odd value as one quoted word; the secret flag's value a reference
    assert shlex.quote('it\'s a "model" $(rm -rf /)') in script
    assert (
        '--api-key "$ORCH_SECRET_API_KEY"' in script
        or '--api-key "$ORCH_SECRET_ORCH_TEST_TOKEN"' in script
    )
    assert f"export NCCL_DEBUG={shlex.quote('WARN; echo x')}" in script
    assert "unset OLD_VAR" in script
    assert "cd '/tmp/a dir'" in script
    assert "URL=http://127.0.0.1:30000/health" in script
    # the secrets file: what the script sources, then removes
    secrets = jobscript.secret_file_text(exp)
    assert f"HF_TOKEN={SECRET}" in secrets
    assert any(
        line.startswith("ORCH_SECRET_") and line.endswith(SECRET) for line in secrets.splitlines()
    )
    assert 'rm -f "$D/secret.env"' in script


def test_the_sbatch_command() -> None:
    exp = load_experiment(REPO / "experiments/lab/b300/good.yaml")
    opts = SlurmOptions(
        partition="gpu",
        gres="gpu:8",
        account="ml team",
        constraint="b300",
        exclusive=True,
        options=("--qos=debug",),
    )
    argv = jobscript.sbatch_argv(
        exp, opts, jobscript.JobFiles("/s/c/c.1"), campaign="c", run_id="c.1", controller="ctl:1:ab"
    )
    assert argv[:2] == ["sbatch", "--parsable"]
    assert "--job-name=orch-c" in argv and "--partition=gpu" in argv and "--gres=gpu:8" in argv
    assert "--comment=orchestrator campaign=c run=c.1 controller=ctl:1:ab" in argv
    assert "--account=ml team" in argv and "--exclusive" in argv and argv[-1] == "--qos=debug"
    assert "--no-requeue" in argv  # the controller decides what runs again
    # default time limit: health deadline (60 s) + margin, in whole minutes
    assert "--time=6" in argv
    assert jobscript.parse_comment(argv[3].split("=", 1)[1]) == {
        "campaign": "c",
        "run": "c.1",
        "controller": "ctl:1:ab",
    }


# Recorded from the lab cluster (Slurm 22.05.8), shortened.
SCONTROL_RUNNING = (
    "JobId=2 JobName=orch-x UserId=root(0) GroupId=root(0) JobState=RUNNING Reason=None "
    "Dependency=(null) Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 "
    "Comment=orchestrator campaign=abc run=abc.1  NodeList=vm BatchHost=vm"
)
SCONTROL_WORDS = "JobState=NODE_FAIL\nReason=NodeDown\nNodeList=vm\nExitCode=0:15\nRestarts=0\n"
SCONTROL_PENDING = (
    "JobState=PENDING\nReason=Nodes_required_for_job_are_DOWN,_DRAINED_or_"
    "reserved_for_jobs_in_higher_priority_partitions\nNodeList=(null)\n"
)


def test_scontrol_states() -> None:
    run = facts.parse_scontrol(SCONTROL_RUNNING)
    assert run is not None and run.running and run.active and run.node == "vm"
    fail = facts.parse_scontrol(SCONTROL_WORDS)
    assert fail is not None and fail.state == "NODE_FAIL" and not fail.active
    assert fail.state in facts.INFRA and fail.exit_signal == 15
    pend = facts.parse_scontrol(SCONTROL_PENDING)
    assert pend is not None and pend.pending and pend.node == ""
    assert pend.reason.startswith("Nodes required for job are DOWN, DRAINED")
    assert facts.parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None
    done = facts.parse_sacct("CANCELLED by 0|0:15|vm|None\n")
    assert done is not None and done.state == "CANCELLED" and done.exit_signal == 15


def test_sinfo_partitions_and_gres() -> None:
    parts = facts.parse_sinfo(
        "lab*|up|1|idle|gpu:8\ngpu|up|3|mix|gpu:h100:8(S:0-1)\ngpu|up|1|drain*|gpu:h100:8(S:0-1)\n"
    )
    assert set(parts) == {"lab", "gpu"}
    assert parts["gpu"].nodes == 4 and parts["gpu"].states == {"mix": 3, "drain": 1}
    assert facts.gres_offered("gpu:8", parts["lab"].gres)
    assert not facts.gres_offered("gpu:9", parts["lab"].gres)
    assert not facts.gres_offered("tpu:1", parts["lab"].gres)
    assert facts.gres_offered("gpu:h100:4", parts["gpu"].gres)
    assert not facts.gres_offered("gpu:a100:4", parts["gpu"].gres)


def test_sbatch_output() -> None:
    assert facts.parse_job_id("1234\n") == "1234" and facts.parse_job_id("77;orchlab") == "77"
    assert facts.parse_job_id("") is None
    said = facts.sbatch_refusal(
        "sbatch: error: Memory specification can not be satisfied\n"
        "sbatch: error: Batch job submission failed: Requested node "
        "configuration is not available\n"
    )
    assert said == (
        "Memory specification can not be satisfied; Batch job submission failed: "
        "Requested node configuration is not available"
    )
    assert "Traceback" not in said


def test_job_results_are_read_as_written() -> None:
    text = "job=8\nnode=vm\nserver_start=1.5\nexit=1\nstate=dead\nend=2.0\n"
    assert jobscript.parse_result(text) == {
        "job": "8",
        "node": "vm",
        "server_start": "1.5",
        "exit": "1",
        "state": "dead",
        "end": "2.0",
    }


@pytest.mark.parametrize(
    "entry, words",
    [
        ({"service_manager": "slurm", "run_dir": "/s"}, "needs a slurm: section"),
        ({"service_manager": "slurm", "slurm": {"partition": "gpu"}}, "run_dir"),
        ({"slurm": {"partition": "gpu"}, "run_dir": "/s"}, "needs service_manager: slurm"),
        ({"service_manager": "slurm", "run_dir": "/s", "slurm": {"partition": "a b"}}, "one word"),
        (
            {
                "service_manager": "slurm",
                "run_dir": "/s",
                "slurm": {"partition": "a", "max_job": 2},
            },
            "max_job",
        ),
    ],
)
def test_bad_slurm_entries_name_the_key(tmp_path: Path, entry: dict, words: str) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(
        yaml.safe_dump({"hosts": {"c": {"address": "login", "known_hosts": "/k", **entry}}})
    )
    with pytest.raises(ConfigError) as err:
        load_inventory(path)
    assert words in str(err.value) and str(path) in str(err.value)


def test_the_example_hosts_file_has_the_lab_cluster() -> None:
    host = load_inventory(REPO / "hosts.example.yaml").host("lab-slurm")
    assert host.service_manager == "slurm" and host.slurm is not None
    assert host.slurm.max_jobs == 4 and host.slurm.partition == "lab"
    assert host.slurm.conf == str(REPO / ".lab" / "slurm" / "slurm.conf")
