"""`orchestrator lab up|down|status` as a user runs it: a real CLI process and a real sshd.

Every test uses its own port (ORCH_LAB_PORT) and state directory (ORCH_LAB_DIR), so a
lab the user runs on 2222 from this checkout is never touched.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config.hosts import load_inventory
from orchestrator.config.loading import load_experiment
from orchestrator.lab import hostctl
from orchestrator.lab.sshd import free_port, is_our_sshd, kill_tree, read_pid
from tests.hosts.prereq import require_sshd

REPO = Path(__file__).resolve().parents[1]


class Lab:
    def __init__(self, state_dir: Path, port: int) -> None:
        self.state_dir = state_dir
        self.port = port
        self.env = {**os.environ, "ORCH_LAB_DIR": str(state_dir), "ORCH_LAB_PORT": str(port)}
        self.settings = hostctl.LabSettings(state_dir=state_dir, port=port)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", "lab", *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def ssh(self, command: str) -> subprocess.CompletedProcess[str]:
        ssh_dir = self.state_dir / "ssh"
        return subprocess.run(
            [
                "ssh",
                "-F",
                "/dev/null",
                "-p",
                str(self.port),
                "-i",
                str(ssh_dir / "id_ed25519"),
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                f"UserKnownHostsFile={ssh_dir / 'known_hosts'}",
                "-o",
                "GlobalKnownHostsFile=/dev/null",
                "127.0.0.1",
                command,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    require_sshd()
    lab = Lab(tmp_path / "lab", free_port())
    try:
        yield lab
    finally:
        # Whatever the test did, no sshd of ours survives it.
        lab.cli("down")
        pid = read_pid(lab.settings.pid_file)
        if pid and is_our_sshd(pid, lab.settings.config_path):
            kill_tree(pid, tree=False)


@pytest.mark.slow
def test_up_down_twice_in_a_row(lab: Lab) -> None:
    for _ in range(2):
        up = lab.cli("up")
        assert up.returncode == 0, up.stderr
        assert "lab: up: sshd pid" in up.stdout and f"127.0.0.1:{lab.port}" in up.stdout
        pid = read_pid(lab.settings.pid_file)
        assert pid is not None and is_our_sshd(pid, lab.settings.config_path)

        again = lab.cli("up")
        assert again.returncode == 0, again.stderr
        assert f"lab: already up: sshd pid {pid}" in again.stdout

        status = lab.cli("status")
        assert status.returncode == 0 and f"lab: up: sshd pid {pid}" in status.stdout

        # Real SSH with host key checking, and the project's Python on the session's PATH.
        res = lab.ssh("command -v python3; python3 -c 'import orchestrator.lab.server'")
        assert res.returncode == 0, res.stderr
        if sys.prefix != sys.base_prefix:
            assert res.stdout.splitlines()[0] == str(Path(sys.executable).parent / "python3")

        down = lab.cli("down")
        assert down.returncode == 0, down.stderr
        assert f"lab: down: stopped sshd pid {pid}" in down.stdout
        assert not is_our_sshd(pid, lab.settings.config_path)
        assert not lab.settings.pid_file.exists()

        down_again = lab.cli("down")
        assert down_again.returncode == 0, down_again.stderr
        assert "already down" in down_again.stdout
        assert "lab: down" in lab.cli("status").stdout


@pytest.mark.slow
def test_down_leaves_other_processes_alone(lab: Lab) -> None:
    # A pid file pointing at something that is not our sshd (a stale file whose pid was
    # reused): `down` must not signal it.
    other = subprocess.Popen(["sleep", "300"])
    try:
        lab.settings.pid_file.parent.mkdir(parents=True)
        lab.settings.pid_file.write_text(f"{other.pid}\n")
        down = lab.cli("down")
        assert down.returncode == 0, down.stderr
        assert "stale pid file" in down.stdout
        assert other.poll() is None
        assert not lab.settings.pid_file.exists()
    finally:
        other.kill()
        other.wait(timeout=10)


@pytest.mark.slow
def test_up_refuses_a_port_taken_by_someone_else(lab: Lab) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", lab.port))
        s.listen()
        up = lab.cli("up")
    assert up.returncode == 3
    assert f"127.0.0.1:{lab.port} is already in use" in up.stderr
    assert "ORCH_LAB_PORT" in up.stderr
    assert "Traceback" not in up.stderr


@pytest.mark.slow
def test_default_layout_matches_the_hosts_example(lab: Lab) -> None:
    example = REPO / "hosts.example.yaml"
    if not example.exists():
        pytest.skip("hosts.example.yaml is not in this checkout")
    host = load_inventory(example).host("lab")
    defaults = hostctl.LabSettings.from_env({})
    assert (host.address, host.port) == (defaults.address, defaults.port)
    assert host.identity_file == str(defaults.ssh_dir / "id_ed25519")
    assert host.known_hosts == str(defaults.ssh_dir / "known_hosts")
    assert host.service_manager == "process"


def test_systemd_lab_defaults_match_the_hosts_example() -> None:
    from orchestrator.lab import container, sdlab

    host = load_inventory(REPO / "hosts.example.yaml").host(sdlab.HOST_NAME)
    defaults = sdlab.SdLabSettings.from_env({})
    x, y = sdlab.DEFAULT_BLOCK.split(".")
    assert defaults.block == sdlab.DEFAULT_BLOCK in container.RESERVED_BLOCKS
    assert host.address == f"{container.NET_PREFIX}.{x}.{int(y) * 4 + 2}"
    assert (host.port, host.user, host.sudo, host.service_manager, host.unit_dir) == (
        22,
        sdlab.USER,
        True,
        "systemd",
        sdlab.UNIT_DIR,
    )
    assert host.identity_file == str(defaults.identity_file)
    assert host.known_hosts == str(defaults.known_hosts)
    # Another name (tests, a second lab) never takes the default's address block.
    assert sdlab.SdLabSettings.from_env({sdlab.NAME_ENV: "orch-lab-t1-x"}).block is None


def test_what_a_lab_creates_follows_its_state_dir(tmp_path: Path) -> None:
    """The run directory of each lab host entry (locks, pid and log files), the Slurm jobs'
    run directory and the systemd lab's container, namespace, veth and work dir all follow
    the lab's state directory: two labs never share one of them."""
    from orchestrator.lab import sdlab, slurmlab

    a, b = tmp_path / "a", tmp_path / "b"
    sa = sdlab.SdLabSettings.from_env({"ORCH_LAB_DIR": str(a)})
    sb = sdlab.SdLabSettings.from_env({"ORCH_LAB_DIR": str(b), "ORCH_LAB_PORT": "2222"})
    assert sa.name != sb.name and sa.name.startswith("orch-lab-")
    assert sa.netns_name != sb.netns_name and sa.veth != sb.veth and sa.workdir != sb.workdir
    assert sa.name == sdlab.SdLabSettings.from_env({"ORCH_LAB_DIR": str(a)}).name  # stable
    # a lab started under another name keeps it (its lab.json says which)
    (b / "systemd").mkdir(parents=True)
    (b / "systemd" / "lab.json").write_text('{"name": "orch-lab"}')
    assert sdlab.SdLabSettings.from_env({"ORCH_LAB_DIR": str(b)}).name == "orch-lab"

    for lab_dir in (a, b):
        settings = hostctl.LabSettings.from_env({"ORCH_LAB_DIR": str(lab_dir)})
        for installed in (True, False):
            st = hostctl.LabStatus(
                settings=settings,
                sshd_installed=installed,
                running=True,
                pid=1,
                port=settings.port,
                user="u",
                identity_file=settings.ssh_dir / "id_ed25519",
                known_hosts=settings.ssh_dir / "known_hosts",
                log_path=settings.ssh_dir / "sshd.log",
            )
            entry = st.hosts_entry()
            assert Path(str(entry["run_dir"])).is_relative_to(lab_dir)
            cluster = slurmlab.lab_cluster(settings.state_dir)
            slurm_entry = slurmlab.hosts_entry(entry, cluster)
            assert Path(str(slurm_entry["run_dir"])).is_relative_to(lab_dir)
            assert slurm_entry["run_dir"] != entry["run_dir"]


