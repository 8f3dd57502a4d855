"""LocalTransport: the same contract as SSH where it applies, on this machine through `sh -c`."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest

from orchestrator.config.hosts import Host
from orchestrator.errors import CommandTimeout, ServiceError, TransportError
from orchestrator.execution.transport import LocalTransport, connect
from tests.hosts.wait import wait_gone

# Every test runs real commands, some until they time out: `slow`, so the fast tier
# (scripts/test --fast) stays within seconds.
pytestmark = pytest.mark.slow

ODD = 'it\'s "quoted" $HOME `date` ; rm -rf / && echo no\n\ttabs \\ back\nunicode: ü ñ 日本 🚀\n'


def local_host(**kw: object) -> Host:
    return Host(name="here", address="localhost", transport="local", **kw)  # type: ignore[arg-type]


@pytest.fixture
def t() -> LocalTransport:
    transport = connect(local_host())
    assert isinstance(transport, LocalTransport)
    return transport


def test_exit_code_stdout_stderr(t: LocalTransport) -> None:
    r = t.run("echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    with pytest.raises(TransportError, match="exit 7"):
        t.run("exit 7", check=True)


def test_stdin_round_trips(t: LocalTransport) -> None:
    assert t.run("cat", stdin=ODD).stdout == ODD


def test_without_stdin_a_reader_gets_eof(t: LocalTransport) -> None:
    assert t.run("cat; echo eof", timeout=20).stdout == "eof\n"


def test_command_that_ignores_stdin_still_returns(t: LocalTransport) -> None:
    assert t.run("exit 0", stdin="ignored\n" * 100000).exit_code == 0


def test_undecodable_output_does_not_raise(t: LocalTransport) -> None:
    r = t.run(r"printf 'ok \377\376 end'")
    assert r.stdout.startswith("ok ") and r.stdout.endswith(" end")


def test_write_file_atomic_mode_and_read_back(t: LocalTransport, tmp_path: Path) -> None:
    path = tmp_path / "a dir" / "unit.conf"
    t.write_file(str(path), ODD, mode=0o600)
    assert path.read_text() == ODD
    assert path.stat().st_mode & 0o777 == 0o600
    assert t.read_file(str(path)) == ODD
    assert sorted(p.name for p in path.parent.iterdir()) == ["unit.conf"]
    assert t.read_file(str(tmp_path / "missing")) is None


def test_host_env_reaches_commands() -> None:
    t = LocalTransport(local_host(env=(("ORCH_A", "a b 'c' $HOME ;x"), ("ORCH_B", "ü"))))
    assert t.run('printf "%s|%s" "$ORCH_A" "$ORCH_B"').stdout == "a b 'c' $HOME ;x|ü"


def test_timeout_kills_the_command(t: LocalTransport, tmp_path: Path) -> None:
    marker = tmp_path / f"touched-{uuid.uuid4().hex}"
    nap = f"30.{uuid.uuid4().int % 10**6:06d}"
    start = time.monotonic()
    with pytest.raises(CommandTimeout, match="timed out after 2s"):
        t.run(f"sleep {nap}; touch {marker}", timeout=2)
    assert time.monotonic() - start < 2 + 10
    assert wait_gone(f"sleep {nap}") == []
    assert wait_gone(str(marker)) == []
    assert not marker.exists()


def test_term_ignoring_command_is_killed(t: LocalTransport) -> None:
    tag = uuid.uuid4().hex
    with pytest.raises(CommandTimeout):
        t.run(f"trap '' TERM; while :; do sleep 0.2; done # {tag}", timeout=1)
    assert wait_gone(tag) == []


def test_plain_exit_137_is_not_a_timeout(t: LocalTransport) -> None:
    assert t.run("exit 137", timeout=30).exit_code == 137


@pytest.mark.skipif(shutil.which("sudo") is not None, reason="sudo is installed")
def test_sudo_missing_is_a_clear_error() -> None:
    t = LocalTransport(local_host(sudo=True))
    with pytest.raises(ServiceError, match="sudo is not installed"):
        t.run("id -u", sudo=True)


@pytest.mark.skipif(
    shutil.which("sudo") is None or os.geteuid() != 0,
    reason="needs sudo installed and root (sudo -n needs no password)",
)
def test_sudo_wraps_the_command() -> None:
    t = LocalTransport(local_host(sudo=True))
    assert t.run("id -u", sudo=True).stdout == "0\n"
