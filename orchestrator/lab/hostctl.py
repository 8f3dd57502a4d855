"""`orchestrator lab up|down|status`: the local lab host that hosts.example.yaml's `lab` points at.

The lab host is this machine: servers run under the process service manager. Where
OpenSSH's sshd is installed, `up` also starts a private sshd on 127.0.0.1:2222 with
throwaway keys, so the demo goes through real SSH with host key checking; its files live
in `<repo>/.lab/ssh/` (id_ed25519, known_hosts, sshd_config, sshd.pid, sshd.log), which is
exactly where the `lab` entry's relative paths point. Without sshd the lab host is
reached through the local transport, and `up` says so.

`up` is idempotent (a running lab sshd is reported, not restarted); `down` stops only the
sshd that `up` started, identified by its pid file *and* its command line, so a stale pid
reused by another process is never signalled. Overrides: ORCH_LAB_PORT (the port) and
ORCH_LAB_DIR (the state directory), for tests and for a second checkout on one machine.

Everything a lab creates lives under its state directory: the sshd's files, and the run
directory of its hosts.yaml entry (`<state dir>/run`: the process manager's locks, pid
and log files), so two labs on one machine never see each other's units or locks. Without
ORCH_LAB_PORT the lab takes 2222 when that is free and another free port when it is not
(recorded in lab.json and written into its hosts.yaml); with it, that port or nothing.
The servers a process lab starts listen on this machine, so the lab chooses their port
too: a free one, recorded in lab.json, and `up` writes every shipped lab config
(experiments/lab/*/*.yaml) moved to that port under `<state dir>/experiments/` (what
`scripts/demo` bisects on the process lab host).

This module returns data and raises `orchestrator.errors`; the CLI prints.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.errors import InfraError, UsageError
from orchestrator.lab import sshd as sshd_mod

DEFAULT_PORT = 2222
DEFAULT_ADDRESS = "127.0.0.1"
PORT_ENV = "ORCH_LAB_PORT"
DIR_ENV = "ORCH_LAB_DIR"


def repo_root() -> Path:
    """The checkout holding this package; hosts.example.yaml's relative paths start here."""
    return Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LabSettings:
    state_dir: Path
    port: int = DEFAULT_PORT
    address: str = DEFAULT_ADDRESS
    repo: Path = field(default_factory=repo_root)
    #: the port was asked for (ORCH_LAB_PORT): a taken one is refused, never replaced
    port_given: bool = False

    @property
    def run_dir(self) -> Path:
        """The process manager's directory on the lab host (locks, pid and log files)."""
        return self.state_dir / "run"

    @property
    def ssh_dir(self) -> Path:
        return self.state_dir / "ssh"

    @property
    def pid_file(self) -> Path:
        return self.ssh_dir / "sshd.pid"

    @property
    def config_path(self) -> Path:
        return self.ssh_dir / "sshd_config"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "lab.json"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> LabSettings:
        env = dict(os.environ) if env is None else env
        repo = repo_root()
        state_dir = Path(env[DIR_ENV]).expanduser() if env.get(DIR_ENV) else repo / ".lab"
        port = DEFAULT_PORT
        if env.get(PORT_ENV):
            try:
                port = int(env[PORT_ENV])
            except ValueError:
                port = 0
            if not 1 <= port <= 65535:
                raise UsageError(
                    f"{PORT_ENV}={env[PORT_ENV]!r} is not a TCP port", hint="e.g. 2222"
                )
        return cls(
            state_dir=state_dir.resolve(), port=port, repo=repo, port_given=bool(env.get(PORT_ENV))
        )