@pytest.mark.slow
def test_two_labs_with_other_state_dirs_do_not_see_or_stop_each_other(tmp_path: Path) -> None:
    """Lab A on a port it was given; lab B without ORCH_LAB_PORT while the default port is
    taken (held here if nobody holds it): B picks a free port of its own. Each lab's copy of
    the shipped configs uses a server port of its own. B's status does not show A, B's
    `down` leaves A running, and a run on A keeps its lock and run files under A's state
    directory."""
    require_sshd()
    a = Lab(tmp_path / "a", free_port())
    b = Lab(tmp_path / "b", hostctl.DEFAULT_PORT)
    b.env.pop("ORCH_LAB_PORT")
    hold = socket.socket()
    try:
        try:
            hold.bind(("127.0.0.1", hostctl.DEFAULT_PORT))
            hold.listen()
        except OSError:
            pass  # someone has it already: just as good
        up_a, up_b = a.cli("up"), b.cli("up")
        assert up_a.returncode == 0, up_a.stderr
        assert up_b.returncode == 0, up_b.stderr
        pid_a = read_pid(a.settings.pid_file)
        pid_b = read_pid(b.settings.pid_file)
        assert pid_a and pid_b and pid_a != pid_b
        hosts_a = load_inventory(a.state_dir / "hosts.yaml").host("lab")
        hosts_b = load_inventory(b.state_dir / "hosts.yaml").host("lab")
        assert hosts_a.port == a.port
        assert hosts_b.port not in (a.port, hostctl.DEFAULT_PORT)
        assert f"127.0.0.1:{hosts_b.port}" in up_b.stdout
        assert Path(str(hosts_a.run_dir)).is_relative_to(a.state_dir)
        assert Path(str(hosts_b.run_dir)).is_relative_to(b.state_dir)
        assert f"sshd pid {pid_a}" not in b.cli("status").stdout

        # each lab's copies of the shipped configs are on a server port of its own
        ports = {}
        for lab in (a, b):
            exp = load_experiment(lab.state_dir / "experiments" / "demo" / "good.yaml")
            shipped = load_experiment(REPO / "experiments" / "lab" / "demo" / "good.yaml")
            assert exp.fingerprint() == shipped.with_changes(flags={"port": exp.port}).fingerprint()
            ports[lab] = exp.port
        assert len({ports[a], ports[b], 30000}) == 3, ports

        # a run on lab A of its demo config: its lock and run files land under A's state dir
        exp = a.state_dir / "experiments" / "demo" / "good.yaml"
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "orchestrator",
                "run",
                str(exp),
                "--host",
                "lab",
                "--hosts",
                str(a.state_dir / "hosts.yaml"),
                "--results",
                str(tmp_path / "res"),
            ],
            env={**a.env, "ORCH_LAB_TIME_SCALE": "0.05"},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert (a.state_dir / "run" / "locks").is_dir()
        assert any((a.state_dir / "run").iterdir())
        assert not (b.state_dir / "run").exists() or not any((b.state_dir / "run").iterdir())

        down_b = b.cli("down")
        assert down_b.returncode == 0, down_b.stderr
        assert is_our_sshd(pid_a, a.settings.config_path)  # A lives on
        assert not is_our_sshd(pid_b, b.settings.config_path)
        assert a.ssh("true").returncode == 0
    finally:
        hold.close()
        for lab in (a, b):
            lab.cli("down")
            for lab_pid in [read_pid(lab.settings.pid_file)]:
                if lab_pid and is_our_sshd(lab_pid, lab.settings.config_path):
                    kill_tree(lab_pid, tree=False)
