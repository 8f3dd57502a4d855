"""The `sshd` test host: real OpenSSH on 127.0.0.1, host key checked, the project's Python."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.config.hosts import load_inventory
from orchestrator.lab.sshd import SshdEndpoint, SshdServer, known_hosts_line

REPO = Path(__file__).resolve().parents[1]


def test_command_runs_with_host_key_checked(sshd: SshdEndpoint) -> None:
    res = sshd.ssh_run("echo hello; echo err >&2; exit 3")
    assert res.returncode == 3, res.stderr
    assert res.stdout == "hello\n"
    assert res.stderr == "err\n"
    # The known_hosts line is the one the fixture wrote, in OpenSSH's [host]:port form.
    assert sshd.known_hosts.read_text() == known_hosts_line(
        sshd.address, sshd.port, sshd.host_key_pub
    )
    assert sshd.known_hosts.read_text().startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    assert "Accepted publickey for" in sshd.log_path.read_text()


def test_argv_round_trips(sshd: SshdEndpoint) -> None:
    odd = ["a b", "it's", '"q"', "$HOME", "x;y", ""]
    res = sshd.ssh_run(["printf", "%s|", *odd])
    assert res.returncode == 0, res.stderr
    assert res.stdout == "|".join(odd) + "|"


@pytest.mark.parametrize("known", ["other key", "empty"])
def test_unknown_host_key_is_refused(sshd: SshdEndpoint, tmp_path: Path, known: str) -> None:
    kh = tmp_path / "known_hosts"
    if known == "empty":
        kh.write_text("")
    else:
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
            check=True,
        )
        kh.write_text(known_hosts_line(sshd.address, sshd.port, (tmp_path / "k.pub").read_text()))
    before = kh.read_text()
    res = replace(sshd, known_hosts=kh).ssh_run("echo should-not-run", timeout=60)
    assert res.returncode == 255
    assert "should-not-run" not in res.stdout
    assert "Host key verification failed" in res.stderr
    assert kh.read_text() == before  # the key was not added behind our back


def test_wrong_client_key_is_refused(sshd: SshdEndpoint, tmp_path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id")], check=True
    )
    res = replace(sshd, identity_file=tmp_path / "id").ssh_run("true")
    assert res.returncode == 255
    assert "Permission denied" in res.stderr


def test_path_gives_the_project_python(sshd: SshdEndpoint) -> None:
    res = sshd.ssh_run(
        "command -v python3; python3 -c 'import orchestrator; print(orchestrator.__file__)'"
    )
    assert res.returncode == 0, res.stderr
    which, module = res.stdout.splitlines()
    if sys.prefix != sys.base_prefix:  # running from the venv: its python comes first
        assert which == str(Path(sys.executable).parent / "python3")
    assert Path(module).resolve() == (REPO / "orchestrator" / "__init__.py").resolve()


def test_hosts_yaml_entry_loads(sshd: SshdEndpoint, tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(sshd.hosts_yaml("lab"))
    host = load_inventory(path).host("lab")
    assert (host.address, host.port, host.user) == (sshd.address, sshd.port, sshd.user)
    assert host.identity_file == str(sshd.identity_file)
    assert host.known_hosts == str(sshd.known_hosts)
    assert host.service_manager == "process" and host.transport == "ssh"


def test_restart_drops_sessions_and_comes_back(sshd_server: SshdServer) -> None:
    ep = sshd_server.endpoint
    marker = f"orch-restart-{time.time_ns()}"
    session = subprocess.Popen(
        ep.ssh_command(f"exec -a {marker} sleep 300"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # Wait (bounded) until the remote command runs, so the restart really cuts a session.
        # Anchored: the client's own command line holds the marker too, and matching it
        # would restart sshd before the session exists (the client then runs on the new one).
        for _ in range(200):
            if subprocess.run(["pgrep", "-f", f"^{marker}"], capture_output=True).returncode == 0:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the remote sleep never started")
        old_pid = sshd_server.pid
        sshd_server.restart()
        assert sshd_server.pid != old_pid
        assert session.wait(timeout=60) == 255  # the client saw the connection drop
        # The session's command went with its sshd: nothing left behind.
        assert subprocess.run(["pgrep", "-f", f"^{marker}"], capture_output=True).returncode == 1
    finally:
        if session.poll() is None:
            session.kill()
            session.wait(timeout=10)
    res = ep.ssh_run("echo back")
    assert (res.returncode, res.stdout) == (0, "back\n"), res.stderr
