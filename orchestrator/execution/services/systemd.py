"""The systemd service manager: the user's unit plus one drop-in, never an edited unit file.

Sequence per run (docs/design.md, "One run on a systemd host", and its contracts):
stop + reset-failed, write `UNIT.d/99-orchestrator.conf` atomically
(`ExecStart=` reset, the variant's `ExecStart`, `Environment=`/`UnsetEnvironment=`,
`Restart=no`), `daemon-reload`, read the effective
`ExecStart` argv and environment back and compare with what was intended (a mismatch is
`invalid`, never a silent run), start, note `InvocationID`. Restore removes the drop-in,
reloads, and leaves the service running or stopped as it was found.
"""

from __future__ import annotations

import json
import re
import shlex

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.config.secrets import TOKEN_VALUE, is_secret_name
from orchestrator.errors import ServiceError, TransportError
from orchestrator.execution import facts
from orchestrator.execution.inputs import digest as inputs_digest
from orchestrator.execution.services.base import (
    LOG_MARK,
    Poll,
    ServiceManager,
    Started,
    health_snippet,
    split_sections,
)
from orchestrator.execution.transport.base import Transport

DROPIN_NAME = "99-orchestrator.conf"
#: secret environment variables, beside the drop-in (systemd reads only `*.conf` there)
ENV_FILE_NAME = "99-orchestrator.env"
#: journal MESSAGE_ID of systemd's "Stopping UNIT..." (SD_MESSAGE_UNIT_STOPPING): a stop
#: job of the unit, which the campaign never runs while it watches a server
UNIT_STOPPING_ID = "de5b426a63be47a7b6ac3eaac82e2f6f"
#: the drop-in's temporary copy while it is written (systemd ignores the name)
TMP_SUFFIX = ".orchestrator-tmp"
#: how the unit was found (active/inactive), written once per campaign before anything changes
STATE_NAME = "orchestrator-found-state"
#: the drop-in remembers how the unit was found, so a restore after a crash knows too
FOUND_MARK = "orchestrator-found-state:"
#: the unit's variables that decide which interpreter and packages its server sees
INTERPRETER_VARS = ("PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX")
STATE_PROPS = (
    "ActiveState,SubState,Result,InvocationID,NRestarts,MainPID,ExecMainStatus,ExecMainCode"
)


def systemd_quote(word: str) -> str:
    """One ExecStart= word, quoted so systemd's parser gives back exactly `word`.

    systemd unquotes double-quoted words and processes C escapes inside them; `$` starts
    an environment variable substitution (`$$` is a literal `$`) and `%` a specifier
    (`%%` is a literal `%`).
    """
    out = []
    for ch in word:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "$":
            out.append("$$")
        elif ch == "%":
            out.append("%%")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def env_assignment(key: str, value: str) -> str:
    """One Environment= word: `"KEY=value"`, quoted so systemd gives back exactly `value`.

    systemd unquotes the word and processes C escapes in it (so a newline or another
    control character travels as `\\n` / `\\xNN`) and expands specifiers (`%%` is a
    literal `%`); there is no `$` expansion in Environment=.
    """
    return systemd_quote(f"{key}={value}").replace("$$", "$")


def env_file_line(key: str, value: str) -> str:
    """One `KEY="value"` line of an EnvironmentFile=, read back exactly by systemd.

    Inside double quotes systemd's env-file parser takes a backslash before one of
    `"`, `\\`, `` ` `` or `$` as an escape, keeps every other character as it is (a
    newline too: the value goes on over lines) and expands nothing.
    """
    return f'{key}="' + re.sub(r'(["\\`$])', r"\\\1", value) + '"'


def is_private_env(key: str, value: str, refs: dict[str, str]) -> bool:
    """Whether an environment variable must stay out of Environment=: systemd serves a
    unit's Environment= to every local user over D-Bus (`systemctl show`), whatever
    the drop-in's file mode, so a secret goes to a 0600 EnvironmentFile= instead."""
    return key in refs or is_secret_name(key) or bool(TOKEN_VALUE.search(value))


