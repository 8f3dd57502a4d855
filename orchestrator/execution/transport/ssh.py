"""The SSH transport: one fabric `Connection` per host, reused for a whole campaign.

Only this module touches fabric, invoke and paramiko for host commands, and it maps their
errors to `orchestrator.errors` here, at this one boundary:

- host not in known_hosts (missing-key policy) -> HostKeyError, hint: the `ssh-keyscan` line
- `paramiko.BadHostKeyException` (key changed) -> HostKeyError, hint: `ssh-keygen -R` line
- known_hosts not configured, missing, unreadable or malformed -> HostKeyError
- `paramiko.AuthenticationException` -> TransportError "authentication failed for U@H:P"
- identity file missing -> TransportError
- `OSError` (refused, timeout, no route, DNS), `SSHException`/`EOFError` in the handshake,
  on the first connect -> TransportError "cannot reach H:P" at once (no retry)
- the same on a reconnect, `SSHException`/`EOFError`/`OSError` while opening a channel or
  mid-command, or a channel closed without an exit status -> reconnect and re-run (below);
  when the budget is spent -> TransportError "connection to H lost ... after N attempts"
- invoke `CommandTimedOut` (our side gave up: the host-side `timeout` should have ended
  the command first, so the link is stuck) -> CommandTimeout, and the connection is
  replaced for the next command

Host keys are always checked against the host's own `known_hosts` file and nothing else
(the user's `~/.ssh/known_hosts` and `~/.ssh/config` are never read implicitly, so what a
campaign trusts is what its hosts file says). `accept_new_host_key=True` is OpenSSH's
`StrictHostKeyChecking=accept-new`: a host with no key on record gets its key appended to
known_hosts as one plain (unhashed) line, `[addr]:port type base64`, the same form
`ssh-keyscan` prints, so it can be reviewed by eye; a key that differs from a recorded one
is still refused.

Reconnect and re-run. A dropped connection (sshd restarted, network blip) is survived:
the connection is reopened with capped exponential backoff (tenacity: 0.5, 1, 2, 4, 8 s;
`reconnect_attempts` tries) and the command is run again. Re-running is always safe when
the drop happened before the command reached the host (opening the channel failed, or
the connection was already dead when the command was about to be sent). After the
command was sent, the outcome is ambiguous; we re-run anyway by default because every
command the orchestrator sends is written to be idempotent: polls only read state, files
are written to a temporary name and renamed over the target, and service operations are
`daemon-reload`/`restart`/`stop`, which converge to the same state when repeated (the
executor identifies a service start by its InvocationID, never by counting commands).
A caller with a command that must not run twice builds the transport with
`rerun_interrupted=False`: a drop after sending is then reported as TransportError (the
connection is still reopened for the next command). Authentication and host key errors
are never retried: they do not heal by waiting.
"""

from __future__ import annotations

import codecs
import fcntl
import io
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Callable, Iterator

import paramiko
from fabric import Config, Connection
from fabric.runners import Remote
from invoke.exceptions import CommandTimedOut, ThreadException
from paramiko.hostkeys import InvalidHostKey
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from orchestrator.config.hosts import Host
from orchestrator.errors import CommandTimeout, HostKeyError, TransportError
from orchestrator.execution.transport.base import CommandResult, Transport

# Events are logged at INFO: WARNING and above would reach stderr through logging's
# last-resort handler when the application configured none, and only the CLI prints.
log = logging.getLogger(__name__)

# paramiko logs socket failures at ERROR level; without any handler configured Python's
# last-resort handler would print them to stderr behind the CLI's back. A NullHandler
# keeps them silent unless the application configures logging (they still propagate).
logging.getLogger("paramiko").addHandler(logging.NullHandler())

#: errors that mean the connection (not the command) failed
_DROP_ERRORS: tuple[type[BaseException], ...] = (paramiko.SSHException, EOFError, OSError)


