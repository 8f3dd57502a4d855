"""Every answer is true, on the real sshd lab (process manager, simulated SGLang server).

What a hostile user did to the lab and what must hold: a server killed from outside in the
middle of a bisection is `infra` (retried, never a finding, never cached) and the answer and
its evidence stay true; a recorded run judged under other health settings is not reused; a
port taken by another process while the server starts is host trouble, not a verdict;
SIGTERM during `run` restores the host; a secret never appears on a command line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.campaign.bisect import Bisection, BisectOptions
from orchestrator.campaign.planning import make_plan
from orchestrator.campaign.single import single_run
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.events import Event, Polled, RunStarted
from orchestrator.execution.executor import Executor
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.support.campaign_lab import (
    REPO,
    check_answer_evidence,
    lab_pair,
    lab_servers,
    load_host,
    read_runs,
    sshd_hosts_file,
)


class KillRun:
    """A listener that SIGKILLs the lab server during the `nth` run, at its first poll."""

    def __init__(self, port: int, nth: int) -> None:
        self.port, self.nth = port, nth
        self.started = 0
        self.killed: list[int] = []

    def __call__(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.started += 1
        elif isinstance(event, Polled) and self.started == self.nth and not self.killed:
            for pid in lab_servers(self.port):
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)


def test_server_killed_mid_bisection_is_infra_and_the_answer_stays_true(
    sshd: SshdEndpoint,
    tmp_path: Path,
) -> None:
    """Row 1: glm5 with --fresh, kill -9 of the server during run 3. The answer is
    {max-running-requests}, every evidence line cites a run of exactly its variant."""
    pair = lab_pair(tmp_path, "glm5")
    hosts = sshd_hosts_file(sshd, tmp_path)
    plan = make_plan(str(pair.good), str(pair.bad), "auto")
    killer = KillRun(pair.port, 3)
    store = Store(tmp_path / "results")
    try:
        outcome = Bisection(
            store,
            plan,
            [load_host(hosts, "lab")],
            options=BisectOptions(fresh=True),
            listener=killer,
            command="test",
        ).run()
    finally:
        store.close()
    assert killer.killed, "the third run was never polled"
    answer = outcome.to_dict()
    assert outcome.status == "found", answer
    assert [c["flags"] for c in answer["culprits"]] == [["--max-running-requests 512"]]
    check_answer_evidence(tmp_path / "results", answer, str(outcome.target))
    runs = read_runs(tmp_path / "results", outcome.campaign_id)
    killed = [r for r in runs if r.verdict is Verdict.INFRA]
    assert len(killed) == 1 and "from outside the campaign" in killed[0].detail, runs
    assert not outcome.findings  # the kill is not a finding
    # the killed variant was run again to a real verdict
    assert any(r.variant == killed[0].variant and r.verdict is not Verdict.INFRA for r in runs)


def _variant_of(src: Path, dest: Path, **changes: object) -> Path:
    data = yaml.safe_load(src.read_text())
    data.update(changes)
    dest.write_text(yaml.safe_dump(data))
    return dest


def test_a_run_under_other_health_settings_or_killed_is_never_reused(
    sshd: SshdEndpoint,
    tmp_path: Path,
) -> None:
    """Row 2: a hang of good under another health path, and a kill -9 of good's server,
    recorded before the bisection: the bisection does not reuse either."""
    hosts = sshd_hosts_file(sshd, tmp_path)
    host = load_host(hosts, "lab")
    results = tmp_path / "results"
    b300 = lab_pair(tmp_path / "b300", "b300")
    nope = _variant_of(b300.good, tmp_path / "nope.yaml", health={"path": "/nope", "timeout": "8s"})
    store = Store(results)
    try:
        row = single_run(
            store, load_experiment(nope), host, kind="run", command="test", label="nope"
        )
        assert row.verdict is Verdict.FAIL and "hang" in str(row.signature)
        outcome = Bisection(
            store, make_plan(str(b300.good), str(b300.bad)), [host], command="test"
        ).run()
        assert outcome.status == "found", outcome.message
        glm5 = lab_pair(tmp_path / "glm5", "glm5")
        killer = KillRun(glm5.port, 1)
        row = single_run(
            store,
            load_experiment(glm5.good),
            host,
            kind="run",
            command="test",
            label="killed",
            listener=killer,
        )
        assert killer.killed and row.verdict is Verdict.INFRA, row
        assert store.cached(row.fingerprint, host.host_class) is None
        outcome = Bisection(
            store, make_plan(str(glm5.good), str(glm5.bad)), [host], command="test"
        ).run()
        assert outcome.status == "found", outcome.message
    finally:
        store.close()


class TakePort:
    """A listener that binds the server's port on this machine once the server has started
    (after the executor's port check): another program racing for the same port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None

    def __call__(self, event: Event) -> None:
        if self.sock is None and isinstance(event, Polled):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.port))
            s.listen(1)
            self.sock = s


