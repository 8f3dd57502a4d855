"""A real systemd host for the tests: a Debian rootfs booted with `systemd-nspawn -b`.

The image: scripts/build-rootfs caches a tarball outside the repo, and the first session
unpacks it beside the tarball (`rootfs-bookworm-<hash>/`); every container boots from that
tree as the read-only lower layer of an overlay, so nothing is copied per boot.

Layout of one test session (all under /var/tmp/orch-systemd-host-<pid>-*/, removed at the end):

    id_ed25519(.pub)   the session's client key; bound read-only into every container as
                       /etc/ssh/orch_authorized_keys (the rootfs's sshd_config lists it)
    <host>/            per booted host: overlay upper/work dirs, the merged root, the
                       console log, known_hosts

Each host gets its own network namespace with a veth pair and a private /30 from
10.213.0.0/16 (host side .1, container side .2), so the container's sshd listens on port
22 of its own namespace and the machine's port 22 is never involved. Tests only ever
talk to the container's address.

Why these choices (gotchas met on the way):
- No systemd runs as PID 1 on the test machines, so nspawn must be told not to register
  with machined (`--register=no`) nor to create a scope unit (`--keep-unit`).
- `--ephemeral` would give each boot a clean root, but on ext4 it copies the whole tree
  (~220 MB): about 5 s per boot here. An overlayfs mount (the extracted rootfs as the
  read-only lower layer, a fresh upper dir per host) gives the same clean start in
  milliseconds, and unlike `--ephemeral` it survives `restart_container()`: a rebooted
  host keeps its installed units, like a real one. Where overlayfs cannot be mounted the
  fixture falls back to `--ephemeral`.
- The container's machine-id is fixed in the rootfs: an empty one makes systemd treat
  every boot as a first boot (firstboot prompts, ConditionFirstBoot units).
- getty units are masked: with no TTY, console-getty would respawn forever.
- The journal is volatile (in /run): nothing to flush or rotate, each boot starts empty.
- sshd runs with `UsePAM no`; OpenSSH then refuses accounts whose password field starts
  with '!' (locked), so the build sets root's to '*' (no password, keys still work).
- The container's console goes to a log file; on a failed boot the error shows its tail
  and, when SSH works, the journal. nspawn prints "Attempted to remove disk file system
  under /run/systemd/nspawn/propagate/..." at shutdown: harmless.
- A session killed hard (SIGKILL) leaves its container, namespace and mounts behind; the
  next session removes those whose owner pid is gone before it starts.
"""

from __future__ import annotations

import fcntl
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.localproc import pid_alive
from tests.hosts.target import SshTarget

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "scripts" / "build-rootfs"
REPO_IN_CONTAINER = "/opt/orchestrator"
WORK_PARENT = Path("/var/tmp")
WORK_PREFIX = "orch-systemd-host-"
NET_PREFIX = "10.213"
NETNS_RE = re.compile(r"^orch-(\d+)-(\d+)$")
VETH_RE = re.compile(r"^oh(\d+)x(\d+)$")
NET_LOCK = Path("/run/orch-test-net.lock")


class HostError(RuntimeError):
    """The test host could not be built, booted or stopped; the message has the evidence."""


def _run(argv: list[str], *, timeout: float = 60.0, check: bool = True) -> str:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise HostError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()}")
    return res.stdout


# --- the image -----------------------------------------------------------------------------


def build_rootfs() -> Path:
    """Run scripts/build-rootfs (a no-op when cached); its progress goes to the terminal."""
    res = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=sys.__stderr__,  # the one-minute build should not look like a hang
        text=True,
        timeout=1800,
    )
    if res.returncode != 0:
        raise HostError(f"scripts/build-rootfs failed (exit {res.returncode}); see its output")
    return Path(res.stdout.strip().splitlines()[-1])


