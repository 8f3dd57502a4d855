"""pytest fixtures for the real test hosts; `tests/conftest.py` imports them by name."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.lab.nshosts import NetnsSshdHost, netns_sshd_hosts
from orchestrator.lab.sdhosts import REPO, SystemdHost, SystemdHostFactory
from orchestrator.lab.sshd import (
    SshdEndpoint,
    SshdServer,
    free_port,
    is_our_sshd,
    kill_tree,
    prepare,
    session_env,
)
from tests.hosts.prereq import require_netns, require_sshd, require_systemd_host
from tests.hosts.procs import LabProcess

SSHD_PREFIX = "orch-sshd-"
DUO_UNIT = "lab-rtx6000.service"  # the unit of the `duo` pool


def _cleanup_stale_sshd() -> None:
    """Stop the sshd of a session killed before its teardown (named by the owner's pid)."""
    for state in Path(tempfile.gettempdir()).glob(f"{SSHD_PREFIX}*"):
        m = re.match(rf"{SSHD_PREFIX}(\d+)-", state.name)
        if not m or Path(f"/proc/{m.group(1)}").exists():
            continue
        config = state / "ssh" / "sshd_config"
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and is_our_sshd(int(proc.name), config):
                kill_tree(int(proc.name))
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def sshd_server() -> Iterator[SshdServer]:
    """OpenSSH's sshd on 127.0.0.1 for the whole session; `.restart()` drops connections."""
    require_sshd()
    _cleanup_stale_sshd()
    state = Path(tempfile.mkdtemp(prefix=f"{SSHD_PREFIX}{os.getpid()}-"))
    try:
        endpoint = prepare(state / "ssh", port=free_port(), env=session_env(REPO))
        server = SshdServer(endpoint)
        try:
            server.start()
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def sshd(sshd_server: SshdServer) -> SshdEndpoint:
    """Address, port, user, identity_file, known_hosts, host_key_pub, log_path; ssh_command()."""
    if not sshd_server.running():  # a test restarted it and failed half-way
        sshd_server.start()
    return sshd_server.endpoint


@pytest.fixture
def netns_hosts() -> Iterator[list[NetnsSshdHost]]:
    """Two sshd hosts, each inside a network namespace of its own (its own address,
    loopback and ports), routed to each other through this machine; the process manager's
    hosts. Everything is removed after the test: sshd, what runs in the namespaces, the
    namespaces with their routes and veth pairs."""
    require_sshd()
    require_netns()
    with netns_sshd_hosts(2, env=session_env(REPO)) as hosts:
        yield hosts


@pytest.fixture(scope="session")
def systemd_hosts() -> Iterator[SystemdHostFactory]:
    """Boots systemd containers (`.boot()`); every one left is stopped at session end."""
    require_systemd_host()
    factory = SystemdHostFactory()
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def systemd_host(systemd_hosts: SystemdHostFactory) -> Iterator[SystemdHost]:
    """A freshly booted systemd container for one test, stopped and discarded after it."""
    host = systemd_hosts.boot()
    try:
        yield host
    finally:
        systemd_hosts.stop(host)


@pytest.fixture(scope="module")
def duo(systemd_hosts: SystemdHostFactory) -> Iterator[list[SystemdHost]]:
    """Two booted containers (each in its own network namespace) with the lab's rtx6000
    unit installed: a pool of two equivalent hosts, shared by a module's tests."""
    from tests.support.campaign_lab import LAB_UNIT

    boxes = [systemd_hosts.boot(), systemd_hosts.boot()]
    try:
        for box in boxes:
            box.install_unit(DUO_UNIT, LAB_UNIT)
        yield boxes
    finally:
        for box in boxes:
            systemd_hosts.stop(box)


@pytest.fixture
def spawn() -> Iterator[Callable[..., LabProcess]]:
    """Starts lab processes (`orchestrator.lab.<module>`, the server by default) for one test
    and stops every one after it."""
    procs: list[LabProcess] = []

    def _spawn(*args: str, env: dict[str, str] | None = None, module: str = "server") -> LabProcess:
        proc = LabProcess(f"orchestrator.lab.{module}", list(args), env=env).start()
        procs.append(proc)
        return proc

    yield _spawn
    for proc in procs:
        proc.stop(grace=3.0)
