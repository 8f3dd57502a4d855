"""`orchestrator lab up --systemd` and the demo on it, as a user runs them.

Real CLI processes, a real systemd-nspawn container with systemd as PID 1, its sshd, the
unit `sglang-lab.service`, reached as `ubuntu` with sudo. Every test uses its own lab
state directory, port and container name (ORCH_LAB_DIR, ORCH_LAB_PORT,
ORCH_LAB_SYSTEMD_NAME = orch-lab-t<pid>-...), so a lab the user runs, and the tests of
other checkouts, are never touched; a lab of a test session killed before its teardown is
removed by the next session (the name carries the owner's pid).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.config.hosts import load_inventory
from orchestrator.execution.localproc import pid_alive
from orchestrator.lab import container as ct
from orchestrator.lab import sdlab
from orchestrator.lab.sshd import _descendants, free_port
from tests.hosts.prereq import require_sshd, require_systemd_host
from tests.hosts.wait import wait_until

REPO = Path(__file__).resolve().parents[1]
NAME_RE = re.compile(r"^orch-lab-t(\d+)-")
DROPIN_DIR = f"{sdlab.UNIT_DIR}/{sdlab.UNIT}.d"

pytestmark = pytest.mark.systemd


class SdLab:
    """One lab of the tests: its settings, and the CLI and ssh as the user has them."""

    def __init__(self, tmp: Path, tag: str) -> None:
        self.state_dir = tmp / "lab"
        self.name = f"orch-lab-t{os.getpid()}-{tag}"
        self.env = {
            **os.environ,
            "ORCH_LAB_DIR": str(self.state_dir),
            "ORCH_LAB_PORT": str(free_port()),
            sdlab.NAME_ENV: self.name,
            "ORCH_RESULTS": str(tmp / "results"),
            "ORCH_SKIP_APT": "1",
            "COLUMNS": "200",
        }
        self.settings = sdlab.SdLabSettings.from_env(self.env)

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def status(self) -> sdlab.SdLabStatus:
        return sdlab.status(self.settings)

    def sh(self, command: str, *, check: bool = True) -> str:
        """A command on the lab host as `ubuntu`, through OpenSSH with host key checking."""
        res = self.status().target().ssh_run(command, timeout=60)
        if check:
            assert res.returncode == 0, f"{command}: {res.stderr}"
        return res.stdout

    def unit_snapshot(self) -> dict[str, str]:
        """Everything that says how the unit is configured and whether it runs."""
        show = self.sh(
            f"systemctl show {sdlab.UNIT} -p ExecStart -p DropInPaths "
            "-p FragmentPath -p ActiveState -p UnitFileState -p Environment"
        )
        props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
        props["cat"] = self.sh(f"sudo -n systemctl cat {sdlab.UNIT}")
        props["unit_sha"] = hashlib.sha256(
            self.sh(f"cat {sdlab.UNIT_DIR}/{sdlab.UNIT}").encode()
        ).hexdigest()
        props["dropin_dir"] = self.sh(f"sudo -n ls -A {DROPIN_DIR} 2>&1; true")
        # ExecStart's path and argv exactly, as D-Bus serves them (without the last run's
        # timestamps and pid).
        props["exec_argv"] = json.dumps(
            [
                rec[:3]
                for rec in json.loads(
                    self.sh(
                        "busctl --json=short get-property org.freedesktop.systemd1 "
                        f"{_bus_path(sdlab.UNIT)} org.freedesktop.systemd1.Service ExecStart"
                    )
                )["data"]
            ]
        )
        # pid and timestamps change when the server restarts; the rest must not.
        props["ExecStart"] = re.sub(
            r"(pid|start_time|stop_time|status)=[^;]*", "", props["ExecStart"]
        )
        return props


def _bus_path(unit: str) -> str:
    from orchestrator.execution.services.systemd import bus_path

    return bus_path(unit)


def _cleanup_stale_labs() -> None:
    """Remove the labs of test sessions that died before their teardown."""
    netns_dir = Path("/run/netns")
    names = {p.name for p in netns_dir.iterdir()} if netns_dir.exists() else set()
    names |= {
        p.name.removeprefix("orchestrator-lab-")
        for p in sdlab.WORK_PARENT.glob("orchestrator-lab-orch-lab-t*")
    }
    for name in names:
        m = NAME_RE.match(name)
        if m and not pid_alive(int(m.group(1))):
            env = {sdlab.NAME_ENV: name, "ORCH_LAB_DIR": f"/tmp/.orch-stale-{name}"}
            sdlab.down(sdlab.SdLabSettings.from_env(env))


def _down(lab: SdLab) -> None:
    res = lab.cli("lab", "down", timeout=180)
    if res.returncode != 0 or lab.status().running or lab.status().leftovers:
        sdlab.down(lab.settings)  # whatever the CLI did, nothing of ours survives


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SdLab]:
    """One systemd lab host for the demo tests (a boot costs seconds)."""
    require_systemd_host()
    require_sshd()
    _cleanup_stale_labs()
    lab = SdLab(tmp_path_factory.mktemp("sdlab"), "demo")
    try:
        up = lab.cli("lab", "up", "--systemd")
        assert up.returncode == 0, up.stdout + up.stderr
        yield lab
    finally:
        _down(lab)


def test_lab_up_systemd_and_down_twice_in_a_row(tmp_path: Path) -> None:
    require_systemd_host()
    require_sshd()
    _cleanup_stale_labs()
    lab = SdLab(tmp_path, "updown")
    try:
        for _ in range(2):
            up = lab.cli("lab", "up", "--systemd")
            assert up.returncode == 0, up.stdout + up.stderr
            st = lab.status()
            assert st.running and st.pid is not None and st.address
            assert (
                f"lab: up: systemd host {lab.name} (systemd-nspawn pid {st.pid}) at "
                f"{st.address}:22; {sdlab.UNIT} active/running, /health 200"
            ) in up.stdout

            # Idempotent: a second `up` reports the same machine, it does not reboot it.
            again = lab.cli("lab", "up", "--systemd")
            assert again.returncode == 0, again.stderr
            assert (
                f"lab: already up: systemd host {lab.name} (systemd-nspawn pid {st.pid})"
                in again.stdout
            )
            status = lab.cli("lab", "status")
            assert status.returncode == 0, status.stderr
            assert f"lab: systemd host {lab.name} up (systemd-nspawn pid {st.pid})" in status.stdout

            # The hosts.yaml entry reaches it, like a GPU host: ubuntu, sudo, systemd.
            inv = load_inventory(lab.settings.hosts_file)
            host = inv.host(sdlab.HOST_NAME)
            assert (host.address, host.port, host.user, host.sudo, host.service_manager) == (
                st.address,
                22,
                "ubuntu",
                True,
                "systemd",
            )
            out = lab.sh(
                f"id -un; sudo -n id -un; cat /proc/1/comm; "
                f"systemctl is-active {sdlab.UNIT}; systemctl is-enabled {sdlab.UNIT}"
            )
            assert out.split() == ["ubuntu", "root", "systemd", "active", "enabled"]
            cat = lab.sh(f"systemctl cat {sdlab.UNIT}")
            assert "ExecStart=/usr/bin/python3 -m orchestrator.lab.server --scenario b300" in cat
            assert "Restart=on-failure" in cat  # the operator's own unit, no drop-in
            assert "99-orchestrator" not in cat

            # What runs on this machine for it: nspawn and everything below it (systemd,
            # sshd, the server).
            below = _descendants(st.pid)
            cmdlines = [_cmdline(p) for p in below]
            assert any("orchestrator.lab.server" in c for c in cmdlines), cmdlines
            assert any(c.startswith("sshd") or "/sshd" in c for c in cmdlines), cmdlines
            netns = ct.Netns(lab.settings.netns_name, lab.settings.veth)
            assert netns.exists()

            down = lab.cli("lab", "down")
            assert down.returncode == 0, down.stderr
            assert (
                f"lab: down: halted systemd host {lab.name} (systemd-nspawn pid {st.pid})"
                in down.stdout
            )
            # Nothing left: no container, sshd or server process, namespace, mount, files.
            assert [p for p in [st.pid, *below] if pid_alive(p)] == []
            assert ct.nspawn_pids(lab.name) == []
            assert not netns.exists()
            assert not lab.settings.workdir.exists()
            assert str(lab.settings.workdir) not in Path("/proc/self/mounts").read_text()
            assert not lab.settings.state_file.exists()
            hosts = yaml.safe_load(lab.settings.hosts_file.read_text())["hosts"]
            assert sdlab.HOST_NAME not in hosts

            down_again = lab.cli("lab", "down")
            assert down_again.returncode == 0, down_again.stderr
            assert "already down" in down_again.stdout
            assert "lab: down" in lab.cli("lab", "status").stdout
    finally:
        _down(lab)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_demo_bisects_on_the_systemd_lab_host_and_leaves_the_unit_as_found(lab: SdLab) -> None:
    before = lab.unit_snapshot()
    assert before["ActiveState"] == "active" and before["DropInPaths"] == ""
    demo = subprocess.run(
        [str(REPO / "scripts" / "demo")],
        env=lab.env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    first = demo.stdout.splitlines()[0]
    assert first.startswith("demo: using the systemd lab host (root and systemd-nspawn")
    # The answer: the interacting pair, the harmless delta cleared, the other bug kept.
    assert "culprit (interacting set): --ep-size 8 + --enable-nccl-nvls" in demo.stdout
    assert "cleared (not needed for the target failure): --max-running-requests 256" in demo.stdout
    assert (
        "other failure: init: AttributeError: 'NoneType' object has no attribute 'dtype'"
        in demo.stdout
    )
    assert f"restore: removed {DROPIN_DIR}/99-orchestrator.conf" in demo.stdout
    # The unit exactly as it was found: no drop-in, the same ExecStart, `systemctl cat`
    # identical, running again.
    assert lab.unit_snapshot() == before

    # `show` of the failing endpoint: what the tool did on the host, checked on the host.
    m = re.search(r"campaign ([0-9a-f]{6})", demo.stdout)
    assert m, demo.stdout
    bad = f"{m.group(1)}.2"
    show = lab.cli("show", bad)
    assert show.returncode == 0, show.stderr
    out = show.stdout
    assert "variant: bad  (endpoint)" in out
    assert f"on the host ({sdlab.HOST_NAME}), unit {sdlab.UNIT}:" in out
    assert f"drop-in written: {DROPIN_DIR}/99-orchestrator.conf" in out
    assert re.search(r'^\s+ExecStart="python3" "-m" "orchestrator.lab.server"', out, re.M)
    read_back = re.search(r"ExecStart read back from systemd: (python3 -m .*)$", out, re.M)
    assert read_back, out
    assert read_back.group(1).endswith("--ep-size 8 --enable-nccl-nvls")
    inv = re.search(r"InvocationID: ([0-9a-f]{32})$", out, re.M)
    assert inv, out
    full = re.search(r"full log on the host: (ssh .*)$", out, re.M)
    assert full and f"sudo journalctl _SYSTEMD_INVOCATION_ID={inv.group(1)}" in full.group(1)
    # The printed command works as printed, and shows that invocation's whole log.
    journal = subprocess.run(
        full.group(1),
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert journal.returncode == 0, journal.stderr
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in journal.stdout
    assert "Init torch distributed begin" in journal.stdout  # the start, not only the tail
    assert "The server is fired up" not in journal.stdout  # only this invocation


def test_ctrl_c_in_the_demo_leaves_the_unit_as_found(lab: SdLab) -> None:
    before = lab.unit_snapshot()
    demo = subprocess.Popen(
        [str(REPO / "scripts" / "demo")],
        env=lab.env,
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Mid-campaign: our drop-in is on the host and a variant's server runs from it.
        def mid_run() -> bool:
            return (
                "99-orchestrator.conf" in lab.sh(f"sudo -n ls {DROPIN_DIR} 2>/dev/null; true")
                and demo.poll() is None
            )

        wait_until(mid_run, timeout=300, interval=0.3, what="a run of the demo on the host")
        assert demo.poll() is None
        demo.send_signal(signal.SIGINT)  # the demo execs the bisect: this is the Ctrl-C
        out, err = demo.communicate(timeout=300)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate(timeout=30)
    assert demo.returncode == 130, out + err
    assert "interrupted" in out + err and "--resume" in out + err
    assert lab.unit_snapshot() == before


def test_the_process_lab_host_gives_the_demos_answer(lab: SdLab, tmp_path: Path) -> None:
    """The demo's pair on the process lab host (moved to a port of this test's own: there
    the server listens on this machine, where other tests run servers) gives the answer the
    demo gives on the systemd lab host (test above): the same target, the interacting pair,
    the same other failure."""
    from orchestrator.lab import hostctl

    require_sshd()
    port = free_port()
    pair = {}
    for side in ("good", "bad"):
        path = tmp_path / f"{side}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": f"test-demo-{side}",
                    "extends": str(REPO / "experiments/lab/demo" / f"{side}.yaml"),
                    "service": {"flags": {"port": port}},
                }
            )
        )
        pair[side] = str(path)
    up = lab.cli("lab", "up")
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        hosts = load_inventory(lab.settings.hosts_file).hosts
        assert hosts["lab"].service_manager == "process"
        assert hosts[sdlab.HOST_NAME].service_manager == "systemd"
        res = lab.cli(
            "bisect",
            "--good",
            pair["good"],
            "--bad",
            pair["bad"],
            "--host",
            "lab",
            "--hosts",
            str(lab.settings.hosts_file),
            "--fresh",
            "--json",
        )
        assert res.returncode == 0, res.stdout + res.stderr
        d = json.loads(res.stdout)
        assert d["target"].startswith("cuda_graph: ") and "CUBLAS" in d["target"], d
        assert [c["flags"] for c in d["culprits"]] == [["--ep-size 8", "--enable-nccl-nvls"]]
        [finding] = d["findings"]
        assert finding["signature"].startswith(
            "init: AttributeError: 'NoneType' object has no attribute 'dtype'"
        ), finding
    finally:
        hostctl.down(lab.settings.lab)  # the process lab only: the systemd one is the module's


def test_lab_down_of_another_state_dir_leaves_the_systemd_lab_running(tmp_path: Path) -> None:
    """Two labs with other state directories (two checkouts), neither naming its container:
    the container's name follows the state dir, so `lab down` of one never halts the
    other's container."""
    require_systemd_host()
    require_sshd()
    a, b = SdLab(tmp_path / "a", "a"), SdLab(tmp_path / "b", "b")
    for lab in (a, b):
        lab.env.pop(sdlab.NAME_ENV)
        lab.settings = sdlab.SdLabSettings.from_env(lab.env)
        lab.name = lab.settings.name
    assert a.name != b.name
    try:
        up = a.cli("lab", "up", "--systemd")
        assert up.returncode == 0, up.stdout + up.stderr
        st = a.status()
        assert st.running and f"systemd host {a.name} " in up.stdout
        assert "down" in b.cli("lab", "status").stdout  # B sees no systemd host of its own
        down_b = b.cli("lab", "down")
        assert down_b.returncode == 0, down_b.stderr
        assert "already down" in down_b.stdout
        after = a.status()
        assert after.running and after.pid == st.pid
        assert a.sh(f"systemctl is-active {sdlab.UNIT}").strip() == "active"
    finally:
        _down(a)
        _down(b)
