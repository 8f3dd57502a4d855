"""Facts: pure parsers of what host commands print (the pyinfra habit).

The executor runs a command on a host and hands its output to a parser here; nothing in
this module runs anything, reads files, or prints. Each parser is tested on recorded
output under `tests/data/facts/`.

Covered: `systemctl show` (key=value lines, `ExecStart=` records, `Environment=`, the unit
state), `busctl --json=short get-property ... ExecStart` (the exact argv), `journalctl -o
json` / `-o cat`, `ss -ltnpH` (who listens on a port), `nvidia-smi --query-compute-apps`
(who holds GPU memory), and argparse `--help` text (which long options a server accepts;
argparse's own accept/reject decision on them is `preflight.check_flags`).
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.config.systemd_quoting import quote_command_line, split_command_line
from orchestrator.errors import InfraError


class FactParseError(InfraError, ValueError):
    """A command's output does not have the shape its parser expects."""


# ---------------------------------------------------------------------------------------
# systemctl show
# ---------------------------------------------------------------------------------------


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p A,B UNIT` -> {"A": ..., "B": ...}.

    A property printed more than once (systemctl prints one `ExecStart=` line per command)
    keeps all its values joined by newlines, in order.
    """
    props: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key):
            raise FactParseError(f"systemctl show: not a key=value line: {line!r}")
        props[key] = f"{props[key]}\n{value}" if key in props else value
    return props


@dataclass(frozen=True)
class ExecCommand:
    """One command of an `Exec*=` property, as `systemctl show` prints it.

    `argv_text` is systemd's rendering of argv. systemd (through at least v252) joins the
    elements with single spaces and no quoting (`strv_join(argv, " ")` in
    systemctl-show.c), so an element containing a space cannot be told apart from two
    elements: `argv` is a best-effort split; compare an intended argv with `argv_matches`,
    or read the exact argv with `busctl --json=short` (`parse_busctl_exec`).
    """

    path: str
    argv_text: str
    argv: tuple[str, ...]
    ignore_errors: bool = False
    flags: tuple[str, ...] = ()  # ExecStartEx= only
    pid: int = 0
    code: str | None = None  # (null), exited, killed, dumped
    status: str | None = None  # "0", "9/KILL"


_EXEC_RE = re.compile(
    r"^\{ path=(?P<path>.*?) ; argv\[\]=(?P<argv>.*) ; "
    r"(?:ignore_errors=(?P<ignore>yes|no)|flags=(?P<flags>.*?)) ; "
    r"start_time=\[(?P<start>.*?)\] ; stop_time=\[(?P<stop>.*?)\] ; "
    r"pid=(?P<pid>\d+) ; code=(?P<code>\S+) ; status=(?P<status>\S*) \}$"
)


def parse_exec_start(value: str) -> list[ExecCommand]:
    """The value(s) of `ExecStart=` (or any `Exec*=`) -> one ExecCommand per command.

    The argv field is matched greedily against the fixed tail of the record, so an
    argument containing ` ; ` does not cut it short.
    """
    commands: list[ExecCommand] = []
    for record in value.splitlines():
        record = record.strip()
        if not record:
            continue
        m = _EXEC_RE.match(record)
        if m is None:
            raise FactParseError(f"not an Exec record of systemctl show: {record!r}")
        argv_text = m.group("argv")
        commands.append(
            ExecCommand(
                path=m.group("path"),
                argv_text=argv_text,
                argv=tuple(split_command_line(argv_text)),
                ignore_errors=m.group("ignore") == "yes",
                flags=tuple((m.group("flags") or "").split()),
                pid=int(m.group("pid")),
                code=None if m.group("code") == "(null)" else m.group("code"),
                status=m.group("status") or None,
            )
        )
    return commands


def argv_matches(intended: Sequence[str], command: ExecCommand) -> bool:
    """Whether `systemctl show` printed exactly `intended` (either rendering systemd uses)."""
    return command.argv_text in (" ".join(intended), quote_command_line(intended))


def parse_busctl_exec(text: str) -> list[tuple[str, tuple[str, ...]]]:
    """`busctl --json=short get-property org.freedesktop.systemd1 PATH
    org.freedesktop.systemd1.Service ExecStart` -> [(path, argv), ...], exact.

    D-Bus carries argv as a string array, so this is the read-back to compare byte for byte.
    """
    try:
        doc = json.loads(text)
        return [(str(rec[0]), tuple(str(a) for a in rec[1])) for rec in doc["data"]]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise FactParseError(f"busctl ExecStart: unexpected output: {text[:200]!r}") from exc


def parse_environment(value: str) -> dict[str, str]:
    """`Environment=A=1 "B=x y"` -> {"A": "1", "B": "x y"}.

    systemd prints each `NAME=value` element through shell_maybe_quote(), separated by
    spaces. Old releases print `[unprintable]` for elements with spaces: refused, because
    a read-back must never compare a guess.
    """
    env: dict[str, str] = {}
    for item in split_command_line(value.strip()):
        if item == "[unprintable]":
            raise FactParseError("Environment= holds a value systemd printed as [unprintable]")
        name, sep, val = item.partition("=")
        if not sep or not name:
            raise FactParseError(f"Environment= element without NAME=: {item!r}")
        env[name] = val
    return env


@dataclass(frozen=True)
class UnitState:
    """The state of a unit, from `systemctl show -p ActiveState,SubState,Result,...`."""

    active_state: str  # active, activating, deactivating, inactive, failed
    sub_state: str  # running, exited, dead, failed, start, auto-restart, ...
    result: str  # success, exit-code, signal, core-dump, timeout, oom-kill, ...
    exec_main_status: int | None = None
    exec_main_code: int | None = None  # CLD_EXITED=1, CLD_KILLED=2, CLD_DUMPED=3
    n_restarts: int = 0
    invocation_id: str = ""
    main_pid: int = 0

    @property
    def running(self) -> bool:
        return self.active_state in ("active", "activating", "reloading") and self.main_pid > 0

    @property
    def failed(self) -> bool:
        return self.active_state == "failed" or self.result not in ("", "success")

    @property
    def exit_signal(self) -> str | None:
        """'SIGKILL' when the main process was killed by a signal, else None."""
        if self.exec_main_code in (2, 3) and self.exec_main_status:
            try:
                return signal.Signals(self.exec_main_status).name
            except ValueError:
                return f"signal {self.exec_main_status}"
        return None

    @property
    def exit_code(self) -> int | None:
        return self.exec_main_status if self.exec_main_code == 1 else None

    @property
    def setup_failure(self) -> str | None:
        """'219/CGROUP' when systemd itself failed to set up the main process, else None.

        Between fork and exec systemd's child exits with one of its own statuses (200 and
        up, `systemd.exec(5)`) when a step of the process' setup fails: the server never
        ran, so the status says nothing of it (and is not `128 + a signal`).
        """
        code = self.exit_code
        if code is None or code not in SYSTEMD_SETUP_EXITS:
            return None
        return f"{code}/{SYSTEMD_SETUP_EXITS[code]}"


#: systemd's exit statuses of a process whose setup failed before its command ran
#: (`systemd.exec(5)`, "Process Exit Codes"), by number
SYSTEMD_SETUP_EXITS: dict[int, str] = {
    200: "CHDIR",
    201: "NICE",
    202: "FDS",
    203: "EXEC",
    204: "MEMORY",
    205: "LIMITS",
    206: "OOM_ADJUST",
    207: "SIGNAL_MASK",
    208: "STDIN",
    209: "STDOUT",
    210: "CHROOT",
    211: "IOPRIO",
    212: "TIMERSLACK",
    213: "SECUREBITS",
    214: "SETSCHEDULER",
    215: "CPUAFFINITY",
    216: "GROUP",
    217: "USER",
    218: "CAPABILITIES",
    219: "CGROUP",
    220: "SETSID",
    221: "CONFIRM",
    222: "STDERR",
    224: "PAM",
    225: "NETWORK",
    226: "NAMESPACE",
    227: "NO_NEW_PRIVILEGES",
    228: "SECCOMP",
    229: "SELINUX_CONTEXT",
    230: "PERSONALITY",
    231: "APPARMOR",
    232: "ADDRESS_FAMILIES",
    233: "RUNTIME_DIRECTORY",
    235: "CHOWN",
    236: "SMACK_PROCESS_LABEL",
    237: "KEYRING",
    238: "STATE_DIRECTORY",
    239: "CACHE_DIRECTORY",
    240: "LOGS_DIRECTORY",
    241: "CONFIGURATION_DIRECTORY",
    242: "NUMA_POLICY",
    243: "CREDENTIALS",
    245: "BPF",
}


UNIT_STATE_PROPERTIES = (
    "ActiveState",
    "SubState",
    "Result",
    "ExecMainStatus",
    "ExecMainCode",
    "NRestarts",
    "InvocationID",
    "MainPID",
)


def _int_or_none(value: str | None) -> int | None:
    if value is None or value.strip() in ("", "[not set]"):
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise FactParseError(f"expected a number, got {value!r}") from exc


def unit_state(props: dict[str, str]) -> UnitState:
    """A UnitState from `parse_show` output of UNIT_STATE_PROPERTIES."""
    missing = [k for k in ("ActiveState", "SubState") if k not in props]
    if missing:
        raise FactParseError(f"systemctl show lacks {', '.join(missing)}")
    return UnitState(
        active_state=props["ActiveState"],
        sub_state=props["SubState"],
        result=props.get("Result", ""),
        exec_main_status=_int_or_none(props.get("ExecMainStatus")),
        exec_main_code=_int_or_none(props.get("ExecMainCode")),
        n_restarts=_int_or_none(props.get("NRestarts")) or 0,
        invocation_id=props.get("InvocationID", ""),
        main_pid=_int_or_none(props.get("MainPID")) or 0,
    )


# ---------------------------------------------------------------------------------------
# journalctl
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JournalEntry:
    """One `journalctl -o json` record, reduced to what the classifier and store need."""

    message: str
    realtime_us: int | None = None
    pid: int | None = None
    invocation_id: str | None = None
    priority: int | None = None
    cursor: str | None = None


def _journal_field(value: object) -> str | None:
    # journald prints binary or non-UTF-8 fields as arrays of byte values, and fields that
    # occur several times as arrays of those.
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) for b in value):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, list) and value:
        return _journal_field(value[-1])
    return str(value)


def parse_journal_json(text: str) -> list[JournalEntry]:
    """`journalctl -o json` (one JSON object per line) -> entries, in order."""
    entries: list[JournalEntry] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise FactParseError(f"journalctl -o json: not JSON: {line[:200]!r}") from exc
        if not isinstance(rec, dict):
            raise FactParseError(f"journalctl -o json: not an object: {line[:200]!r}")
        entries.append(
            JournalEntry(
                message=_journal_field(rec.get("MESSAGE")) or "",
                realtime_us=_int_or_none(_journal_field(rec.get("__REALTIME_TIMESTAMP"))),
                pid=_int_or_none(_journal_field(rec.get("_PID"))),
                invocation_id=_journal_field(rec.get("_SYSTEMD_INVOCATION_ID")),
                priority=_int_or_none(_journal_field(rec.get("PRIORITY"))),
                cursor=_journal_field(rec.get("__CURSOR")),
            )
        )
    return entries


def journal_text(entries: Iterable[JournalEntry]) -> str:
    """The messages as one log text (what `-o cat` would print)."""
    return "".join(e.message + "\n" for e in entries)


def parse_journal_cat(text: str) -> list[str]:
    """`journalctl -o cat` -> message lines ("-- No entries --" is no line)."""
    return [line for line in text.splitlines() if line.strip() != "-- No entries --"]


# ---------------------------------------------------------------------------------------
# ss -ltnpH
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ListeningSocket:
    """A listening TCP socket and the processes holding it (empty without privileges)."""

    address: str  # "0.0.0.0", "::", "127.0.0.1", "*"
    port: int
    processes: tuple[tuple[str, int], ...] = ()  # (name, pid)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(pid for _, pid in self.processes)


_SS_USER_RE = re.compile(r'\("(?P<name>(?:[^"\\]|\\.)*)",pid=(?P<pid>\d+),fd=\d+\)')


def _split_host_port(local: str) -> tuple[str, int]:
    host, sep, port = local.rpartition(":")
    if not sep or not port.isdigit():
        raise FactParseError(f"ss: no port in {local!r}")
    host = host.split("%", 1)[0]  # "127.0.0.53%lo" carries the interface
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def parse_ss_listening(text: str) -> list[ListeningSocket]:
    """`ss -ltnpH` -> listening sockets. Columns: State Recv-Q Send-Q Local Peer [users:(...)]."""
    sockets: list[ListeningSocket] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("State"):
            continue
        cols = line.split()
        if len(cols) < 5:
            raise FactParseError(f"ss: short line: {line!r}")
        # `-l` lists only listening sockets; State may be absent with some ss builds.
        local = cols[3] if cols[0].isalpha() else cols[2]
        host, port = _split_host_port(local)
        procs = tuple((m.group("name"), int(m.group("pid"))) for m in _SS_USER_RE.finditer(line))
        sockets.append(ListeningSocket(host, port, procs))
    return sockets


def port_listeners(sockets: Iterable[ListeningSocket], port: int) -> list[ListeningSocket]:
    """The sockets listening on `port`, on any address."""
    return [s for s in sockets if s.port == port]


# ---------------------------------------------------------------------------------------
# argparse --help
# ---------------------------------------------------------------------------------------

_LONG_OPT_RE = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w.-]*")


def parse_help_options(text: str) -> tuple[str, ...]:
    """Long options an argparse `--help` text accepts, in the parser's order, no repeats.

    Read from the usage block (every option appears there, wrapped over many lines) and
    from the invocation column of the option sections (`  --tp-size TP_SIZE, --tp TP_SIZE
    help...`). Help prose is not read: it may name options that no longer exist.
    """
    lines = text.splitlines()
    usage: list[str] = []
    rest_start = 0
    for i, line in enumerate(lines):
        if line.lstrip().startswith("usage:"):
            usage.extend(_LONG_OPT_RE.findall(line))
            j = i + 1
            # wrapped usage lines are indented; a blank or unindented line ends the block
            while j < len(lines) and lines[j].strip() and lines[j][:1].isspace():
                usage.extend(_LONG_OPT_RE.findall(lines[j]))
                j += 1
            rest_start = j
            break
    # The option sections list each action with all its aliases, in registration order:
    # the order argparse lists matches in, so they go first; the usage block adds any
    # option a section does not show (e.g. help=SUPPRESS is absent from both anyway).
    found: dict[str, None] = {}
    for line in lines[rest_start:]:
        # Invocation lines start with a few spaces and a dash; the help text starts after
        # a run of two or more spaces (or on the next, deeper-indented line).
        m = re.match(r"^ {1,8}(-\S.*)$", line)
        if not m:
            continue
        invocation = re.split(r"\s{2,}", m.group(1), maxsplit=1)[0]
        for opt in _LONG_OPT_RE.findall(invocation):
            found.setdefault(opt, None)
    for opt in usage:
        found.setdefault(opt, None)
    return tuple(found)


# ---------------------------------------------------------------------------------------
# nvidia-smi: who holds GPU memory
# ---------------------------------------------------------------------------------------

GPU_APPS_MARK = "@@APPS"
#: exit 3 when the host has no nvidia-smi (no GPU check); the GPUs (index, uuid), then the
#: processes that hold memory on them (uuid, pid, name, MiB)
GPU_HOLDERS_COMMAND = (
    "command -v nvidia-smi >/dev/null 2>&1 || exit 3; "
    "nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null; "
    f"echo {GPU_APPS_MARK}; nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,"
    "used_memory --format=csv,noheader,nounits 2>/dev/null"
)


@dataclass(frozen=True)
class GpuHolder:
    """A process that holds memory on a GPU, as nvidia-smi lists it."""

    gpu: int | None  # the GPU's index (None: its uuid is not among the GPUs listed)
    uuid: str
    pid: int
    name: str
    used_mib: int | None

    def describe(self) -> str:
        where = f"GPU {self.gpu}" if self.gpu is not None else self.uuid
        used = f"{self.used_mib} MiB" if self.used_mib is not None else "memory"
        return f"{where}: {used} held by pid {self.pid} ({self.name})"


def parse_gpu_holders(text: str) -> list[GpuHolder]:
    """The output of GPU_HOLDERS_COMMAND -> the processes holding GPU memory. Lines of
    another shape ("No running processes found", an error) hold no process."""
    gpus_text, _, apps_text = text.partition(GPU_APPS_MARK)
    index: dict[str, int] = {}
    for line in gpus_text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            index[parts[1]] = int(parts[0])
    holders = []
    for line in apps_text.splitlines():
        parts = line.split(",")
        if len(parts) < 4 or not parts[1].strip().isdigit():
            continue
        uuid, pid, used = parts[0].strip(), int(parts[1]), parts[-1].strip()
        name = ",".join(parts[2:-1]).strip()  # a name may hold commas
        holders.append(
            GpuHolder(index.get(uuid), uuid, pid, name, int(used) if used.isdigit() else None)
        )
    return holders


#: processes that hold GPU memory on behalf of the servers they serve (the MPS server
#: is listed on every GPU while MPS runs): never someone else's
GPU_SERVICE_PROCESSES = ("nvidia-cuda-mps-server",)


def holders_on(holders: Sequence[GpuHolder], visible: str | None) -> list[GpuHolder]:
    """The holders on the GPUs a server with CUDA_VISIBLE_DEVICES=`visible` uses (every
    GPU when unset, or when an entry is neither an index nor a GPU uuid), besides the
    GPU_SERVICE_PROCESSES."""
    holders = [h for h in holders if h.name.rsplit("/", 1)[-1] not in GPU_SERVICE_PROCESSES]
    if visible is None:
        return list(holders)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if not entries:
        return []  # CUDA_VISIBLE_DEVICES= (empty): no GPU at all
    if not all(e.isdigit() or e.startswith("GPU-") for e in entries):
        return list(holders)  # MIG devices and the like: every GPU counts
    return [
        h
        for h in holders
        if any(str(h.gpu) == e if e.isdigit() else h.uuid.startswith(e) for e in entries)
    ]
