"""A real systemd host on this machine: the Debian rootfs booted with `systemd-nspawn -b`.

One copy of the machinery behind both `orchestrator lab up --systemd` (orchestrator.lab.
sdlab) and the tests' `systemd_host` fixture (orchestrator/lab/sdhosts.py, which adds its own
pid-based names and the cleanup of killed test sessions).

The image: `orchestrator/lab/rootfs.py` (run by scripts/build-rootfs) builds and caches a
tarball outside the repo; the first user unpacks it beside the tarball
(`rootfs-bookworm-<hash>/`) and every container boots from that tree as the read-only lower
layer of an overlay, so nothing is copied per boot.

Each container gets its own network namespace with a veth pair and a private /30 from
10.213.0.0/16 (host side .1, container side .2 of the block), so the container's sshd
listens on port 22 of its own namespace and the machine's port 22 is never involved.

Why these choices (gotchas met on the way):
- No systemd runs as PID 1 on the test machines, so nspawn must be told not to register
  with machined (`--register=no`) nor to create a scope unit (`--keep-unit`).
- `--ephemeral` would give each boot a clean root, but on ext4 it copies the whole tree
  (~220 MB): about 5 s per boot here. An overlayfs mount (the extracted rootfs as the
  read-only lower layer, a fresh upper dir per container) gives the same clean start in
  milliseconds, and unlike `--ephemeral` it survives a power cycle of the container: a
  rebooted host keeps its installed units, like a real one. Where overlayfs cannot be
  mounted, `--ephemeral` is the fallback.
- nspawn runs in a session of its own: a Ctrl-C in the terminal must not reach it (the
  owner stops it, and the lab host outlives the `lab up` command that started it).
- The container's console goes to a log file; a failed boot reports its tail and, when
  SSH works, the journal. nspawn prints "Attempted to remove disk file system under
  /run/systemd/nspawn/propagate/..." at shutdown: harmless.

This module raises `ContainerError` (an InfraError) with the evidence; it never prints.
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO

from orchestrator.errors import InfraError
from orchestrator.execution.localproc import pid_alive
from orchestrator.lab.sshd import SshTarget, answers_ssh

#: the one builder and cache of the image (stdlib only; scripts/build-rootfs runs it)
ROOTFS_BUILDER = Path(__file__).with_name("rootfs.py")
NET_PREFIX = "10.213"
#: one lock for every allocator of these blocks on the machine (the tests of any checkout
#: and the lab): the name predates the lab and is kept so they all still exclude each other
NET_LOCK = Path("/run/orch-test-net.lock")
#: /30 blocks ("x.y": addresses 10.213.x.4y+1 and +2) that random allocation never hands
#: out: the default systemd lab host's fixed address lives there (see sdlab)
RESERVED_BLOCKS = frozenset({"255.63"})


class ContainerError(InfraError):
    """The container could not be built, booted or stopped; the message has the evidence."""


def run(argv: list[str], *, timeout: float = 60.0, check: bool = True) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise ContainerError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}")
    return res.stdout


# --- the image -----------------------------------------------------------------------------


def rootfs_tarball() -> Path:
    """Where the builder caches the tarball of the current recipe (built or not)."""
    res = subprocess.run(
        [sys.executable, str(ROOTFS_BUILDER), "--print-path"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if res.returncode != 0:
        raise ContainerError(f"{ROOTFS_BUILDER} --print-path failed: {res.stderr.strip()}")
    return Path(res.stdout.strip().splitlines()[-1])


def build_rootfs(progress: IO[str] | None = None) -> Path:
    """Run the builder (a no-op when cached); its progress lines go to `progress`
    (the terminal's stderr by default: the one-minute build must not look like a hang)."""
    res = subprocess.run(
        [sys.executable, str(ROOTFS_BUILDER)],
        stdout=subprocess.PIPE,
        stderr=progress if progress is not None else sys.__stderr__,
        text=True,
        timeout=1800,
    )
    if res.returncode != 0:
        raise ContainerError(
            f"building the Debian rootfs failed (exit {res.returncode}); see its output above",
            hint="scripts/build-rootfs needs root, debootstrap, zstd and the Debian mirror",
        )
    return Path(res.stdout.strip().splitlines()[-1])


def extracted_rootfs(tarball: Path) -> Path:
    """The tarball unpacked beside it, once per recipe: the read-only lower layer of hosts.

    Unpacking takes about a second, but deleting 220 MB of small files after every use
    costs far more on a busy disk, so the tree is kept in the cache like the tarball. A
    lock and an atomic rename make concurrent users safe.
    """
    dest = tarball.parent / tarball.name.removesuffix(".tar.zst")
    if dest.is_dir():
        return dest
    with open(tarball.parent / ".extract.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if dest.is_dir():
            return dest
        for partial in tarball.parent.glob(".extract-*"):  # from a user killed midway
            shutil.rmtree(partial, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=tarball.parent))
        with subprocess.Popen(["zstd", "-dc", str(tarball)], stdout=subprocess.PIPE) as zst:
            tar = subprocess.run(
                ["tar", "-C", str(tmp), "--numeric-owner", "--xattrs", "-xf", "-"],
                stdin=zst.stdout,
                capture_output=True,
                text=True,
                timeout=600,
            )
        if zst.returncode != 0 or tar.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ContainerError(f"extracting {tarball} failed: {tar.stderr.strip()}")
        tmp.chmod(0o755)  # mkdtemp's 0700 would become the container's / mode
        os.rename(tmp, dest)
    return dest


def rootfs_host_key(rootfs: Path) -> str:
    """The image's sshd host key, "ssh-ed25519 AAAA..." (for known_hosts lines)."""
    return " ".join((rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2])


# --- network -------------------------------------------------------------------------------


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Held by one process at a time on this machine (an exclusive lock on `path`)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def net_lock() -> AbstractContextManager[None]:
    """Serialize address allocation between concurrent users (test workers, the lab)."""
    return file_lock(NET_LOCK)


def used_blocks() -> set[str]:
    """The 10.213.x.y /30 blocks ("x.y") already configured anywhere on this machine."""
    used: set[str] = set()
    out = run(["ip", "-o", "-4", "addr", "show"], check=False)
    out += run(["ip", "-4", "route", "show"], check=False)
    for m in re.finditer(rf"\b{re.escape(NET_PREFIX)}\.(\d+)\.(\d+)", out):
        used.add(f"{m.group(1)}.{int(m.group(2)) // 4}")
    return used


class Netns:
    """A network namespace plus a veth pair with a private /30: ours to create and delete."""

    def __init__(self, name: str, veth: str) -> None:
        if len(veth) > 15:
            raise ValueError(f"interface name {veth!r} is longer than 15 characters")
        self.name = name
        self.path = Path("/run/netns") / name
        self.veth = veth
        self.host_address = ""
        self.address = ""

    def create(self, *, block: str | None = None) -> None:
        """`block` ("x.y") asks for a fixed /30; without it a free one is drawn at random."""
        with net_lock():
            used = used_blocks()
            if block is None:
                free = [
                    f"{x}.{y}"
                    for x in range(256)
                    for y in range(64)
                    if f"{x}.{y}" not in used and f"{x}.{y}" not in RESERVED_BLOCKS
                ]
                if not free:
                    raise ContainerError(f"no free /30 left in {NET_PREFIX}.0.0/16")
                block = random.choice(free)
            elif block in used:
                raise ContainerError(
                    f"the addresses {NET_PREFIX}.{block.split('.')[0]}."
                    f"{int(block.split('.')[1]) * 4}/30 are already configured on this machine",
                    hint="another lab host of this name may run from another checkout",
                )
            x, y = block.split(".")
            base = int(y) * 4
            self.host_address = f"{NET_PREFIX}.{x}.{base + 1}"
            self.address = f"{NET_PREFIX}.{x}.{base + 2}"
            try:
                run(["ip", "netns", "add", self.name])
                # The container end is created inside the namespace, already named eth0.
                run(
                    [
                        "ip",
                        "link",
                        "add",
                        self.veth,
                        "type",
                        "veth",
                        "peer",
                        "name",
                        "eth0",
                        "netns",
                        self.name,
                    ]
                )
                run(["ip", "addr", "add", f"{self.host_address}/30", "dev", self.veth])
                run(["ip", "link", "set", self.veth, "up"])
                # Configured from outside: the rootfs has no network manager, and systemd
                # inside leaves an already configured interface alone.
                run(["ip", "-n", self.name, "addr", "add", f"{self.address}/30", "dev", "eth0"])
                run(["ip", "-n", self.name, "link", "set", "eth0", "up"])
                run(["ip", "-n", self.name, "link", "set", "lo", "up"])
            except BaseException:
                self.delete()
                raise

    def exists(self) -> bool:
        return self.path.exists() or Path(f"/sys/class/net/{self.veth}").exists()

    def delete(self) -> None:
        # Deleting the namespace destroys its end of the pair and with it ours; the explicit
        # link delete covers a namespace that never got its end.
        if self.path.exists():
            run(["ip", "netns", "del", self.name], check=False)
        if Path(f"/sys/class/net/{self.veth}").exists():
            run(["ip", "link", "del", self.veth], check=False)


def route_between(namespaces: Sequence[Netns]) -> None:
    """Each namespace reaches the others' addresses through this machine (its own end of
    its pair): a namespace has its /30 and no route beyond it. The routes live inside the
    namespaces and go with them when they are deleted."""
    for ns in namespaces:
        # This machine forwards between the pairs. Forwarding is turned on for our own veth
        # ends only (a per-interface setting that goes with the veth), never machine-wide:
        # a machine whose net.ipv4.ip_forward is 0 (Debian's default) still routes them.
        Path(f"/proc/sys/net/ipv4/conf/{ns.veth}/forwarding").write_text("1\n")
        for other in namespaces:
            if other is not ns:
                route = [f"{other.address}/32", "via", ns.host_address]
                run(["ip", "-n", ns.name, "route", "replace", *route], timeout=30)


# --- mounts --------------------------------------------------------------------------------


def _mounted(path: Path) -> bool:
    # os.path.ismount misses a bind mount on the same device; /proc/self/mounts does not.
    target = str(path).replace(" ", "\\040")
    return any(
        line.split()[1] == target for line in Path("/proc/self/mounts").read_text().splitlines()
    )


def umount(path: Path) -> None:
    for _ in range(20):
        if not _mounted(path):
            return
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.25)
    subprocess.run(["umount", "--lazy", str(path)], capture_output=True)