def bus_path(unit: str) -> str:
    """The D-Bus object path of a unit (systemd's bus_label_escape)."""
    out = []
    for i, ch in enumerate(unit):
        if ch.isascii() and (ch.isalpha() or (ch.isdigit() and i > 0)):
            out.append(ch)
        else:
            out.append("_" + "".join(f"{b:02x}" for b in ch.encode()))
    return "/org/freedesktop/systemd1/unit/" + "".join(out)


def _bus_data(text: str) -> list[object]:
    """The `data` of `busctl --json=short get-property` output."""
    try:
        data = json.loads(text)["data"]
    except (ValueError, KeyError, TypeError) as exc:
        raise facts.FactParseError(f"busctl: unexpected output: {text[:200]!r}") from exc
    if not isinstance(data, list):
        raise facts.FactParseError(f"busctl: expected an array: {text[:200]!r}")
    return data


def _bus_strings(text: str) -> list[str]:
    return [str(x) for x in _bus_data(text)]


class SystemdManager(ServiceManager):
    kind = "systemd"

    def __init__(self, host: Host, transport: Transport, *, name: str, campaign: str = "") -> None:
        if not re.fullmatch(r"[A-Za-z0-9:_.@\\-]+\.[a-z]+", name):
            raise ServiceError(f"'{name}' is not a systemd unit name", hint="e.g. sglang.service")
        super().__init__(host, transport, name=name, campaign=campaign)
        self.dropin_dir = f"{host.unit_dir.rstrip('/')}/{name}.d"
        self.dropin = f"{self.dropin_dir}/{DROPIN_NAME}"
        self.env_file = f"{self.dropin_dir}/{ENV_FILE_NAME}"
        self._env_text: str | None = None
        self.state_file = f"{self.dropin_dir}/{STATE_NAME}"
        self._text: str | None = None
        self.found_active: bool | None = None
        self.backup: str | None = None
        #: the effective ExecStart argv systemd reported after the last install
        self.read_back_exec: list[str] | None = None
        self.read_back_path: str | None = None  # the binary systemd resolved argv[0] to
        self._context: tuple[list[tuple[str, str]], str | None] | None = None
        self._unit_inputs: str | None = None  # read by prepare(), before any drop-in
        self._prepared = False

    # ---- helpers
    def _ctl(self, args: str, *, timeout: float = 60, check: bool = True) -> str:
        r = self.t.run(f"systemctl {args}", sudo=True, timeout=timeout)
        if check and not r.ok:
            raise ServiceError(
                f"{self.host.describe()}: systemctl {args} failed: "
                f"{(r.stderr or r.stdout).strip()[-400:]}"
            )
        return r.stdout

    def _show(self, props: str) -> dict[str, str]:
        return facts.parse_show(self._ctl(f"show {shlex.quote(self.name)} -p {props}"))

    # ---- lifecycle
    def prepare(self) -> None:
        r = self.t.run(
            "command -v systemctl >/dev/null && systemctl --version | head -1", timeout=20
        )
        if not r.ok:
            raise ServiceError(
                f"{self.host.describe()}: systemctl not found",
                hint="use service_manager: process for hosts without systemd",
            )
        props = self._show("LoadState,ActiveState,FragmentPath,DropInPaths")
        if props.get("LoadState") != "loaded":
            raise ServiceError(
                f"{self.host.describe()}: unit {self.name} is not installed "
                f"(LoadState={props.get('LoadState') or '?'})",
                hint=f"install {self.name} on the host first (orchestrator only adds a drop-in "
                f"to it), or fix service.unit in the experiment config",
            )
        # What a crashed controller left (its drop-in, or only its note of how it found the
        # unit, when it died between stopping the unit and writing the drop-in): undo it
        # first, so the unit is found as it was before that campaign.
        leftover = self.t.read_file(self.dropin, sudo=True)
        noted = self.t.read_file(self.state_file, sudo=True)
        if leftover is not None or noted is not None:
            self.restore()
            props = self._show("LoadState,ActiveState,FragmentPath,DropInPaths")
        self.found_active = props.get("ActiveState") in ("active", "activating", "reloading")
        # systemd ignores files without a .conf suffix in the drop-in directory
        self.t.write_file(
            self.state_file,
            "active\n" if self.found_active else "inactive\n",
            mode=0o600,
            sudo=True,
        )
        self.backup = self._ctl(f"cat {shlex.quote(self.name)}", check=False)
        self._unit_inputs = self._read_unit_inputs(self.backup)
        self._prepared = True

    def _read_unit_inputs(self, text: str | None = None) -> str | None:
        """The unit as the operator left it, before our drop-in: its files (`systemctl cat`),
        the environment systemd gives it (`Environment=`, `UnsetEnvironment=`, the
        manager's own environment) and the contents of its `EnvironmentFile=`s. None when
        any of it cannot be read, or when a drop-in of ours is in it (another campaign's,
        or a crashed one's): then no verdict is reused on this host."""
        unit = shlex.quote(self.name)
        if text is None:
            text = self._ctl(f"cat {unit}", check=False)
        if DROPIN_NAME in text:
            return None
        r = self.t.run(
            f"systemctl show {unit} -p Environment -p UnsetEnvironment "
            "-p EnvironmentFiles -p WorkingDirectory -p User -p Group; "
            "echo @@MANAGER; systemctl show-environment",
            sudo=True,
            timeout=30,
        )
        if not r.ok or not text:
            return None
        shown, _, manager = r.stdout.partition("@@MANAGER")
        files: list[list[str | None]] = []
        for line in shown.splitlines():
            if line.startswith("EnvironmentFiles="):  # `PATH (ignore_errors=yes|no)`
                path = line.removeprefix("EnvironmentFiles=").rsplit(" (ignore_errors=", 1)[0]
                try:
                    files.append([path, self.t.read_file(path, sudo=True)])
                except TransportError:
                    return None
        return inputs_digest([text, shown, manager, files])

    def install(self, exp: Experiment, *, env_keys: frozenset[str], run_id: str) -> str | None:
        env = exp.env_map()
        unset = list(exp.unsetting(env_keys).unset)
        refs = dict(exp.secret_refs)
        private = {k: v for k, v in env.items() if is_private_env(k, v, refs)}
        lines = [
            f"# written by orchestrator (campaign {self.campaign}, run {run_id}).",
            "# Removed when the campaign ends; `orchestrator restore` removes it too.",
            f"# {FOUND_MARK} {'active' if self.found_active else 'inactive'}",
            "[Unit]",
            "StartLimitIntervalSec=0",
            "[Service]",
            "ExecStart=",
            "ExecStart=" + " ".join(systemd_quote(w) for w in exp.argv()),
            "Restart=no",
        ]
        if exp.workdir:
            lines.append("WorkingDirectory=" + exp.workdir.replace("%", "%%"))
        if unset:
            lines.append("UnsetEnvironment=" + " ".join(unset))
        for k, v in env.items():
            if k not in private:
                lines.append("Environment=" + env_assignment(k, v))
        self._env_text = None
        if private:
            # Names only: the values are in the 0600 file, never in what D-Bus serves.
            lines.append(f"# {self.env_file} holds: {' '.join(private)}")
            lines.append("EnvironmentFile=" + self.env_file.replace("%", "%%"))
            self._env_text = "".join(env_file_line(k, v) + "\n" for k, v in private.items())
            self.t.write_file(self.env_file, self._env_text, mode=0o600, sudo=True)
        else:
            self.t.run(f"rm -f {shlex.quote(self.env_file)}", sudo=True, timeout=30)
        self._text = "\n".join(lines) + "\n"
        self.read_back_exec = self.read_back_path = None
        self.t.write_file(self.dropin, self._text, mode=0o600, sudo=True)
        self._ctl("daemon-reload", timeout=120)
        return self._read_back(
            exp, {k: v for k, v in env.items() if k not in private}, unset, private
        )

    def _busctl(self, prop: str) -> str | None:
        """A Service property as `busctl --json=short` prints it (exact), or None."""
        r = self.t.run(
            "busctl --json=short get-property org.freedesktop.systemd1 "
            f"{shlex.quote(bus_path(self.name))} org.freedesktop.systemd1.Service {prop}",
            sudo=True,
            timeout=30,
        )
        return r.stdout if r.ok and r.stdout.strip() else None

    def _read_back(
        self, exp: Experiment, env: dict[str, str], unset: list[str], private: dict[str, str]
    ) -> str | None:
        # `systemctl show` prints argv words raw: a newline or carriage return in one
        # breaks its line format, so it is asked for ExecStart only when busctl is missing.
        props = self._show("DropInPaths")
        intended = exp.argv()
        # systemd keeps `$$` in the stored argv and turns it into `$` only when it runs
        # the command (with `$VAR` expansion), so the property holds the escaped words.
        stored = [w.replace("$", "$$") for w in intended]
        exact = self._busctl("ExecStart")
        if exact is not None:
            cmds = facts.parse_busctl_exec(exact)
            got = list(cmds[0][1]) if len(cmds) == 1 else [f"<{len(cmds)} commands>"]
            argv_ok = got == stored
            self.read_back_path = cmds[0][0] if len(cmds) == 1 else None
        else:
            props |= self._show("ExecStart")
            commands = facts.parse_exec_start(props.get("ExecStart", ""))
            got = list(commands[0].argv) if len(commands) == 1 else [f"<{len(commands)} commands>"]
            argv_ok = len(commands) == 1 and facts.argv_matches(stored, commands[0])
            self.read_back_path = commands[0].path if len(commands) == 1 else None
        self.read_back_exec = got
        if not argv_ok:
            return f"ExecStart read back differs: intended {intended!r}, systemd has {got!r}"
        # The exact strings over D-Bus; `systemctl show` prints control characters in
        # escapes of its own, so it is only the fallback.
        bus_env, bus_unset = self._busctl("Environment"), self._busctl("UnsetEnvironment")
        if bus_env is not None and bus_unset is not None:
            effective = dict(w.partition("=")[::2] for w in _bus_strings(bus_env))
            unset_now = _bus_strings(bus_unset)
        else:
            props |= self._show("Environment,UnsetEnvironment")
            effective = facts.parse_environment(props.get("Environment", ""))
            unset_now = props.get("UnsetEnvironment", "").split()
        for k in unset_now:
            effective.pop(k.split("=", 1)[0], None)
        wrong = {k: (v, effective.get(k)) for k, v in env.items() if effective.get(k) != v}
        stale = [k for k in unset if k in effective]
        if wrong or stale:
            return (
                f"Environment read back differs: intended {env!r} without {unset!r}; "
                f"systemd has {effective!r}"
            )
        if private:
            problem = self._read_back_env_file(private, unset_now)
            if problem:
                return problem
        if self.dropin not in props.get("DropInPaths", "").split():
            return f"systemd does not list the drop-in {self.dropin} (DropInPaths differs)"
        return None

    def _read_back_env_file(self, private: dict[str, str], unset_now: list[str]) -> str | None:
        """The secret variables: the file as written, the last EnvironmentFile= of the
        unit (a later one would override it), and none of them unset again."""
        text = self.t.read_file(self.env_file, sudo=True)
        if text != self._env_text:
            return f"the environment file {self.env_file} read back differs from the one written"
        files = self._busctl("EnvironmentFiles")
        paths = [rec[0] for rec in _bus_data(files)] if files is not None else []
        if not paths or paths[-1] != self.env_file:
            return (
                f"EnvironmentFiles read back differs: intended {self.env_file} last, "
                f"systemd has {paths!r}"
            )
        dropped = sorted(k for k in private if k in {u.split("=", 1)[0] for u in unset_now})
        if dropped:
            return f"UnsetEnvironment= of the unit removes {', '.join(dropped)}"
        return None

    def rendered(self) -> str | None:
        return self._text

    def host_record(self, started: Started | None) -> dict[str, object] | None:
        """The drop-in's path, the ExecStart systemd read back, the InvocationID and the
        journalctl command that shows that invocation's whole log on the host."""
        if self._text is None:
            return None
        inv = re.sub(r"[^0-9a-f]", "", started.invocation or "") if started else ""
        journal = (
            f"journalctl _SYSTEMD_INVOCATION_ID={inv} --no-pager"
            if inv
            else f"journalctl -u {shlex.quote(self.name)} --no-pager"
        )
        return {
            "manager": "systemd",
            "unit": self.name,
            "dropin_path": self.dropin,
            "exec_start": self.read_back_exec,
            "exec_path": self.read_back_path,
            "invocation": inv or None,
            "journal_command": ("sudo " if self.host.sudo else "") + journal,
        }

    def unit_inputs(self) -> str | None:
        # Before the campaign prepared the unit (a cache lookup only reads), read it now.
        return self._unit_inputs if self._prepared else self._read_unit_inputs()

    def interpreter_context(self) -> tuple[list[tuple[str, str]], str | None]:
        """The unit's own PATH/PYTHONPATH/venv variables and WorkingDirectory=: the server
        runs with them, an SSH command does not. Read once, before our drop-in is added."""
        if self._context is None:
            r = self.t.run(
                f"systemctl show {shlex.quote(self.name)} -p Environment -p WorkingDirectory",
                timeout=30,
            )
            try:
                props = facts.parse_show(r.stdout) if r.ok else {}
                env = facts.parse_environment(props.get("Environment", ""))
            except facts.FactParseError:
                props, env = {}, {}
            wd = props.get("WorkingDirectory", "").lstrip("-!")
            self._context = (
                [(k, v) for k, v in env.items() if k in INTERPRETER_VARS],
                wd if wd.startswith("/") else None,
            )
        return self._context

    def start(self, exp: Experiment, *, run_id: str) -> Started:
        self._ctl(f"reset-failed {shlex.quote(self.name)}", check=False)
        # `systemctl start` returns 0 even when the server dies at once: the poll decides.
        self._ctl(f"start --no-block {shlex.quote(self.name)}", timeout=120)
        props = self._show(STATE_PROPS)
        st = facts.unit_state(props)
        return Started(
            invocation=st.invocation_id or None, pid=st.main_pid or None, restarts=st.n_restarts
        )

    def poll_command(self, exp: Experiment, started: Started, *, log_lines: int = 150) -> str:
        unit = shlex.quote(self.name)
        inv = re.sub(r"[^0-9a-f]", "", started.invocation or "")
        journal = (
            f"journalctl _SYSTEMD_INVOCATION_ID={inv} -o cat --no-pager -n {int(log_lines)}"
            if inv
            else f"journalctl -u {unit} -o cat --no-pager -n {int(log_lines)}"
        )
        return (
            f"systemctl show {unit} -p {STATE_PROPS}; {health_snippet(exp)}; "
            f"echo '{LOG_MARK}'; {journal} 2>/dev/null"
        )

    def parse_poll(self, text: str, started: Started) -> Poll:
        state_part, code, log = split_sections(text)
        st = facts.unit_state(facts.parse_show(state_part))
        same = not started.invocation or st.invocation_id == started.invocation
        restarted = not same or st.n_restarts > started.restarts
        alive = st.active_state in ("active", "activating", "reloading") and not restarted
        return Poll(
            alive=alive,
            state=f"{st.active_state}/{st.sub_state}" + (" (restarted)" if restarted else ""),
            http_code=code,
            exit_code=st.exit_code,
            exit_signal=st.exit_signal,
            unit_result=st.result,
            setup_failure=st.setup_failure,
            invocation=st.invocation_id,
            restarts=st.n_restarts,
            log_tail=log,
        )

    def server_pids_command(self, started: Started) -> str | None:
        # Every process of the unit is in its cgroup (v2 layout, then v1's named hierarchy).
        cg = f"$(systemctl show -p ControlGroup --value {shlex.quote(self.name)})"
        return (
            f'cg={cg}; [ -n "$cg" ] && {{ cat /sys/fs/cgroup$cg/cgroup.procs '
            f"2>/dev/null || cat /sys/fs/cgroup/systemd$cg/cgroup.procs 2>/dev/null; }}"
        )

    def logs(self, started: Started, *, lines: int = 400) -> str:
        inv = re.sub(r"[^0-9a-f]", "", started.invocation or "")
        if not inv:
            return ""
        r = self.t.run(
            f"journalctl _SYSTEMD_INVOCATION_ID={inv} -o cat --no-pager -n {int(lines)}",
            sudo=True,
            timeout=60,
        )
        return r.stdout

    def stopped_from_outside(self, started: Started) -> str | None:
        # PID 1 logs a stop job of the unit ("Stopping UNIT...") with the invocation's id;
        # asked by message id, not by its words (which vary with the version and locale).
        inv = re.sub(r"[^0-9a-f]", "", started.invocation or "")
        if not inv:
            return None
        r = self.t.run(
            f"journalctl _PID=1 INVOCATION_ID={inv} MESSAGE_ID={UNIT_STOPPING_ID} "
            "-o cat --no-pager -n 1",
            sudo=True,
            timeout=60,
        )
        line = r.stdout.strip().splitlines()[-1:] if r.ok else []
        return f"systemd: {line[0].strip()[:200]!r}" if line else None

    def stop(self) -> None:
        self._ctl(f"stop {shlex.quote(self.name)}", timeout=300, check=False)

    def restore(self) -> list[str]:
        done: list[str] = []
        unit = shlex.quote(self.name)
        text = self.t.read_file(self.dropin, sudo=True)
        noted = self.t.read_file(self.state_file, sudo=True)
        had = text is not None
        if self.found_active is None and noted is not None:
            self.found_active = noted.strip() == "active"
        elif self.found_active is None and text is not None:
            m = re.search(rf"{FOUND_MARK} (\w+)", text)
            self.found_active = bool(m and m[1] == "active")
        self._ctl(f"stop {unit}", timeout=300, check=False)
        if had or noted is not None:
            self.t.run(
                f"rm -f {shlex.quote(self.dropin)} {shlex.quote(self.state_file)} "
                f"{shlex.quote(self.env_file)}; "
                f"rmdir {shlex.quote(self.dropin_dir)} 2>/dev/null || true",
                sudo=True,
                timeout=30,
                check=True,
            )
        if had:
            done.append(f"removed {self.dropin}")
        self._ctl("daemon-reload", timeout=120)
        self._ctl(f"reset-failed {unit}", check=False)
        if self.found_active:
            why = self._start_again()
            done.append(
                f"started {self.name} again with its own configuration (it was running)"
                if why is None
                else f"could not start {self.name} again with its own "
                f"configuration (it was running): {why}"
            )
        else:
            done.append(f"left {self.name} stopped (as it was found)")
        return done

    def _start_again(self, *, attempts: int = 2) -> str | None:
        """Start the unit as it was found and see it running a second later; None when it
        is, else why not (what systemctl and the unit's state say). A start that fails is
        tried once more after a reset-failed: what is said must be what the host shows."""
        unit = shlex.quote(self.name)
        why = ""
        for attempt in range(attempts):
            if attempt:  # the failed state is kept when nothing is tried after it
                self._ctl(f"reset-failed {unit}", check=False)
            # a second later: a unit that dies at once has been "started" too
            r = self.t.run(f"systemctl start {unit} && sleep 1", sudo=True, timeout=300)
            props = self._show("ActiveState,SubState,Result")
            state = props.get("ActiveState", "")
            if r.ok and state in ("active", "activating", "reloading"):
                return None
            said = (r.stderr or r.stdout).strip().splitlines()[-1:] if not r.ok else []
            why = (
                f"it is {state or 'unknown'} ({props.get('SubState') or '?'}, result "
                f"{props.get('Result') or '?'})" + (f"; systemctl: {said[0][:300]}" if said else "")
            )
        return why

    def left_over(self) -> list[str] | None:
        """Our files in the unit's drop-in directory, and the unit's state against the one
        it was found in, as the host shows them now."""
        files = " ".join(shlex.quote(f) for f in (self.dropin, self.state_file, self.env_file))
        r = self.t.run(
            f'for f in {files}; do [ -e "$f" ] && echo "$f"; done; '
            f"echo @@; systemctl show {shlex.quote(self.name)} -p ActiveState --value",
            sudo=True,
            timeout=30,
        )
        if "@@" not in r.stdout:
            return None
        present, _, state = r.stdout.partition("@@")
        left = [f"{f} is still on the host" for f in present.split()]
        state = state.strip()
        if self.found_active is not None:
            want = "active" if self.found_active else "inactive"
            now = "active" if state in ("active", "activating", "reloading") else state
            if now != want:
                left.append(
                    f"{self.name} is {state or 'unknown'} (it was {want} when the "
                    "campaign found it)"
                )
        return left

    def owns_pid(self, pid: int) -> bool:
        r = self.t.run(f"cat /proc/{int(pid)}/cgroup 2>/dev/null", timeout=20)
        return f"/{self.name}" in r.stdout