def test_a_port_taken_while_the_server_starts_is_infra_never_cached(
    sshd: SshdEndpoint,
    tmp_path: Path,
) -> None:
    """Row 3: another program takes the port between the port check and the bind."""
    pair = lab_pair(tmp_path, "glm5")
    # the lab's real startup pace (about 2.5 s before it binds): the first poll comes first
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        sshd.hosts_yaml("lab", run_dir=str(tmp_path / "run"), env={"ORCH_LAB_TIME_SCALE": "1.0"})
    )
    host = load_host(hosts, "lab")
    thief = TakePort(pair.port)
    store = Store(tmp_path / "results")
    try:
        row = single_run(
            store,
            load_experiment(pair.good),
            host,
            kind="run",
            command="test",
            label="clash",
            listener=thief,
        )
        assert thief.sock is not None
        assert row.verdict is Verdict.INFRA, row
        assert row.detail.startswith("port clash") and "address already in use" in row.detail
        assert row.signature is None
        assert store.cached(row.fingerprint, host.host_class) is None
    finally:
        store.close()
        if thief.sock is not None:
            thief.sock.close()
    # `classify` of that log names it too
    log = next((tmp_path / "results" / "logs").glob("*.log"))
    out = subprocess.run(
        [sys.executable, "-m", "orchestrator", "classify", str(log)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert "port clash" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_during_run_restores_the_host(
    sshd: SshdEndpoint, tmp_path: Path, sig: signal.Signals
) -> None:
    """Row 4: SIGTERM (or SIGHUP: a closed terminal) a few seconds into `orchestrator run`:
    the server is stopped, the lock released, exit 130 with the message (which says
    restored only as read back); the next run is not refused."""
    pair = lab_pair(tmp_path, "glm5")
    hosts = sshd_hosts_file(sshd, tmp_path)
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "run",
        str(pair.good),
        "--host",
        "lab",
        "--hosts",
        str(hosts),
        "--results",
        str(tmp_path / "results"),
    ]
    child = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for _ in range(600):  # until the server runs (bounded: 60 s)
        if lab_servers(pair.port):
            break
        time.sleep(0.1)
    assert lab_servers(pair.port), "the server never started"
    time.sleep(1.0)
    child.send_signal(sig)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, (child.returncode, out, err)
    assert "interrupted" in out + err, out + err
    assert "the host was restored (read back: as found): lab" in out + err, out + err
    for _ in range(100):
        if not lab_servers(pair.port):
            break
        time.sleep(0.1)
    assert lab_servers(pair.port) == []
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr


class Recording:
    """Every command line the executor sends to the host, through the real SSH transport."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.commands: list[str] = []

    def run(self, command: str, **kw: object) -> object:
        self.commands.append(command)
        return self._inner.run(command, **kw)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


def test_a_secret_is_never_on_a_command_line(
    sshd: SshdEndpoint, tmp_path: Path, monkeypatch: object
) -> None:
    """Row 5: HF_TOKEN=${HF_TOKEN}: not in any command the project runs on the host (the
    flag pre-check included), and not in any process's argv while the run goes on."""
    from orchestrator.execution.transport import connect

    secret = "hf_" + "Q" * 10 + "secretvalue1234567890"
    monkeypatch.setenv("HF_TOKEN", secret)  # type: ignore[attr-defined]
    # a help cache of its own: the pre-check must run here, not be answered from an earlier test
    monkeypatch.setenv("ORCH_HELP_CACHE", str(tmp_path / "help"))  # type: ignore[attr-defined]
    pair = lab_pair(tmp_path, "glm5")
    exp_path = _variant_of(
        pair.good,
        tmp_path / "secret.yaml",
        extends=str(pair.good),
        service={"env": {"HF_TOKEN": "${HF_TOKEN}"}},
    )
    exp = load_experiment(exp_path)
    assert exp.env_map()["HF_TOKEN"] == secret
    host = load_host(sshd_hosts_file(sshd, tmp_path), "lab")
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # every process's argv on this machine (the sshd host is local)
        for _ in range(20_000):
            if stop.is_set():
                return
            for proc in Path("/proc").iterdir():
                try:
                    argv = (proc / "cmdline").read_bytes()
                except OSError:
                    continue
                if secret.encode() in argv:
                    seen.append(argv.decode(errors="replace"))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    transport = Recording(connect(host))
    try:
        with Executor(host, service="lab-glm5.service", transport=transport) as ex:  # type: ignore[arg-type]
            result = ex.run(exp, run_id="t.1", env_keys=frozenset(exp.env_map()))
    finally:
        stop.set()
        watcher.join(timeout=30)
        transport.close()  # type: ignore[attr-defined]
    assert result.verdict is Verdict.PASS, result
    assert any("--help" in c for c in transport.commands)  # the pre-check ran
    assert not [c for c in transport.commands if secret in c]
    assert not seen, seen
