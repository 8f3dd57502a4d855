"""What goes wrong on real hosts, and what the user is told: never a traceback.

Preflight refuses flags the server does not know before anything is stopped; an unknown
host key, a missing unit and a refused sudo are clear errors of our own types with a
hint; a config polling the wrong port ends `timeout` with what the server listens on;
an sshd restart in the middle of polling is survived without changing the verdict.
Hosts: the real sshd fixture (process manager) and one systemd container for the module.
"""

from __future__ import annotations

import glob
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host, load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.errors import HostKeyError, OrchestratorError, ServiceError
from orchestrator.events import Event, Polled
from orchestrator.execution.executor import Executor
from orchestrator.execution.transport.ssh import SSHTransport
from orchestrator.lab.sdhosts import SystemdHostFactory
from orchestrator.lab.sshd import SshdEndpoint, SshdServer, free_port
from tests.hosts.faults import BoxView
from tests.support.campaign_lab import LAB_UNIT

REPO = Path(__file__).resolve().parents[1]
LAB = REPO / "experiments" / "lab"
SCALE = {"ORCH_LAB_TIME_SCALE": "0.1"}
V0523 = "lab-b300-v0523.service"
B300 = "lab-b300.service"
AMBIGUOUS = (
    "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
    "--cuda-graph-max-bs-prefill"
)


def exp(rel: str) -> Experiment:
    return load_experiment(LAB / rel)


def proc_host(sshd: SshdEndpoint, tmp_path: Path, **extra: object) -> Host:
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(sshd.hosts_yaml("lab", run_dir=str(tmp_path / "run"), **extra))
    return load_inventory(hosts).host("lab")


def one_line(err: OrchestratorError) -> str:
    """What the CLI prints: one line, no traceback, no library type names."""
    text = str(err)
    assert "\n" not in text and "Traceback" not in text
    return text


# ---------------------------------------------------------------------------- systemd box


@dataclass
class Box(BoxView):
    dir: Path

    def host_as(self, name: str, **extra: object) -> Host:
        path = self.dir / f"{name}.yaml"
        path.write_text(self.box.hosts_yaml(name, env={"PYTHONPATH": "/opt/orchestrator"}, **extra))
        return load_inventory(path).host(name)


@pytest.fixture(scope="module")
def box(
    systemd_hosts: SystemdHostFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Box]:
    sd = systemd_hosts.boot()
    try:
        for unit in (V0523, B300):
            sd.write_file(f"/etc/systemd/system/{unit}", LAB_UNIT)
        sd.ssh_run("systemctl daemon-reload", check=True)
        b = Box(sd, None, tmp_path_factory.mktemp("errors-hosts"))  # type: ignore[arg-type]
        b.host = b.host_as("sd")
        yield b
    finally:
        systemd_hosts.stop(sd)


@pytest.fixture
def clean_box(box: Box) -> Iterator[Box]:
    yield box
    box.sh(
        f"systemctl stop {V0523} {B300}; rm -rf /etc/systemd/system/*.service.d "
        "/tmp/orchestrator; systemctl daemon-reload; systemctl reset-failed",
        check=False,
    )


# ---------------------------------------------------------------------------- preflight


