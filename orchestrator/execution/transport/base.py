"""The transport contract: run one shell command on a host with a timeout, on both sides.

Every command is wrapped the same way whatever the transport: the host's environment
exported, `sudo -n` where the host says so, and coreutils' `timeout` so that a command
that runs past its time is killed on the host too, not only abandoned by us.

The host's environment (`env:` in the hosts file, often a token) never appears on a
command line, which every local user of the host can read (`ps`): it goes ahead of the
command's own input on stdin, ended by a line no value can hold, and the wrapping shell
reads it (the shell's `read` takes one byte at a time from a pipe, so the rest of stdin
is left, untouched, for the command).
"""

from __future__ import annotations

import secrets
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass

from orchestrator.config.hosts import Host
from orchestrator.errors import CommandTimeout, ServiceError, TransportError

#: exit status coreutils' `timeout` uses when it had to stop the command
TIMEOUT_EXIT = 124
#: exit status of `timeout -k` when the command ignored SIGTERM and got SIGKILL
KILLED_EXIT = 128 + 9
#: extra seconds we wait beyond the host-side timeout before giving up locally
LOCAL_GRACE = 10.0


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Transport(ABC):
    """Runs commands on one host. Subclasses implement `_exec`."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.commands_run = 0
        # Ends the environment on stdin. Random: a value would have to contain it to end
        # the environment early, and values are quoted, so they cannot guess it.
        self._env_end = f"orchestrator-env-end-{secrets.token_hex(8)}"

    # ---- the public surface
    def run(
        self,
        command: str,
        *,
        timeout: float = 60.0,
        sudo: bool = False,
        stdin: str | None = None,
        check: bool = False,
    ) -> CommandResult:
        """Run a shell command; raise CommandTimeout past `timeout`, TransportError on
        connection trouble. A non-zero exit is returned, or raised with `check=True`."""
        wrapped = self.wrap(command, timeout=timeout, sudo=sudo and self.host.sudo)
        if self.host.env:
            stdin = self.env_header() + (stdin or "")
        self.commands_run += 1
        try:
            result = self._exec(wrapped, timeout=timeout + LOCAL_GRACE, stdin=stdin)
        except TransportError as exc:
            # whoever records the run names this host as the one in trouble
            exc.host = exc.host or self.host.name
            raise
        result = CommandResult(
            command, result.exit_code, result.stdout, result.stderr, result.duration
        )
        if result.exit_code == TIMEOUT_EXIT or (
            # `timeout -k` had to SIGKILL a command that ignored SIGTERM: it then exits
            # 128+9, not 124. A kill -9 from elsewhere exactly at the deadline is unlikely.
            result.exit_code == KILLED_EXIT and result.duration >= timeout
        ):
            raise CommandTimeout(
                f"{self.host.describe()}: command timed out after {timeout:g}s and was "
                f"stopped on the host: {_short(command)}",
                host=self.host.name,
            )
        if sudo and self.host.sudo and _sudo_missing(result):
            raise ServiceError(
                f"{self.host.describe()}: sudo is not installed on the host (the host's "
                "sudo: true asks for it)",
                hint="install sudo on the host, or set sudo: false if the user is root",
            )
        if sudo and self.host.sudo and _sudo_refused(result.stderr):
            raise ServiceError(
                f"{self.host.describe()}: sudo refused: {result.stderr.strip().splitlines()[-1]}",
                hint=f"allow passwordless sudo for {self.host.user or 'the user'} on the host "
                "(sudo -n must work), or set sudo: false if the user is root",
            )
        if check and not result.ok:
            raise TransportError(
                f"{self.host.describe()}: command failed with exit {result.exit_code}: "
                f"{_short(command)}: {result.stderr.strip()[-300:]}",
                host=self.host.name,
            )
        return result

    def write_file(self, path: str, content: str, *, mode: int = 0o644, sudo: bool = False) -> None:
        """Write a file atomically: a temporary file beside it, then rename over it.

        Never a truncated file: a connection dropped mid-write closes the command's stdin,
        `cat` ends at EOF with exit 0, and a plain `cat > tmp && mv` would rename the first
        part over the target (a half drop-in the next daemon-reload loads). The copy is
        renamed only when it holds every byte sent; the SSH transport then re-runs the
        whole command on a new connection.
        """
        d = shlex.quote(path.rsplit("/", 1)[0] or "/")
        tmp = shlex.quote(f"{path}.orchestrator-tmp")
        q = shlex.quote(path)
        size = len(content.encode())
        cmd = (
            f"umask 077 && mkdir -p {d} && cat > {tmp} && if [ $(wc -c < {tmp}) -eq {size} ]; "
            f"then chmod {mode:o} {tmp} && mv -f {tmp} {q}; else rm -f {tmp}; "
            "echo 'the file arrived incomplete' >&2; exit 1; fi"
        )
        self.run(cmd, sudo=sudo, stdin=content, check=True, timeout=30)

    def read_file(self, path: str, *, sudo: bool = False) -> str | None:
        """A file's text, or None if it does not exist."""
        q = shlex.quote(path)
        r = self.run(f"if [ -e {q} ]; then cat {q}; else exit 3; fi", sudo=sudo, timeout=30)
        if r.exit_code == 3:
            return None
        if not r.ok:
            raise TransportError(f"{self.host.describe()}: cannot read {path}: {r.stderr.strip()}")
        return r.stdout

    def close(self) -> None:  # noqa: B027 (optional for subclasses)
        """Release the connection, if any."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- wrapping
    def wrap(self, command: str, *, timeout: float, sudo: bool) -> str:
        inner = command
        if self.host.env:
            # The lines up to the end mark are `export K='v'` lines (env_header): read,
            # then evaluated in the shell that runs the command, under sudo where asked.
            inner = (
                f'_e=; while IFS= read -r _l; do [ "$_l" = {self._env_end} ] && break; '
                # a real newline inside the quotes: a value may span lines
                '_e="$_e$_l\n"; done; eval "$_e"; unset _e _l; ' + command
            )
        # -k: SIGKILL if the command ignores SIGTERM for 5 s after its time is up
        wrapped = f"timeout -k 5 {max(int(timeout + 0.999), 1)} sh -c {shlex.quote(inner)}"
        if sudo:
            wrapped = f"sudo -n -- sh -c {shlex.quote(wrapped)}"
        return wrapped

    def env_header(self) -> str:
        """The host's environment as the wrapping shell reads it from stdin."""
        lines = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.host.env)
        return f"{lines}{self._env_end}\n"

    @abstractmethod
    def _exec(self, command: str, *, timeout: float, stdin: str | None) -> CommandResult:
        """Run an already wrapped command; map library errors to TransportError."""


def _short(command: str, limit: int = 120) -> str:
    one = " ".join(command.split())
    return one if len(one) <= limit else one[: limit - 3] + "..."


def _sudo_refused(stderr: str) -> bool:
    s = stderr.lower()
    return "sudo:" in s and (
        "password is required" in s
        or "not in the sudoers" in s
        or "not allowed to execute" in s
        or "no tty present" in s
    )


def _sudo_missing(result: CommandResult) -> bool:
    """The shell could not find `sudo` itself (127), as sh and bash word it."""
    s = result.stderr.lower()
    return result.exit_code == 127 and "sudo" in s and "not found" in s
