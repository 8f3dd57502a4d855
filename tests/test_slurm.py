"""The Slurm backend against a real Slurm 22.05 cluster (tests/hosts/slurm.py: slurmctld,
slurmd and munged of this session, 8 placeholder GPUs), reached through the session's
sshd as its login node.

The b300 bisection on the cluster gives the answer and findings of the process host with
several jobs at once; a sweep runs there, with variants that hang past their health
deadline; a node that goes down mid-campaign costs `infra` runs that
are retried, and the answer stays; Ctrl-C with jobs pending and running leaves no job in
the queue; a controller killed with SIGKILL leaves jobs that the resume cancels; bad
cluster options get one line of ours (exit 3), never a Slurm traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.sweep import SweepCampaign
from orchestrator.config.hosts import load_inventory
from orchestrator.config.sweep import load_sweep
from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.errors import InfraError
from orchestrator.events import Event, StepDone
from orchestrator.execution.checks import Check
from orchestrator.execution.hostops import check_host
from orchestrator.execution.slurm.jobscript import JOB_PREFIX
from orchestrator.execution.transport import connect
from orchestrator.lab import slurmlab
from orchestrator.lab.slurmlab import SlurmCluster
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.store.store import Store
from tests.hosts.slurm import hang_config, slurm_hosts_file
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import (
    LAB,
    REPO,
    check_b300_answer,
    cli,
    lab_pair,
    popen_cli,
    read_runs,
    recorded_b300,
    stop_child,
)

GOOD = LAB / "b300" / "good.yaml"
BAD = LAB / "b300" / "bad.yaml"


def _queue(cluster: SlurmCluster) -> list[tuple[str, str, str]]:
    """(job id, state, name) of every job of ours the cluster has not finished."""
    r = cluster.client("squeue", "-h", "-o", "%i|%T|%j")
    assert r.returncode == 0, r.stderr
    rows = [tuple(line.split("|")) for line in r.stdout.splitlines() if line.strip()]
    return [row for row in rows if row[2].startswith(JOB_PREFIX)]  # type: ignore[misc]


def _wait_queue_empty(cluster: SlurmCluster, timeout: float = 30) -> list[tuple[str, str, str]]:
    deadline = time.monotonic() + timeout
    left = _queue(cluster)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _queue(cluster)
    return left


def _same_answer(slurm: dict, lab: dict) -> None:
    """The two campaigns name the same target, culprit sets, cleared flags and findings."""
    assert slurm["status"] == lab["status"] == "found"
    assert slurm["target"] == lab["target"]
    assert sorted(sorted(c["flags"]) for c in slurm["culprits"]) == sorted(
        sorted(c["flags"]) for c in lab["culprits"]
    )
    assert sorted((f["signature"], f["variant"]) for f in slurm["findings"]) == sorted(
        (f["signature"], f["variant"]) for f in lab["findings"]
    )
    assert sorted(slurm["deltas"]) == sorted(lab["deltas"])


def _most_at_once(results: Path, campaign: str) -> int:
    """The most runs of the campaign whose servers ran at the same time."""
    runs = [r for r in read_runs(results, campaign) if r.cached_from is None]
    edges = sorted([(r.started, 1) for r in runs] + [(r.started + r.duration, -1) for r in runs])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.fixture(scope="module")
def hosts(
    sshd: SshdEndpoint, slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """lab-slurm: the cluster behind the sshd (gpu:2 per job, 4 jobs at once)."""
    return slurm_hosts_file(sshd, slurm_cluster, tmp_path_factory.mktemp("slurm"))


def test_bisect_on_slurm_gives_the_lab_hosts_answer(
    sshd: SshdEndpoint,
    slurm_cluster: SlurmCluster,
    hosts: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    results = tmp_path / "results"
    # the cluster's bisection and the lab host's (made once per session) side by side
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "bisect",
            "--good",
            str(GOOD),
            "--bad",
            str(BAD),
            "--host",
            "lab-slurm",
            "--hosts",
            str(hosts),
            "--results",
            str(results),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        lab = recorded_b300(sshd, tmp_path_factory.getbasetemp())
        out, err = child.communicate(timeout=300)
    finally:
        stop_child(child)  # type: ignore[arg-type]
    assert child.returncode == 0, out[-3000:] + err[-3000:]
    answer = json.loads(out)
    _same_answer(answer, lab.outcome)
    check_b300_answer(answer, results)
    runs = read_runs(results, answer["campaign"])
    assert {r.host for r in runs} == {"lab-slurm"}
    # each run was a job of its own; up to 4 ran at once, and more than one did
    store = Store(results)
    try:
        jobs = {store.host_record(r.id)["job"] for r in runs}  # type: ignore[index]
    finally:
        store.close()
    assert len(jobs) == len(runs)
    bad = next(r for r in runs if r.variant == (0, 1, 2))
    assert 2 <= _most_at_once(results, answer["campaign"]) <= 4
    # the jobs of rounds decided without them were cancelled: none is left, and every job
    # of the campaign is a recorded run's or ended CANCELLED
    assert _wait_queue_empty(slurm_cluster, timeout=10) == []
    r = slurm_cluster.client(
        "squeue", "-h", "-t", "all", f"--name=orch-{answer['campaign']}", "-o", "%i|%T"
    )
    ended = dict(line.split("|") for line in r.stdout.split())
    assert jobs <= set(ended)
    unrecorded = {job: state for job, state in ended.items() if job not in jobs}
    assert all(state == "CANCELLED" for state in unrecorded.values()), (unrecorded, ended)
    # `show` of a run says which job it was and where it ran
    shown = cli("show", bad.id, "--results", results, timeout=60)
    assert f"on the cluster (lab-slurm): job {store_job(results, bad.id)} on node" in shown.stdout
    # the job script holds the variant's argv, quoted, and the environment read on the node
    assert "--ep-size 8 --enable-nccl-nvls" in (bad.rendered or "")
    assert bad.env_digest is not None


def test_a_sweep_runs_on_slurm_and_a_hang_is_a_timeout(hosts: Path, tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(
        yaml.safe_dump(
            {
                # 6 s: far more than the lab needs to start, even on a busy machine
                "name": "b300-sweep-base",
                "extends": str(hang_config(tmp_path, health_timeout="6s")),
            }
        )
    )
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        yaml.safe_dump(
            {
                "name": "slurm-sweep",
                "base": str(base),
                "matrix": {"cuda-graph-max-bs": [128, 512], "max-running-requests": [128, 256]},
            }
        )
    )
    store = Store(tmp_path / "results")
    try:
        host = load_inventory(hosts).resolve("lab-slurm")
        outcome = SweepCampaign(store, load_sweep(sweep_file), host).run()
        assert outcome.status == "done", outcome.message
        runs = store.runs(outcome.campaign_id)
    finally:
        store.close()
    assert len(runs) == 4
    by_bs = {
        (
            r.config["service"]["flags"]["cuda-graph-max-bs"],
            r.config["service"]["flags"]["max-running-requests"],
        ): r
        for r in runs
    }
    for (bs, _mrr), r in by_bs.items():
        if bs == 512:  # a sweep has no target failure: a hang is its failure, as anywhere
            assert r.verdict is Verdict.FAIL, (r.verdict, r.detail)
            assert r.signature is not None and r.signature.error_class == "hang"
            assert r.signature.phase is Phase.CUDA_GRAPH
            assert "not ready after 6s; last phase: cuda_graph" in r.detail
        else:
            assert r.verdict is Verdict.PASS, (r.verdict, r.detail, r.log_tail())
    assert len({r.host for r in runs}) == 1


def test_a_node_going_down_mid_campaign_costs_retried_infra_runs_only(
    hosts: Path,
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
) -> None:
    """The node is drained and goes down while jobs run (their state: NODE_FAIL), then
    comes back; those runs are `infra`, run again, and the answer is the lab's."""
    from orchestrator.campaign.bisect import Bisection
    from orchestrator.campaign.planning import make_plan

    node = slurm_cluster.node
    started = []
    downed = threading.Event()

    def listener(event: Event) -> None:
        if isinstance(event, StepDone) and event.step == "started":
            started.append(event.detail)
            if len(started) == 3 and not downed.is_set():
                downed.set()
                for state in ("DRAIN", "DOWN"):
                    slurm_cluster.client(
                        "scontrol", "update", f"NodeName={node}", f"State={state}", "Reason=test"
                    )
                # a node that fails takes its jobs' processes with it; the lab's node does
                # not really fail, so the drill ends them (Slurm has forgotten them)
                for pid in slurmlab.job_processes(slurm_cluster.conf):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                threading.Timer(
                    2.0,
                    lambda: slurm_cluster.client(
                        "scontrol", "update", f"NodeName={node}", "State=RESUME"
                    ),
                ).start()

    store = Store(tmp_path / "results")
    try:
        pair = lab_pair(tmp_path, "b300")  # the shipped pair, settling as fast as it starts
        plan = make_plan(str(pair.good), str(pair.bad), "auto")
        outcome = Bisection(
            store, plan, load_inventory(hosts).resolve("lab-slurm"), listener=listener
        ).run()
        runs = store.runs(outcome.campaign_id)
    finally:
        store.close()
        slurm_cluster.client("scontrol", "update", f"NodeName={node}", "State=RESUME")
    assert downed.is_set()
    assert outcome.status == "found", outcome.message
    [culprit] = outcome.culprits
    assert sorted(culprit.flags) == ["--enable-nccl-nvls", "--ep-size 8"]
    [finding] = outcome.findings
    assert str(finding.signature).startswith("init: AttributeError")
    infra = [r for r in runs if r.verdict is Verdict.INFRA]
    assert infra, [(r.id, r.verdict, r.detail) for r in runs]
    assert all("node fail" in r.detail for r in infra), [r.detail for r in infra]
    # every variant that met the node failure ran again and got a verdict
    judged = {r.variant for r in runs if r.verdict is not Verdict.INFRA}
    assert {r.variant for r in infra} <= judged
    # and nothing of the campaign's jobs is left running on the node
    assert (
        wait_until(
            lambda: not slurmlab.job_processes(slurm_cluster.conf) or None,
            timeout=240,  # slurmd ends them after its KillWait; minutes on a loaded machine
            what="the jobs' processes gone",
        )
        is True
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_with_jobs_pending_and_running_leaves_no_job(
    sshd: SshdEndpoint,
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    sig: signal.Signals,
) -> None:
    """Ctrl-C (SIGINT) and SIGTERM alike."""
    # gpu:8 per job and 2 at once: one job runs, the other waits for the GPUs
    hosts = slurm_hosts_file(sshd, slurm_cluster, tmp_path, gres="gpu:8", max_jobs=2)
    data = yaml.safe_load(hosts.read_text())
    data["hosts"]["lab-slurm"]["env"]["ORCH_LAB_TIME_SCALE"] = "3"  # slow enough to catch
    hosts.write_text(yaml.safe_dump(data))
    child = popen_cli(
        "bisect",
        "--good",
        GOOD,
        "--bad",
        BAD,
        "--host",
        "lab-slurm",
        "--hosts",
        hosts,
        "--results",
        tmp_path / "results",
        log=tmp_path / "out.log",
    )
    try:
        deadline = time.monotonic() + 60
        states: set[str] = set()
        while time.monotonic() < deadline and not {"RUNNING", "PENDING"} <= states:
            states = {s for _, s, _ in _queue(slurm_cluster)}
            time.sleep(0.1)
        assert {"RUNNING", "PENDING"} <= states, states
        child.send_signal(sig)
        code = child.wait(timeout=60)
    finally:
        stop_child(child)
    out = (tmp_path / "out.log").read_text()
    assert code == 130, out[-3000:]
    assert "resume with: orchestrator bisect --resume" in out
    assert _queue(slurm_cluster) == []  # cancelled before the controller exited


def test_resume_after_sigkill_cancels_the_orphaned_jobs_and_answers(
    hosts: Path,
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
) -> None:
    data = yaml.safe_load(hosts.read_text())
    # slow servers (over a minute to start or crash): the dead controller's jobs are still
    # running when the resume comes, however busy the machine (they are cancelled, so the
    # slowness costs the test nothing)
    data["hosts"]["lab-slurm"]["env"]["ORCH_LAB_TIME_SCALE"] = "30"
    slow = tmp_path / "hosts.yaml"
    slow.write_text(yaml.safe_dump(data))
    pair = lab_pair(tmp_path, "b300")
    args = (
        "bisect",
        "--good",
        pair.good,
        "--bad",
        pair.bad,
        "--host",
        "lab-slurm",
        "--hosts",
        slow,
        "--results",
        tmp_path / "results",
    )
    child = popen_cli(*args, log=tmp_path / "killed.log")
    try:
        deadline = time.monotonic() + 60
        running: list[tuple[str, str, str]] = []
        while time.monotonic() < deadline and not running:
            running = [j for j in _queue(slurm_cluster) if j[1] == "RUNNING"]
            time.sleep(0.1)
        assert running
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        stop_child(child)
    orphans = {j for j, _, _ in _queue(slurm_cluster)}
    assert orphans  # the dead controller's jobs are still there
    data["hosts"]["lab-slurm"]["env"]["ORCH_LAB_TIME_SCALE"] = "0.1"
    slow.write_text(yaml.safe_dump(data))  # the rest at the usual speed
    res = cli(*args, "--json", timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    answer = json.loads(res.stdout)
    assert answer["status"] == "found"
    assert sorted(answer["culprits"][0]["flags"]) == ["--enable-nccl-nvls", "--ep-size 8"]
    left = _wait_queue_empty(slurm_cluster)
    assert left == []
    for job in orphans:  # cancelled by the resume (not left to run out)
        r = slurm_cluster.client("scontrol", "show", "job", "-o", job)
        assert "JobState=CANCELLED" in r.stdout, r.stdout


@pytest.mark.parametrize(
    "change, words",
    [
        ({"partition": "nope"}, "no partition 'nope' on this cluster"),
        ({"gres": "tpu:1"}, "has no node with gres tpu:1"),
        (
            {"options": ["--mem=999999"]},
            "sbatch refused the job: Memory specification can not be satisfied",
        ),
        ({"login_port": True}, "cannot reach 127.0.0.1"),
    ],
)
def test_bad_cluster_options_get_one_line_of_ours(
    sshd: SshdEndpoint,
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
    change: dict,
    words: str,
) -> None:
    slurm = {k: v for k, v in change.items() if k != "login_port"}
    hosts = slurm_hosts_file(sshd, slurm_cluster, tmp_path, **slurm)
    if change.get("login_port"):  # nothing listens there: the login node is unreachable
        data = yaml.safe_load(hosts.read_text())
        data["hosts"]["lab-slurm"]["port"] = free_port()
        hosts.write_text(yaml.safe_dump(data))
    res = cli(
        "run",
        GOOD,
        "--host",
        "lab-slurm",
        "--hosts",
        hosts,
        "--results",
        tmp_path / "results",
        timeout=120,
    )
    assert res.returncode == 3, res.stdout + res.stderr
    assert words in res.stderr, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    [line] = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    assert len(line) < 400
    assert _queue(slurm_cluster) == []
    if "options" in change:
        return  # only sbatch itself can tell: hosts check asks sinfo
    host = load_inventory(hosts).host("lab-slurm")
    try:
        with connect(host) as t:
            checks = check_host(host, t)
    except InfraError as exc:  # the login node: unreachable, as `hosts check` reports it
        checks = [Check("reachable", False, str(exc), exc.hint)]
    [failed] = [c for c in checks if c.ok is False]
    assert words in failed.detail and failed.hint


def test_hosts_check_of_the_cluster(hosts: Path) -> None:
    res = cli("hosts", "check", "lab-slurm", "--hosts", hosts, "--json", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    checks = {c["name"]: c for c in json.loads(res.stdout)["lab-slurm"]}
    assert checks["reachable"]["ok"] and "host key verified" in checks["reachable"]["detail"]
    assert checks["slurm"]["ok"] and "22.05" in checks["slurm"]["detail"]
    assert checks["partition"]["ok"] and checks["partition"]["detail"].startswith("lab: up")
    assert checks["gres"]["ok"] and "gpu:8" in checks["gres"]["detail"]
    assert checks["idle nodes"]["ok"]


@pytest.mark.slurm  # starts a real Slurm cluster of its own: not the fast tier
def test_lab_up_slurm_and_down(tmp_path: Path) -> None:
    """`lab up --slurm` starts the lab's cluster beside its sshd and writes the lab-slurm
    entry; `lab down` stops every daemon it started."""
    env = {"ORCH_LAB_DIR": str(tmp_path / "lab"), "ORCH_LAB_PORT": str(free_port())}
    up = cli("lab", "up", "--slurm", env=env, timeout=120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        entry = yaml.safe_load((tmp_path / "lab" / "hosts.yaml").read_text())["hosts"]
        assert entry["lab-slurm"]["service_manager"] == "slurm"
        cluster = SlurmCluster(tmp_path / "lab" / "slurm")
        assert cluster.running() and cluster.node_state() == "idle"
        pids = [cluster.pid(d) for d in ("munged", "slurmctld", "slurmd")]
        assert "lab: up: Slurm cluster orchlab" in up.stdout
    finally:
        down = cli("lab", "down", env=env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped the Slurm cluster" in down.stdout
    for pid in pids:
        assert (
            pid is not None
            and not Path(f"/proc/{pid}").exists()
            or subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True)
            .stdout.strip()
            .startswith("Z")
        )


def test_secrets_reach_the_server_but_not_the_script_or_the_shared_disk(
    hosts: Path,
    tmp_path: Path,
) -> None:
    secret = "hf_" + "Z" * 32
    exp = tmp_path / "secret.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "name": "b300-secret",
                "extends": str(GOOD),
                "service": {
                    "env": {"HF_TOKEN": "${ORCH_TEST_TOKEN}"},
                    "flags": {"api-key": "${ORCH_TEST_TOKEN}"},
                },
                # the probe runs in the job's environment: it reports the token's length
                "health": {"settle": "0.1s"},
                "probe": {
                    "run": "sh -c 'echo \"token length: ${#HF_TOKEN}\"'",
                    "metric": r"token length: (\d+)",
                    "pass_if": ">= 1",
                },
            }
        )
    )
    results = tmp_path / "results"
    res = cli(
        "run",
        exp,
        "--host",
        "lab-slurm",
        "--hosts",
        hosts,
        "--results",
        results,
        "--json",
        env={"ORCH_TEST_TOKEN": secret},
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out["verdict"] == "pass" and out["probe_metric"] == len(secret)
    [run] = read_runs_any(results)
    assert secret not in (run.rendered or "")
    assert "[REDACTED:" in run.log_tail()  # the server printed its api key: it got it
    jobs = Path(yaml.safe_load(hosts.read_text())["hosts"]["lab-slurm"]["run_dir"])
    for f in jobs.rglob("*"):
        if f.is_file():  # the server's own log holds what it printed (its api key): private
            assert f.name == "server.log" or secret not in f.read_text(errors="replace"), f
            assert f.stat().st_mode & 0o077 == 0 or f.name == "slurm.out", f
    assert not list(jobs.rglob("secret.env"))


def store_job(results: Path, run_id: str) -> str:
    store = Store(results)
    try:
        return str(store.host_record(run_id)["job"])  # type: ignore[index]
    finally:
        store.close()


def read_runs_any(results: Path) -> list:
    store = Store(results)
    try:
        return [r for c in store.campaigns() for r in store.runs(c.id)]
    finally:
        store.close()


def test_restore_cancels_only_the_jobs_of_stopped_controllers(
    hosts: Path,
    slurm_cluster: SlurmCluster,
    tmp_path: Path,
) -> None:
    import os
    import socket

    me = socket.gethostname().split(".")[0]
    jobs = {}
    for who, pid in (("dead", 2**22 + 12345), ("alive", os.getpid())):
        r = slurm_cluster.client(
            "sbatch",
            "--parsable",
            "--job-name=orch-restore",
            f"--output={tmp_path}/%j.out",
            f"--comment=orchestrator campaign=restore run=restore.1 controller={me}:{pid}:x",
            "--wrap",
            "sleep 60",
        )
        assert r.returncode == 0, r.stderr
        jobs[who] = r.stdout.strip()
    try:
        res = cli("restore", "--host", "lab-slurm", "--hosts", hosts, timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"cancelled job {jobs['dead']}" in res.stdout
        left = {j for j, _, _ in _queue(slurm_cluster)}
        assert jobs["alive"] in left and jobs["dead"] not in left
    finally:
        slurm_cluster.client("scancel", *jobs.values())
