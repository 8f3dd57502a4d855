"""scripts/bootstrap never stops an sshd it did not install: on a remote development machine
the running sshd is the one its user came in through. It may install openssh-server for
the tests (which start sshds of their own on private ports) and then stops only the
ssh.service that this install started.

The script runs for real, from a copy of the repository's layout in a temporary directory
(its .venv already installed, so it touches no Python packages); only the commands that
would change this machine's system (apt-get, systemctl) and the ones that report on it
(id, dpkg-query) are stand-ins that log their arguments, so that the test can run as
any user on any machine.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

STUBS = {
    "id": "echo 0\n",
    "apt-get": 'echo "apt-get $*" >> "$STUB_LOG"\n',
    "dpkg-query": 'case " $STUB_INSTALLED " in *" ${!#} "*) printf "install ok installed";; '
    "*) exit 1;; esac\n",
    "systemctl": 'echo "systemctl $*" >> "$STUB_LOG"\n'
    'if [ "$1" = is-active ]; then [ "$STUB_SSH_ACTIVE" = 1 ]; exit; fi\n',
}


def _bootstrap(tmp: Path, installed: list[str], ssh_active: bool) -> list[str]:
    """Run scripts/bootstrap in a copy of the repository's layout with the packages
    `installed` present; return the system commands it ran."""
    root = tmp / "repo"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "bootstrap").write_text((REPO / "scripts" / "bootstrap").read_text())
    (root / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text("#!/bin/sh\nexit 0\n")
    (venv_bin / "python").chmod(0o755)
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (root / ".venv" / f".installed-{digest}").touch()
    stubs = tmp / "bin"
    stubs.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text("#!/bin/bash\n" + body)
        (stubs / name).chmod(0o755)
    log = tmp / "log"
    log.touch()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("ORCH_") and k != "EXTRA_APT_PACKAGES"
    }
    env.update(
        PATH=f"{stubs}:/usr/bin:/bin",
        STUB_LOG=str(log),
        STUB_INSTALLED=" ".join(installed),
        STUB_SSH_ACTIVE="1" if ssh_active else "0",
    )
    subprocess.run(
        ["bash", str(root / "scripts" / "bootstrap")],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    return log.read_text().splitlines()


def _packages() -> list[str]:
    text = (REPO / "scripts" / "bootstrap").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("APT_PACKAGES=("))
    return line.split("(", 1)[1].rstrip(")").split()


def test_a_running_sshd_is_left_alone_when_other_packages_are_installed(tmp_path: Path) -> None:
    installed = [p for p in _packages() if p != "stress-ng"]
    assert "openssh-server" in installed
    calls = _bootstrap(tmp_path, installed, ssh_active=True)
    assert any(c.startswith("apt-get install") and "stress-ng" in c for c in calls), calls
    touched = [c for c in calls if c.startswith("systemctl") and "is-active" not in c]
    assert touched == [], touched


def test_the_sshd_this_install_started_is_stopped(tmp_path: Path) -> None:
    installed = [p for p in _packages() if p != "openssh-server"]
    calls = _bootstrap(tmp_path, installed, ssh_active=False)
    assert any(c.startswith("apt-get install") and "openssh-server" in c for c in calls), calls
    assert "systemctl disable --now ssh.service ssh.socket" in calls, calls


def test_an_sshd_already_running_without_the_package_is_left_alone(tmp_path: Path) -> None:
    """openssh-server missing (removed, not purged) while an sshd unit still runs: not ours."""
    installed = [p for p in _packages() if p != "openssh-server"]
    calls = _bootstrap(tmp_path, installed, ssh_active=True)
    assert any(c.startswith("apt-get install") for c in calls), calls
    assert not any("disable" in c or " stop" in c for c in calls), calls


def test_nothing_missing_runs_no_system_command(tmp_path: Path) -> None:
    assert _bootstrap(tmp_path, _packages(), ssh_active=True) == []
