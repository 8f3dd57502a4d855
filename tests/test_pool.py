"""Host pools on real hosts: cancel, Ctrl-C, a host that dies mid-sweep, an error on the last host.

Two booted systemd containers (each in its own network namespace) form the pool; the
lab's unit is installed in both. A cancelled run stops its server and frees the host for
the next task; Ctrl-C on `orchestrator sweep --pool` restores both hosts; a host whose
container is killed mid-run (a power cut: the container's init SIGKILLed) is taken out
of the pool after its runs fail on host trouble, is reported, its runs move to the other
host, and once it is back it is restored with the rest at the end. On the sshd host, an
error that every run would hit (the port held by a foreign process) stops a one-host
sweep or bisection at once instead of retrying forever.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.pool import Pool, Task
from orchestrator.campaign.sweep import SweepCampaign
from orchestrator.config.hosts import load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.config.sweep import load_sweep
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.events import Event, Notice, StepDone
from orchestrator.execution.contract import RunCancelled
from orchestrator.execution.executor import Executor
from orchestrator.lab.sdhosts import SystemdHost
from orchestrator.lab.sshd import SshdEndpoint, free_port
from orchestrator.reports.sweep_report import write_sweep_reports
from orchestrator.store.store import Store
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import (
    LAB,
    SETTLE,
    UNIT_DIR,
    cli,
    popen_cli,
    sshd_hosts_file,
    stop_child,
)

UNIT = "lab-rtx6000.service"
PERF_GOOD = LAB / "rtx6000" / "perf_good.yaml"
PROBE = "python3 -m orchestrator.lab.bench --port {port} --num-prompts 24 --random-output-len 32"


def hosts_file(boxes: list[SystemdHost], tmp: Path) -> Path:
    hosts = {
        f"gpu{i + 1}": box.hosts_entry(env={"PYTHONPATH": "/opt/orchestrator"})
        for i, box in enumerate(boxes)
    }
    path = tmp / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": hosts, "pools": {"duo": list(hosts)}}))
    return path


def experiment(tmp: Path, name: str, **extra: object) -> Path:
    """The shipped rtx6000 perf config with a short probe, plus `extra` keys."""
    tmp.mkdir(parents=True, exist_ok=True)
    data = {
        "name": name,
        "extends": str(PERF_GOOD),
        "probe": {"run": PROBE},
        "health": SETTLE,
        **extra,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sweep_file(tmp: Path, matrix: dict, **base: object) -> Path:
    experiment(tmp, "base", **base)
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "pool-test", "base": "base.yaml", "matrix": matrix}))
    return path


def unit_state(box: SystemdHost) -> dict[str, str]:
    out = box.ssh_run(f"systemctl show {UNIT} -p ActiveState -p ExecStart", check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def check_restored(box: SystemdHost) -> None:
    """No drop-in left; the unit stopped, with its own ExecStart again."""
    assert box.ssh_run(f"test -e {UNIT_DIR}/{UNIT}.d/99-orchestrator.conf").returncode != 0
    props = unit_state(box)
    assert props["ActiveState"] == "inactive" and "/bin/sleep" in props["ExecStart"], props


def power_cut(box: SystemdHost) -> None:
    """Kill the container's init (and with it every process inside) at once."""
    proc = box.container._proc  # noqa: SLF001 - the nspawn process; its child is the init
    assert proc is not None and proc.poll() is None
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert children, "systemd-nspawn has no container process"
    os.kill(int(children[0]), signal.SIGKILL)
    proc.wait(timeout=30)


# ---- cancel and Ctrl-C --------------------------------------------------------------------