def extracted_rootfs(tarball: Path) -> Path:
    """The tarball unpacked beside it, once per recipe: the read-only lower layer of hosts.

    Unpacking takes about a second, but deleting 220 MB of small files at the end of every
    session costs far more on a busy disk, so the tree is kept in the cache like the
    tarball. A lock and an atomic rename make concurrent sessions safe.
    """
    dest = tarball.parent / tarball.name.removesuffix(".tar.zst")
    if dest.is_dir():
        return dest
    with open(tarball.parent / ".extract.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if dest.is_dir():
            return dest
        for partial in tarball.parent.glob(".extract-*"):  # from a session killed midway
            shutil.rmtree(partial, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=tarball.parent))
        with subprocess.Popen(["zstd", "-dc", str(tarball)], stdout=subprocess.PIPE) as zst:
            tar = subprocess.run(
                ["tar", "-C", str(tmp), "--numeric-owner", "--xattrs", "-xf", "-"],
                stdin=zst.stdout, capture_output=True, text=True, timeout=600,
            )
        if zst.returncode != 0 or tar.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise HostError(f"extracting {tarball} failed: {tar.stderr.strip()}")
        tmp.chmod(0o755)  # mkdtemp's 0700 would become the container's / mode
        os.rename(tmp, dest)
    return dest


class SystemdImage:
    """The extracted rootfs and the session's client key, shared by every host booted."""

    def __init__(self, tarball: Path, workdir: Path) -> None:
        self.tarball = tarball
        self.workdir = workdir
        self.rootfs = extracted_rootfs(tarball)
        self.host_key_pub = (
            (self.rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
        )
        self.identity_file = workdir / "id_ed25519"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "orch-tests",
              "-f", str(self.identity_file)])
        self.authorized_keys = workdir / "authorized_keys"
        shutil.copy(str(self.identity_file) + ".pub", self.authorized_keys)
        self.authorized_keys.chmod(0o644)


# --- network -------------------------------------------------------------------------------


