"""The process service manager: servers started from a shell, without systemd.

Each service gets a directory under the host's run_dir holding the pid file, the exit
status and one log file per run. The server runs detached in its own session (setsid),
so it outlives the SSH command that started it and can be stopped as a whole: SIGTERM
first, SIGKILL after a grace period, to every process of that session. The session, not
only the process group: a server's child may make a group of its own (vLLM's
data-parallel API servers call setpgrp) and would outlive a group kill, holding the port
and gigabytes of memory into the next run.
"""

from __future__ import annotations

import re
import shlex
import time

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.errors import ServiceError
from orchestrator.execution.services.base import (
    LOG_MARK,
    STATE_MARK,
    Poll,
    ServiceManager,
    Started,
    health_snippet,
    split_sections,
)
from orchestrator.execution.transport.base import Transport

STOP_GRACE_S = 20
#: after SIGKILL, how long the stop waits for the kernel to tear the processes down
KILL_WAIT_S = 10


def session_members(sid: int) -> str:
    """Shell that prints the live (not zombie) processes of the server's session, one pid
    a line; without ps, the session leader's process group (`kill -0` counts zombies).
    Each line is an argument `kill` takes (a pid, or `-PGID`)."""
    return (
        f"if command -v ps >/dev/null 2>&1; then ps -eo pid=,sid=,stat= | "
        f"awk '$2 == {sid} && $3 !~ /^Z/ {{print $1}}'; "
        f"else kill -s 0 -- -{sid} 2>/dev/null && echo -{sid}; fi"
    )


