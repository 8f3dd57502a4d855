"""`hosts check --experiment` and `restore --experiment` over every host of a deployment.

On two real systemd containers (the `duo`), a deployment of two node ranks, one on each,
finds what a controller killed after writing each role's drop-in left (the drop-in, its
note of how it found the unit, a lock naming a process that is gone): `hosts check` names
it per role and host, `restore` undoes it on both hosts and reads each role's unit back by
name, and the hosts show nothing of ours after. The refusals (a role without a host, an
unknown host, a pool) need no host.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.config import load_experiment
from orchestrator.config.hosts import load_inventory
from orchestrator.execution.hostlock import lock_dir, lock_path, me
from orchestrator.execution.services.systemd import SystemdManager
from orchestrator.execution.transport import connect
from orchestrator.lab.sdhosts import SystemdHost
from tests.hosts.fixtures import DUO_UNIT


def _experiment(tmp: Path, *, node1_host: str | None = "sd1") -> Path:
    node1: dict[str, object] = {"kind": "node", "rank": 1, "unit": DUO_UNIT}
    if node1_host is not None:
        node1["host"] = node1_host
    data = {
        "name": "two-nodes",
        "service": {
            "exec": "python3 -m orchestrator.lab.server --scenario rtx6000",
            "flags": {"model-path": "/m", "nnodes": 2, "port": 30000},
        },
        "roles": {
            "node0": {"kind": "node", "rank": 0, "host": "sd0", "unit": DUO_UNIT},
            "node1": node1,
        },
    }
    path = tmp / "two-nodes.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_and_restore_reach_every_role_of_a_deployment(
    duo: list[SystemdHost], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts_file = tmp_path / "hosts.yaml"
    entries = {f"sd{i}": box.hosts_entry() for i, box in enumerate(duo)}
    hosts_file.write_text(yaml.safe_dump({"hosts": entries, "pools": {"both": list(entries)}}))
    exp_file = _experiment(tmp_path)
    exp = load_experiment(exp_file)
    inv = load_inventory(hosts_file)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    # a controller killed after it wrote each role's drop-in: its drop-in, its note of the
    # unit's state and its lock (naming a process that is gone) on both hosts
    for role, name in (("node0", "sd0"), ("node1", "sd1")):
        host = inv.host(name)
        with connect(host) as t:
            m = SystemdManager(host, t, name=DUO_UNIT, campaign="dead01")
            m.prepare()
            m.install(exp.role_launch(role), env_keys=frozenset(), run_id="dead01.1")
            lock = {"owner": me(), "campaign": "dead01", "pid": gone.pid, "since": time.time()}
            t.run(f"mkdir -p {lock_dir(host)}", sudo=True, timeout=30, check=True)
            t.write_file(lock_path(host, DUO_UNIT), json.dumps(lock) + "\n", sudo=True)
    dropin = f"/etc/systemd/system/{DUO_UNIT}.d/99-orchestrator.conf"

    code, out, err = cli(
        capsys, "hosts", "check", "--experiment", exp_file, "--hosts", hosts_file, "--json"
    )
    assert code == 3, out + err
    found = json.loads(out)
    assert list(found) == ["sd0", "sd1"]
    for name, role in (("sd0", "node0"), ("sd1", "node1")):
        checks = {c["name"]: c for c in found[name]}
        assert checks[f"role {role} unit"]["ok"] is True, checks
        mine = checks[f"role {role}"]
        assert mine["ok"] is False, mine
        assert f"{DUO_UNIT}: orchestrator's drop-in {dropin}" in mine["detail"]
        assert "the lock left by" in mine["detail"] and "which is gone" in mine["detail"]
        assert f"orchestrator restore --experiment {exp_file}" in mine["hint"]
        other = "node1" if role == "node0" else "node0"
        assert f"role {other}" not in checks  # each host checks only its own roles

    code, out, err = cli(capsys, "restore", "--experiment", exp_file, "--hosts", hosts_file)
    assert code == 0, out + err
    lines = out.splitlines()
    assert f"sd0: role node0 ({DUO_UNIT}): read back: as found" in lines, out
    assert f"sd1: role node1 ({DUO_UNIT}): read back: as found" in lines, out
    assert any(x.startswith("sd0: removed the lock on") for x in lines), out
    assert any(x.startswith("sd1: removed the lock on") for x in lines), out
    for i, box in enumerate(duo):  # the hosts agree: no drop-in, no lock
        lock_file = lock_path(inv.host(f"sd{i}"), DUO_UNIT)
        left = box.ssh_run(f"ls {dropin} {lock_file} 2>/dev/null; true").stdout.strip()
        assert left == "", left

    code, out, err = cli(
        capsys, "hosts", "check", "--experiment", exp_file, "--hosts", hosts_file, "--json"
    )
    assert code == 0, out + err
    for name, role in (("sd0", "node0"), ("sd1", "node1")):
        checks = {c["name"]: c for c in json.loads(out)[name]}
        assert checks[f"role {role}"]["ok"] is True, checks
        assert "no drop-in, server or lock of orchestrator" in checks[f"role {role}"]["detail"]


def _hosts(tmp: Path) -> Path:
    (tmp / "known_hosts").write_text("")
    entry = {
        "address": "127.0.0.1",
        "user": "nobody",
        "known_hosts": str(tmp / "known_hosts"),
        "service_manager": "systemd",
    }
    path = tmp / "hosts.yaml"
    path.write_text(
        yaml.safe_dump({"hosts": {"sd0": entry, "sd1": entry}, "pools": {"both": ["sd0", "sd1"]}})
    )
    return path


@pytest.mark.parametrize("command", [["hosts", "check"], ["restore"]])
def test_a_role_without_a_host_is_refused_naming_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    exp_file = _experiment(tmp_path, node1_host=None)
    code, out, err = cli(capsys, *command, "--experiment", exp_file, "--hosts", _hosts(tmp_path))
    assert code == 2, out + err
    assert "role node1 names no host" in err and str(exp_file) in err
    assert "roles.node1.host" in err


def test_an_unknown_host_or_a_pool_of_a_role_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = _hosts(tmp_path)
    exp_file = _experiment(tmp_path, node1_host="sd9")
    code, out, err = cli(capsys, "restore", "--experiment", exp_file, "--hosts", hosts)
    assert code == 2 and "role node1: no host or pool named 'sd9'" in err, err
    assert "roles.node1.host" in err
    exp_file = _experiment(tmp_path, node1_host="both")
    code, out, err = cli(capsys, "hosts", "check", "--experiment", exp_file, "--hosts", hosts)
    assert code == 2 and "'both' is a pool of 2 hosts; a role runs on one host" in err, err


def test_restore_needs_a_host_or_an_experiment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "restore", "--hosts", _hosts(tmp_path))
    assert code == 2 and "restore needs --host H or --experiment CONFIG" in err, err
