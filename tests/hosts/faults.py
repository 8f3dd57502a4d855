"""Faults injected on purpose, and the checks that a host was left as found.

- `NetFault`: iptables rules inside a test host's own network namespace (REJECT with a
  TCP reset, or a silent DROP) for its SSH port; every rule it adds carries a comment
  naming this process, and `clear()` (a fixture finalizer) removes them all.
- `small_tmpfs` / `read_only_dir`: a results directory that is full, or read-only, as
  mounts of the test's own; always unmounted.
- `SdLab`: a systemd test host with the lab unit installed, the checks that it is
  restored (no drop-in, unit as found, no lab server, no lock).
- `python -m tests.hosts.faults STEP N -- ORCHESTRATOR-ARGS`: the CLI, paused at STEP of
  its Nth run (the marker file in ORCH_FAULT_MARKER says so), for a test to SIGKILL it
  there. The pause is injected by wrapping one method in this child process only.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.hosts import Host, load_inventory
from orchestrator.lab.sdhosts import SystemdHost
from orchestrator.lab.units import lab_unit

UNIT_DIR = "/etc/systemd/system"
B300 = "lab-b300.service"
DROPIN = f"{UNIT_DIR}/{B300}.d/99-orchestrator.conf"
TAG = f"orch-fault-{os.getpid()}"


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}")
    return res


# ---- the network ---------------------------------------------------------------------------


class NetFault:
    """iptables rules for a host's SSH port inside its own network namespace."""

    def __init__(self, netns: str, port: int = 22) -> None:
        self.netns = netns
        self.port = port
        self.rules: list[list[str]] = []

    def _spec(self, action: str) -> list[str]:
        spec = [
            "INPUT",
            "-i",
            "eth0",
            "-p",
            "tcp",
            "--dport",
            str(self.port),
            "-m",
            "comment",
            "--comment",
            TAG,
            "-j",
            action,
        ]
        if action == "REJECT":
            spec += ["--reject-with", "tcp-reset"]
        return spec

    def block(self, action: str = "REJECT") -> None:
        """REJECT: every packet to sshd is answered by a reset (a dropped link, a refused
        reconnect); DROP: packets vanish (a stalled link)."""
        spec = self._spec(action)
        _run(["ip", "netns", "exec", self.netns, "iptables", "-w", "-I", *spec])
        self.rules.append(spec)

    def unblock(self) -> None:
        while self.rules:
            spec = self.rules.pop()
            _run(["ip", "netns", "exec", self.netns, "iptables", "-w", "-D", *spec], check=False)

    def clear(self) -> None:
        """Remove every rule of this process in the namespace (finalizers call this)."""
        self.unblock()
        if not Path(f"/run/netns/{self.netns}").exists():
            return
        out = _run(
            ["ip", "netns", "exec", self.netns, "iptables", "-w", "-S", "INPUT"], check=False
        ).stdout
        for line in out.splitlines():
            if TAG in line and line.startswith("-A "):
                _run(
                    ["ip", "netns", "exec", self.netns, "iptables", "-w", "-D", *line.split()[1:]],
                    check=False,
                )

    def active(self) -> bool:
        out = _run(
            ["ip", "netns", "exec", self.netns, "iptables", "-w", "-S", "INPUT"], check=False
        ).stdout
        return TAG in out


# ---- the results directory -----------------------------------------------------------------


@contextmanager
def small_tmpfs(path: Path, size: str = "64k") -> Iterator[Path]:
    """`path` as a tmpfs of `size` (a full disk once a little is written)."""
    path.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)])
    try:
        yield path
    finally:
        _umount(path)


@contextmanager
def read_only_dir(path: Path) -> Iterator[Path]:
    """`path` (with what it holds) bind-mounted read-only over itself: even root cannot
    write there (chmod does not stop root)."""
    path.mkdir(parents=True, exist_ok=True)
    _run(["mount", "--bind", str(path), str(path)])
    try:
        _run(["mount", "-o", "remount,bind,ro", str(path)])
        yield path
    finally:
        _umount(path)


def _mounted(path: Path) -> bool:
    # Not os.path.ismount: a bind mount of a directory onto itself is on the same device
    # as its parent, and ismount() says False.
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    return any(line.split()[1].replace("\\040", " ") == str(path) for line in mounts)


def _umount(path: Path) -> None:
    for _ in range(20):
        if not _mounted(path):
            return
        if _run(["umount", str(path)], check=False).returncode == 0:
            return
        time.sleep(0.25)
    _run(["umount", "--lazy", str(path)], check=False)


# ---- a systemd host with the lab unit --------------------------------------------------------


@dataclass
class BoxView:
    """A booted systemd container (`box`, reached with the OpenSSH client for checks) and
    the same container as a host of ours (`host`, reached through our transport)."""

    box: SystemdHost
    host: Host

    def sh(self, command: str, *, check: bool = True) -> str:
        return self.box.ssh_run(command, check=check, timeout=120).stdout

    def exists(self, path: str) -> bool:
        return self.box.ssh_run(f"test -e {path}").returncode == 0