@contextmanager
def _net_lock() -> Iterator[None]:
    """Serialize address allocation between concurrent sessions (xdist workers, checkouts)."""
    with open(NET_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _used_prefixes() -> set[str]:
    """The 10.213.x.y /30 blocks already configured anywhere on this machine."""
    used: set[str] = set()
    out = _run(["ip", "-o", "-4", "addr", "show"], check=False)
    out += _run(["ip", "-4", "route", "show"], check=False)
    for m in re.finditer(rf"\b{re.escape(NET_PREFIX)}\.(\d+)\.(\d+)", out):
        used.add(f"{m.group(1)}.{int(m.group(2)) // 4}")
    return used


class Netns:
    """A network namespace plus a veth pair with a private /30: ours to create and delete."""

    def __init__(self, index: int) -> None:
        pid = os.getpid()
        self.name = f"orch-{pid}-{index}"
        self.path = Path("/run/netns") / self.name
        self.veth = f"oh{pid}x{index}"[:15]
        self.host_address = ""
        self.address = ""

    def create(self) -> None:
        with _net_lock():
            used = _used_prefixes()
            free = [f"{x}.{y}" for x in range(256) for y in range(64) if f"{x}.{y}" not in used]
            if not free:
                raise HostError(f"no free /30 left in {NET_PREFIX}.0.0/16")
            x, y = random.choice(free).split(".")
            base = int(y) * 4
            self.host_address = f"{NET_PREFIX}.{x}.{base + 1}"
            self.address = f"{NET_PREFIX}.{x}.{base + 2}"
            try:
                _run(["ip", "netns", "add", self.name])
                # The container end is created inside the namespace, already named eth0.
                _run(["ip", "link", "add", self.veth, "type", "veth",
                      "peer", "name", "eth0", "netns", self.name])
                _run(["ip", "addr", "add", f"{self.host_address}/30", "dev", self.veth])
                _run(["ip", "link", "set", self.veth, "up"])
                # Configured from outside: the rootfs has no network manager, and systemd
                # inside leaves an already configured interface alone.
                _run(["ip", "-n", self.name, "addr", "add", f"{self.address}/30", "dev", "eth0"])
                _run(["ip", "-n", self.name, "link", "set", "eth0", "up"])
                _run(["ip", "-n", self.name, "link", "set", "lo", "up"])
            except BaseException:
                self.delete()
                raise

    def delete(self) -> None:
        # Deleting the namespace destroys its end of the pair and with it ours; the explicit
        # link delete covers a namespace that never got its end.
        if self.path.exists():
            _run(["ip", "netns", "del", self.name], check=False)
        if Path(f"/sys/class/net/{self.veth}").exists():
            _run(["ip", "link", "del", self.veth], check=False)


# --- one host ------------------------------------------------------------------------------


class SystemdHost:
    """One booted container: reach it with `ssh_run`, give it units with `install_unit`.

    Fields for the project's own transport: `address`, `port` (22), `user` (root),
    `identity_file`, `known_hosts`, `host_key_pub`; `hosts_entry()`/`hosts_yaml()` render
    it for a hosts.yaml.
    """

    port = 22
    user = "root"

    def __init__(self, image: SystemdImage, index: int, workdir: Path) -> None:
        self.image = image
        self.name = f"orch-sd-{os.getpid()}-{index}"
        self.dir = workdir / f"host{index}"
        self.dir.mkdir()
        self.console_log = self.dir / "console.log"
        self.netns = Netns(index)
        self._proc: subprocess.Popen[bytes] | None = None
        self._root: Path | None = None
        self.mode = ""  # "overlay" or "ephemeral"
        self.target: SshTarget | None = None
        self.boot_warnings: list[str] = []

    # Fields of the target, for readability in tests.
    @property
    def address(self) -> str:
        return self.netns.address

    @property
    def identity_file(self) -> Path:
        return self.image.identity_file

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def host_key_pub(self) -> str:
        return " ".join(self.image.host_key_pub)

    # -- lifecycle --

    def start(self, *, timeout: float = 120.0) -> None:
        try:
            if not self.netns.path.exists():
                self.netns.create()
            self.known_hosts.write_text(f"{self.address} {self.host_key_pub}\n")
            self.target = SshTarget(
                address=self.address, port=self.port, user=self.user,
                identity_file=self.identity_file, known_hosts=self.known_hosts,
                host_key_pub=self.host_key_pub,
            )
            self._mount_root()
            self._spawn()
            self._wait_booted(timeout)
        except BaseException:
            self.stop()
            raise

    def _mount_root(self) -> None:
        if self.mode:  # restarts reuse the mount (and with it the host's state)
            return
        upper, work, merged = self.dir / "upper", self.dir / "work", self.dir / "root"
        for d in (upper, work, merged):
            d.mkdir(exist_ok=True)
        res = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o",
             f"lowerdir={self.image.rootfs},upperdir={upper},workdir={work}", str(merged)],
            capture_output=True, text=True, timeout=60,
        )
        if res.returncode == 0:
            self.mode, self._root = "overlay", merged
        else:
            self.mode, self._root = "ephemeral", self.image.rootfs

    def _spawn(self) -> None:
        assert self._root is not None
        argv = [
            "systemd-nspawn",
            "--directory", str(self._root),
            "--boot",
            "--register=no",
            "--keep-unit",
            f"--machine={self.name}",
            f"--network-namespace-path={self.netns.path}",
            f"--bind-ro={REPO}:{REPO_IN_CONTAINER}",
            f"--bind-ro={self.image.authorized_keys}:/etc/ssh/orch_authorized_keys",
            "--console=read-only",
            # Plain console text in the log (PID 1 reads these from its environment).
            "--setenv=SYSTEMD_COLORS=0",
        ]
        if self.mode == "ephemeral":
            argv.append("--ephemeral")
        with open(self.console_log, "ab") as log:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # teardown stops it; a Ctrl-C must not race that
            )

    def _console_tail(self, lines: int = 40) -> str:
        try:
            text = self.console_log.read_text(errors="replace")
        except OSError:
            return "(no console log)"
        return "\n".join(text.splitlines()[-lines:])

    def _fail(self, what: str) -> HostError:
        msg = [f"systemd host {self.name} ({self.address}): {what}",
               f"--- console ({self.console_log}) ---", self._console_tail()]
        if self.target and self.running():
            try:
                j = self.target.ssh_run(
                    "journalctl -b --no-pager -n 60; systemctl --failed --no-pager", timeout=20
                )
                msg += ["--- journal ---", j.stdout or j.stderr]
            except subprocess.TimeoutExpired:
                pass
        return HostError("\n".join(msg))

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _wait_booted(self, timeout: float) -> None:
        assert self.target is not None
        deadline = time.monotonic() + timeout
        # 1. sshd answers on port 22 (bounded by count and time; nspawn must stay alive).
        for _ in range(5000):
            if not self.running():
                raise self._fail("systemd-nspawn exited during boot")
            if time.monotonic() > deadline:
                raise self._fail(f"sshd did not answer on port 22 within {timeout:.0f}s")
            try:
                with socket.create_connection((self.address, 22), timeout=2) as s:
                    s.settimeout(5)
                    if s.recv(64).startswith(b"SSH-"):
                        break
            except OSError:
                time.sleep(0.05)
        # 2. Boot finished: tests must not race units still starting.
        left = max(10.0, deadline - time.monotonic())
        try:
            res = self.target.ssh_run(
                f"timeout {int(left)} systemctl is-system-running --wait", timeout=left + 15
            )
        except subprocess.TimeoutExpired:
            raise self._fail("boot did not finish (systemctl is-system-running --wait)") from None
        state = res.stdout.strip()
        if res.returncode == 255:
            raise self._fail(f"ssh as root with the session key failed: {res.stderr.strip()}")
        if state == "degraded":
            failed = self.target.ssh_run("systemctl --failed --no-pager --plain", timeout=30)
            self.boot_warnings.append(f"boot degraded:\n{failed.stdout}")
            warnings.warn(f"{self.name}: boot degraded:\n{failed.stdout}", stacklevel=2)
        elif state != "running":
            raise self._fail(f"system state after boot is {state!r}: {res.stderr.strip()}")

    def stop(self) -> None:
        """Halt the container (SIGTERM asks nspawn for a clean halt), then drop everything."""
        self._stop_container()
        self._unmount()
        self.netns.delete()

    def _stop_container(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                # A second SIGTERM makes nspawn terminate at once; SIGKILL if even that hangs.
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)

    def _unmount(self) -> None:
        if self.mode == "overlay" and self._root is not None:
            _umount(self._root)
        self.mode, self._root = "", None

    def restart_container(self, *, fresh: bool = False, timeout: float = 120.0) -> None:
        """Power-cycle the container: sessions drop, services restart from their units.

        State on disk survives (like a rebooted host) unless `fresh`, or in the
        `--ephemeral` fallback where every boot starts from the image.
        """
        self._stop_container()
        if fresh:
            self._unmount()
            shutil.rmtree(self.dir / "upper", ignore_errors=True)
            shutil.rmtree(self.dir / "work", ignore_errors=True)
        self._mount_root()
        self._spawn()
        try:
            self._wait_booted(timeout)
        except BaseException:
            self.stop()
            raise

    # -- use --

    def _target(self) -> SshTarget:
        if self.target is None:
            raise HostError(f"{self.name} is not started")
        return self.target

    def ssh_command(self, *remote: str) -> list[str]:
        return self._target().ssh_command(*remote)

    def ssh_run(
        self,
        command: str | list[str],
        *,
        input: str | None = None,
        timeout: float = 60.0,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        return self._target().ssh_run(command, input=input, timeout=timeout, check=check)

    def write_file(self, path: str, text: str, *, mode: str = "0644") -> None:
        """Write a file on the host through ssh (stdin, so any content arrives unchanged)."""
        q = "'" + path.replace("'", "'\\''") + "'"
        self.ssh_run(
            f"mkdir -p \"$(dirname {q})\" && cat > {q} && chmod {mode} {q}",
            input=text, check=True,
        )

    def install_unit(self, name: str, text: str, *, directory: str = "/etc/systemd/system") -> None:
        """Write a unit (or `UNIT.d/x.conf` drop-in, as `name`) and `daemon-reload`."""
        self.write_file(f"{directory}/{name}", text)
        self.ssh_run("systemctl daemon-reload", check=True)

    def hosts_entry(self, **extra: object) -> dict[str, object]:
        return self._target().hosts_entry(service_manager="systemd", **extra)

    def hosts_yaml(self, name: str = "systemd-host", **extra: object) -> str:
        return self._target().hosts_yaml(name, service_manager="systemd", **extra)


def _umount(path: Path) -> None:
    for _ in range(20):
        if not os.path.ismount(path):
            return
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.25)
    subprocess.run(["umount", "--lazy", str(path)], capture_output=True)


