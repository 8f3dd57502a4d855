"""The executor with the process manager on a real host: OpenSSH's sshd on 127.0.0.1.

Every run goes through the project's `SSHTransport` (host key checked against the
fixture's known_hosts), starts the lab server detached on the host, and is judged from
its health, exit and log. The watch loop's decisions (deadline, last phase, settle, probe,
other vs fail) are proven on the scripted host (test_executor_watch.py); here, what only
a real host shows: the detached process group, its signals, its exit file and log.
Each test gets its own run_dir (pid file, launch script, logs, lock) and its own free
port, so tests never meet another session's servers.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host, load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.errors import LockError
from orchestrator.events import Event, PhaseReached, Polled, RunFinished, RunStarted
from orchestrator.execution.executor import Executor
from orchestrator.execution.services import process as process_mod
from orchestrator.execution.transport.ssh import SSHTransport
from orchestrator.lab.sshd import SshdEndpoint, free_port
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import our_processes, sigkill_executor_child_while_polling

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "experiments" / "lab"
SCALE = {"ORCH_LAB_TIME_SCALE": "0.1"}
#: a value no shell, systemd or YAML layer may change on its way to the server's argv
ODD = "a b 'single' \"double\" $HOME ${X} `id` ; & | %n %% \\ \\\\n * ? ü ✓ end"


def lab_exp(rel: str, port: int, **env: str) -> Experiment:
    """A lab experiment on a free port, with the lab's fast startup."""
    exp = load_experiment(LAB / rel)
    return exp.with_changes(flags={"port": port}, env={**SCALE, **env})


def hang_scenario(path: Path) -> Path:
    """b300 plus a first rule: `cuda-graph-max-bs 512` hangs in CUDA-graph capture."""
    data = yaml.safe_load((LAB / "b300" / "scenario.yaml").read_text())
    data["name"] = "b300-hang"
    data["faults"].insert(
        0,
        {
            "description": "graph capture deadlocks",
            "when": {"cuda-graph-max-bs": 512},
            "phase": "cuda_graph",
            "effect": "hang",
        },
    )
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def hang_exp(scenario: Path, port: int, timeout: float) -> Experiment:
    good = lab_exp("b300/good.yaml", port)
    exp = replace(
        good, exec=("python3", "-m", "orchestrator.lab.server", "--scenario", str(scenario))
    )
    exp = exp.with_changes(flags={"cuda-graph-max-bs": 512}, name="b300-hang")
    return replace(exp, health=replace(exp.health, timeout=timeout))


def make_host(sshd: SshdEndpoint, tmp_path: Path, name: str = "lab") -> tuple[Host, Path]:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(sshd.hosts_yaml(name, run_dir=str(tmp_path / "run")))
    return load_inventory(hosts).host(name), hosts


