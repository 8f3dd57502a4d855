"""Throwaway systemd hosts for the tests and the benchmarks: a Debian rootfs booted with
`systemd-nspawn -b`, as many as asked for, each in its own network namespace.

The machinery (image, overlay root, network namespace, nspawn, boot wait) is
`orchestrator.lab.container`, which `orchestrator lab up --systemd` uses too; this module
adds what many short-lived hosts need: names that carry the owning pid, a per-session
client key, helpers to install units, and the cleanup of killed sessions.

Layout of one test session (all under /var/tmp/orch-systemd-host-<pid>-*/, removed at the end):

    id_ed25519(.pub)   the session's client key; bound read-only into every container as
                       /etc/ssh/orch_authorized_keys (the rootfs's sshd_config lists it)
    <host>/            per booted host: overlay upper/work dirs, the merged root, the
                       console log, known_hosts

Test-side gotchas (the container's own are in orchestrator.lab.container):
- The container's machine-id is fixed in the rootfs: an empty one makes systemd treat
  every boot as a first boot (firstboot prompts, ConditionFirstBoot units).
- getty units are masked: with no TTY, console-getty would respawn forever.
- The journal is volatile (in /run): nothing to flush or rotate, each boot starts empty.
- sshd runs with `UsePAM no`; OpenSSH then refuses accounts whose password field starts
  with '!' (locked), so the build sets root's to '*' (no password, keys still work).
- A session killed hard (SIGKILL) leaves its container, namespace and mounts behind; the
  next session removes those whose owner pid is gone before it starts. Names carry the
  owner's pid (netns `orch-<pid>-<i>`, veth `oh<pid>x<i>`, machine `orch-sd-<pid>-<i>`).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

from orchestrator.execution.localproc import pid_alive
from orchestrator.lab import container as ct
from orchestrator.lab.container import ContainerError, Netns, build_rootfs, extracted_rootfs
from orchestrator.lab.sshd import SshTarget

REPO = Path(__file__).resolve().parents[2]
REPO_IN_CONTAINER = "/opt/orchestrator"
WORK_PARENT = Path("/var/tmp")
WORK_PREFIX = "orch-systemd-host-"
NETNS_RE = re.compile(r"^orch-(\d+)-(\d+)$")
VETH_RE = re.compile(r"^oh(\d+)x(\d+)$")

#: the test host's failures are the container's (the fixtures' callers catch this name)
HostError = ContainerError
__all__ = [
    "HostError",
    "SystemdHost",
    "SystemdHostFactory",
    "SystemdImage",
    "build_rootfs",
    "cleanup_stale",
    "extracted_rootfs",
]


def _run(argv: list[str], *, timeout: float = 60.0, check: bool = True) -> str:
    return ct.run(argv, timeout=timeout, check=check)


class SystemdImage:
    """The extracted rootfs and the session's client key, shared by every host booted."""

    def __init__(self, tarball: Path, workdir: Path) -> None:
        self.tarball = tarball
        self.workdir = workdir
        self.rootfs = extracted_rootfs(tarball)
        self.host_key_pub = ct.rootfs_host_key(self.rootfs).split()
        self.identity_file = workdir / "id_ed25519"
        _run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "orch-tests",
                "-f",
                str(self.identity_file),
            ]
        )
        self.authorized_keys = workdir / "authorized_keys"
        shutil.copy(str(self.identity_file) + ".pub", self.authorized_keys)
        self.authorized_keys.chmod(0o644)


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
        pid = os.getpid()
        self.name = f"orch-sd-{pid}-{index}"
        self.dir = workdir / f"host{index}"
        self.dir.mkdir()
        self.netns = Netns(f"orch-{pid}-{index}", f"oh{pid}x{index}"[:15])
        self.container = ct.Container(
            machine=self.name,
            rootfs=image.rootfs,
            workdir=self.dir,
            netns=self.netns,
            binds=[
                (REPO, REPO_IN_CONTAINER),
                (image.authorized_keys, "/etc/ssh/orch_authorized_keys"),
            ],
        )
        self.console_log = self.container.console_log
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

    @property
    def mode(self) -> str:
        """ "overlay" or "ephemeral" (see orchestrator.lab.container)."""
        return self.container.mode

    # -- lifecycle --

    def start(self, *, timeout: float = 120.0) -> None:
        try:
            if not self.netns.path.exists():
                self.netns.create()
            self.known_hosts.write_text(f"{self.address} {self.host_key_pub}\n")
            self.target = SshTarget(
                address=self.address,
                port=self.port,
                user=self.user,
                identity_file=self.identity_file,
                known_hosts=self.known_hosts,
                host_key_pub=self.host_key_pub,
            )
            self.container.mount_root()
            self.container.spawn()
            self._wait_booted(timeout)
        except BaseException:
            self.stop()
            raise

    def running(self) -> bool:
        return self.container.running()

    def _wait_booted(self, timeout: float) -> None:
        assert self.target is not None
        for warning in self.container.wait_booted(self.target, timeout):
            self.boot_warnings.append(warning)
            warnings.warn(f"{self.name}: {warning}", stacklevel=2)

    def stop(self) -> None:
        """Halt the container (SIGTERM asks nspawn for a clean halt), then drop everything."""
        self.container.stop()
        self.container.unmount()
        self.netns.delete()

    def restart_container(self, *, fresh: bool = False, timeout: float = 120.0) -> None:
        """Power-cycle the container: sessions drop, services restart from their units.

        State on disk survives (like a rebooted host) unless `fresh`, or in the
        `--ephemeral` fallback where every boot starts from the image.
        """
        self.container.stop()
        if fresh:
            self.container.unmount()
            shutil.rmtree(self.dir / "upper", ignore_errors=True)
            shutil.rmtree(self.dir / "work", ignore_errors=True)
        self.container.mount_root()
        self.container.spawn()
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
            f'mkdir -p "$(dirname {q})" && cat > {q} && chmod {mode} {q}',
            input=text,
            check=True,
        )

    def install_unit(self, name: str, text: str, *, directory: str = "/etc/systemd/system") -> None:
        """Write a unit (or `UNIT.d/x.conf` drop-in, as `name`) and `daemon-reload`."""
        self.write_file(f"{directory}/{name}", text)
        self.ssh_run("systemctl daemon-reload", check=True)

    def hosts_entry(self, **extra: object) -> dict[str, object]:
        return self._target().hosts_entry(service_manager="systemd", **extra)

    def hosts_yaml(self, name: str = "systemd-host", **extra: object) -> str:
        return self._target().hosts_yaml(name, service_manager="systemd", **extra)


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
        ct.remove_tree(self.workdir)
        if errors:
            raise HostError("teardown failed: " + "; ".join(errors))


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
        owner = workdir.name[len(WORK_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            dead.add(owner)
    if not dead:
        return
    # Their nspawn processes outlive them (own session); find them by the namespace path
    # in their argv, which names the dead owner's pid.
    for pid, argv in ct.nspawn_processes():
        for arg in argv:
            m = re.match(rb"--network-namespace-path=/run/netns/orch-(\d+)-\d+$", arg)
            if m and m.group(1).decode() in dead:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    time.sleep(0.5)
    for owner in dead:
        for entry in Path("/run/netns").glob(f"orch-{owner}-*"):
            _run(["ip", "netns", "del", entry.name], check=False)
        for link in Path("/sys/class/net").glob(f"oh{owner}x*"):
            _run(["ip", "link", "del", link.name], check=False)
        for workdir in WORK_PARENT.glob(f"{WORK_PREFIX}{owner}-*"):
            ct.remove_tree(workdir)