# --- the session ---------------------------------------------------------------------------


class SystemdHostFactory:
    """Boots hosts from one image; `stop_all()` at session end stops whatever is left."""

    def __init__(self) -> None:
        cleanup_stale()
        self.workdir = Path(
            tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=WORK_PARENT)
        )
        self.hosts: list[SystemdHost] = []
        self._image: SystemdImage | None = None
        self._index = 0

    @property
    def image(self) -> SystemdImage:
        if self._image is None:
            self._image = SystemdImage(build_rootfs(), self.workdir)
        return self._image

    def boot(self, *, timeout: float = 120.0) -> SystemdHost:
        self._index += 1
        host = SystemdHost(self.image, self._index, self.workdir)
        self.hosts.append(host)
        host.start(timeout=timeout)
        return host

    def stop(self, host: SystemdHost) -> None:
        host.stop()
        shutil.rmtree(host.dir, ignore_errors=True)
        if host in self.hosts:
            self.hosts.remove(host)

    def stop_all(self) -> None:
        errors: list[str] = []
        for host in list(self.hosts):
            try:
                self.stop(host)
            except Exception as exc:  # keep tearing down the rest
                errors.append(f"{host.name}: {exc}")
        _remove_workdir(self.workdir)
        if errors:
            raise HostError("teardown failed: " + "; ".join(errors))