def test_cancel_stops_the_run_and_frees_the_host(duo: list[SystemdHost], tmp_path: Path) -> None:
    inv = load_inventory(hosts_file(duo, tmp_path))
    # startup 20x slower than the lab's default: about 50 s to ready, far past the cancel
    slow = load_experiment(
        experiment(tmp_path, "slow", service={"env": {"ORCH_LAB_TIME_SCALE": "20"}})
    )
    fast = load_experiment(experiment(tmp_path, "fast"))
    events: list[Event] = []

    def factory(host, service, campaign, listener):  # noqa: ANN001, ANN202
        return Executor(host, service=service, campaign=campaign, listener=listener)

    env_keys = frozenset({"ORCH_LAB_TIME_SCALE"})
    with Pool(
        inv.resolve("duo"),
        service=UNIT,
        campaign="pooltest",
        executor_factory=factory,
        listener=events.append,
        env_keys=env_keys,
    ) as pool:
        t_slow = Task(key="slow", exp=slow, label="slow", run_id="pooltest.1")
        t_fast = Task(key="fast", exp=fast, label="fast", run_id="pooltest.2")
        assert pool.submit(t_slow) and pool.submit(t_fast)
        assert pool.idle() == [] and not pool.submit(Task("x", fast, "x", "pooltest.9"))
        first = pool.wait()
        assert first.task is t_fast and first.result is not None, first
        assert first.result.verdict is Verdict.PASS and first.host.name == "gpu2"
        assert unit_state(duo[0])["ActiveState"] == "active"  # the slow server is starting
        t0 = time.monotonic()
        pool.cancel(t_slow)
        cancelled = pool.wait()
        assert cancelled.task is t_slow and isinstance(cancelled.error, RunCancelled)
        assert time.monotonic() - t0 < 15
        assert [w.host.name for w in pool.healthy()] == ["gpu1", "gpu2"]  # not a host fault
        assert unit_state(duo[0])["ActiveState"] != "active"  # its server was stopped
        # the host is free again and runs the next task
        again = Task(key="again", exp=fast, label="again", run_id="pooltest.3")
        assert pool.submit(again)
        done = pool.wait()
        assert done.task is again and done.host.name == "gpu1"
        assert done.result is not None and done.result.verdict is Verdict.PASS
    assert pool.removed == []
    assert any(
        isinstance(e, StepDone)
        and e.step == "stopped"
        and e.detail == "run cancelled"
        and e.host == "gpu1"
        for e in events
    )
    for box in duo:
        check_restored(box)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["SIGINT", "SIGHUP"])
def test_ctrl_c_on_a_pool_sweep_restores_every_host(
    duo: list[SystemdHost], tmp_path: Path, sig: signal.Signals
) -> None:
    path = sweep_file(tmp_path, {"cuda-graph-max-bs": [128, 256, 384, 512]})
    hosts = hosts_file(duo, tmp_path)
    child = popen_cli(
        "sweep",
        path,
        "--pool",
        "duo",
        "--hosts",
        hosts,
        "--results",
        tmp_path / "results",
        log=tmp_path / "sweep.log",
    )
    try:
        wait_until(
            lambda: all(unit_state(b)["ActiveState"] == "active" for b in duo),
            timeout=60,
            what="a run in progress on both hosts",
            describe=lambda: (tmp_path / "sweep.log").read_text()[-2000:],
        )
        child.send_signal(sig)
        code = child.wait(timeout=120)
    finally:
        stop_child(child)
    log = (tmp_path / "sweep.log").read_text()
    assert code == 130, log[-3000:]
    assert "resume with: orchestrator sweep --resume" in log
    assert "the hosts were restored (read back: as found): gpu1, gpu2" in log, log[-3000:]
    for box in duo:
        check_restored(box)


# ---- a host dies mid-sweep ----------------------------------------------------------------


