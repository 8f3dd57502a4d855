"""The `systemd_host` test host: a real systemd in a container, driven over real SSH.

Everything here goes through the OpenSSH client with the fixture's key and known_hosts
(the project's own transport is tested against this host elsewhere), and through the
real `systemctl` and `journalctl` of the container.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

from orchestrator.lab.sdhosts import SystemdHost, SystemdHostFactory, cleanup_stale
from orchestrator.lab.units import lab_unit
from tests.hosts.wait import wait_until

LAB_UNIT = lab_unit(
    exec_start="/usr/bin/python3 -m orchestrator.lab.server --scenario b300 "
    "--port 30000 --tp-size 8"
)

# The b300 scenario's bad config: EP8 + NVLS dies in CUDA-graph capture.
FAILING_DROPIN = """\
[Service]
ExecStart=
ExecStart=/usr/bin/python3 -m orchestrator.lab.server --scenario b300 --port 30000 \\
    --tp-size 8 --ep-size 8 --enable-nccl-nvls
"""


def show(host: SystemdHost, unit: str, *props: str) -> dict[str, str]:
    """`systemctl show -p ...` as a dict (the real command, parsed here)."""
    res = host.ssh_run(["systemctl", "show", unit, *(f"--property={p}" for p in props)], check=True)
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)


def http_status(host: SystemdHost, port: int, path: str = "/health") -> str:
    """The status code curl gets inside the container ('000' when nothing listens)."""
    res = host.ssh_run(
        f"curl -s -o /dev/null -m 5 -w '%{{http_code}}' http://127.0.0.1:{port}{path}",
        timeout=60,
    )
    return res.stdout.strip()


def test_boots_with_checked_host_key_and_readonly_repo(
    systemd_host: SystemdHost, tmp_path: Path
) -> None:
    res = systemd_host.ssh_run("systemctl is-system-running; id -un; cat /etc/os-release")
    assert res.returncode == 0, res.stderr
    state, user = res.stdout.splitlines()[:2]
    assert state == "running" and user == "root"
    assert "VERSION_CODENAME=bookworm" in res.stdout
    # The address is the container's own, in its own namespace, on port 22.
    assert systemd_host.port == 22 and systemd_host.address.startswith("10.213.")
    assert systemd_host.known_hosts.read_text().split() == [
        systemd_host.address,
        *systemd_host.host_key_pub.split(),
    ]
    # The project is there, read-only.
    res = systemd_host.ssh_run(
        "test -f /opt/orchestrator/orchestrator/__init__.py && touch /opt/orchestrator/x"
    )
    assert res.returncode != 0 and "Read-only file system" in res.stderr
    # A host key that does not match known_hosts is refused, never added.
    kh = tmp_path / "known_hosts"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True
    )
    kh.write_text(f"{systemd_host.address} {(tmp_path / 'k.pub').read_text()}")
    assert systemd_host.target is not None
    res = replace(systemd_host.target, known_hosts=kh).ssh_run("echo should-not-run")
    assert res.returncode == 255 and "Host key verification failed" in res.stderr
    assert "should-not-run" not in res.stdout


def test_lab_server_as_a_systemd_unit_healthy_then_crashing(systemd_host: SystemdHost) -> None:
    unit = "sglang-lab.service"
    systemd_host.install_unit(unit, LAB_UNIT)
    systemd_host.ssh_run(["systemctl", "start", unit], check=True)

    def healthy() -> bool:
        return http_status(systemd_host, 30000) == "200"

    wait_until(
        healthy,
        timeout=120,
        interval=0.5,
        what="/health 200 from the lab server",
        describe=lambda: (
            systemd_host.ssh_run(
                f"systemctl status --no-pager {unit}; journalctl -u {unit} --no-pager -n 30"
            ).stdout
        ),
    )
    state = show(systemd_host, unit, "ActiveState", "SubState", "Result", "MainPID")
    assert (state["ActiveState"], state["SubState"], state["Result"]) == (
        "active",
        "running",
        "success",
    )
    assert int(state["MainPID"]) > 0
    log = systemd_host.ssh_run(["journalctl", "-u", unit, "--no-pager", "-o", "cat"]).stdout
    assert "The server is fired up and ready to roll!" in log

    # The failing config as a drop-in, the way the executor will do it.
    systemd_host.install_unit(f"{unit}.d/50-orchestrator.conf", FAILING_DROPIN)
    exec_start = show(systemd_host, unit, "ExecStart")["ExecStart"]
    assert "--ep-size 8 --enable-nccl-nvls" in exec_start
    # `systemctl restart` returns 0 even though the service dies moments later: the
    # outcome has to be read from the unit's state afterwards.
    res = systemd_host.ssh_run(["systemctl", "restart", unit])
    assert res.returncode == 0, res.stderr

    def ended() -> dict[str, str] | None:
        s = show(systemd_host, unit, "ActiveState", "Result", "InvocationID", "ExecMainStatus")
        return s if s["ActiveState"] in ("failed", "inactive") else None

    final = wait_until(ended, timeout=120, interval=0.5, what=f"{unit} to fail")
    assert final["ActiveState"] == "failed"
    assert final["Result"] == "exit-code"
    assert final["ExecMainStatus"] != "0"
    invocation = final["InvocationID"]
    assert re.fullmatch(r"[0-9a-f]{32}", invocation)

    journal = systemd_host.ssh_run(
        ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation}", "--no-pager", "-o", "cat"]
    ).stdout
    assert "Traceback (most recent call last):" in journal
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in journal
    # Only this invocation: the healthy run's lines are not in it.
    assert "The server is fired up and ready to roll!" not in journal


def test_restart_container_keeps_installed_units(systemd_host: SystemdHost) -> None:
    # A tiny HTTP server as an enabled unit: after a power cycle it comes back by itself.
    systemd_host.install_unit(
        "tiny-http.service",
        "[Service]\nExecStart=/usr/bin/python3 -m http.server --bind 127.0.0.1 18080\n"
        "[Install]\nWantedBy=multi-user.target\n",
    )
    systemd_host.ssh_run("systemctl enable --now tiny-http.service", check=True)
    wait_until(
        lambda: http_status(systemd_host, 18080, "/") == "200",
        timeout=60,
        what="the tiny http server",
    )
    systemd_host.restart_container()
    wait_until(
        lambda: http_status(systemd_host, 18080, "/") == "200",
        timeout=60,
        what="the tiny http server after the restart",
    )
    systemd_host.restart_container(fresh=True)
    res = systemd_host.ssh_run("systemctl cat tiny-http.service")
    assert res.returncode != 0  # a fresh boot starts from the image again


def test_teardown_leaves_nothing(systemd_hosts: SystemdHostFactory) -> None:
    host = systemd_hosts.boot()
    netns, veth, hostdir = host.netns.path, host.netns.veth, host.dir
    assert host.container.pid is not None
    nspawn_pid = host.container.pid
    assert netns.exists() and Path(f"/sys/class/net/{veth}").exists()
    systemd_hosts.stop(host)
    assert not netns.exists()
    assert not Path(f"/sys/class/net/{veth}").exists()
    assert not hostdir.exists()
    try:
        os.kill(nspawn_pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError(f"systemd-nspawn {nspawn_pid} still runs after stop")
    mounts = Path("/proc/mounts").read_text()
    assert str(hostdir) not in mounts


def test_leftovers_of_a_killed_session_are_cleaned(systemd_hosts: SystemdHostFactory) -> None:
    # A session killed with SIGKILL never tears down; the next one removes what it left,
    # recognised by the dead owner pid in the names. Simulated with a namespace + veth.
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=10)
    dead = gone.pid
    netns, veth = f"orch-{dead}-1", f"oh{dead}x1"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns],
        check=True,
    )
    try:
        cleanup_stale()
        assert not Path(f"/run/netns/{netns}").exists()
        assert not Path(f"/sys/class/net/{veth}").exists()
    finally:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