def _remove_workdir(workdir: Path) -> None:
    # Never rm -rf through a mount (the repo is bound read-only inside merged roots).
    for line in Path("/proc/mounts").read_text().splitlines():
        mnt = line.split()[1].replace("\\040", " ")
        if mnt.startswith(str(workdir) + "/"):
            _umount(Path(mnt))
    shutil.rmtree(workdir, ignore_errors=True)


def cleanup_stale() -> None:
    """Remove what sessions that died without teardown left: containers, netns, mounts."""
    if os.geteuid() != 0:
        return
    dead: set[str] = set()
    for entry in Path("/run/netns").glob("orch-*") if Path("/run/netns").exists() else []:
        m = NETNS_RE.match(entry.name)
        if m and not pid_alive(int(m.group(1))):
            dead.add(m.group(1))
    for workdir in WORK_PARENT.glob(f"{WORK_PREFIX}*"):
        owner = workdir.name[len(WORK_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            dead.add(owner)
    if not dead:
        return
    # Their nspawn processes outlive them (own session); find them by the namespace path
    # in their argv, which names the dead owner's pid.
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"systemd-nspawn"):
            continue
        for arg in argv:
            m = re.match(rb"--network-namespace-path=/run/netns/orch-(\d+)-\d+$", arg)
            if m and m.group(1).decode() in dead:
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    time.sleep(0.5)
    for owner in dead:
        for entry in Path("/run/netns").glob(f"orch-{owner}-*"):
            _run(["ip", "netns", "del", entry.name], check=False)
        for link in Path("/sys/class/net").glob(f"oh{owner}x*"):
            _run(["ip", "link", "del", link.name], check=False)
        for workdir in WORK_PARENT.glob(f"{WORK_PREFIX}{owner}-*"):
            _remove_workdir(workdir)