@dataclass
class SdLab(BoxView):
    """One systemd container with the lab unit; `host` reaches it through our transport."""

    hosts_file: Path

    @classmethod
    def setup(cls, box: SystemdHost, tmp: Path, *, restart: str = "no") -> SdLab:
        box.write_file(f"{UNIT_DIR}/{B300}", lab_unit(restart=restart, restart_sec="200ms"))
        box.ssh_run("systemctl daemon-reload", check=True)
        tmp.mkdir(parents=True, exist_ok=True)
        hosts_file = tmp / "hosts.yaml"
        hosts_file.write_text(box.hosts_yaml("sd", env={"PYTHONPATH": "/opt/orchestrator"}))
        return cls(box, load_inventory(hosts_file).host("sd"), hosts_file)

    @property
    def netns(self) -> str:
        return self.box.netns.name

    def show(self, *props: str, unit: str = B300) -> dict[str, str]:
        out = self.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def unit_sha(self) -> str:
        return hashlib.sha256(self.sh(f"cat {UNIT_DIR}/{B300}").encode()).hexdigest()

    def reset(self) -> None:
        """Back to the installed state whatever a test left (a finalizer)."""
        self.sh(
            f"systemctl stop {B300}; rm -rf {UNIT_DIR}/{B300}.d /tmp/orchestrator; "
            "systemctl daemon-reload; systemctl reset-failed",
            check=False,
        )

    def lab_servers(self) -> str:
        return self.sh("pgrep -af '[o]rchestrator[.]lab[.]server|[o]rch-flaky' || true").strip()

    def locks(self) -> str:
        return self.sh("ls /tmp/orchestrator/locks 2>/dev/null; true").strip()

    def restored_problems(self, *, active: str = "inactive", sha: str | None = None) -> list[str]:
        """What differs from "left as found": empty when the host is restored."""
        bad = []
        if self.exists(f"{UNIT_DIR}/{B300}.d"):
            bad.append(f"{UNIT_DIR}/{B300}.d exists: " + self.sh(f"ls -la {UNIT_DIR}/{B300}.d"))
        st = self.show("ActiveState", "DropInPaths")
        if "99-orchestrator" in st.get("DropInPaths", ""):
            bad.append(f"systemd still lists our drop-in: {st['DropInPaths']}")
        if st.get("ActiveState") != active:
            bad.append(f"ActiveState={st.get('ActiveState')}, expected {active}")
        if active == "inactive" and self.lab_servers():
            bad.append(f"a server still runs: {self.lab_servers()}")
        if self.locks():
            bad.append(f"lock left: {self.locks()}")
        if sha is not None and self.unit_sha() != sha:
            bad.append("the unit file changed")
        return bad


# ---- a CLI child paused at one step of one run -------------------------------------------------

STEPS = ("before-dropin", "after-daemon-reload", "polling", "recording")


def _pause(step: str) -> None:
    """Say where we are (the marker file), then wait: for a SIGKILL, or for the test to
    create MARKER.go to let us go on (bounded: 10 minutes)."""
    marker = Path(os.environ["ORCH_FAULT_MARKER"])
    go = marker.with_name(marker.name + ".go")
    marker.write_text(step)
    for _ in range(6000):
        if go.exists():
            return
        time.sleep(0.1)


def _install_pause(step: str, nth: int) -> None:
    """Wrap the one method where `step` of run `nth` happens so that it pauses there."""
    from orchestrator.execution.executor import Executor
    from orchestrator.execution.services.systemd import SystemdManager
    from orchestrator.store.store import Store

    runs = {"n": 0}
    paused_once: list[bool] = []
    orig_run = Executor.run

    def counted(self: Executor, *a: Any, **kw: Any) -> Any:
        runs["n"] += 1
        return orig_run(self, *a, **kw)

    Executor.run = counted  # type: ignore[method-assign]

    def wrap(cls: type, name: str, before: bool) -> None:
        orig: Callable[..., Any] = getattr(cls, name)

        def paused(*a: Any, **kw: Any) -> Any:
            if before and runs["n"] == nth and not paused_once:
                paused_once.append(True)
                _pause(step)
            out = orig(*a, **kw)
            if not before and runs["n"] == nth and not paused_once:
                paused_once.append(True)
                _pause(step)
            return out

        setattr(cls, name, paused)

    if step == "before-dropin":  # stopped and reset, nothing of this run written yet
        wrap(SystemdManager, "install", before=True)
    elif step == "after-daemon-reload":  # the drop-in is loaded, nothing started
        wrap(SystemdManager, "_read_back", before=True)
    elif step == "polling":  # our variant runs under the drop-in
        wrap(SystemdManager, "parse_poll", before=False)
    elif step == "recording":  # the run's INSERT is done, its COMMIT not
        orig_tx = Store._tx

        @contextmanager
        def tx(self: Store) -> Iterator[Any]:
            with orig_tx(self) as db:
                yield db
                if runs["n"] == nth and _in_add_run() and not paused_once:
                    paused_once.append(True)
                    _pause(step)

        Store._tx = tx  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown step {step}; one of {', '.join(STEPS)}")


def _in_add_run() -> bool:
    f = sys._getframe()
    for _ in range(10):
        if f is None:
            return False
        if f.f_code.co_name == "add_run":
            return True
        f = f.f_back
    return False


def main(argv: list[str]) -> int:
    step, nth, sep, *rest = argv
    assert sep == "--", "usage: STEP N -- ORCHESTRATOR-ARGS"
    _install_pause(step, int(nth))
    from orchestrator.cli import main as cli_main

    sys.argv = ["orchestrator", *rest]
    return cli_main(rest)


def marker_path() -> Path:
    fd, name = tempfile.mkstemp(prefix="orch-fault-marker-")
    os.close(fd)
    os.unlink(name)
    return Path(name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