def server_pid_in_group(pgid: int) -> int | None:
    """The lab server below the wrapper shell (same process group)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != pgid:
                continue
            if b"orchestrator.lab.server" in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except OSError:
            continue
    return None


class Recorder:
    """An event listener that keeps every event with its arrival time."""

    def __init__(self) -> None:
        self.events: list[tuple[float, Event]] = []

    def __call__(self, event: Event) -> None:
        self.events.append((time.monotonic(), event))

    def of(self, kind: type) -> list[Event]:
        return [e for _, e in self.events if isinstance(e, kind)]


@pytest.fixture
def lab_host(sshd: SshdEndpoint, tmp_path: Path) -> Iterator[Host]:
    host, _ = make_host(sshd, tmp_path)
    yield host
    # Nothing of ours may outlive a test, whatever it asserted.
    leftovers = our_processes(str(tmp_path / "run"))
    for pid in leftovers:
        try:
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        except OSError:
            pass
    assert not leftovers, f"processes left behind: {leftovers}"


def test_verdicts_through_real_sshd(lab_host: Host, tmp_path: Path) -> None:
    port = free_port()
    good = lab_exp("b300/good.yaml", port)
    bad = lab_exp("b300/bad.yaml", port)
    rec = Recorder()
    with Executor(lab_host, service="lab-b300", campaign="c-verdicts", listener=rec) as ex:
        assert isinstance(ex.t, SSHTransport)
        r_good = ex.run(good, run_id="good")
        r_bad = ex.run(bad, run_id="bad")
        assert ex.t.connection_count == 1  # one connection for the whole campaign
    assert r_good.verdict is Verdict.PASS, (r_good.detail, r_good.log_tail[-2000:])
    assert r_good.ready_s is not None and r_good.signature is None
    assert r_bad.verdict is Verdict.FAIL, r_bad.log_tail[-2000:]
    assert r_bad.signature is not None
    assert (r_bad.signature.phase, r_bad.signature.error_class) == (Phase.CUDA_GRAPH, "cublas")
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in r_bad.signature.message
    # Each run has its own log file on the host; the launch script is recorded.
    logs = sorted(p.name for p in (tmp_path / "run" / "lab-b300").glob("run-*.log"))
    assert logs == ["run-bad.log", "run-good.log"]
    assert r_good.rendered is not None and "exec python3 -m orchestrator.lab.server" in (
        r_good.rendered
    )
    # Events: each run started and finished, phases reported live, in order.
    assert [e.run_id for e in rec.of(RunStarted)] == ["good", "bad"]
    assert [e.verdict for e in rec.of(RunFinished)] == [Verdict.PASS, Verdict.FAIL]
    assert rec.of(PhaseReached) and rec.of(Polled)
    # Nothing left: no pid file, no lock, no process.
    assert not (tmp_path / "run" / "lab-b300" / "pid").exists()
    assert not list((tmp_path / "run" / "locks").glob("*.lock"))


def test_crash_under_load_is_caught_by_the_probe(lab_host: Host) -> None:
    exp = lab_exp("glm5/bad.yaml", free_port())
    with Executor(lab_host, service="lab-glm5", campaign="c-load") as ex:
        r = ex.run(exp, run_id="load")
    assert r.ready_s is not None  # startup and /health were fine: only the probe found it
    assert r.verdict is Verdict.FAIL, (r.detail, r.log_tail[-2000:])
    assert r.signature is not None
    assert (r.signature.phase, r.signature.error_class) == (Phase.SERVING, "illegal_address")


def test_argv_and_env_round_trip(lab_host: Host) -> None:
    exp = lab_exp("b300/good.yaml", free_port(), ORCH_ODD=ODD).with_changes(
        flags={"served-model-name": ODD}
    )
    seen: dict[str, bytes] = {}

    def listener(event: Event) -> None:
        if isinstance(event, Polled) and event.http_code == 200 and not seen:
            pgid = int((Path(lab_host.run_dir or "") / "lab-odd" / "pid").read_text())
            pid = server_pid_in_group(pgid)
            assert pid is not None
            seen["argv"] = Path(f"/proc/{pid}/cmdline").read_bytes()
            seen["env"] = Path(f"/proc/{pid}/environ").read_bytes()

    with Executor(lab_host, service="lab-odd", campaign="c-odd", listener=listener) as ex:
        r = ex.run(exp, run_id="odd", env_keys=["ORCH_ODD"])
    assert r.verdict is Verdict.PASS, (r.detail, r.log_tail[-2000:])
    argv = [w.decode() for w in seen["argv"].split(b"\0")[:-1]]
    assert argv[argv.index("--served-model-name") + 1] == ODD
    assert argv[-len(exp.argv()) + 1 :] == exp.argv()[1:]  # all but argv[0] (python3)
    env = dict(w.decode().split("=", 1) for w in seen["env"].split(b"\0") if b"=" in w)
    assert env["ORCH_ODD"] == ODD


def test_stop_sends_sigterm_then_sigkill(
    lab_host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server that ignores SIGTERM (it notes that it got one) and never answers /health.
    marker = tmp_path / "got-term"
    script = tmp_path / "stubborn.sh"
    script.write_text(
        '[ "$1" = --help ] && exit 0\n'
        f"trap 'echo term >> {marker}' TERM\n"
        "echo stubborn server starting\n"
        "while :; do sleep 0.2; done\n"
    )
    exp = Experiment(name="stubborn", exec=("sh", str(script)))
    exp = replace(exp, health=replace(exp.health, port=free_port(), timeout=2.0))
    # The grace period is a setting of the edge (a real one is 20 s); a short one here.
    monkeypatch.setattr(process_mod, "STOP_GRACE_S", 2)
    with Executor(lab_host, service="stubborn", campaign="c-stubborn") as ex:
        r = ex.run(exp, run_id="stubborn")
        assert r.verdict is Verdict.FAIL  # no target: a hang is the failure itself
        assert r.signature is not None and r.signature.error_class == "hang"
    assert marker.exists() and "term" in marker.read_text()  # SIGTERM came first...
    wait_until(
        lambda: not our_processes(str(script)), timeout=30, what="the stubborn server to be killed"
    )  # ...then SIGKILL


def test_stop_reaches_a_child_that_made_its_own_process_group(
    lab_host: Host,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # vLLM's data-parallel API servers call setpgrp: a kill of the server's process group
    # misses them. The stop kills the server's session, which they stay in.
    escaped = tmp_path / "escaped-child"
    script = tmp_path / "forks.sh"
    script.write_text(
        '[ "$1" = --help ] && exit 0\n'
        'python3 -c \'import os, sys, time; os.setpgrp(); open(sys.argv[1], "w").write('
        f"str(os.getpgrp())); time.sleep(600)' {escaped} &\n"
        "echo server starting\n"
        "while :; do sleep 0.2; done\n"
    )
    exp = Experiment(name="forks", exec=("sh", str(script)))
    exp = replace(exp, health=replace(exp.health, port=free_port(), timeout=3.0))
    monkeypatch.setattr(process_mod, "STOP_GRACE_S", 2)
    with Executor(lab_host, service="forks", campaign="c-forks") as ex:
        r = ex.run(exp, run_id="forks")
        assert r.verdict is Verdict.FAIL
    # the child ran, in a group of its own (its pid file holds its group)...
    assert escaped.exists() and escaped.read_text().isdigit()
    # ...and the run's stop (SIGTERM to the session, then the wait) left nothing of it
    assert our_processes(str(escaped)) == []


def test_restore_after_the_controller_is_sigkilled(
    lab_host: Host, sshd: SshdEndpoint, tmp_path: Path
) -> None:
    _, hosts = make_host(sshd, tmp_path)
    exp = hang_exp(hang_scenario(tmp_path / "hang.yaml"), free_port(), timeout=300)
    pid = sigkill_executor_child_while_polling(
        {
            "hosts": str(hosts),
            "host": "lab",
            "service": "lab-crash",
            "campaign": "c-crash",
            "experiment": exp.to_dict(),
        },
        tmp_path,
    )
    run = tmp_path / "run"
    pid_file = run / "lab-crash" / "pid"
    assert pid_file.exists() and our_processes(str(run))  # the orphaned server still runs
    assert list((run / "locks").glob("*.lock"))

    # Another campaign is refused, naming the holder.
    with pytest.raises(LockError) as err:
        Executor(lab_host, service="lab-crash", campaign="c-other").open()
    assert "c-crash" in str(err.value) and f"pid {pid}" in str(err.value)
    assert err.value.hint and "orchestrator restore" in err.value.hint

    # The same campaign takes the lock over and its prepare() stops the orphan.
    ex = Executor(lab_host, service="lab-crash", campaign="c-crash").open()
    try:
        wait_until(
            lambda: not our_processes(str(run)),
            timeout=30,
            what="the orphaned server to be stopped by prepare()",
        )
    finally:
        ex.close()
    assert not pid_file.exists()
    assert not list((run / "locks").glob("*.lock"))