class ProcessManager(ServiceManager):
    kind = "process"

    def __init__(self, host: Host, transport: Transport, *, name: str, campaign: str = "") -> None:
        super().__init__(host, transport, name=name, campaign=campaign)
        safe = re.sub(r"[^A-Za-z0-9_.@-]", "_", name)
        if set(safe) <= {"."}:  # "." or ".." would be run_dir itself or its parent
            safe = "_" * max(len(safe), 1)
        base = host.run_dir or "/tmp/orchestrator"
        self.dir = f"{base.rstrip('/')}/{safe}"
        self._script: str | None = None

    def _q(self, leaf: str) -> str:
        return shlex.quote(f"{self.dir}/{leaf}")

    def prepare(self) -> None:
        # Private: the server's log holds its argv (SGLang prints `server_args=...` with
        # the API key); a directory made by an older version is made private too.
        d = shlex.quote(self.dir)
        r = self.t.run(
            f"umask 077 && mkdir -p {d} && [ ! -L {d} ] && test -O {d} && "
            f"chmod -R go-rwx {d} && test -w {d}",
            timeout=20,
        )
        if not r.ok:
            raise ServiceError(
                f"{self.host.describe()}: cannot use run directory {self.dir}: {r.stderr.strip()}",
                hint="set run_dir in the hosts file to a directory on the host that the "
                "user owns and can write (it is kept private: mode 0700)",
            )
        # A server left by a controller that died (SIGKILL, lost laptop): stop it now, so
        # the campaign starts from the state a restore would have left.
        if self._pid() is not None:
            self.stop()

    def install(self, exp: Experiment, *, env_keys: frozenset[str], run_id: str) -> str | None:
        env = exp.env_map()
        unset = exp.unsetting(env_keys).unset
        lines = [
            "#!/bin/sh",
            f"# written by orchestrator for run {run_id}; argv and env of the variant",
        ]
        for k in unset:
            lines.append(f"unset {k}")
        for k, v in env.items():
            lines.append(f"export {k}={shlex.quote(v)}")
        if exp.workdir:
            lines.append(f"cd {shlex.quote(exp.workdir)} || exit 200")
        lines.append("exec " + shlex.join(exp.argv()))
        self._script = "\n".join(lines) + "\n"
        self.t.write_file(f"{self.dir}/launch.sh", self._script, mode=0o600)  # run by `sh`
        back = self.t.read_file(f"{self.dir}/launch.sh")
        if back != self._script:
            return "the launch script read back from the host differs from the one written"
        return None

    def rendered(self) -> str | None:
        return self._script

    def start(self, exp: Experiment, *, run_id: str) -> Started:
        log = f"{self.dir}/run-{run_id}.log"
        d = shlex.quote(self.dir)
        # The wrapper shell records the server's exit status; `exec` would lose it.
        inner = f"echo $$ > {d}/pid; sh {d}/launch.sh; echo $? > {d}/exit"
        # umask 077: the log, pid and exit files are the user's only (0600).
        cmd = (
            f"umask 077; rm -f {d}/pid {d}/exit; "
            f"setsid -f sh -c {shlex.quote(inner)} > {shlex.quote(log)} 2>&1 < /dev/null; "
            f"for i in $(seq 50); do [ -s {d}/pid ] && break; sleep 0.1; done; cat {d}/pid"
        )
        r = self.t.run(cmd, timeout=30)
        pid = int(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else None
        if not r.ok or pid is None:
            raise ServiceError(
                f"{self.host.describe()}: could not start the server detached: {r.stderr.strip()}",
                hint="the process manager needs sh, setsid (util-linux) and a writable run_dir",
            )
        return Started(pid=pid, log_ref=log)

    def poll_command(self, exp: Experiment, started: Started, *, log_lines: int = 150) -> str:
        pid = int(started.pid or 0)
        return (
            f"if [ -d /proc/{pid} ] && ! grep -q '^State:.*Z' /proc/{pid}/status 2>/dev/null; "
            f"then echo '{STATE_MARK} alive'; "
            f'else echo "{STATE_MARK} dead $(cat {self._q("exit")} 2>/dev/null)"; fi; '
            f"{health_snippet(exp)}; echo '{LOG_MARK}'; "
            f"tail -n {int(log_lines)} {shlex.quote(started.log_ref or '/dev/null')} 2>/dev/null"
        )

    def parse_poll(self, text: str, started: Started) -> Poll:
        state_part, code, log = split_sections(text)
        m = re.search(rf"{STATE_MARK} (alive|dead)\s*(-?\d+)?", state_part)
        alive = bool(m and m[1] == "alive")
        exit_code = int(m[2]) if m and m[2] else None
        state = "running" if alive else ("exited" if exit_code is not None else "gone")
        return Poll(alive=alive, state=state, http_code=code, exit_code=exit_code, log_tail=log)

    def server_pids_command(self, started: Started) -> str | None:
        # The wrapper leads its own session: every process of the server is in it.
        sid = int(started.pid or 0)
        return f"ps -eo pid=,sid= | awk '$2 == {sid} {{print $1}}'" if sid else None

    def logs(self, started: Started, *, lines: int = 400) -> str:
        if not started.log_ref:
            return ""
        # Once this run's log is copied, only the newest `keep_runs` run logs stay on the
        # host (the results store keeps every one).
        keep = max(int(self.host.keep_runs), 1)
        prune = (
            f"ls -1t {shlex.quote(self.dir)}/run-*.log 2>/dev/null | tail -n +{keep + 1}"
            ' | while IFS= read -r f; do rm -f -- "$f"; done'
        )
        r = self.t.run(
            f"tail -n {int(lines)} {shlex.quote(started.log_ref)}; s=$?; {prune}; exit $s",
            timeout=30,
        )
        return r.stdout

    def _pid(self) -> int | None:
        text = self.t.read_file(f"{self.dir}/pid")
        return int(text.strip()) if text and text.strip().isdigit() else None

    def stop(self) -> None:
        pid = self._pid()
        if pid is None:
            return
        # The wrapper is a session leader: its pid is the session (and process group) of
        # the server. "Alive" means a member that is not a zombie: the wrapper dies with
        # the server and waits as a zombie until init reaps it, which some inits (container
        # and VM init shims) do only every second or so. One SIGTERM each (a second one
        # makes some servers skip their own shutdown); `kill -s SIG -- -PGID`: the one
        # spelling both dash and bash accept for a group. After SIGKILL the stop waits,
        # bounded, until the kernel has torn every member down (memory, the port).
        cmd = (
            f"m() {{ {session_members(pid)}; }}; "
            f'p=$(m); [ -n "$p" ] || exit 0; kill -s TERM -- $p 2>/dev/null; '
            f'for i in $(seq {STOP_GRACE_S * 10}); do [ -n "$(m)" ] || exit 0; '
            f"sleep 0.1; done; kill -s KILL -- -{pid} $(m) 2>/dev/null; "
            f'for i in $(seq {KILL_WAIT_S * 10}); do [ -n "$(m)" ] || exit 0; '
            f"sleep 0.1; done; exit 0"
        )
        self.t.run(cmd, timeout=STOP_GRACE_S + KILL_WAIT_S + 15)
        self.t.run(f"rm -f {self._q('pid')}", timeout=20)

    def restore(self) -> list[str]:
        done: list[str] = []
        if self._pid() is not None:
            self.stop()
            done.append(f"stopped the server started by orchestrator in {self.dir}")
        self.t.run(f"rm -f {self._q('launch.sh')} {self._q('exit')}", timeout=20)
        return done

    def left_over(self) -> list[str] | None:
        """A server of ours still running (a live process of its session), as the host
        shows it."""
        pid = self._pid()
        if pid is None:
            return []
        r = self.t.run(
            f"ps -eo sid=,stat= | awk '$1 == {pid} && $2 !~ /^Z/ {{f = 1}} END {{exit !f}}'",
            timeout=20,
        )
        return (
            [f"the server started in {self.dir} (session {pid}) still runs"]
            if r.exit_code == 0
            else []
        )

    def owns_pid(self, pid: int) -> bool:
        mine = self._pid()
        if mine is None:
            return False
        r = self.t.run(f"ps -o sid= -p {int(pid)} 2>/dev/null", timeout=20)
        return r.stdout.strip() == str(mine)

    def wait_port_free(self, port: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.listeners_on(port):
            time.sleep(0.5)
