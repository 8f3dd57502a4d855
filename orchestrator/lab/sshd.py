"""A private OpenSSH sshd on 127.0.0.1 with throwaway keys: the lab's and the tests' SSH host.

One state directory holds everything: an ed25519 host key and client key made with
`ssh-keygen`, `authorized_keys` (the client key only), a `known_hosts` with the host key
(so clients verify it like any real host), `sshd_config`, the log, and for a daemonized
sshd its pid file. `orchestrator lab up` and the test fixtures use this same code.

Remote commands must find the project's Python: the config sets `SetEnv PATH=<venv bin>:...`
and `PYTHONPATH=<repo>`. sshd applies its `SetEnv` after it builds the session's default
environment (PATH included), so it overrides PATH for every session. The login shell
then runs the command as a non-login shell, which reads no profile; but bash (Debian
builds it with SSH_SOURCE_BASHRC) still sources ~/.bashrc for commands run by sshd, and
a .bashrc that prepends pyenv or conda to PATH would win. The config therefore also sets
SHLVL=1: bash only sources .bashrc that way at shell level 1, and the session's bash
becomes level 2. The tests check the result (`python3` resolves to the venv's
interpreter over SSH).
"""

from __future__ import annotations

import getpass
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.errors import InfraError
from orchestrator.execution.localproc import pid_alive

DEFAULT_ADDRESS = "127.0.0.1"


