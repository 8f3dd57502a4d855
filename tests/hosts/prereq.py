"""Skip-or-fail for tests whose machine lacks what a real test host needs.

A developer's machine without root or systemd-nspawn skips those tests with the reason;
under CI (`CI=true`) a missing prerequisite is a failure, so a broken CI image can never
turn the real-host tests into silent skips.
"""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

from orchestrator.lab.sshd import find_sshd


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> NoReturn:
    if in_ci():
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def require_sshd() -> str:
    """Path of OpenSSH's sshd (plus the client tools the fixtures use)."""
    sshd = find_sshd()
    if not sshd:
        unavailable("OpenSSH's sshd is not installed (run scripts/bootstrap as root)")
    for tool in ("ssh", "ssh-keygen"):
        if not shutil.which(tool):
            unavailable(f"'{tool}' is not installed (run scripts/bootstrap as root)")
    return sshd


def require_systemd_host() -> None:
    """Root plus the tools that build and boot the nspawn test host."""
    if os.geteuid() != 0:
        unavailable("the systemd test host needs root (network namespaces, systemd-nspawn)")
    for tool, pkg in (
        ("systemd-nspawn", "systemd-container"),
        ("debootstrap", "debootstrap"),
        ("ip", "iproute2"),
        ("zstd", "zstd"),
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
    ):
        if not shutil.which(tool):
            unavailable(f"'{tool}' is not installed (Debian package {pkg}; run scripts/bootstrap)")


def require_netns() -> None:
    """Root and iproute2, for hosts in network namespaces of their own."""
    if os.geteuid() != 0:
        unavailable("hosts in network namespaces need root (ip netns)")
    if not shutil.which("ip"):
        unavailable("'ip' is not installed (Debian package iproute2; run scripts/bootstrap)")


def require_slurm() -> None:
    """Debian's Slurm (slurmctld, slurmd, clients) and munge, for the lab cluster."""
    from orchestrator.lab.slurmlab import PACKAGES, missing_programs

    missing = missing_programs()
    if missing:
        unavailable(
            f"{', '.join(missing)} not installed (Debian packages {PACKAGES}; run "
            "scripts/bootstrap as root)"
        )
