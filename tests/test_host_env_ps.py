"""The host's `env:` (hosts file) never reaches a command line on the host.

A token in a host's `env:` used to be exported on every remote command line
(`sh -c 'export HF_TOKEN=...; ...'`), where any local user of the host reads it with
`ps`. Here a sampler runs `ps` on the host, as another user where the host has one
(uid 65534 in the systemd container; this machine's own user on the sshd host, whose
`ps` shows every process), all through a run, and looks for the value. It also counts
the orchestrator's own commands it saw (`timeout -k 5 ...`), so a sampler that saw
nothing cannot pass; and the value must still reach what the host's env is for (the
server started by the process manager, the commands of the systemd manager).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from orchestrator.config.hosts import Host
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution.executor import Executor
from orchestrator.execution.transport.ssh import SSHTransport
from orchestrator.lab.sshd import SshdEndpoint, free_port
from tests.hosts.faults import B300, SdLab
from tests.support.campaign_lab import LAB
from tests.test_executor_process import lab_exp, make_host

SECRET = "hf_HostEnvValueNobodyMaySee0123456789"
#: what the orchestrator's wrapped commands look like in `ps`
OURS = "timeout -k 5"
#: the sampler: `ps` every 20 ms, matches only (its own argv holds no pattern), bounded
SAMPLER = """
i=0
while [ $i -lt 4000 ] && [ ! -e {stop} ]; do
  ps -eww -o args= | grep -F -f {patterns}
  i=$((i+1)); sleep 0.02
done
"""


class Sampler:
    """`ps` sampled on the host by `argv` (a shell reading its script on stdin)."""

    def __init__(self, argv: list[str], stop: str, patterns: str) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(SAMPLER.format(stop=stop, patterns=patterns))
        self.proc.stdin.close()
        self.proc.stdin = None  # communicate() must not touch the closed pipe

    def lines(self, stop: Callable[[], object]) -> list[str]:
        stop()
        try:
            out, _ = self.proc.communicate(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return out.splitlines()


def _judge(lines: list[str]) -> None:
    leaks = [line for line in lines if SECRET in line]
    assert not leaks, f"the host env's value is on a command line: {leaks[:3]}"
    # the sampler saw the orchestrator's commands while they ran: it was looking
    assert sum(OURS in line for line in lines) >= 5, lines[:20]


def test_process_host_env_not_in_ps(sshd: SshdEndpoint, tmp_path: Path) -> None:
    host, _ = make_host(sshd, tmp_path)
    host = replace(host, env=(*host.env, ("HF_TOKEN", SECRET)))
    patterns = tmp_path / "patterns"
    patterns.write_text(f"{SECRET}\n{OURS}\n")
    stop = tmp_path / "stop"
    sampler = Sampler(["sh", "-s"], str(stop), str(patterns))
    exp = lab_exp("b300/good.yaml", free_port())
    try:
        with Executor(host, service="lab-b300", campaign="c-envps") as ex:
            assert isinstance(ex.t, SSHTransport)
            result = ex.run(exp, run_id="envps-1")
            seen = ex.t.run('printf %s "$HF_TOKEN"', timeout=20).stdout
    finally:
        lines = sampler.lines(stop.touch)
    assert result.verdict is Verdict.PASS, (result.detail, result.log_tail[-1500:])
    assert seen == SECRET  # the host's env still applies to every command
    _judge(lines)


def test_systemd_host_env_not_in_ps(sd: SdLab) -> None:
    host: Host = replace(sd.host, env=(*sd.host.env, ("HF_TOKEN", SECRET)))
    sd.box.write_file("/tmp/ps-patterns", f"{SECRET}\n{OURS}\n", mode="0644")
    sd.sh("rm -f /tmp/ps-stop")
    argv = sd.box.ssh_command("setpriv --reuid=65534 --regid=65534 --clear-groups sh -s")
    sampler = Sampler(argv, "/tmp/ps-stop", "/tmp/ps-patterns")
    exp = load_experiment(LAB / "b300" / "good.yaml")
    try:
        with Executor(host, service=B300, campaign="c-envps-sd") as ex:
            result = ex.run(exp, run_id="envps-sd-1")
            seen = ex.t.run('printf %s "$HF_TOKEN"', sudo=True, timeout=20).stdout
    finally:
        lines = sampler.lines(lambda: sd.sh("touch /tmp/ps-stop"))
        sd.sh("rm -f /tmp/ps-stop /tmp/ps-patterns")
    assert result.verdict is Verdict.PASS, (result.detail, result.log_tail[-1500:])
    assert seen == SECRET  # under sudo too
    _judge(lines)


def test_the_host_env_travels_on_stdin_not_the_command_line() -> None:
    """Any value (quotes, `$`, backslashes, lines) arrives whole, the command's own stdin
    after it is untouched (`cat`, `. /dev/stdin`), and the command line holds no value."""
    from orchestrator.execution.transport.base import CommandResult
    from orchestrator.execution.transport.local import LocalTransport

    odd = "a 'b' \"c\" $HOME `id` \\n \\\\ ; |\nsecond line\n"
    host = Host(
        name="x", address="localhost", transport="local", env=(("HF_TOKEN", SECRET), ("ODD", odd))
    )
    seen: list[str] = []

    class Recording(LocalTransport):
        def _exec(self, command: str, *, timeout: float, stdin: str | None) -> CommandResult:
            seen.append(command)
            return super()._exec(command, timeout=timeout, stdin=stdin)

    t = Recording(host)
    r = t.run('printf "%s|%s|" "$HF_TOKEN" "$ODD"; cat', stdin="own\ninput\n")
    assert r.ok and r.stdout == f"{SECRET}|{odd}|own\ninput\n", r
    r = t.run('. /dev/stdin && printf "%s %s" "$X" "$HF_TOKEN"', stdin="export X=1\n")
    assert r.stdout == f"1 {SECRET}"
    assert t.run("cat", timeout=10).stdout == ""  # no input of its own: EOF at once
    assert seen and not any(SECRET in c or "second line" in c for c in seen)
