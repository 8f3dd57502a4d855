"""SSHTransport against real OpenSSH on 127.0.0.1 (the `sshd` test host): no SSH is mocked.

Commands, stdin, files, host-side timeouts, host key checking (unknown, changed,
accept-new), authentication and reachability errors, connection reuse, and surviving an
sshd restart between and during commands.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

import orchestrator.execution.transport.ssh as ssh_mod
from orchestrator.config.hosts import Host
from orchestrator.errors import (
    CommandTimeout,
    HostKeyError,
    ServiceError,
    TransportError,
)
from orchestrator.execution.transport import connect
from orchestrator.execution.transport.ssh import SSHTransport, keyscan_command
from orchestrator.lab.sshd import (
    SshdEndpoint,
    SshdServer,
    free_port,
    known_hosts_line,
    read_pid,
)
from tests.hosts.wait import wait_gone

ODD = 'it\'s "quoted" $HOME `date` ; rm -rf / && echo no\n\ttabs \\ back\nunicode: ü ñ 日本 🚀\n'


def host_of(ep: SshdEndpoint, **changes: object) -> Host:
    host = Host(
        name="lab",
        address=ep.address,
        port=ep.port,
        user=ep.user,
        identity_file=str(ep.identity_file),
        known_hosts=str(ep.known_hosts),
    )
    return replace(host, **changes)  # type: ignore[arg-type]


@pytest.fixture
def t(sshd: SshdEndpoint):
    with SSHTransport(host_of(sshd)) as transport:
        yield transport


def other_key(tmp_path: Path) -> str:
    key = tmp_path / f"k{uuid.uuid4().hex[:6]}"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60
    )
    return key.with_suffix(".pub").read_text()


# ---- commands, stdin, files ---------------------------------------------------------------


def test_exit_code_stdout_stderr(t: SSHTransport) -> None:
    r = t.run("echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert not r.ok
    assert r.command == "echo out; echo err >&2; exit 7"  # the caller's, not the wrapped one
    with pytest.raises(TransportError, match="exit 7"):
        t.run("exit 7", check=True)


def test_stdin_round_trips(t: SSHTransport) -> None:
    r = t.run("cat", stdin=ODD)
    assert r.stdout == ODD
    r = t.run("wc -c", stdin=ODD)
    assert int(r.stdout) == len(ODD.encode())


def test_large_stdin_is_fed_quickly(t: SSHTransport) -> None:
    data = "".join(f"line {i} {'x' * 60}\n" for i in range(4000))  # ~270 KB
    start = time.monotonic()
    r = t.run("sha256sum", stdin=data, timeout=60)
    assert time.monotonic() - start < 20
    expected = subprocess.run(["sha256sum"], input=data, capture_output=True, text=True)
    assert r.stdout.split()[0] == expected.stdout.split()[0]


def test_command_that_ignores_stdin_still_returns(t: SSHTransport) -> None:
    r = t.run("exit 0", stdin="ignored\n" * 10000)
    assert r.exit_code == 0


def test_without_stdin_a_reader_gets_eof(t: SSHTransport) -> None:
    start = time.monotonic()
    r = t.run("cat; echo eof", timeout=20)
    assert r.stdout == "eof\n"
    assert time.monotonic() - start < 10


def test_write_file_is_atomic_with_mode_and_reads_back(t: SSHTransport, tmp_path: Path) -> None:
    path = tmp_path / "sub dir" / "drop-in.conf"
    t.write_file(str(path), ODD, mode=0o640)
    assert path.read_text() == ODD
    assert path.stat().st_mode & 0o777 == 0o640
    assert t.read_file(str(path)) == ODD
    t.write_file(str(path), "second\n")  # replaces
    assert t.read_file(str(path)) == "second\n"
    assert path.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == ["drop-in.conf"]  # no temp left


def test_read_file_missing_is_none(t: SSHTransport, tmp_path: Path) -> None:
    assert t.read_file(str(tmp_path / "nope")) is None


def test_host_env_reaches_commands(sshd: SshdEndpoint) -> None:
    env = (("ORCH_A", "a b 'c' $HOME ;x"), ("ORCH_B", "ü"))
    with SSHTransport(host_of(sshd, env=env)) as t:
        r = t.run('printf "%s|%s" "$ORCH_A" "$ORCH_B"')
    assert r.stdout == "a b 'c' $HOME ;x|ü"


# ---- timeouts -----------------------------------------------------------------------------


def test_timeout_kills_the_command_on_the_host(t: SSHTransport, tmp_path: Path) -> None:
    marker = tmp_path / f"touched-{uuid.uuid4().hex}"
    nap = f"30.{uuid.uuid4().int % 10**6:06d}"  # a sleep argument no other process has
    start = time.monotonic()
    with pytest.raises(CommandTimeout, match="timed out after 2s") as info:
        t.run(f"sleep {nap}; touch {marker}", timeout=2)
    assert time.monotonic() - start < 2 + 10
    assert "stopped on the host" in str(info.value)
    assert wait_gone(f"sleep {nap}") == []
    assert wait_gone(str(marker)) == []  # the shell that would touch it is gone too
    assert not marker.exists()
    # and the connection is still good for the next command
    assert t.run("echo ok").stdout == "ok\n"
    assert t.connection_count == 1


def test_term_ignoring_command_is_killed(t: SSHTransport) -> None:
    tag = uuid.uuid4().hex
    with pytest.raises(CommandTimeout):
        t.run(f"trap '' TERM; while :; do sleep 0.2; done # {tag}", timeout=1)
    assert wait_gone(tag) == []


# ---- host keys ----------------------------------------------------------------------------


def test_unknown_host_key_is_refused_with_the_keyscan_line(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    with SSHTransport(host_of(sshd, known_hosts=str(kh))) as t:
        with pytest.raises(HostKeyError) as info:
            t.run("echo should-not-run")
    err = info.value
    assert f"[127.0.0.1]:{sshd.port}" in str(err)
    assert "unknown" in str(err)
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {kh}" in (err.hint or "")
    assert kh.read_text() == ""  # nothing recorded behind our back
    assert t.connection_count == 0


def test_keyscan_line_for_port_22() -> None:
    assert keyscan_command("10.0.0.5", 22, "/k h") == "ssh-keyscan 10.0.0.5 >> '/k h'"
    assert keyscan_command("10.0.0.5", 2222, "/kh") == "ssh-keyscan -p 2222 10.0.0.5 >> /kh"


def test_missing_known_hosts_file_is_refused(sshd: SshdEndpoint, tmp_path: Path) -> None:
    kh = tmp_path / "absent" / "known_hosts"
    for transport in (
        SSHTransport(host_of(sshd, known_hosts=str(kh))),
        SSHTransport(host_of(sshd, known_hosts=str(kh)), accept_new_host_key=True),
        SSHTransport(host_of(sshd, known_hosts=None)),
    ):
        with pytest.raises(HostKeyError, match="known_hosts"):
            transport.run("true")
        assert transport.connection_count == 0
    assert not kh.exists()


def test_malformed_known_hosts_is_a_host_key_error(sshd: SshdEndpoint, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(sshd.known_hosts.read_text() + "broken.example ssh-ed25519 not-base64!\n")
    with pytest.raises(HostKeyError, match="cannot read known_hosts") as info:
        SSHTransport(host_of(sshd, known_hosts=str(kh))).run("true")
    assert "malformed" in (info.value.hint or "")


def test_changed_host_key_is_refused(sshd: SshdEndpoint, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(known_hosts_line(sshd.address, sshd.port, other_key(tmp_path)))
    before = kh.read_text()
    for accept_new in (False, True):
        with SSHTransport(host_of(sshd, known_hosts=str(kh)), accept_new_host_key=accept_new) as t:
            with pytest.raises(HostKeyError) as info:
                t.run("echo should-not-run")
        assert "CHANGED" in str(info.value)
        assert "man-in-the-middle" in str(info.value)
        assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}' -f {kh}" in (info.value.hint or "")
        assert kh.read_text() == before


def test_accept_new_records_the_key_then_verifies_it(sshd: SshdEndpoint, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    other = " ".join(other_key(tmp_path).split()[:2])
    kh.write_text(f"# my hosts\nother.example {other}")  # no final newline, on purpose
    host = host_of(sshd, known_hosts=str(kh))
    with SSHTransport(host, accept_new_host_key=True) as t:
        assert t.run("echo first").stdout == "first\n"
    lines = kh.read_text().splitlines()
    assert lines[0] == "# my hosts"  # appended, the user's file is not rewritten
    assert lines[1].startswith("other.example ")
    assert lines[2] + "\n" == known_hosts_line(sshd.address, sshd.port, sshd.host_key_pub)
    # The recorded key now verifies the host under strict checking.
    with SSHTransport(host) as t:
        assert t.run("echo strict").stdout == "strict\n"
    # A second accept-new connection adds nothing.
    with SSHTransport(host, accept_new_host_key=True) as t:
        t.run("true")
    assert len(kh.read_text().splitlines()) == 3


# ---- authentication and reachability ------------------------------------------------------


def test_wrong_key_is_an_authentication_error(sshd: SshdEndpoint, tmp_path: Path) -> None:
    other_key(tmp_path)
    key = next(p for p in tmp_path.iterdir() if p.suffix == "")
    start = time.monotonic()
    with SSHTransport(host_of(sshd, identity_file=str(key))) as t:
        with pytest.raises(TransportError) as info:
            t.run("true")
    assert time.monotonic() - start < 30
    err = info.value
    assert not isinstance(err, HostKeyError)
    assert f"authentication failed for {sshd.user}@127.0.0.1:{sshd.port} with {key}" in str(err)
    assert "authorized_keys" in (err.hint or "")
    assert "Traceback" not in str(err) and "\n" not in str(err)


def test_missing_identity_file(sshd: SshdEndpoint, tmp_path: Path) -> None:
    with pytest.raises(TransportError, match="identity file .* does not exist"):
        SSHTransport(host_of(sshd, identity_file=str(tmp_path / "nokey"))).run("true")


def test_unreachable_port_fails_fast(sshd: SshdEndpoint) -> None:
    port = free_port()  # nothing listens there
    start = time.monotonic()
    with SSHTransport(host_of(sshd, port=port, connect_timeout=5)) as t:
        with pytest.raises(TransportError) as info:
            t.run("true")
    assert time.monotonic() - start < 5
    assert f"cannot reach 127.0.0.1:{port}: connection refused" in str(info.value)
    assert "port" in (info.value.hint or "")
    assert "Traceback" not in str(info.value)


@pytest.mark.slow
def test_silent_host_times_out_at_connect_timeout(tmp_path: Path) -> None:
    """A port that accepts TCP but never says the SSH banner: bounded by connect_timeout."""
    import socket

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        kh = tmp_path / "known_hosts"
        kh.write_text("")
        host = Host(
            name="mute",
            address="127.0.0.1",
            port=srv.getsockname()[1],
            known_hosts=str(kh),
            connect_timeout=2,
        )
        start = time.monotonic()
        with pytest.raises(TransportError, match="cannot reach"):
            SSHTransport(host).run("true")
        assert time.monotonic() - start < 15


# ---- connection reuse and reconnects ------------------------------------------------------


def source_port(t: SSHTransport) -> str:
    return t.run("echo $SSH_CONNECTION").stdout.split()[1]


def test_one_connection_for_many_commands(t: SSHTransport, tmp_path: Path) -> None:
    ports = {source_port(t) for _ in range(6)}
    t.write_file(str(tmp_path / "probe"), "x")
    t.read_file(str(tmp_path / "probe"))
    assert len(ports) == 1
    assert t.connection_count == 1
    assert t.commands_run == 8


def test_close_then_reopen(sshd: SshdEndpoint) -> None:
    t = SSHTransport(host_of(sshd))
    with t:
        first = source_port(t)
        assert t.connected
    assert not t.connected
    assert source_port(t) != first  # lazily reopened
    t.close()
    assert t.connection_count == 2


def test_restart_between_commands_reconnects(sshd_server: SshdServer) -> None:
    t = SSHTransport(host_of(sshd_server.endpoint))
    try:
        before = source_port(t)
        sshd_server.restart()
        assert t.run("echo again").stdout == "again\n"
        assert source_port(t) != before
        assert t.connection_count == 2
        assert t.drop_count == 1
    finally:
        t.close()
        sshd_server.start()


@pytest.mark.parametrize("rerun", [True, False])
def test_restart_during_a_command(sshd_server: SshdServer, tmp_path: Path, rerun: bool) -> None:
    runs = tmp_path / "runs"
    t = SSHTransport(host_of(sshd_server.endpoint), rerun_interrupted=rerun)
    t.run("true")
    timer = threading.Timer(1.0, sshd_server.restart)
    try:
        timer.start()
        if rerun:
            r = t.run(f"echo run >> {runs}; sleep 3; echo done", timeout=30)
            assert r.stdout == "done\n"
            assert runs.read_text() == "run\nrun\n"  # interrupted once, then run again
        else:
            with pytest.raises(TransportError, match="not re-run"):
                t.run(f"echo run >> {runs}; sleep 3; echo done", timeout=30)
            assert runs.read_text() == "run\n"
            timer.join(60)
            assert t.run("echo next").stdout == "next\n"  # reconnects for the next one
        assert t.connection_count == 2
    finally:
        timer.join(60)
        t.close()
        sshd_server.start()


def test_reconnect_budget_then_clear_error(sshd_server: SshdServer) -> None:
    waits: list[float] = []
    t = SSHTransport(host_of(sshd_server.endpoint), reconnect_attempts=3, sleep=waits.append)
    try:
        t.run("true")
        sshd_server.stop()
        start = time.monotonic()
        with pytest.raises(TransportError) as info:
            t.run("true")
        assert time.monotonic() - start < 30
        assert "lost and not re-established after 3 attempts" in str(info.value)
        assert "connection refused" in str(info.value)
        assert waits == [0.5, 1.0, 2.0]  # capped exponential backoff
    finally:
        t.close()
        sshd_server.start()
    # Once sshd is back the same transport works again.
    assert t.run("echo back").stdout == "back\n"
    t.close()


def _session_sshds(server: SshdServer) -> list[int]:
    """The per-connection sshd processes below the listener (not the commands they run)."""
    out = subprocess.run(
        ["pgrep", "-P", str(server.pid), "-x", "sshd"], capture_output=True, text=True, timeout=30
    ).stdout
    found = [int(p) for p in out.split()]
    for pid in list(found):  # privilege-separated children of each session
        more = subprocess.run(
            ["pgrep", "-P", str(pid), "-x", "sshd"], capture_output=True, text=True, timeout=30
        ).stdout
        found += [int(p) for p in more.split()]
    return found


def _sshd_above(pid: int) -> int:
    """The nearest sshd above a process of a session (the command may run under `timeout`
    or another shell): the one that forwards its output."""
    for _ in range(10):
        stat = Path(f"/proc/{pid}/stat").read_text()
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        if name == "sshd":
            return pid
        pid = int(rest.split()[1])
    raise AssertionError(f"no sshd above process {pid}")


def _freeze(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)


def _thaw(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def test_connection_stuck_mid_command_times_out_locally(
    sshd_server: SshdServer, mocker: MockerFixture, tmp_path: Path
) -> None:
    """The host stops answering while a command runs (its sshd frozen with SIGSTOP): our
    own timeout ends the wait, and the next command gets a fresh connection.

    No race with the machine's load: the command cannot end before sshd is frozen (it
    waits for a file that is created only after the freeze), and its host-side `timeout`
    (60 s) cannot end it first either; only our local wait can end the call. That wait's
    3 s count from the freeze: counted from the call, a busy machine that took longer to
    start the command ended the wait first, and nothing was left to freeze."""
    # The clock edge only: our local wait is the host-side timeout plus LOCAL_GRACE; here
    # 3 s in all, well before the host-side 60 s.
    mocker.patch("orchestrator.execution.transport.base.LOCAL_GRACE", -57.0)
    started, go, done = tmp_path / "started", tmp_path / "go", tmp_path / "done"
    t = SSHTransport(host_of(sshd_server.endpoint))
    frozen: list[int] = []
    errors: list[BaseException] = []

    def freeze_once_running() -> None:
        try:
            deadline = time.monotonic() + 120
            while not read_pid(started) and time.monotonic() < deadline:
                time.sleep(0.02)
            # the session process that carries this command's answer: its shell's parent,
            # as the shell wrote it (found by name alone, a busy machine once let the answer
            # through); then every session process, looked for again after each freeze
            # until none is new (one forked while the first look ran would still carry it)
            shell = read_pid(started)
            assert shell is not None, "the command never started"
            carrier = _sshd_above(shell)
            _freeze([carrier])
            frozen.append(carrier)
            for _ in range(5):
                new = [p for p in _session_sshds(sshd_server) if p not in frozen]
                if not new:
                    break
                _freeze(new)
                frozen.extend(new)
            go.touch()  # the command ends on the host now; its answer cannot leave it
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    def freeze_once_running_then_count() -> None:
        try:
            freeze_once_running()
        finally:
            host_frozen.set()

    host_frozen = threading.Event()

    class _FromTheFreeze(threading.Timer):
        """The local wait's timer (invoke's), counting only once the host is frozen."""

        def run(self) -> None:
            host_frozen.wait(60)
            super().run()

    def start_timer(runner: object, timeout: float) -> None:
        if timeout:
            runner._timer = _FromTheFreeze(timeout, runner.kill)  # type: ignore[attr-defined]
            runner._timer.start()  # type: ignore[attr-defined]

    freezer = threading.Thread(target=freeze_once_running_then_count)
    try:
        t.run("true")
        assert _session_sshds(sshd_server)
        mocker.patch.object(ssh_mod._Remote, "start_timer", start_timer)
        freezer.start()
        start = time.monotonic()
        with pytest.raises(CommandTimeout, match="no answer from the host within 3s"):
            t.run(
                f"echo $PPID > {started}.new; mv {started}.new {started}; i=0; "
                f"while [ ! -e {go} ] && [ $i -lt 600 ]; do "
                f"sleep 0.05; i=$((i+1)); done; touch {done}; echo stuck",
                timeout=60,
            )
        assert time.monotonic() - start < 20
        assert not t.connected
        freezer.join(30)
        assert not errors and frozen, errors
        wait_done = time.monotonic() + 30
        while not done.exists() and time.monotonic() < wait_done:
            time.sleep(0.05)
        assert done.exists()  # it did end on the host: only its answer never came
    finally:
        freezer.join(30)
        _thaw(frozen)
    try:
        assert t.run("echo fresh").stdout == "fresh\n"
        assert t.connection_count == 2
    finally:
        t.close()


def test_connection_stuck_before_sending_is_replaced(sshd_server: SshdServer) -> None:
    """A connection that cannot even open a channel (connect_timeout bounds the wait) is
    replaced, and the command runs on the new one: nothing had reached the host."""
    t = SSHTransport(host_of(sshd_server.endpoint, connect_timeout=3))
    frozen: list[int] = []
    try:
        t.run("true")
        frozen = _session_sshds(sshd_server)
        _freeze(frozen)
        start = time.monotonic()
        assert t.run("echo replaced", timeout=30).stdout == "replaced\n"
        assert time.monotonic() - start < 20
        assert t.connection_count == 2
    finally:
        _thaw(frozen)
        t.close()


# ---- sudo, describing ---------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("sudo") is None, reason="sudo is not installed")
def test_sudo_runs_as_root(sshd: SshdEndpoint) -> None:
    with SSHTransport(host_of(sshd, sudo=True)) as t:
        assert t.run("id -u", sudo=True).stdout == "0\n"


@pytest.mark.skipif(shutil.which("sudo") is not None, reason="sudo is installed")
def test_sudo_missing_is_a_clear_error(sshd: SshdEndpoint) -> None:
    with SSHTransport(host_of(sshd, sudo=True)) as t:
        with pytest.raises(ServiceError, match="sudo is not installed") as info:
            t.run("id -u", sudo=True)
        assert "sudo: false" in (info.value.hint or "")
        assert t.run("id -u").stdout.strip().isdigit()  # no sudo asked: runs as is


def test_sudo_not_used_when_the_host_says_no(t: SSHTransport) -> None:
    assert t.run("echo plain", sudo=True).stdout == "plain\n"


def test_repr_and_describe_leak_nothing(sshd: SshdEndpoint) -> None:
    t = connect(host_of(sshd, env=(("TOKEN", "s3cr3t-value"),)))
    assert isinstance(t, SSHTransport)
    text = repr(t) + t.describe()
    assert "s3cr3t" not in text
    assert sshd.identity_file.read_text().split("\n")[1] not in text
    assert f"127.0.0.1:{sshd.port}" in t.describe()