def remove_tree(workdir: Path) -> None:
    """rm -rf that never goes through a mount (the repo is bound read-only inside roots)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        mnt = line.split()[1].replace("\\040", " ")
        if mnt.startswith(str(workdir) + "/"):
            umount(Path(mnt))
    shutil.rmtree(workdir, ignore_errors=True)


# --- one container -------------------------------------------------------------------------


def nspawn_processes() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, argv) of every systemd-nspawn process on this machine."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"systemd-nspawn"):
            yield int(proc.name), argv


def nspawn_pids(machine: str) -> list[int]:
    """systemd-nspawn processes running the machine `machine` (found by their argv)."""
    want = f"--machine={machine}".encode()
    return [pid for pid, argv in nspawn_processes() if want in argv]


class Container:
    """One machine booted from the image: overlay root under `workdir`, console log, nspawn.

    `binds` are (host path, container path) pairs bound read-only. Started by this process
    (`spawn`) it is our child; `attach(pid)` adopts one started by an earlier process
    (the lab host outlives `lab up`), checked by its argv before it is ever signalled.
    """

    def __init__(
        self,
        *,
        machine: str,
        rootfs: Path,
        workdir: Path,
        netns: Netns,
        binds: Sequence[tuple[Path | str, str]] = (),
    ) -> None:
        self.machine = machine
        self.rootfs = rootfs
        self.dir = workdir
        self.netns = netns
        self.binds = list(binds)
        self.console_log = workdir / "console.log"
        self.mode = ""  # "overlay" or "ephemeral" once the root is mounted
        self._root: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None

    @property
    def root(self) -> Path:
        """The container's / as seen from here (to provision files before boot)."""
        if self._root is None:
            raise ContainerError(f"{self.machine}: the root is not mounted")
        return self._root

    def mount_root(self) -> None:
        if self.mode:  # restarts reuse the mount (and with it the machine's state)
            return
        upper, work, merged = self.dir / "upper", self.dir / "work", self.dir / "root"
        for d in (upper, work, merged):
            d.mkdir(parents=True, exist_ok=True)
        if _mounted(merged):  # left by an earlier owner of this directory
            self.mode, self._root = "overlay", merged
            return
        res = subprocess.run(
            [
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={self.rootfs},upperdir={upper},workdir={work}",
                str(merged),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if res.returncode == 0:
            self.mode, self._root = "overlay", merged
        else:
            self.mode, self._root = "ephemeral", self.rootfs

    def spawn(self, *, hostname: str | None = None) -> int:
        root = self.root
        argv = [
            "systemd-nspawn",
            "--directory",
            str(root),
            "--boot",
            "--register=no",
            "--keep-unit",
            f"--machine={self.machine}",
            f"--network-namespace-path={self.netns.path}",
            *(f"--bind-ro={src}:{dest}" for src, dest in self.binds),
            "--console=read-only",
            # Plain console text in the log (PID 1 reads these from its environment).
            "--setenv=SYSTEMD_COLORS=0",
        ]
        if hostname:
            argv.append(f"--hostname={hostname}")
        if self.mode == "ephemeral":
            argv.append("--ephemeral")
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.console_log, "ab") as log:
            try:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C in the terminal is not for it
                )
            except FileNotFoundError as exc:
                raise ContainerError(
                    "systemd-nspawn not found", hint="apt-get install systemd-container"
                ) from exc
        self.pid = self._proc.pid
        return self.pid

    def attach(self, pid: int) -> bool:
        """Adopt the nspawn `pid` started earlier, if it still runs this machine."""
        if pid in nspawn_pids(self.machine):
            self.pid = pid
            return True
        return False

    def running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return (
            self.pid is not None and pid_alive(self.pid) and self.pid in nspawn_pids(self.machine)
        )

    def console_tail(self, lines: int = 40) -> str:
        try:
            text = self.console_log.read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str, target: SshTarget | None = None) -> ContainerError:
        msg = [
            f"systemd host {self.machine} ({self.netns.address}): {what}",
            f"--- console ({self.console_log}) ---",
            self.console_tail(),
        ]
        if target is not None and self.running():
            try:
                j = target.ssh_run(
                    "journalctl -b --no-pager -n 60; systemctl --failed --no-pager", timeout=20
                )
                msg += ["--- journal ---", j.stdout or j.stderr]
            except subprocess.TimeoutExpired:
                pass
        return ContainerError("\n".join(msg))

    def wait_booted(self, target: SshTarget, timeout: float) -> list[str]:
        """Wait for sshd on port 22, then for the boot to finish; returns boot warnings."""
        deadline = time.monotonic() + timeout
        # 1. sshd answers on port 22 (bounded by count and time; nspawn must stay alive).
        for _ in range(5000):
            if not self.running():
                raise self.failure("systemd-nspawn exited during boot")
            if time.monotonic() > deadline:
                raise self.failure(f"sshd did not answer on port 22 within {timeout:.0f}s")
            if answers_ssh(target.address, target.port):
                break
            time.sleep(0.05)
        # 2. Boot finished: nothing may race units still starting.
        left = max(10.0, deadline - time.monotonic())
        try:
            res = target.ssh_run(
                f"timeout {int(left)} systemctl is-system-running --wait", timeout=left + 15
            )
        except subprocess.TimeoutExpired:
            raise self.failure(
                "boot did not finish (systemctl is-system-running --wait)", target
            ) from None
        state = res.stdout.strip()
        if res.returncode == 255:
            raise self.failure(f"ssh as {target.user} failed: {res.stderr.strip()}", target)
        if state == "degraded":
            failed = target.ssh_run("systemctl --failed --no-pager --plain", timeout=30)
            return [f"boot degraded:\n{failed.stdout}"]
        if state != "running":
            raise self.failure(
                f"system state after boot is {state!r}: {res.stderr.strip()}", target
            )
        return []

    def stop(self, *, grace: float = 30.0) -> None:
        """Halt the machine: SIGTERM asks nspawn for a clean shutdown (units stopped), a
        second SIGTERM makes it terminate at once, SIGKILL if even that hangs."""
        proc, self._proc = self._proc, None
        pid, self.pid = self.pid, None
        if pid is None:
            return

        def alive() -> bool:
            if proc is not None:
                return proc.poll() is None
            return pid_alive(pid) and pid in nspawn_pids(self.machine)

        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            if not alive():
                return
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and alive():
                time.sleep(0.1)
        if alive():
            raise ContainerError(f"systemd-nspawn {pid} ({self.machine}) did not stop")

    def unmount(self) -> None:
        """Unmount the overlay root, also one mounted by an earlier owner of `workdir`."""
        if self.mode == "overlay" and self._root is not None:
            umount(self._root)
        elif not self.mode and _mounted(self.dir / "root"):
            umount(self.dir / "root")
        self.mode, self._root = "", None