@dataclass(frozen=True)
class SshTarget:
    """How to reach an SSH host with the OpenSSH client: address, key, known_hosts."""

    address: str
    port: int
    user: str
    identity_file: Path
    known_hosts: Path
    host_key_pub: str  # "ssh-ed25519 AAAA..." as the host serves it

    def ssh_options(self) -> list[str]:
        """Client options that trust only this host's key and log in with the client key."""
        return [
            "-F",
            "/dev/null",  # the user's ~/.ssh/config must not change what we test
            "-p",
            str(self.port),
            "-i",
            str(self.identity_file),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityAgent=none",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "HostKeyAlgorithms=ssh-ed25519",
            # Plain X25519: OpenSSH 9's default hybrid (sntrup761x25519) costs ~0.1 s of CPU per
            # connection, and the tests and the lab open hundreds of short ones.
            "-o",
            "KexAlgorithms=curve25519-sha256",
            "-o",
            "BatchMode=yes",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "ConnectTimeout=15",
            "-o",
            "LogLevel=ERROR",
        ]

    def ssh_command(self, *remote: str) -> list[str]:
        """An `ssh` argv for this host; `remote` words are joined by ssh, so quote them."""
        return ["ssh", *self.ssh_options(), f"{self.user}@{self.address}", *remote]

    def ssh_run(
        self,
        command: str | Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 60.0,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run one command over real ssh: a shell string, or an argv quoted here. With
        `check`, a non-zero exit raises InfraError with both output streams."""
        remote = command if isinstance(command, str) else shlex.join(command)
        res = subprocess.run(
            self.ssh_command(remote),
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise InfraError(
                f"ssh {self.user}@{self.address}: {remote!r} exited {res.returncode}\n"
                f"stdout: {res.stdout[-2000:]}\nstderr: {res.stderr[-2000:]}"
            )
        return res

    def hosts_entry(self, **extra: object) -> dict[str, object]:
        """This host as a `hosts.yaml` entry (the inventory's field names)."""
        entry: dict[str, object] = {
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts),
            "transport": "ssh",
        }
        entry.update(extra)
        return entry

    def hosts_yaml(self, name: str = "lab", **extra: object) -> str:
        """A whole `hosts.yaml` text with this host as host `name`."""
        return yaml.safe_dump({"hosts": {name: self.hosts_entry(**extra)}}, sort_keys=False)


@dataclass(frozen=True)
class SshdEndpoint(SshTarget):
    """How to reach one private sshd, and where its files are."""

    log_path: Path = Path()
    config_path: Path = Path()
    state_dir: Path = Path()
    env: tuple[tuple[str, str], ...] = field(default=())  # what sessions get via SetEnv

    def hosts_entry(self, **extra: object) -> dict[str, object]:
        return super().hosts_entry(**{"service_manager": "process", **extra})


def find_sshd() -> str | None:
    """Absolute path of sshd (it refuses to run from a relative path: it re-executes itself)."""
    found = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin")
    return os.path.abspath(found) if found else None


#: where the lab's listeners take their ports: below the kernel's ephemeral range
#: (32768-60999 by default), which outgoing connections (ssh, curl, a probe) and every
#: `bind(port 0)` draw from; a port handed out there can be taken again before the lab
#: server that was given it listens
LAB_PORTS = range(20000, 32000)


def free_port(address: str = DEFAULT_ADDRESS) -> int:
    """A TCP port free on `address` now, drawn at random from LAB_PORTS (two labs, or a lab
    and a test cluster, asking at once rarely draw the same one), else one the kernel picks."""
    draw = random.SystemRandom()
    for _ in range(200):  # bounded; almost always the first draw
        port = draw.choice(LAB_PORTS)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((address, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def known_hosts_line(address: str, port: int, host_key_pub: str) -> str:
    key = " ".join(host_key_pub.split()[:2])  # type + base64; drop the comment
    host = address if port == 22 else f"[{address}]:{port}"
    return f"{host} {key}\n"


def session_env(repo_root: Path | None = None) -> dict[str, str]:
    """Environment for SSH sessions so that `python3 -m orchestrator...` runs this checkout.

    PATH starts with the running interpreter's bin directory when that is a virtualenv
    (not resolved: `.venv/bin/python` is a symlink to the system interpreter), and with
    the lab's nvidia-smi stand-in when the checkout is given.
    """
    path = ["/usr/local/bin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/sbin", "/sbin"]
    if sys.prefix != sys.base_prefix:
        path.insert(0, str(Path(sys.executable).parent))
    if repo_root is not None:
        # The lab host has no GPUs: its nvidia-smi stand-in (orchestrator/lab/bin) comes
        # first, for this host only, so the environment capture sees GPUs and a driver.
        path.insert(0, str(repo_root / "orchestrator" / "lab" / "bin"))
    env = {"PATH": ":".join(path)}
    if repo_root is not None:
        env["PYTHONPATH"] = str(repo_root)
    return env


def _keygen(path: Path, comment: str) -> None:
    if path.exists() and path.with_suffix(".pub").exists():
        return  # reuse: keys (and the known_hosts line) stay valid across restarts
    path.unlink(missing_ok=True)
    try:
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except FileNotFoundError as exc:
        raise InfraError(
            "ssh-keygen not found", hint="install OpenSSH (apt-get install openssh-client)"
        ) from exc
    except subprocess.CalledProcessError as exc:
        raise InfraError(f"ssh-keygen failed for {path}: {exc.stderr.strip()}") from exc


def _quote_setenv(name: str, value: str) -> str:
    word = f"{name}={value}"
    return f'"{word}"' if any(c in word for c in " \t\"'#") else word


def prepare(
    state_dir: Path,
    *,
    port: int,
    address: str = DEFAULT_ADDRESS,
    user: str | None = None,
    env: Mapping[str, str] | None = None,
    pid_file: Path | None = None,
) -> SshdEndpoint:
    """Write keys, authorized_keys, known_hosts and sshd_config under `state_dir`.

    Existing keys are reused, so a restarted sshd keeps its identity; the config and
    known_hosts are rewritten (the port may have changed).
    """
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)
    user = user or getpass.getuser()
    host_key = state_dir / "ssh_host_ed25519_key"
    client_key = state_dir / "id_ed25519"
    _keygen(host_key, "orchestrator-lab-host")
    _keygen(client_key, f"orchestrator-lab-client@{address}")
    host_pub = host_key.with_suffix(".pub").read_text().strip()
    authorized = state_dir / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    authorized.chmod(0o600)
    known_hosts = state_dir / "known_hosts"
    known_hosts.write_text(known_hosts_line(address, port, host_pub))
    log_path = state_dir / "sshd.log"
    env = dict(env) if env is not None else session_env()
    lines = [
        "# Written by orchestrator.lab.sshd: a private sshd with throwaway keys.",
        f"ListenAddress {address}:{port}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {authorized}",
        f"AllowUsers {user}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        # No PAM: it needs the system's sshd PAM stack and, as root, a full session setup.
        "UsePAM no",
        # The state dir may sit under /tmp (world-writable), which StrictModes rejects.
        "StrictModes no",
        "PermitRootLogin prohibit-password",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "AllowTcpForwarding yes",
        # Tests and parallel campaigns open many connections at once.
        "MaxStartups 64:30:128",
        "MaxSessions 64",
        "LogLevel VERBOSE",
        "Subsystem sftp internal-sftp",
        f"PidFile {pid_file if pid_file else 'none'}",
    ]
    if env:
        # SHLVL=1: bash sources ~/.bashrc for commands run by sshd only at shell level 1
        # (Debian builds bash with SSH_SOURCE_BASHRC); a .bashrc that prepends to PATH
        # (pyenv, conda) would otherwise shadow the PATH set here. With SHLVL already 1
        # the session's bash is level 2 and leaves PATH alone.
        env = {"SHLVL": "1", **env}
        lines.append("SetEnv " + " ".join(_quote_setenv(k, v) for k, v in env.items()))
    config = state_dir / "sshd_config"
    config.write_text("\n".join(lines) + "\n")
    return SshdEndpoint(
        address=address,
        port=port,
        user=user,
        identity_file=client_key,
        known_hosts=known_hosts,
        host_key_pub=host_pub,
        log_path=log_path,
        config_path=config,
        state_dir=state_dir,
        env=tuple(env.items()),
    )


def _require_sshd() -> str:
    sshd = find_sshd()
    if not sshd:
        raise InfraError("OpenSSH's sshd is not installed", hint="apt-get install openssh-server")
    if os.geteuid() == 0:
        # sshd running as root insists on its privilege separation directory; on a machine
        # where the ssh service never ran nothing has created it.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    return sshd


def check_config(endpoint: SshdEndpoint) -> None:
    """`sshd -t`: a config error reported at once, not as a timeout waiting for the port."""
    sshd = _require_sshd()
    res = subprocess.run(
        [sshd, "-t", "-f", str(endpoint.config_path)], capture_output=True, text=True, timeout=30
    )
    if res.returncode != 0:
        raise InfraError(
            f"sshd rejects {endpoint.config_path}: {res.stderr.strip() or res.stdout.strip()}"
        )


def log_tail(endpoint: SshdEndpoint, lines: int = 20) -> str:
    try:
        return "\n".join(endpoint.log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def answers_ssh(address: str, port: int) -> bool:
    """True when an SSH server answers on address:port with its banner."""
    try:
        with socket.create_connection((address, port), timeout=2) as sock:
            sock.settimeout(5)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def wait_listening(
    endpoint: SshdEndpoint,
    *,
    timeout: float = 30.0,
    alive: object = None,
) -> None:
    """Wait until the port answers with an SSH banner; bounded in time and attempts.

    `alive` is an optional callable returning False once the sshd process is gone, so a
    failed start is reported at once with the log instead of after the timeout.
    """
    deadline = time.monotonic() + timeout
    delay = 0.02
    for _ in range(2000):
        if callable(alive) and not alive():
            raise InfraError(
                f"sshd exited during startup on {endpoint.address}:{endpoint.port}; "
                f"log {endpoint.log_path}:\n{log_tail(endpoint)}"
            )
        if answers_ssh(endpoint.address, endpoint.port):
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    raise InfraError(
        f"sshd did not answer on {endpoint.address}:{endpoint.port} within {timeout:.0f}s; "
        f"log {endpoint.log_path}:\n{log_tail(endpoint)}"
    )


# --- processes ---------------------------------------------------------------------------


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_our_sshd(pid: int, config_path: Path) -> bool:
    """True when `pid` is an sshd started with `config_path` (pid files can go stale)."""
    argv = _cmdline(pid)
    if not argv:
        return False
    # sshd rewrites its process title into one string, e.g.
    # "sshd: /usr/sbin/sshd -f CONFIG -E LOG [listener] 0 of 10-100 startups".
    words = " ".join(argv).split()
    return "sshd" in words[0] and any(
        a == "-f" and b == str(config_path) for a, b in zip(words, words[1:], strict=False)
    )


def _descendants(pid: int) -> list[int]:
    """All processes below `pid` (per-connection sshds, the sessions' commands)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The comm field may contain spaces and parentheses; ppid follows the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 10000:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int, *, grace: float = 5.0, wait: object = None, tree: bool = True) -> None:
    """SIGTERM `pid` and (with `tree`) everything below it; SIGKILL what is left after `grace`.

    The tree is collected first: once sshd is gone its session processes are reparented
    and could no longer be found. `wait` is an optional callable reaping `pid` when it is
    our child (Popen.poll).
    """
    pids = [pid, *(_descendants(pid) if tree else [])]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            if callable(wait):
                wait()
            pids = [p for p in pids if pid_alive(p)]
            if not pids:
                return
            time.sleep(0.05)


class SshdServer:
    """An sshd run in the foreground as our child (`-D -e`): for test sessions.

    `restart()` kills the listener and every session below it (clients see the
    connection drop) and starts it again on the same port with the same keys. With
    `netns`, it runs inside that network namespace (`ip netns exec`, which execs sshd in
    place: the pid is sshd's), and so does every session's command.
    """

    def __init__(self, endpoint: SshdEndpoint, *, netns: str | None = None) -> None:
        self.endpoint = endpoint
        self.netns = netns
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    def running(self) -> bool:
        return self.pid is not None

    def start(self, *, timeout: float = 30.0) -> None:
        if self.running():
            return
        sshd = _require_sshd()
        check_config(self.endpoint)
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        with open(self.endpoint.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                [*inside, sshd, "-D", "-e", "-f", str(self.endpoint.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a Ctrl-C in the terminal must not reach it first
            )
        proc = self._proc
        try:
            wait_listening(self.endpoint, timeout=timeout, alive=lambda: proc.poll() is None)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            kill_tree(proc.pid, wait=proc.poll)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self, *, timeout: float = 30.0) -> None:
        self.stop()
        self.start(timeout=timeout)

    def __enter__(self) -> SshdServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_daemon(endpoint: SshdEndpoint, pid_file: Path, *, timeout: float = 30.0) -> int:
    """Start sshd daemonized (it writes `pid_file` itself); return its pid once listening."""
    sshd = _require_sshd()
    check_config(endpoint)
    pid_file.unlink(missing_ok=True)
    res = subprocess.run(
        [sshd, "-f", str(endpoint.config_path), "-E", str(endpoint.log_path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if res.returncode != 0:
        raise InfraError(f"sshd failed to start: {res.stderr.strip()}\n{log_tail(endpoint)}")
    # The daemon binds and writes its pid file after detaching, so poll for both.
    pid: int | None = None
    deadline = time.monotonic() + timeout
    for _ in range(1000):
        pid = read_pid(pid_file)
        if pid is not None or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    if pid is None:
        raise InfraError(
            f"sshd wrote no pid file {pid_file} within {timeout:.0f}s; "
            f"log {endpoint.log_path}:\n{log_tail(endpoint)}"
        )
    wait_listening(endpoint, timeout=timeout, alive=lambda: pid_alive(pid))
    return pid


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