def test_unknown_flag_is_invalid_before_the_process_server_starts(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    host = proc_host(sshd, tmp_path)
    seed = exp("b300-v0523/seed_good.yaml").with_changes(flags={"port": free_port()}, env=SCALE)
    typo = exp("b300/good.yaml").with_changes(flags={"port": free_port(), "tp-szie": 8}, env=SCALE)
    with Executor(host, service="v0523", campaign="c-flags") as ex:
        r_seed = ex.run(seed, run_id="seed")
        r_typo = ex.run(typo, run_id="typo")
    assert r_seed.verdict is Verdict.INVALID
    assert AMBIGUOUS in r_seed.detail  # argparse's own wording, with the candidates
    assert r_typo.verdict is Verdict.INVALID
    assert "unrecognized arguments: --tp-szie" in r_typo.detail
    assert "did you mean --tp-size" in r_typo.detail
    # Never started: no launch, no log file, no pid file.
    assert glob.glob(str(tmp_path / "run" / "*" / "run-*.log")) == []
    assert r_seed.invocation is None and r_seed.polls == 0 and r_seed.rendered is None


def test_unknown_flag_is_invalid_before_the_unit_is_touched(clean_box: Box) -> None:
    b = clean_box
    b.sh(f"systemctl start {V0523}")  # the unit runs: preflight must not stop it
    before = b.sh(f"systemctl show {V0523} -p InvocationID -p ActiveState -p MainPID")
    with Executor(b.host, service=V0523, campaign="c-flags") as ex:
        r = ex.run(exp("b300-v0523/seed_good.yaml"), run_id="seed")
        during = b.sh(f"systemctl show {V0523} -p InvocationID -p ActiveState -p MainPID")
    assert r.verdict is Verdict.INVALID
    assert AMBIGUOUS in r.detail
    assert during == before  # same invocation, same pid: never stopped nor restarted
    assert (
        b.box.ssh_run(f"test -e /etc/systemd/system/{V0523}.d/99-orchestrator.conf").returncode != 0
    )  # no drop-in was written


# ---------------------------------------------------------------------------- connection


def test_unknown_host_key_is_refused_with_the_keyscan_line(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    host = proc_host(sshd, tmp_path, known_hosts=str(empty))
    with pytest.raises(HostKeyError) as err:
        with Executor(host, service="x", campaign="c-key"):
            pass
    text = one_line(err.value)
    assert "unknown" in text and "refused" in text
    assert err.value.hint is not None
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {empty}" in err.value.hint
    assert empty.read_text() == ""  # never added behind the user's back


def test_connection_dropped_mid_poll_keeps_the_verdict(
    sshd_server: SshdServer, sshd: SshdEndpoint, tmp_path: Path
) -> None:
    host = proc_host(sshd, tmp_path)
    # Slower startup (time scale 1): several polls happen while the server loads.
    good = exp("b300/good.yaml").with_changes(
        flags={"port": free_port()}, env={"ORCH_LAB_TIME_SCALE": "1"}
    )
    restarted = threading.Event()
    errors: list[BaseException] = []

    def restart() -> None:
        try:
            sshd_server.restart()
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            restarted.set()

    thread: threading.Thread | None = None

    def listener(event: Event) -> None:
        nonlocal thread
        if isinstance(event, Polled) and thread is None:
            thread = threading.Thread(target=restart)  # while the next poll runs
            thread.start()

    with Executor(host, service="drop", campaign="c-drop", listener=listener) as ex:
        r = ex.run(good, run_id="drop")
        assert isinstance(ex.t, SSHTransport)
        assert restarted.wait(timeout=60) and not errors, errors
        drops = ex.t.drop_count
    if thread is not None:
        thread.join(timeout=60)
    assert r.verdict is Verdict.PASS, (r.detail, r.log_tail[-2000:])
    assert drops >= 1  # the drop really happened and was survived by reconnecting


# ---------------------------------------------------------------------------- wrong port


def test_wrong_port_times_out_naming_the_port_the_server_listens_on(
    sshd: SshdEndpoint, tmp_path: Path
) -> None:
    host = proc_host(sshd, tmp_path)
    listen, poll = free_port(), free_port()
    e = exp("b300/good.yaml").with_changes(flags={"port": listen}, env=SCALE)
    e = replace(e, health=replace(e.health, port=poll, timeout=4.0))
    with Executor(host, service="port", campaign="c-port") as ex:
        r = ex.run(e, run_id="port")
    assert r.verdict is Verdict.FAIL  # the bad endpoint: a hang is the failure itself
    assert r.signature is not None and r.signature.error_class == "hang"
    assert "not ready after 4s" in r.detail
    assert f"the server listens on {listen} but the health check polls port {poll}" in r.detail


def test_wrong_port_on_systemd_names_the_port_too(clean_box: Box) -> None:
    # The config has no --port (the server's default, 30000) but health.port says 30001.
    e = exp("b300/good.yaml").with_changes(flags={"port": None})
    e = replace(e, health=replace(e.health, port=30001, timeout=4.0))
    with Executor(clean_box.host, service=B300, campaign="c-port") as ex:
        target = ex.run(exp("b300/bad.yaml"), run_id="bad").signature
        r = ex.run(e, run_id="port", target=target)
    assert r.verdict is Verdict.TIMEOUT
    assert "the server listens on 30000 but the health check polls port 30001" in r.detail
    # A server alive but never ready on a real unit: ended at the deadline on the real
    # clock (not before it), its last phase from its journal, and the unit stopped after.
    assert r.detail.startswith("not ready after 4s; last phase: serving")
    assert r.last_phase is Phase.SERVING and r.ready_s is None
    assert 4.0 <= r.duration_s < 4.0 + 60
    assert clean_box.sh(f"systemctl show {B300} -p ActiveState").strip() == "ActiveState=inactive"


# ---------------------------------------------------------------------------- host setup


def test_missing_unit_is_a_clear_service_error(clean_box: Box) -> None:
    with pytest.raises(ServiceError) as err:
        with Executor(clean_box.host, service="no-such-server.service", campaign="c-missing"):
            pass
    text = one_line(err.value)
    assert "no-such-server.service is not installed" in text
    assert err.value.hint and "install no-such-server.service on the host" in err.value.hint
    # The lock was given back: nothing of ours is left on the host.
    assert clean_box.sh("ls /tmp/orchestrator/locks 2>/dev/null; true").strip() == ""


def _sudo_deb() -> Path | None:
    found = sorted(glob.glob("/var/cache/apt/archives/sudo_*.deb"))
    return Path(found[-1]) if found else None


def test_sudo_refused_is_a_clear_service_error(clean_box: Box) -> None:
    deb = _sudo_deb()
    if deb is None:
        pytest.skip(
            "sudo is not in the test image and no sudo .deb is cached here "
            "(`cd /var/cache/apt/archives && apt-get download sudo` enables this)"
        )
    b = clean_box
    with deb.open("rb") as f:
        subprocess.run(
            b.box.ssh_command("cat > /tmp/sudo.deb"),
            stdin=f,
            check=True,
            capture_output=True,
            timeout=120,
        )
    b.sh(
        "dpkg -i /tmp/sudo.deb >/dev/null && "
        "(id tester >/dev/null 2>&1 || useradd -m -s /bin/sh tester) && usermod -p '*' tester"
    )
    host = b.host_as("sd-tester", user="tester", sudo=True)
    with pytest.raises(ServiceError) as err:
        with Executor(host, service=B300, campaign="c-sudo"):
            pass
    text = one_line(err.value)
    assert "sudo refused" in text
    assert err.value.hint and "passwordless sudo" in err.value.hint