@dataclass(frozen=True)
class LabStatus:
    """What runs for the lab host, and how to reach it."""

    settings: LabSettings
    sshd_installed: bool
    running: bool
    pid: int | None
    port: int  # of the running sshd, else the configured one
    user: str | None
    identity_file: Path
    known_hosts: Path
    log_path: Path
    stale_pid_file: bool = False
    server_port: int | None = None  # the port of the lab's configs (experiments_dir)

    @property
    def experiments_dir(self) -> Path:
        """The shipped lab configs moved to this lab's server port (written by `up`)."""
        return self.settings.state_dir / "experiments"

    @property
    def transport(self) -> str:
        return "ssh" if self.sshd_installed else "local"

    def hosts_entry(self) -> dict[str, object]:
        """The `lab` entry of hosts.yaml that reaches this lab (absolute paths)."""
        run_dir = str(self.settings.run_dir)
        if not self.sshd_installed:
            return {
                "address": "localhost",
                "transport": "local",
                "service_manager": "process",
                "run_dir": run_dir,
                "labels": ["lab"],
            }
        entry: dict[str, object] = {
            "address": self.settings.address,
            "port": self.port,
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts),
            "service_manager": "process",
            "run_dir": run_dir,
            "labels": ["lab"],
        }
        if self.user:
            entry["user"] = self.user
        return entry


@dataclass(frozen=True)
class UpResult:
    status: LabStatus
    started: bool  # False: it was already up (or there is no sshd to start)
    python: str | None = None  # the interpreter `python3` resolves to over the lab's SSH


@dataclass(frozen=True)
class DownResult:
    stopped_pid: int | None
    removed_stale_pid_file: bool = False
    notes: tuple[str, ...] = ()


