"""Throwaway SSH hosts with networks of their own: each an OpenSSH sshd started inside a
network namespace of its own, for deployments whose roles must talk over a real network.

A host here is what the lab's sshd host is (`orchestrator.lab.sshd`: throwaway keys,
known_hosts checked, the process service manager), except that the sshd, and so every
command its sessions run (the servers the process manager starts), lives in a namespace
with its own loopback, ports and address: a veth pair with a private /30 to this machine
(`orchestrator.lab.container.Netns`). `route_between` gives the namespaces routes to each
other through this machine, so a server on one reaches the other's address as on two
machines, and a port taken on one is free on the other.

`netns_sshd_hosts(n)` starts n of them and removes everything at the end: the sshd and
whatever still runs in its namespace, the namespace with its routes and veth pair, the
state directory. Names carry the owner's pid (namespace `orchs-<pid>-<i>`, veth
`os<pid>x<i>`, state `/tmp/orch-nshosts-<pid>-*`), so `cleanup_stale()` removes what a
killed session left. Needs root (network namespaces).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from orchestrator.execution.localproc import pid_alive
from orchestrator.lab.container import ContainerError, Netns, file_lock, route_between, run
from orchestrator.lab.sshd import SshdEndpoint, SshdServer, _descendants, prepare

NETNS_PREFIX = "orchs-"
NETNS_RE = re.compile(rf"^{NETNS_PREFIX}(\d+)-(\d+)$")
VETH_PREFIX = "os"
WORK_PREFIX = "orch-nshosts-"
#: the port the sshd listens on inside its namespace (nothing else is there)
SSH_PORT = 22
_INDEX = itertools.count(1)


class NetnsSshdHost:
    """One sshd in a network namespace of its own: `endpoint` is how to reach it (its
    address is the namespace's end of the veth pair)."""

    def __init__(self, workdir: Path, env: Mapping[str, str] | None = None) -> None:
        index = next(_INDEX)
        pid = os.getpid()
        self.netns = Netns(f"{NETNS_PREFIX}{pid}-{index}", f"{VETH_PREFIX}{pid}x{index}")
        self.dir = workdir / f"host{index}"
        self.env = dict(env) if env is not None else None
        self._server: SshdServer | None = None

    @property
    def address(self) -> str:
        return self.netns.address

    @property
    def endpoint(self) -> SshdEndpoint:
        if self._server is None:
            raise ContainerError(f"the sshd of namespace {self.netns.name} is not started")
        return self._server.endpoint

    @property
    def sshd_pid(self) -> int | None:
        return self._server.pid if self._server is not None else None

    def start(self) -> None:
        try:
            self.netns.create()
            endpoint = prepare(self.dir, port=SSH_PORT, address=self.address, env=self.env)
            self._server = SshdServer(endpoint, netns=self.netns.name)
            self._server.start()
        except BaseException:
            self.stop()
            raise

    def pids(self) -> list[int]:
        """Every process running in the namespace (the sshd included)."""
        if not self.netns.path.exists():
            return []
        out = run(["ip", "netns", "pids", self.netns.name], check=False, timeout=30)
        return [int(w) for w in out.split() if w.isdigit()]

    def processes(self) -> list[tuple[int, str]]:
        """(pid, command line) of every process in the namespace but the sshd and what
        runs below it (its sessions): what the host's users left running."""
        sshd = self.sshd_pid
        own = {sshd, *_descendants(sshd)} if sshd is not None else set()
        found = []
        for pid in self.pids():
            if pid in own or not pid_alive(pid):  # a zombie only waits to be reaped
                continue
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            line = " ".join(a.decode(errors="replace") for a in argv if a)
            if line:
                found.append((pid, line))
        return found

    def stop(self) -> None:
        """The sshd and everything below it, then whatever else still runs in the
        namespace (only our sessions' commands can be there), then the namespace."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        _kill_all(self.pids)
        self.netns.delete()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.netns.exists():
            raise ContainerError(f"namespace {self.netns.name} or its veth is still there")


def _kill_all(pids: Callable[[], list[int]], *, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL, every pid `pids()` lists, until none is left (bounded)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        left = pids()
        for pid in left:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [p for p in pids() if pid_alive(p)]
        if not left:
            return


@contextmanager
def netns_sshd_hosts(
    count: int = 2, *, env: Mapping[str, str] | None = None
) -> Iterator[list[NetnsSshdHost]]:
    """`count` sshd hosts, each in a namespace of its own, routed to each other; every
    trace of them removed at the end (a teardown that leaves one raises)."""
    cleanup_stale()
    workdir = Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-"))
    hosts: list[NetnsSshdHost] = []
    try:
        for _ in range(count):
            host = NetnsSshdHost(workdir, env)
            hosts.append(host)
            host.start()
        route_between([h.netns for h in hosts])
        yield hosts
    finally:
        errors = []
        for host in hosts:
            try:
                host.stop()
            except Exception as exc:  # noqa: BLE001 (the others are removed still)
                errors.append(str(exc))
        shutil.rmtree(workdir, ignore_errors=True)
        if errors:
            raise ContainerError("teardown failed: " + "; ".join(errors))


STALE_LOCK = Path(tempfile.gettempdir()) / "orch-nshosts.lock"  # not a session's name


def stale_cleanup_held() -> AbstractContextManager[None]:
    """Hold off every other process's `cleanup_stale` (sessions of several test workers
    clean up after killed owners at once; one must not remove what another is reading)."""
    return file_lock(STALE_LOCK)


def cleanup_stale() -> None:
    """Remove the namespaces (with whatever runs in them), veths and state directories of
    sessions whose owner died without its teardown."""
    if os.geteuid() != 0:
        return
    with stale_cleanup_held():
        _cleanup_stale()


def _cleanup_stale() -> None:
    dead: set[str] = set()
    netns_dir = Path("/run/netns")
    for entry in netns_dir.iterdir() if netns_dir.is_dir() else ():
        m = NETNS_RE.match(entry.name)
        if m and not pid_alive(int(m.group(1))):
            dead.add(m.group(1))
    for workdir in Path(tempfile.gettempdir()).glob(f"{WORK_PREFIX}*"):
        owner = workdir.name[len(WORK_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            dead.add(owner)
    for owner in dead:
        for entry in netns_dir.glob(f"{NETNS_PREFIX}{owner}-*"):
            ns = Netns(entry.name, f"{VETH_PREFIX}{owner}x{entry.name.rsplit('-', 1)[1]}")

            def pids(name: str = entry.name) -> list[int]:
                out = run(["ip", "netns", "pids", name], check=False, timeout=30)
                return [int(w) for w in out.split() if w.isdigit()]

            _kill_all(pids, grace=2.0)
            ns.delete()
        for link in Path("/sys/class/net").glob(f"{VETH_PREFIX}{owner}x*"):
            run(["ip", "link", "del", link.name], check=False)
        for workdir in Path(tempfile.gettempdir()).glob(f"{WORK_PREFIX}{owner}-*"):
            shutil.rmtree(workdir, ignore_errors=True)
