"""What every service manager provides, and the pieces of remote shell they share.

A poll is ONE remote command printing the server's state, the health endpoint's HTTP
status and the log tail, so each readiness check costs one SSH round trip.
"""

from __future__ import annotations

import re
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.execution.transport.base import Transport

HTTP_MARK = "@@HTTP"
LOG_MARK = "@@LOG"
STATE_MARK = "@@STATE"
SS_MARK = "@@SS"


@dataclass(frozen=True)
class Started:
    """What identifies one start of the server (to notice restarts)."""

    invocation: str | None = None  # systemd InvocationID
    pid: int | None = None
    restarts: int = 0
    log_ref: str | None = None  # process manager: the run's log file


@dataclass(frozen=True)
class Poll:
    alive: bool
    state: str
    http_code: int = 0  # 0: connection refused / no answer
    exit_code: int | None = None
    exit_signal: str | None = None
    unit_result: str | None = None
    setup_failure: str | None = None  # systemd could not set the process up: "219/CGROUP"
    invocation: str | None = None
    restarts: int = 0
    log_tail: str = ""


class ServiceManager(ABC):
    """Drives one server (a unit, or a process) on one host."""

    kind = "?"

    def __init__(self, host: Host, transport: Transport, *, name: str, campaign: str = "") -> None:
        self.host = host
        self.t = transport
        self.name = name  # the unit name (systemd) or a service key (process)
        self.campaign = campaign

    @abstractmethod
    def prepare(self) -> None:
        """Once per campaign: check the service exists, back it up, note its state."""

    @abstractmethod
    def install(self, exp: Experiment, *, env_keys: frozenset[str], run_id: str) -> str | None:
        """Make the next start use `exp`. Returns a reason if it could not be applied exactly
        (the variant is then `invalid`), else None. `env_keys`: every env var any variant of
        the campaign sets, so ones this variant lacks are removed."""

    @abstractmethod
    def start(self, exp: Experiment, *, run_id: str) -> Started: ...

    @abstractmethod
    def poll_command(self, exp: Experiment, started: Started, *, log_lines: int = 150) -> str: ...

    @abstractmethod
    def parse_poll(self, text: str, started: Started) -> Poll: ...

    @abstractmethod
    def logs(self, started: Started, *, lines: int = 400) -> str: ...

    @abstractmethod
    def stop(self) -> None:
        """Stop the server if it runs (graceful, then forced)."""

    @abstractmethod
    def restore(self) -> list[str]:
        """Leave the service as it was found; returns what was done, for the user."""

    def left_over(self) -> list[str] | None:
        """Read back from the host what of ours is still there after `restore` (empty: the
        service is as it was found); None when this manager cannot tell."""
        return None

    def rendered(self) -> str | None:
        """The unit drop-in (or launch script) last written, for the record."""
        return None

    def stopped_from_outside(self, started: Started) -> str | None:
        """The host's own record that someone stopped the server we started (asked right
        after its death was seen, before we stop anything), or None when it has none."""
        return None

    def host_record(self, started: Started | None) -> dict[str, object] | None:
        """What the last run did on the host, for `orchestrator show` (None: nothing to add)."""
        return None

    def unit_inputs(self) -> str | None:
        """A digest of what the user's own service definition hands the server (its unit
        file, drop-ins and environment), as read when the campaign prepared the host; ""
        when there is none (the launch is wholly ours), None when it could not be read."""
        return ""

    def interpreter_context(self) -> tuple[list[tuple[str, str]], str | None]:
        """What decides which interpreter and packages the server sees, beyond its config:
        (environment variables such as PATH/PYTHONPATH, working directory). A process
        manager host's own `env:` already travels with every command."""
        return [], None

    def listeners_on(self, port: int) -> list[tuple[int | None, str]]:
        """Processes listening on a TCP port on the host: (pid, name)."""
        cmd = f"ss -Hltnp 'sport = :{int(port)}' 2>/dev/null || true"
        out = self.t.run(cmd, timeout=20, sudo=True).stdout
        found: list[tuple[int | None, str]] = []
        for line in out.splitlines():
            if not line.strip():
                continue
            m = re.search(r'users:\(\("([^"]*)",pid=(\d+)', line)
            found.append((int(m[2]), m[1]) if m else (None, "unknown"))
        return found

    def server_pids_command(self, started: Started) -> str | None:
        """Shell printing the pids of the server's processes (None: not known)."""
        return None

    def listening_ports(self, started: Started) -> list[int] | None:
        """TCP ports the server's processes listen on (None when that cannot be told).

        For a run that never became healthy: "it listens on 30000, you poll 30001" is the
        one line that saves the user a 15-minute rerun.
        """
        pids_cmd = self.server_pids_command(started)
        if pids_cmd is None:
            return None
        r = self.t.run(
            f"{pids_cmd}; command -v ss >/dev/null && echo '{SS_MARK}' && ss -Hltnp 2>/dev/null",
            timeout=20,
            sudo=True,
        )
        pid_text, found, ss_text = r.stdout.partition(SS_MARK)
        pids = {int(w) for w in pid_text.split() if w.isdigit()}
        if not found or not pids:  # no ss on the host, or the server's pids are unknown
            return None
        ports: set[int] = set()
        for line in ss_text.splitlines():
            fields = line.split()
            if len(fields) < 4 or not pids & {int(p) for p in re.findall(r"pid=(\d+)", line)}:
                continue
            port = fields[3].rsplit(":", 1)[-1]
            if port.isdigit():
                ports.add(int(port))
        return sorted(ports)

    @abstractmethod
    def owns_pid(self, pid: int) -> bool:
        """True if the pid belongs to this service (so its port is ours)."""


def health_url(exp: Experiment) -> str:
    """The config's own health URL, on the address the server binds (loopback for any)."""
    host = str(exp.flag_map().get("host", "127.0.0.1"))
    if host in ("0.0.0.0", "::", "", "True"):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{exp.port}{exp.health.path}"


def health_snippet(exp: Experiment) -> str:
    """Shell printing `@@HTTP <code>` for the config's own health URL (curl, or python)."""
    url = health_url(exp)
    py = (
        "import sys,urllib.request,urllib.error\n"
        "try:\n print(urllib.request.urlopen(sys.argv[1],timeout=3).status)\n"
        "except urllib.error.HTTPError as e:\n print(e.code)\n"
        "except Exception:\n print('000')"
    )
    q = shlex.quote(url)
    return (
        f"if command -v curl >/dev/null 2>&1; then "
        f"c=$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 3 {q} 2>/dev/null); "
        f"else c=$(python3 -c {shlex.quote(py)} {q} 2>/dev/null); fi; "
        f'echo "{HTTP_MARK} ${{c:-000}}"'
    )


def split_sections(text: str) -> tuple[str, int, str]:
    """(state part, http code, log part) of a poll's output."""
    state, _, rest = text.partition(HTTP_MARK)
    http_line, _, log = rest.partition(LOG_MARK)
    m = re.search(r"(\d{3})", http_line)
    code = int(m[1]) if m else 0
    return state, code, log.lstrip("\n")