def test_a_host_that_dies_leaves_the_pool_and_its_runs_move(
    duo: list[SystemdHost], tmp_path: Path
) -> None:
    path = sweep_file(
        tmp_path, {"cuda-graph-max-bs": [128, 256, 512], "mem-fraction-static": [0.85, 0.92]}
    )
    inv = load_inventory(hosts_file(duo, tmp_path))
    box2 = duo[1]
    state = {"cut": 0.0, "back": 0.0}
    lock = threading.Lock()
    events: list[Event] = []

    def listener(e: Event) -> None:
        events.append(e)
        with lock:
            # gpu2's first server is up: cut its power mid-run (in gpu2's worker thread)
            if (
                isinstance(e, StepDone)
                and e.host == "gpu2"
                and e.step == "started"
                and not state["cut"]
            ):
                power_cut(box2)
                state["cut"] = time.time()
            # taken out of the pool: bring it back, so that it can be restored at the end
            if (
                isinstance(e, Notice)
                and e.host == "gpu2"
                and "taken out" in e.message
                and not state["back"]
            ):
                box2.restart_container()
                state["back"] = time.time()

    store = Store(tmp_path / "results")
    try:
        outcome = SweepCampaign(
            store, load_sweep(path), inv.resolve("duo"), listener=listener, command="test"
        ).run()
        runs = store.runs(outcome.campaign_id)
        reports = write_sweep_reports(store, outcome.campaign_id)
    finally:
        store.close()
    assert state["cut"] and state["back"], "the host was never cut off or never taken out"
    # reported: in the outcome, and in the reports
    [(host, why)] = outcome.removed_hosts
    assert host == "gpu2" and "host trouble" in why, why
    md = reports[0].read_text()
    assert "host gpu2 was taken out of the pool" in md
    # every config has exactly one verdict; gpu2's attempts are infra records, and every
    # run after the cut happened on gpu1
    assert outcome.status == "done", outcome.message
    real = [r for r in runs if r.verdict is not Verdict.INFRA]
    assert Counter(r.variant for r in real) == Counter({(i,): 1 for i in range(6)})
    # each verdict is its metric against the relative bar of the base measured in the sweep
    [ref] = [r for r in real if r.variant == (outcome.rows[0].item.index,)]
    assert all(
        r.verdict is (Verdict.PASS if r.probe_metric >= 0.95 * ref.probe_metric else Verdict.FAIL)
        for r in real
    )
    infra = [r for r in runs if r.verdict is Verdict.INFRA]
    assert len(infra) >= 2 and all(r.host == "gpu2" for r in infra)
    assert all(r.host == "gpu1" for r in real if r.started > state["cut"])
    moved = {r.variant for r in infra}
    assert all(any(r.variant == v and r.host == "gpu1" for r in real) for v in moved)
    assert {r.host for r in runs} == {"gpu1", "gpu2"}
    # every host restored at the end, the one that came back included
    for box in duo:
        check_restored(box)


# ---- an error every run would hit, on the only host ---------------------------------------


@pytest.mark.parametrize("command", ["sweep", "bisect"])
def test_an_error_on_the_only_host_stops_the_campaign(
    sshd: SshdEndpoint, tmp_path: Path, command: str
) -> None:
    port = free_port()
    on_port = {"service": {"flags": {"port": port}}}
    hosts = sshd_hosts_file(sshd, tmp_path)
    if command == "sweep":
        target = [sweep_file(tmp_path, {"cuda-graph-max-bs": [128, 512]}, **on_port)]
    else:
        base = experiment(tmp_path, "base", **on_port)
        bad = experiment(
            tmp_path, "bad", extends=str(base), service={"flags": {"cuda-graph-max-bs": 512}}
        )
        target = ["--good", base, "--bad", bad]
    with socket.socket() as holder:  # a foreign process holds the config's port
        holder.bind(("127.0.0.1", port))
        holder.listen()
        t0 = time.monotonic()
        try:
            res = cli(
                command,
                *target,
                "--host",
                "lab",
                "--hosts",
                hosts,
                "--results",
                tmp_path / "results",
                timeout=90,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{command} kept retrying the only host")
    assert res.returncode == 3, res.stdout[-3000:] + res.stderr[-3000:]
    assert time.monotonic() - t0 < 60
    text = res.stdout + res.stderr
    assert f"port {port} is already in use" in text
    assert "Traceback" not in text