class _Dropped(Exception):
    """Internal: the connection failed under a command; `sent` says if it reached the host."""

    def __init__(self, reason: str, *, sent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.sent = sent


class _WholeStdin(io.StringIO):
    """A stdin that hands invoke everything it has in one read.

    invoke reads a stream that is not a terminal one byte per 10 ms poll (it cannot ask
    how much is buffered), which would feed a 4 KB drop-in file in 40 s.
    """

    def read(self, size: int | None = -1) -> str:
        if size is not None and 0 <= size < 65536:
            size = 65536
        return super().read(size)


class _Remote(Remote):
    """fabric's runner, plus: note when the command was sent, and treat stdin like EPIPE.

    A command that exits without reading all its stdin closes the channel under the
    writer thread; like a local pipe's EPIPE that is not an error of the command.
    """

    sent = False

    def send_start_message(self, command: str) -> None:
        # Set before the request: if it fails half-way the command may have started.
        self.sent = True
        super().send_start_message(command)

    def _write_proc_stdin(self, data: bytes) -> None:
        try:
            super()._write_proc_stdin(data)
        except OSError:
            if not self.channel.exit_status_ready():
                raise

    def close_proc_stdin(self) -> None:
        try:
            super().close_proc_stdin()
        except OSError:
            if not self.channel.exit_status_ready():
                raise

    def read_proc_output(self, reader: Callable[[int], bytes | None]) -> Iterator[str]:
        # invoke decodes each 1000-byte chunk on its own, so a multi-byte UTF-8 character
        # cut by a chunk boundary came out as U+FFFD (a read-back of a drop-in or of an
        # argv with non-ASCII text then differed). One incremental decoder per stream
        # keeps a character whole across chunks.
        decoder = codecs.getincrementaldecoder(self.encoding)("replace")
        while True:
            data = reader(self.read_chunk_size)
            text = decoder.decode(data or b"", final=not data)
            if text:
                yield text
            if not data:
                break


def host_key_name(address: str, port: int) -> str:
    """How known_hosts names a host: `addr` on port 22, `[addr]:port` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


def keyscan_command(address: str, port: int, known_hosts: str) -> str:
    """The `ssh-keyscan` line that records a host's key, for the user to review and run."""
    p = "" if port == 22 else f"-p {port} "
    return f"ssh-keyscan {p}{shlex.quote(address)} >> {shlex.quote(known_hosts)}"


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    """StrictHostKeyChecking=yes: an unknown host is refused with the line to add it."""

    def __init__(self, transport: SSHTransport) -> None:
        self.transport = transport

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        h = self.transport.host
        kh = str(h.known_hosts)
        raise HostKeyError(
            f"{h.describe()}: host key of {hostname} is unknown ({_fingerprint(key)} is not "
            f"in {kh}); refused",
            hint=f"check the fingerprint with the host's administrator, then record it: "
            f"{keyscan_command(h.address, h.port, kh)}",
        )


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """StrictHostKeyChecking=accept-new: record a first-seen key (paramiko has already
    refused a key that differs from a recorded one before asking this policy)."""

    def __init__(self, transport: SSHTransport) -> None:
        self.transport = transport

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        path = str(self.transport.host.known_hosts)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        try:
            # Append, never rewrite: paramiko's save_host_keys() would drop comments and
            # lines it does not understand from the user's file.
            with open(path, "a+", encoding="utf-8") as f:
                fcntl.flock(f, fcntl.LOCK_EX)  # two campaigns adding hosts at once
                f.seek(0, os.SEEK_END)
                if f.tell() > 0:
                    f.seek(f.tell() - 1)
                    if f.read(1) != "\n":
                        line = "\n" + line
                f.write(line)
        except OSError as exc:
            raise HostKeyError(
                f"{self.transport.host.describe()}: cannot record the new host key in {path}: {exc}"
            ) from exc
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.info(
            "%s: recorded new host key %s in %s",
            self.transport.host.describe(),
            _fingerprint(key),
            path,
        )


class SSHTransport(Transport):
    """Runs commands on one host over SSH; see the module docstring for the policies."""

    def __init__(
        self,
        host: Host,
        *,
        accept_new_host_key: bool = False,
        keepalive: int = 15,
        reconnect_attempts: int = 4,
        rerun_interrupted: bool = True,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(host)
        self.accept_new_host_key = accept_new_host_key
        self.keepalive = keepalive
        self.reconnect_attempts = max(0, reconnect_attempts)
        self.rerun_interrupted = rerun_interrupted
        self._sleep = sleep  # tests may pass a no-op; production waits for real
        #: SSH connections opened so far (1 for a campaign without drops)
        self.connection_count = 0
        #: connections found dropped (or abandoned after a stuck command) and replaced
        self.drop_count = 0
        self._conn: Connection | None = None
        self._lock = threading.Lock()  # guards opening/replacing the connection

    # ---- describing
    def describe(self) -> str:
        return f"{self.host.describe()} over ssh"

    def __repr__(self) -> str:
        # Paths and counters only: never key material or environment values.
        return (
            f"<SSHTransport {self.host.describe()} known_hosts={self.host.known_hosts!r} "
            f"identity_file={self.host.identity_file!r} connected={self.connected} "
            f"connections={self.connection_count}>"
        )

    @property
    def connected(self) -> bool:
        conn = self._conn
        return conn is not None and conn.is_connected

    @property
    def _who(self) -> str:
        user = self.host.user or (self._conn.user if self._conn else None) or "?"
        return f"{user}@{self.host.address}:{self.host.port}"

    # ---- the connection
    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            _quiet_close(conn)

    def _connection(self) -> Connection:
        """The open connection, opened (or reopened after a drop) on demand.

        Raises HostKeyError/TransportError for errors that retrying cannot fix, and
        `_Dropped` for an unreachable host once we had been connected (a reconnect).
        """
        with self._lock:
            conn = self._conn
            if conn is not None and conn.is_connected:
                return conn
            if conn is not None:  # found dead before sending anything: reopen
                _quiet_close(conn)
                self._conn = None
                self.drop_count += 1
                log.info("%s: connection lost; reconnecting", self.host.describe())
            conn = self._open()
            self._conn = conn
            self.connection_count += 1
            return conn

    def _open(self) -> Connection:
        h = self.host
        kh = h.known_hosts
        if not kh:
            raise HostKeyError(
                f"{h.describe()}: no known_hosts file configured; host keys are always verified",
                hint="set known_hosts: for the host in hosts.yaml and record its key: "
                + keyscan_command(h.address, h.port, "KNOWN_HOSTS"),
            )
        if not os.path.isfile(kh):
            raise HostKeyError(
                f"{h.describe()}: known_hosts file {kh} does not exist; refusing to connect "
                "to a host whose key cannot be verified",
                hint=f"review and record the host's key: {keyscan_command(h.address, h.port, kh)}",
            )
        if h.identity_file and not os.path.isfile(h.identity_file):
            raise TransportError(
                f"{h.describe()}: identity file {h.identity_file} does not exist",
                hint="fix identity_file in hosts.yaml (relative paths are relative to it)",
            )
        timeout = float(h.connect_timeout)
        connect_kwargs: dict[str, object] = {
            "timeout": timeout,  # TCP connect
            "banner_timeout": timeout,  # sshd's first line
            "auth_timeout": timeout,
            "channel_timeout": timeout,  # opening a session on a half-dead link
        }
        if h.identity_file:
            # Only the configured key: an agent or ~/.ssh keys would make what works
            # depend on who runs the campaign, and can exhaust sshd's MaxAuthTries.
            connect_kwargs |= {
                "key_filename": [h.identity_file],
                "look_for_keys": False,
                "allow_agent": False,
            }
        # lazy + no ssh configs: neither ~/.ssh/config nor fabric's config files may change
        # the address, user, port, key or proxy the hosts file names.
        config = Config(lazy=True, overrides={"load_ssh_configs": False})
        conn = Connection(
            h.address,
            user=h.user,
            port=h.port,
            config=config,
            connect_kwargs=connect_kwargs,
            gateway=False,
            forward_agent=False,
        )
        client: paramiko.SSHClient = conn.client
        try:
            client.load_host_keys(kh)
        except (OSError, paramiko.SSHException, ValueError, InvalidHostKey) as exc:
            # paramiko refuses a whole file for one malformed line (OpenSSH skips it).
            raise HostKeyError(
                f"{h.describe()}: cannot read known_hosts {kh}: {_one_line(exc)}",
                hint=f"fix or remove the malformed line in {kh}",
            ) from exc
        policy = _AcceptNew(self) if self.accept_new_host_key else _RejectUnknown(self)
        client.set_missing_host_key_policy(policy)
        try:
            conn.open()
        except BaseException as exc:
            _quiet_close(conn)
            raise self._connect_error(exc) from exc
        if self.keepalive > 0 and conn.transport is not None:
            # Keeps NAT/firewall state alive through long silent polls of a loading server.
            conn.transport.set_keepalive(self.keepalive)
        return conn

    def _connect_error(self, exc: BaseException) -> BaseException:
        """Map a connect failure; `_Dropped` when a reconnect may heal it."""
        h = self.host
        kh = str(h.known_hosts)
        name = host_key_name(h.address, h.port)
        if isinstance(exc, HostKeyError | TransportError):
            return exc
        if isinstance(exc, paramiko.BadHostKeyException):
            return HostKeyError(
                f"{h.describe()}: the host key of {name} has CHANGED: the host offered "
                f"{_fingerprint(exc.key)} but {kh} has {_fingerprint(exc.expected_key)}; "
                "this may be a man-in-the-middle attack; refused",
                hint="if the host was reinstalled or re-keyed, confirm the new fingerprint "
                f"with its administrator, then remove the old key: ssh-keygen -R "
                f"{shlex.quote(name)} -f {shlex.quote(kh)} and record the new one: "
                f"{keyscan_command(h.address, h.port, kh)}",
            )
        if isinstance(exc, paramiko.AuthenticationException):
            key = h.identity_file or "the SSH agent and default keys"
            encrypted = isinstance(exc, paramiko.PasswordRequiredException)
            return TransportError(
                f"{h.describe()}: authentication failed for {self._who} with {key}"
                + (" (the key is passphrase-protected)" if encrypted else ""),
                hint=f"check that {key}.pub is in ~{h.user or ''}/.ssh/authorized_keys on the "
                "host and that user: is right in hosts.yaml"
                if h.identity_file
                else "set identity_file: for the host in hosts.yaml",
            )
        if isinstance(exc, _DROP_ERRORS):
            what = _describe_net_error(exc)
            err = TransportError(
                f"{h.describe()}: cannot reach {h.address}:{h.port}: {what}",
                hint=f"is the host up and sshd listening on port {h.port}? check address: "
                "and port: in hosts.yaml, and any firewall between here and the host",
            )
            if self.connection_count > 0:  # we were connected before: may be a restart
                dropped = _Dropped(f"reconnect failed: {what}", sent=False)
                dropped.__cause__ = err
                return dropped
            return err
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            return exc
        return TransportError(f"{h.describe()}: cannot connect: {type(exc).__name__}: {exc}")

    # ---- running
    def _exec(self, command: str, *, timeout: float, stdin: str | None) -> CommandResult:
        retrying = Retrying(
            stop=stop_after_attempt(1 + self.reconnect_attempts),
            wait=wait_exponential(multiplier=0.5, min=0.5, max=8),
            retry=retry_if_exception_type(_Dropped),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    result = self._exec_once(command, timeout=timeout, stdin=stdin)
        except _Dropped as exc:
            n = self.reconnect_attempts
            raise TransportError(
                f"connection to {self.host.describe()} lost and not re-established after "
                f"{n} attempt{'s' if n != 1 else ''}: {exc.reason}",
                hint=f"is the host up and sshd running on port {self.host.port}?",
            ) from (exc.__cause__ or exc)
        return result

    def _exec_once(self, command: str, *, timeout: float, stdin: str | None) -> CommandResult:
        conn = self._connection()
        runner = _Remote(context=conn, inline_env=conn.inline_ssh_env)
        # Under an `sh` that outlives it: when `timeout -k` must SIGKILL a command that
        # ignored SIGTERM it dies by that signal itself, and a login shell that exec'd it
        # would leave sshd to report a bare "exit-signal", which paramiko drops (exit -1).
        # This shell reports 128+9 like a local one does, and the base class knows it.
        remote = f"sh -c {shlex.quote(command + '; exit $?')}"
        start = time.monotonic()
        try:
            res = runner.run(
                remote,
                hide=True,
                warn=True,  # a non-zero exit is a result, not an exception
                pty=False,  # separate stdout/stderr, and no terminal echo of stdin
                # Empty stdin when there is none: a command that reads stdin gets EOF at
                # once (like </dev/null) instead of waiting for its timeout.
                in_stream=_WholeStdin(stdin or ""),
                timeout=timeout,
                encoding="utf-8",
            )
        except CommandTimedOut:
            # Only reached when the host-side `timeout` did not end the command in time:
            # the host or the link is stuck. Start the next command on a fresh connection.
            self._discard(conn)
            raise CommandTimeout(
                f"{self.host.describe()}: no answer from the host within {timeout:g}s; the "
                "command's own timeout should have ended it earlier, so the host or the "
                "connection is stuck",
                hint="check the host's load and the network; the connection will be reopened",
            ) from None
        except ThreadException as exc:
            errors = [w.value for w in exc.exceptions]
            if any(isinstance(e, _DROP_ERRORS) for e in errors):
                self._on_drop(conn, errors[0], sent=runner.sent)
            raise TransportError(
                f"{self.host.describe()}: I/O with the command failed: "
                + "; ".join(f"{type(e).__name__}: {e}" for e in errors)
            ) from exc
        except _DROP_ERRORS as exc:
            self._on_drop(conn, exc, sent=runner.sent)
        if res.exited == -1 and not conn.is_connected:
            # The channel closed with the transport and no exit status ever came.
            self._on_drop(conn, EOFError("connection closed before the command ended"), sent=True)
        return CommandResult(command, res.exited, res.stdout, res.stderr, time.monotonic() - start)

    def _on_drop(self, conn: Connection, exc: BaseException, *, sent: bool) -> None:
        """Drop the dead connection and decide whether the command may run again."""
        self._discard(conn)
        reason = _describe_net_error(exc)
        log.info(
            "%s: connection dropped (%s)%s",
            self.host.describe(),
            reason,
            " after the command was sent" if sent else "",
        )
        if sent and not self.rerun_interrupted:
            raise TransportError(
                f"{self.host.describe()}: connection lost while a command was running "
                f"({reason}); it was not re-run because its outcome is unknown",
                hint="check the host's state; the next command reconnects",
            ) from exc
        raise _Dropped(reason, sent=sent) from exc

    def _discard(self, conn: Connection) -> None:
        with self._lock:
            if self._conn is conn:
                self._conn = None
                self.drop_count += 1
        _quiet_close(conn)


def _quiet_close(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 (a dead connection may fail to close; it is gone anyway)
        log.debug("closing a dead connection failed", exc_info=True)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] or type(exc).__name__


def _describe_net_error(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        errs = {e.errno for e in exc.errors.values()}
        if errs <= {111}:  # ECONNREFUSED
            return "connection refused"
        return "no route to host"
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the address ({exc.strerror})"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, EOFError):
        return str(exc) or "connection closed by the host"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


__all__ = ["SSHTransport", "host_key_name", "keyscan_command"]