def _read_state(settings: LabSettings) -> dict[str, object]:
    try:
        data = json.loads(settings.state_file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _running_pid(settings: LabSettings) -> tuple[int | None, bool]:
    """(pid of our running sshd or None, whether a pid file exists that is stale)."""
    pid = sshd_mod.read_pid(settings.pid_file)
    if pid is None:
        return None, settings.pid_file.exists()
    if sshd_mod.is_our_sshd(pid, settings.config_path):
        return pid, False
    return None, True


def status(settings: LabSettings) -> LabStatus:
    pid, stale = _running_pid(settings)
    state = _read_state(settings)
    port = state.get("port") if pid is not None else None
    user = state.get("user")
    server_port = state.get("server_port")
    return LabStatus(
        settings=settings,
        sshd_installed=sshd_mod.find_sshd() is not None,
        running=pid is not None,
        pid=pid,
        port=port if isinstance(port, int) else settings.port,
        user=user if isinstance(user, str) else None,
        identity_file=settings.ssh_dir / "id_ed25519",
        known_hosts=settings.ssh_dir / "known_hosts",
        log_path=settings.ssh_dir / "sshd.log",
        stale_pid_file=stale,
        server_port=server_port if isinstance(server_port, int) else None,
    )


def _server_port(settings: LabSettings) -> int:
    """This lab's server port: the one it recorded, else a free one of the kernel's
    choosing (never the shipped 30000, which every other lab would pick too)."""
    recorded = _read_state(settings).get("server_port")
    if isinstance(recorded, int) and 0 < recorded < 65536:
        return recorded
    return sshd_mod.free_port(settings.address)


def write_lab_configs(settings: LabSettings, server_port: int) -> Path:
    """Every shipped lab config (experiments/lab/*/*.yaml but the scenarios) as a config
    of the same name that extends it on `server_port`, under `<state dir>/experiments/`."""
    from orchestrator.config.loading import load_experiment

    out = settings.state_dir / "experiments"
    for shipped in sorted((settings.repo / "experiments" / "lab").glob("*/*.yaml")):
        if shipped.name == "scenario.yaml":
            continue
        exp = load_experiment(shipped)
        if "port" not in exp.flag_map():
            continue  # its port is not a flag: it cannot be moved
        dest = out / shipped.parent.name / shipped.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        head = (
            f"# Written by `orchestrator lab up`: {shipped.relative_to(settings.repo)} "
            "on this lab's server port.\n"
        )
        body = {
            "name": exp.name,
            "extends": str(shipped),
            "service": {"flags": {"port": server_port}},
        }
        dest.write_text(head + json.dumps(body) + "\n")
    return out


def _port_taken(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def up(settings: LabSettings) -> UpResult:
    """Start the lab's sshd unless it runs already; without sshd, report the local transport."""
    current = status(settings)
    if not current.sshd_installed:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        server_port = _server_port(settings)
        settings.state_file.write_text(json.dumps({"server_port": server_port}) + "\n")
        write_lab_configs(settings, server_port)
        return UpResult(status=status(settings), started=False)
    if current.running:
        if current.port != settings.port and settings.port_given:
            raise UsageError(
                f"the lab sshd already runs on port {current.port}, not {settings.port}",
                hint="run `orchestrator lab down` first to move it",
            )
        settings = replace(settings, port=current.port)
        if current.server_port is None:  # started before its servers had a port of their own
            state = _read_state(settings) | {"server_port": _server_port(settings)}
            settings.state_file.write_text(json.dumps(state, indent=2) + "\n")
            current = status(settings)
        write_lab_configs(settings, current.server_port or _server_port(settings))
        return UpResult(status=current, started=False, python=_python_over_ssh(settings))
    if _port_taken(settings.address, settings.port) and not settings.port_given:
        # another lab (another checkout's) or another program has it: this lab picks its own
        settings = replace(settings, port=sshd_mod.free_port(settings.address))
    if _port_taken(settings.address, settings.port):
        raise InfraError(
            f"{settings.address}:{settings.port} is already in use by another program",
            hint=f"stop it, or set {PORT_ENV} to a free port (and use that port in the "
            "`lab` entry of hosts.yaml)",
        )
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    # Sessions must run this checkout with this interpreter (see orchestrator.lab.sshd).
    endpoint = sshd_mod.prepare(
        settings.ssh_dir,
        port=settings.port,
        address=settings.address,
        env=sshd_mod.session_env(settings.repo),
        pid_file=settings.pid_file,
    )
    server_port = _server_port(settings)
    pid = sshd_mod.start_daemon(endpoint, settings.pid_file)
    settings.state_file.write_text(
        json.dumps(
            {
                "pid": pid,
                "port": settings.port,
                "address": settings.address,
                "user": endpoint.user,
                "server_port": server_port,
            },
            indent=2,
        )
        + "\n"
    )
    write_lab_configs(settings, server_port)
    settings.run_dir.mkdir(mode=0o700, exist_ok=True)
    return UpResult(status=status(settings), started=True, python=_python_over_ssh(settings))


def _python_over_ssh(settings: LabSettings) -> str | None:
    """Which python3 a lab session gets: proves login, host key and PATH in one command."""
    state = _read_state(settings)
    user = state.get("user")
    endpoint = sshd_mod.SshdEndpoint(
        address=settings.address,
        port=settings.port,
        user=user if isinstance(user, str) else getpass.getuser(),
        identity_file=settings.ssh_dir / "id_ed25519",
        known_hosts=settings.ssh_dir / "known_hosts",
        host_key_pub="",
        log_path=settings.ssh_dir / "sshd.log",
        config_path=settings.config_path,
        state_dir=settings.ssh_dir,
    )
    try:
        res = endpoint.ssh_run("command -v python3", timeout=30)
    except OSError as exc:
        raise InfraError(f"cannot run ssh: {exc}", hint="install openssh-client") from exc
    except subprocess.TimeoutExpired as exc:
        raise InfraError("ssh to the lab sshd timed out") from exc
    if res.returncode != 0:
        raise InfraError(
            f"ssh to the lab sshd failed: {res.stderr.strip() or f'exit {res.returncode}'}",
            hint=f"see {endpoint.log_path}",
        )
    return res.stdout.strip() or None


def down(settings: LabSettings) -> DownResult:
    """Stop the sshd that `up` started; anything else is left alone."""
    pid, stale = _running_pid(settings)
    if pid is None:
        if stale:
            settings.pid_file.unlink(missing_ok=True)
            return DownResult(
                stopped_pid=None,
                removed_stale_pid_file=True,
                notes=(f"removed a stale pid file ({settings.pid_file})",),
            )
        return DownResult(stopped_pid=None)
    # Only the listener: sessions still running (a lab server started over SSH) end with
    # their own connections rather than being killed from here.
    sshd_mod.kill_tree(pid, tree=False)
    if sshd_mod.is_our_sshd(pid, settings.config_path):
        raise InfraError(f"the lab sshd (pid {pid}) did not stop")
    settings.pid_file.unlink(missing_ok=True)
    return DownResult(stopped_pid=pid)
