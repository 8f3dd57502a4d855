"""A scripted host behind the real `Transport` interface, on a scripted clock: the fast tier
of the executor.

`ScriptedTransport` answers the shell commands that the executor, the host lock and the
process and systemd service managers send (the shapes they build in
`orchestrator/execution/`: one regex per shape in `_COMMANDS`), from a timeline of
scripted servers driven by a `FakeClock`: each start prints SGLang's real startup lines
(`orchestrator.lab.sglang_text`, as the lab server does) phase by phase, answers `/health`
once warm, and crashes with a traceback, hangs, dies right after ready, dies under the
probe, or is killed from outside at a scripted moment; a unit can be restarted by systemd
behind the run's back; the host can reboot (its boot id changes) or its link can drop (the
transport's own `TransportError`, after the time the SSH transport spends on reconnects).

The clock advances only when the executor sleeps (and by what a probe or a lost link
costs), so a run with a 15-minute deadline is decided in milliseconds, and poll times are
exact.

Only the host is scripted: the executor, the service manager, the lock, the classifier and
tenacity's retrying are the real ones. A command the script does not know fails the test
at once (`UnscriptedCommand`), never answered by a guess. No test of SSH or systemd uses
this: those run on the real sshd and systemd hosts (`tests/hosts`).
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.config.hosts import Host
from orchestrator.errors import TransportError
from orchestrator.execution.executor import BOOT_MARK
from orchestrator.execution.services.base import HTTP_MARK, LOG_MARK, SS_MARK, STATE_MARK
from orchestrator.execution.transport.base import CommandResult, Transport
from orchestrator.lab import sglang_text
from orchestrator.lab.scenario_model import ModelInfo
from tests.support.scripted import _lines as sglang_lines

#: SGLang's startup phases and how long each takes in the script (seconds): ready at 13 s
PHASES: tuple[tuple[str, float], ...] = (
    ("init", 2.0),
    ("load_weights", 6.0),
    ("kv_cache", 1.0),
    ("cuda_graph", 3.0),
    ("warmup", 1.0),
)
#: what a link drop costs before the SSH transport gives up (its reconnect backoff)
DROP_COST_S = 15.5


class UnscriptedCommand(AssertionError):
    """The executor sent a command the scripted host does not know: the test fails."""


class FakeClock:
    """A monotonic clock, a wall clock and a sleep that only advance when told to."""

    def __init__(self, start: float = 1000.0, epoch: float = 1_796_000_000.0) -> None:
        self.now = start
        self.epoch = epoch - start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.epoch + self.now

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise AssertionError(f"negative sleep: {seconds}")
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass(frozen=True)
class Probe:
    """What the probe command does: takes `seconds`, prints `output`, exits `exit_code`;
    with `outputs`, the i-th run of one start prints the i-th (the last one after them)."""

    seconds: float = 5.0
    output: str = "Output token throughput (tok/s): 89.50\n"
    exit_code: int = 0
    outputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Server:
    """One start of the server, in seconds after its start.

    crash_in: the phase it crashes in (`crash_after` s into it) with `error`'s traceback;
    hang_in: the phase it stops in (logs its beginning, never ends, never ready);
    dies_at: a crash with a traceback while serving (after ready);
    killed_at: SIGKILL from outside, no word in its log; listen_port: the port it really
    binds (None: the config's)."""

    phases: tuple[tuple[str, float], ...] = PHASES
    crash_in: str | None = None
    crash_after: float = 0.5
    error: str = "RuntimeError: CUDA error: an illegal memory access was encountered"
    exit_code: int = 137  # SGLang's kill_process_tree SIGKILLs itself after a crash
    hang_in: str | None = None
    dies_at: float | None = None
    killed_at: float | None = None
    listen_port: int | None = None
    probe: Probe | None = None
    #: how it answers the answers check once ready (tests/support/scripted_answers.py:
    #: None right, `garbled`, `different`, `drift`, `silent`: HTTP 500 to every request)
    answers: str | None = None

    def phase_starts(self) -> list[tuple[str, float, float]]:
        """(phase, begins, ends) after the start."""
        out, t = [], 0.0
        for name, seconds in self.phases:
            out.append((name, t, t + seconds))
            t += seconds
        return out

    @property
    def ready_at(self) -> float | None:
        if self.crash_in or self.hang_in:
            return None
        return self.phase_starts()[-1][2]

    def end(self) -> tuple[float, int, str | None] | None:
        """(when it dies, its exit status, the phase of its traceback or None)."""
        ends: list[tuple[float, int, str | None]] = []
        if self.crash_in is not None:
            begins = next(b for p, b, _ in self.phase_starts() if p == self.crash_in)
            ends.append((begins + self.crash_after, self.exit_code, self.crash_in))
        if self.dies_at is not None:
            ends.append((self.dies_at, self.exit_code, "serving"))
        if self.killed_at is not None:
            ends.append((self.killed_at, 128 + 9, None))
        return min(ends, key=lambda e: e[0]) if ends else None


@dataclass
class _Proc:
    """A started server on the scripted host."""

    pid: int
    script: Server
    started: float  # clock time
    log: str
    invocation: str = ""
    stopped: float | None = None

    def end(self, reboot: float | None = None) -> tuple[float, int | None]:
        """(clock time of its death, the exit status its wrapper wrote, None if none);
        `reboot`: when the host rebooted under it (it dies with no exit status)."""
        ends: list[tuple[float, int | None]] = [(float("inf"), None)]
        scripted = self.script.end()
        if scripted is not None:
            ends.append((self.started + scripted[0], scripted[1]))
        if self.stopped is not None:
            ends.append((self.stopped, 128 + 15))
        if reboot is not None:
            ends.append((reboot, None))
        return min(ends, key=lambda e: e[0])

    def lines(self, now: float) -> list[str]:
        """Its log up to `now`."""
        t = min(now, self.end()[0]) - self.started
        model, flags = ModelInfo(), {"tp-size": 2}
        n = sglang_text.numbers(model, flags, {}, 2)
        out: list[str] = []
        for phase, begins, ends in self.script.phase_starts():
            if t < begins:
                break
            out += sglang_lines(
                sglang_text.phase_begin(phase, n, model, flags, "127.0.0.1", 30000, self.pid)
            )
            if phase == self.script.hang_in:
                break
            if t < ends or phase == self.script.crash_in:
                break
            out += sglang_lines(sglang_text.phase_end(phase, n, model, ends - begins))
        scripted = self.script.end()
        if scripted is not None and scripted[2] is not None and t >= scripted[0]:
            out += sglang_lines(sglang_text.traceback_lines(scripted[2], self.script.error))
        return out


Handler = Callable[[re.Match[str], str | None], tuple[int, str]]


@dataclass
class ScriptedTransport(Transport):
    """The scripted host: one server script per start, host events on the clock."""

    host: Host
    clock: FakeClock
    starts: list[Server]
    #: clock times the host reboots at
    reboots: list[float] = field(default_factory=list)
    #: how long before each reboot its shutdown stops the server (the boot id is still the
    #: old one then, and systemd says `stopping`): a poll can see the server dead first
    shutdown_lead: float = 0.0
    #: systemd answers `systemctl show` with nothing while it shuts down (its bus is going)
    show_fails_while_stopping: bool = False
    #: clock windows [from, until) in which another process holds memory on GPU `gpu`
    #: (from, until, gpu); None: the host has no nvidia-smi (no GPU check)
    gpu_held: list[tuple[float, float, int]] | None = None
    #: clock windows [from, until) in which the link is down
    link_down: list[tuple[float, float]] = field(default_factory=list)
    #: what `EXEC --help` prints (exit 0); None: it fails (exit 1), so the preflight
    #: trusts no help and the server's own start judges its flags
    help_text: str | None = None
    #: systemd hosts: the unit's own text, and when a dead server is started again by
    #: systemd (None: never; a `Restart=always` that wins over our drop-in's Restart=no)
    unit_text: str = (
        "[Service]\nEnvironment=PYTHONPATH=/opt/srv\nExecStart=/bin/sleep infinity\nRestart=no\n"
    )
    restart_after: float | None = None
    files: dict[str, str] = field(default_factory=dict)
    procs: list[_Proc] = field(default_factory=list)
    #: how many times the probe ran on each start (by its process)
    probe_runs: dict[int, int] = field(default_factory=dict)
    #: (clock time, kind) of every command, in order
    log: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        Transport.__init__(self, self.host)
        self._next = 0
        self.polled_port = 0
        self._loaded_dropin: str | None = None  # the drop-in as of the last daemon-reload
        self._table: list[tuple[str, re.Pattern[str], Handler]] = [
            (kind, re.compile(rx, re.S), getattr(self, f"_{kind}")) for kind, rx in _COMMANDS
        ]

    # ---- what the tests look at
    def boot_id(self) -> str:
        n = sum(1 for t in self.reboots if t <= self.clock.now)
        return f"boot-{n}"

    def times(self, kind: str) -> list[float]:
        return [t for t, k in self.log if k == kind]

    # ---- Transport
    def _exec(self, command: str, *, timeout: float, stdin: str | None) -> CommandResult:
        inner = _unwrap(command)
        started = self.clock.now
        for begins, until in self.link_down:
            if begins <= started < until:
                self.clock.now += DROP_COST_S
                self.log.append((started, "dropped"))
                raise TransportError(
                    f"connection to {self.host.describe()} lost and not re-established "
                    "after 4 attempts: Connection reset by peer"
                )
        found = [
            (kind, m, handler)
            for kind, rx, handler in self._table
            if (m := rx.fullmatch(inner)) is not None
        ]
        if len(found) != 1:
            what = (
                "does not know"
                if not found
                else "cannot tell apart (" + ", ".join(k for k, _, _ in found) + ")"
            )
            raise UnscriptedCommand(f"the scripted host {what} this command: {inner!r}")
        kind, m, handler = found[0]
        self.log.append((started, kind))
        code, out = handler(m, stdin)
        return CommandResult(command, code, out, "", self.clock.now - started)

    # ---- the server
    def _proc(self, pid: int) -> _Proc | None:
        return next((p for p in self.procs if p.pid == pid), None)

    def _end(self, p: _Proc) -> tuple[float, int | None]:
        reboot = next((t for t in sorted(self.reboots) if t > p.started), None)
        return p.end(None if reboot is None else reboot - self.shutdown_lead)

    def _stopping(self) -> bool:
        return any(t - self.shutdown_lead <= self.clock.now < t for t in self.reboots)

    def _alive(self, p: _Proc) -> bool:
        return self.clock.now < self._end(p)[0]

    def _state(self, pid: int) -> str:
        p = self._proc(pid)
        if p is not None and self._alive(p):
            return f"{STATE_MARK} alive"
        code = self._end(p)[1] if p is not None else None
        return f"{STATE_MARK} dead {'' if code is None else code}".rstrip()

    def _http(self, url: str) -> int:
        m = re.fullmatch(r"http://[^/]+:(\d+)(/.*)", url)
        if m is None:
            raise UnscriptedCommand(f"a health URL the scripted host cannot read: {url}")
        self.polled_port = int(m[1])
        for p in self.procs:
            ready = p.script.ready_at
            port = p.script.listen_port or self.polled_port
            if (
                self._alive(p)
                and ready is not None
                and self.clock.now - p.started >= ready
                and port == self.polled_port
            ):
                return 200 if m[2] == "/health" else 404
        return 0

    def _tail(self, path: str, lines: int) -> str:
        p = next((p for p in self.procs if p.log == path), None)
        return "".join(x + "\n" for x in p.lines(self.clock.now)[-lines:]) if p else ""

    # ---- the commands (see _COMMANDS)
    def _poll(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        boot = f"{BOOT_MARK} {self.boot_id()}\n" if m["boot"] else ""
        return 0, (
            f"{boot}{self._state(int(m['pid']))}\n{HTTP_MARK} "
            f"{self._http(_word(m['url'])):03d}\n{LOG_MARK}\n"
            + self._tail(_word(m["log"]), int(m["lines"]))
        )

    def _spawn(self, log: str, script: Server | None = None, at: float | None = None) -> _Proc:
        if script is None:
            if self._next >= len(self.starts):
                raise UnscriptedCommand(
                    f"start #{self._next + 1}: the script has only {len(self.starts)}"
                )
            script = self.starts[self._next]
            self._next += 1
        n = len(self.procs)
        p = _Proc(
            4242 + 100 * n,
            script,
            self.clock.now if at is None else at,
            log,
            invocation=f"{n + 1:032x}",
        )
        self.procs.append(p)
        return p

    def _start(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        p = self._spawn(_word(m["log"]))
        self.files[f"{_word(m['dir'])}/pid"] = f"{p.pid}\n"
        return 0, f"{p.pid}\n"

    def _stop(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        p = self._proc(int(m["pid"]))
        if p is not None and self._alive(p):
            p.stopped = self.clock.now
        return 0, ""

    def _probe(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        p = self.procs[-1]
        probe = p.script.probe or Probe()
        self.clock.now += probe.seconds
        if not self._alive(p):
            return 1, "Error: server disconnected\n"
        runs = self.probe_runs[id(p)] = self.probe_runs.get(id(p), 0) + 1
        if probe.outputs:
            return probe.exit_code, probe.outputs[min(runs, len(probe.outputs)) - 1]
        return probe.exit_code, probe.output

    def _ask(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        """The answers check's asker: every prompt of every mode answered as the live
        server's script says (a second each); a dead server answers nothing."""
        from orchestrator.diagnosis.answers import Prompt
        from orchestrator.execution.answers import MARK
        from tests.support.scripted_answers import answer

        req = json.loads(stdin or "{}")
        live = next((p for p in self.procs if self._alive(p)), None)
        reply: dict[str, object] = {"model": "scripted", "sets": {}, "seconds": {}}
        for mode in req["modes"]:
            got = []
            for p in req["prompts"]:  # a server that dies while asked answers no more
                alive = live is not None and self._alive(live)
                kind = live.script.answers if live is not None and alive else "silent"
                got.append(answer(Prompt(p["id"], prompt="?"), kind))
                self.clock.now += 1
            reply["sets"][mode] = got  # type: ignore[index]
            reply["seconds"][mode] = float(len(req["prompts"]))  # type: ignore[index]
        reply["requests"] = len(req["prompts"]) * len(req["modes"]) + 1
        return 0, MARK + json.dumps(reply) + "\n"

    def _now(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        return 0, f"@@NOW {self.clock.time():.6f} +0000\n"

    def _stop_ask(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        return 0, ""  # the scripted asker is over before anything can stop it

    def _pids(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        p = self._proc(int(m["pgid"]))
        if p is None or not self._alive(p):
            return 0, f"{SS_MARK}\n"
        port = p.script.listen_port or self.polled_port
        server = p.pid + 1
        return 0, (
            f"{p.pid}\n{server}\n{SS_MARK}\nLISTEN 0 2048 127.0.0.1:{port} 0.0.0.0:* "
            f'users:(("python3",pid={server},fd=9))\n'
        )

    def _logs(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        return 0, self._tail(_word(m["log"]), int(m["lines"]))

    def _listeners(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        return 0, ""  # nothing else holds the port

    def _gpu_holders(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        if self.gpu_held is None:
            return 3, ""
        gpus = "".join(f"{i}, GPU-scripted-{i}\n" for i in range(8))
        apps = "".join(
            f"GPU-scripted-{gpu}, {7000 + gpu}, python3, 70000\n"
            for begins, until, gpu in self.gpu_held
            if begins <= self.clock.now < until
        )
        return 0, f"{gpus}@@APPS\n{apps}"

    def _environment(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        out = "@@NVSMI\n@@KERNEL\n6.1.0-scripted\n@@PYHOW exec python3\n"
        # the files the launch names, read from the scripted host's files (absent: `-`)
        named = re.search(r"echo @@FILES; for f in (.*?); do ", m.string)
        if named:
            import hashlib

            out += "@@FILES\n"
            for path in shlex.split(named[1]):
                text = self.files.get(path)
                sha = hashlib.sha256(text.encode()).hexdigest()[:16] if text is not None else "-"
                out += f"{sha} {path}\n"
        return 0, out

    def _help(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        return (0, self.help_text) if self.help_text is not None else (1, "")

    def _lock(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        path = _word(m["path"])
        if path in self.files:
            return 1, ""
        self.files[path] = _word(m["body"]) + "\n"
        return 0, ""

    def _mkdir(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        return 0, ""

    def _read(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        text = self.files.get(_word(m["path"]))
        return (3, "") if text is None else (0, text)

    def _write(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        self.files[_word(m["path"])] = stdin or ""
        return 0, ""

    def _rm(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        for path in shlex.split(m["paths"]):
            self.files.pop(path, None)
        return 0, ""

    # ---- the systemd unit (orchestrator/execution/services/systemd.py)
    def _unit_proc(self) -> _Proc | None:
        """The unit's current server; a `restart_after` unit starts a dead one again."""
        units = [p for p in self.procs if p.log == "journal"]
        if not units:
            return None
        p = units[-1]
        while self.restart_after is not None and p.stopped is None:
            again = self._end(p)[0] + self.restart_after
            if again > self.clock.now:
                break
            p = self._spawn("journal", p.script, at=again)
        return p

    def _unit_props(self) -> dict[str, str]:
        p = self._unit_proc()
        restarts = max(sum(1 for q in self.procs if q.log == "journal") - 1, 0)
        props = {
            "LoadState": "loaded",
            "FragmentPath": "/etc/systemd/system/unit.service",
            "DropInPaths": self._loaded_dropin or "",
            "NRestarts": str(restarts),
            "ActiveState": "inactive",
            "SubState": "dead",
            "Result": "success",
            "InvocationID": "",
            "MainPID": "0",
            "ExecMainStatus": "0",
            "ExecMainCode": "0",
            "WorkingDirectory": "/opt/srv",
            "Environment": " ".join(self._unit_env()),
        }
        if p is None:
            return props
        props["InvocationID"] = p.invocation
        dies, code = self._end(p)
        reboot = next((t for t in sorted(self.reboots) if t > p.started), None)
        if reboot is not None and reboot <= self.clock.now:
            props["InvocationID"] = ""  # a unit not enabled is not started by the boot
        elif self.clock.now < dies:
            props |= {"ActiveState": "active", "SubState": "running", "MainPID": str(p.pid)}
        elif p.stopped is not None and p.stopped == dies:
            props |= {"ExecMainCode": "2", "ExecMainStatus": "15"}
        elif code is not None and code > 128:
            props |= {
                "ActiveState": "failed",
                "SubState": "failed",
                "Result": "signal",
                "ExecMainCode": "2",
                "ExecMainStatus": str(code - 128),
            }
        elif code is not None:
            props |= {
                "ActiveState": "failed",
                "SubState": "failed",
                "Result": "exit-code",
                "ExecMainCode": "1",
                "ExecMainStatus": str(code),
            }
        if self.restart_after is not None and props["ActiveState"] == "failed":
            props |= {"ActiveState": "activating", "SubState": "auto-restart"}
        return props

    def _unit_env(self) -> list[str]:
        env = [
            ln.split("=", 1)[1]
            for ln in self.unit_text.splitlines()
            if ln.startswith("Environment=")
        ]
        return env + [
            w
            for ln in (
                self._loaded_dropin and self.files.get(self._loaded_dropin, "") or ""
            ).splitlines()
            if ln.startswith("Environment=")
            for w in _systemd_words(ln.split("=", 1)[1])
        ]

    def _exec_start(self) -> tuple[str, list[str]]:
        text = self.files.get(self._loaded_dropin or "", "") if self._loaded_dropin else ""
        lines = [
            ln.split("=", 1)[1]
            for ln in (text or self.unit_text).splitlines()
            if ln.startswith("ExecStart=") and ln != "ExecStart="
        ]
        words = _systemd_words(lines[-1]) if text else lines[-1].split()
        return words[0], words

    def _systemctl_version(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        return 0, "systemd 252 (252.30-1~deb12u2)\n"

    def _show(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        names = [n for arg in re.findall(r"-p (\S+)", m["props"]) for n in arg.split(",")]
        if self.show_fails_while_stopping and self._stopping():
            return 1, ""  # "Failed to connect to bus" goes to stderr
        props = self._unit_props()
        missing = [n for n in names if n not in props]
        if missing:
            raise UnscriptedCommand(f"systemctl show of properties not scripted: {missing}")
        return 0, "".join(f"{n}={props[n]}\n" for n in names)

    def _cat(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        return 0, self.unit_text

    def _unit_inputs(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        env = " ".join(self._unit_env())
        return 0, (
            f"Environment={env}\nUnsetEnvironment=\nWorkingDirectory=/opt/srv\n"
            "User=\nGroup=\n@@MANAGER\nPATH=/usr/bin:/bin\n"
        )

    def _reload(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        dropins = [p for p in self.files if p.endswith(".service.d/99-orchestrator.conf")]
        self._loaded_dropin = dropins[0] if dropins else None
        return 0, ""

    def _busctl(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        prop = m["prop"]
        if prop == "ExecStart":
            path, argv = self._exec_start()
            return 0, json.dumps(
                {"type": "a(sasbttttuii)", "data": [[path, argv, False, 0, 0, 0, 0, 0, 0, 0]]}
            )
        if prop == "Environment":
            return 0, json.dumps({"type": "as", "data": self._unit_env()})
        if prop == "UnsetEnvironment":  # the loaded drop-in's, as systemd serves them
            text = self.files.get(self._loaded_dropin or "", "") if self._loaded_dropin else ""
            names = [
                w
                for ln in (text or "").splitlines()
                if ln.startswith("UnsetEnvironment=")
                for w in ln.split("=", 1)[1].split()
            ]
            return 0, json.dumps({"type": "as", "data": names})
        raise UnscriptedCommand(f"busctl property not scripted: {prop}")

    def _ctl(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        verb = m["verb"]
        p = self._unit_proc()
        if verb == "start --no-block":
            if p is None or not self._alive(p):
                self._spawn("journal")
        elif verb == "stop" and p is not None and self._alive(p):
            p.stopped = self.clock.now
        elif verb == "stop" and p is not None and p.stopped is None:
            p.stopped = self._end(p)[0]  # a unit restarting is stopped for good
        return 0, ""

    def _journal(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        self._unit_proc()  # a restart due by now writes its own lines
        p = next((q for q in self.procs if q.invocation == m["inv"]), None)
        lines = p.lines(self.clock.now) if p is not None else []
        return 0, "".join(x + "\n" for x in lines[-int(m["lines"]) :])

    def _stop_jobs(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        # systemd's record of stop jobs: none here (the scripted faults kill, never stop)
        return 0, ""

    def _unit_poll(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        boot = f"{BOOT_MARK} {self.boot_id()}\n" if m["boot"] else ""
        state = self._show(m, stdin)[1]
        code = self._http(_word(m["url"]))
        log = self._journal(m, stdin)[1]
        return 0, f"{boot}{state}{HTTP_MARK} {code:03d}\n{LOG_MARK}\n{log}"

    def _cgroup_pids(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        p = self._unit_proc()
        if p is None or not self._alive(p):
            return 0, f"{SS_MARK}\n"
        port = p.script.listen_port or self.polled_port
        return 0, (
            f"{p.pid}\n{SS_MARK}\nLISTEN 0 2048 127.0.0.1:{port} 0.0.0.0:* "
            f'users:(("python3",pid={p.pid},fd=9))\n'
        )

    def _rm_dropin(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        return self._rm(m, stdin)

    # ---- the read-back after a restore (ServiceManager.left_over)
    def _left_systemd(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        present = [f for f in shlex.split(m["files"]) if f in self.files]
        return 0, "".join(f + "\n" for f in present) + "@@\n" + self._unit_props()[
            "ActiveState"
        ] + "\n"

    def _boot_state(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        return 0, f"{self.boot_id()}\n{'stopping' if self._stopping() else 'running'}\n"

    def _left_process(self, m: re.Match[str], stdin: str | None) -> tuple[int, str]:
        p = self._proc(int(m["pgid"]))
        return (0, "") if p is not None and self._alive(p) else (1, "")


#: the commands the scripted host knows: (kind, the whole command as a regex). One shape
#: each, as the executor (poll with boot id, probe), the host lock and the process manager
#: (orchestrator/execution/services/process.py) build them.
_W = r"(?:'[^']*'|[^\s;'&|]+)"  # one shell word, maybe single-quoted
_POLL = (
    r"if \[ -d /proc/(?P<pid>\d+) \] && ! grep -q '\^State:\.\*Z' /proc/(?P=pid)/status "
    r"2>/dev/null; then echo '@@STATE alive'; else echo \"@@STATE dead \$\(cat "
    rf"{_W}/exit 2>/dev/null\)\"; fi; if command -v curl .*? --max-time 3 (?P<url>{_W}) "
    rf"2>/dev/null\); else .*?; fi; echo \"@@HTTP \$\{{c:-000\}}\"; echo '@@LOG'; "
    rf"tail -n (?P<lines>\d+) (?P<log>{_W}) 2>/dev/null"
)
_COMMANDS: tuple[tuple[str, str], ...] = (
    (
        "poll",
        rf"(?P<boot>echo {BOOT_MARK} \$\(cat /proc/sys/kernel/random/boot_id "
        rf"2>/dev/null\); )?{_POLL}",
    ),
    (
        "start",
        rf"umask 077; rm -f (?P<dir>{_W})/pid {_W}/exit; setsid -f sh -c {_W} > "
        rf"(?P<log>{_W}) 2>&1 < /dev/null; for i in \$\(seq 50\); do .*; cat {_W}/pid",
    ),
    (
        "stop",
        r"m\(\) \{ if command -v ps >/dev/null 2>&1; then ps -eo pid=,sid=,stat= \| "
        r"awk '\$2 == (?P<pid>\d+) && .*",
    ),
    (
        "pids",
        r"ps -eo pid=,sid= \| awk '\$2 == (?P<pgid>\d+) \{print \$1\}'; "
        r"command -v ss >/dev/null && echo '@@SS' && ss -Hltnp 2>/dev/null",
    ),
    ("logs", rf"tail -n (?P<lines>\d+) (?P<log>{_W}); s=\$\?; ls -1t .*; exit \$s"),
    ("listeners", r"ss -Hltnp 'sport = :\d+' 2>/dev/null \|\| true"),
    (
        "gpu_holders",
        r"command -v nvidia-smi >/dev/null 2>&1 \|\| exit 3; nvidia-smi "
        r"--query-gpu=index,uuid .*",
    ),
    ("environment", r"(?:cd \S+ 2>/dev/null; )?(?:export \S+; )*echo @@NVSMI; .*"),
    (
        "lock",
        rf"umask 077 && mkdir -p {_W} && \(set -C; printf '%s\\n' (?P<body>{_W}) > "
        rf"(?P<path>{_W})\) 2>/dev/null",
    ),
    ("mkdir", rf"umask 077 && mkdir -p (?P<dir>{_W}) && \[ ! -L (?P=dir) \] && .*"),
    ("read", rf"if \[ -e (?P<path>{_W}) \]; then cat (?P=path); else exit 3; fi"),
    (
        "write",
        rf"umask 077 && mkdir -p {_W} && cat > {_W} && .* mv -f {_W} "
        rf"(?P<path>{_W}); else .*",
    ),
    ("rm", r"rm -f (?P<paths>[^;&|]+)"),
    (
        "left_systemd",
        r"for f in (?P<files>.*?); do \[ -e \"\$f\" \] && echo \"\$f\"; done; "
        r"echo @@; systemctl show [\w.@-]+ -p ActiveState --value",
    ),
    ("left_process", r"ps -eo sid=,stat= \| awk '\$1 == (?P<pgid>\d+) && .*"),
    ("systemctl_version", r"command -v systemctl >/dev/null && systemctl --version \| head -1"),
    ("show", r"systemctl show [\w.@-]+(?P<props>( -p [\w,]+)+)"),
    ("cat", r"systemctl cat [\w.@-]+"),
    (
        "unit_inputs",
        r"systemctl show [\w.@-]+ -p Environment -p UnsetEnvironment "
        r"-p EnvironmentFiles -p WorkingDirectory -p User -p Group; "
        r"echo @@MANAGER; systemctl show-environment",
    ),
    ("reload", r"systemctl daemon-reload"),
    ("ctl", r"systemctl (?P<verb>start --no-block|stop|reset-failed) [\w.@-]+"),
    (
        "busctl",
        r"busctl --json=short get-property org\.freedesktop\.systemd1 \S+ "
        r"org\.freedesktop\.systemd1\.Service (?P<prop>\w+)",
    ),
    (
        "journal",
        r"journalctl _SYSTEMD_INVOCATION_ID=(?P<inv>[0-9a-f]+) -o cat --no-pager "
        r"-n (?P<lines>\d+)",
    ),
    (
        "stop_jobs",
        r"journalctl _PID=1 INVOCATION_ID=(?P<inv>[0-9a-f]+) MESSAGE_ID=[0-9a-f]+ "
        r"-o cat --no-pager -n 1",
    ),
    (
        "unit_poll",
        rf"(?P<boot>echo {BOOT_MARK} \$\(cat /proc/sys/kernel/random/boot_id "
        r"2>/dev/null\); )?systemctl show [\w.@-]+(?P<props> -p [\w,]+); "
        rf"if command -v curl .*? --max-time 3 (?P<url>{_W}) 2>/dev/null\); else "
        r".*?; fi; echo \"@@HTTP \$\{c:-000\}\"; echo '@@LOG'; journalctl "
        r"_SYSTEMD_INVOCATION_ID=(?P<inv>[0-9a-f]+) -o cat --no-pager "
        r"-n (?P<lines>\d+) 2>/dev/null",
    ),
    (
        "boot_state",
        r"cat /proc/sys/kernel/random/boot_id 2>/dev/null; "
        r"systemctl is-system-running 2>/dev/null \|\| true",
    ),
    ("cgroup_pids", r"cg=\$\(systemctl show -p ControlGroup --value [\w.@-]+\); .*"),
    ("rm_dropin", r"rm -f (?P<paths>[^;&|]+); rmdir \S+ 2>/dev/null \|\| true"),
    ("help", r"(?:cd \S+ && )?(?:\. /dev/stdin && )?python3 -m sglang\.launch_server --help"),
    ("probe", r"python3 -m sglang\.bench_serving --port \d+ .*"),
    ("ask", r"python3 -c '\"\"\"Ask an OpenAI-compatible server.*"),
    ("stop_ask", r"pkill -f -- '\[o\]rchestrator-ask-[0-9a-f]+' \|\| true"),
    # a deployment's reading of each host's clock (roles.offset_command)
    ("now", r'echo "@@NOW \$\(date \+%s\.%N\) \$\(date \+%z\)"'),
)


@functools.lru_cache(maxsize=256)  # a poll sends the same command hundreds of times
def _unwrap(command: str) -> str:
    """The command as the caller wrote it, out of the transport's `timeout` (and `sudo`)
    wrapping and the reading of the host's environment."""
    words = shlex.split(command)
    if words[:4] == ["sudo", "-n", "--", "sh"]:
        words = shlex.split(words[5])
    if words[:3] != ["timeout", "-k", "5"] or words[4:6] != ["sh", "-c"] or len(words) != 7:
        raise UnscriptedCommand(f"not wrapped the way Transport.wrap wraps: {command!r}")
    inner = words[6]
    # the host's environment is read from stdin ahead of the command (Transport.wrap)
    return re.sub(r"^_e=; while .*?; unset _e _l; ", "", inner, flags=re.DOTALL)


def _systemd_words(text: str) -> list[str]:
    """The words of an `ExecStart=`/`Environment=` value as orchestrator quotes them
    (`systemd_quote`): double-quoted, C escapes, `%%` for `%` (and `$$` kept in the stored
    argv, as systemd keeps it until it runs the command)."""
    words = []
    for raw in re.findall(r'"((?:[^"\\]|\\.)*)"', text):
        word = re.sub(
            r"\\(x[0-9a-f]{2}|.)",
            lambda e: {"n": "\n", "t": "\t"}.get(
                e[1], chr(int(e[1][1:], 16)) if e[1].startswith("x") and len(e[1]) == 3 else e[1]
            ),
            raw,
        )
        words.append(word.replace("%%", "%"))
    return words


@functools.lru_cache(maxsize=256)
def _word(word: str) -> str:
    return shlex.split(word)[0]


def host(name: str = "scripted") -> Host:
    """A host the scripted transport stands for (a documentation address: never reached)."""
    return Host(name=name, address="192.0.2.1", host_class=name, service_manager="process")
