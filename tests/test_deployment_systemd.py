"""A deployment on real systemd hosts: two containers (systemd-nspawn), each in a network
namespace of its own, routed to each other through this machine; each rank a unit of its
own on its container, changed only through a drop-in there. The two-node lab pair is
bisected end to end through the command line, and every unit is as found afterwards."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.container import route_between
from orchestrator.lab.sdhosts import SystemdHost, SystemdHostFactory
from orchestrator.store.store import Store
from tests.hosts.wait import wait_until
from tests.support.campaign_lab import (
    LAB_UNIT,
    UNIT_DIR,
    cli,
    cli_json,
    popen_cli,
    stop_child,
)
from tests.support.deployment_lab import two_node_pair

pytestmark = pytest.mark.systemd


@pytest.fixture(scope="module")
def pair(systemd_hosts: SystemdHostFactory) -> Iterator[list[SystemdHost]]:
    boxes = [systemd_hosts.boot(), systemd_hosts.boot()]
    try:
        route_between([box.netns for box in boxes])
        yield boxes
    finally:
        for box in boxes:
            systemd_hosts.stop(box)


def test_the_two_containers_reach_each_other_over_tcp(pair: list[SystemdHost]) -> None:
    probe = (
        "python3 -c \"import socket; socket.create_connection(('{}', 22), timeout=5); "
        "print('reached')\""
    )
    out = pair[1].ssh_run(probe.format(pair[0].address))
    assert "reached" in str(out), out


NODE_UNITS = ("lab-node0.service", "lab-node1.service")


def unit_state(box: SystemdHost, unit: str) -> tuple[str, str, bool]:
    """(the unit file's digest, ActiveState, whether a drop-in directory of it exists)."""
    text = box.ssh_run(f"sha256sum {UNIT_DIR}/{unit}", check=True, timeout=60).stdout
    show = box.ssh_run(f"systemctl show {unit} -p ActiveState", check=True, timeout=60).stdout
    dropin = box.ssh_run(f"test -e {UNIT_DIR}/{unit}.d", timeout=60).returncode == 0
    return text.split()[0], show.strip().split("=", 1)[1], dropin


def test_two_node_pair_over_two_containers(pair: list[SystemdHost], tmp_path: Path) -> None:
    for box, unit in zip(pair, NODE_UNITS, strict=True):
        box.install_unit(unit, LAB_UNIT)
    found = [unit_state(box, unit) for box, unit in zip(pair, NODE_UNITS, strict=True)]
    assert all(state == "inactive" and not dropin for _, state, dropin in found)
    hosts = tmp_path / "hosts.yaml"
    env = {"PYTHONPATH": "/opt/orchestrator"}
    entries = {f"b{i}": box.hosts_entry(env=env) for i, box in enumerate(pair)}
    hosts.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    good, bad = two_node_pair(tmp_path, node1_host="b1", init_host=pair[0].address)
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "b0", "--hosts", hosts]
    code, out = cli_json(*argv, "--results", tmp_path / "results", "--no-report")
    assert code == 0, out
    assert [c["flags"] for c in out["culprits"]] == [["--enable-nccl-nvls"]], out
    assert out["target"].startswith("cuda_graph: cublas: CUBLAS_STATUS_EXECUTION_FAILED")
    store = Store(tmp_path / "results")
    try:
        runs = store.runs(out["campaign"])
        failed = [r for r in runs if r.verdict is Verdict.FAIL]
        records = [store.host_record(r.id) or {} for r in failed]
    finally:
        store.close()
    assert failed and all(r.host == "b1" for r in failed)
    for record in records:
        assert record["first_failure"]["role"] == "node1", record["first_failure"]
        roles = {x["role"]: x for x in record["roles"]}
        # each rank through a drop-in on its own container, its journal kept
        rendered = str(roles["node1"]["rendered"])
        assert "ExecStart=" in rendered and '"--node-rank" "1"' in rendered, rendered
        assert roles["node0"]["host"] == "b0" and roles["node0"]["invocation"]
        assert "Watchdog caught collective operation timeout" in roles["node0"]["log_tail"]
    # every unit as found: byte-identical, no drop-in, stopped
    assert [unit_state(box, unit) for box, unit in zip(pair, NODE_UNITS, strict=True)] == found


HANG = """
name: two-node-hang
startup: {init: 0.3, load_weights: 0.5, kv_cache: 0.2, cuda_graph: 0.6, warmup: 0.2}
known_flags: sglang
faults:
  - when: {node-rank: 1, enable-nccl-nvls: true}
    phase: cuda_graph
    effect: hang
"""
HANG_PATH = "/var/tmp/two-node-hang.yaml"


def hanging_campaign(pair: list[SystemdHost], tmp_path: Path) -> tuple[list[str], list]:
    """Units installed, the hosts file and a pair whose bad variant hangs on rank 1 (rank
    0 waits past the run's deadline): the command line of its bisection, and the units'
    state as found."""
    for box, unit in zip(pair, NODE_UNITS, strict=True):
        box.install_unit(unit, LAB_UNIT)
        box.write_file(HANG_PATH, HANG)
    found = [unit_state(box, unit) for box, unit in zip(pair, NODE_UNITS, strict=True)]
    hosts = tmp_path / "hosts.yaml"
    env = {"PYTHONPATH": "/opt/orchestrator"}
    entries = {f"b{i}": box.hosts_entry(env=env) for i, box in enumerate(pair)}
    hosts.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    good, bad = two_node_pair(tmp_path, node1_host="b1", init_host=pair[0].address, watchdog=600)
    for path in (good, bad):
        doc = yaml.safe_load(path.read_text())
        doc["service"]["exec"] = f"python3 -m orchestrator.lab.server --scenario {HANG_PATH}"
        doc["health"]["timeout"] = "120s"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    argv = ["bisect", "--good", str(good), "--bad", str(bad), "--host", "b0"]
    argv += ["--hosts", str(hosts), "--results", str(tmp_path / "results"), "--no-report"]
    return argv, found


def wait_both_ranks_of_bad(pair: list[SystemdHost], child: subprocess.Popen, log: Path) -> None:
    def up() -> bool | None:
        assert child.poll() is None, log.read_text()
        for box, unit in zip(pair, NODE_UNITS, strict=True):
            conf = f"{UNIT_DIR}/{unit}.d/99-orchestrator.conf"
            check = f"grep -q enable-nccl-nvls {conf} && systemctl is-active -q {unit}"
            if box.ssh_run(check, timeout=60).returncode != 0:
                return None
        return True

    wait_until(up, timeout=180, interval=0.5, what="both ranks of bad", describe=log.read_text)
    time.sleep(1.0)


def test_ctrl_c_leaves_both_containers_units_as_found(
    pair: list[SystemdHost], tmp_path: Path
) -> None:
    argv, found = hanging_campaign(pair, tmp_path)
    log = tmp_path / "bisect.log"
    child = popen_cli(*argv, log=log)
    try:
        wait_both_ranks_of_bad(pair, child, log)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=120) == 130, log.read_text()
    finally:
        stop_child(child)
    out = " ".join(log.read_text().split())
    assert "the hosts were restored (read back: as found): b0, b1" in out, out
    assert [unit_state(box, unit) for box, unit in zip(pair, NODE_UNITS, strict=True)] == found


def test_restore_after_kill_9_leaves_both_containers_units_as_found(
    pair: list[SystemdHost], tmp_path: Path
) -> None:
    argv, found = hanging_campaign(pair, tmp_path)
    log = tmp_path / "bisect.log"
    child = popen_cli(*argv, log=log)
    try:
        wait_both_ranks_of_bad(pair, child, log)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        stop_child(child)
    hosts = argv[argv.index("--hosts") + 1]
    for name, box, unit in zip(("b0", "b1"), pair, NODE_UNITS, strict=True):
        assert unit_state(box, unit)[2]  # the dead controller's drop-in is still there
        res = cli("restore", "--host", name, "--hosts", hosts, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
    assert [unit_state(box, unit) for box, unit in zip(pair, NODE_UNITS, strict=True)] == found


def test_a_role_whose_unit_is_missing_stops_the_campaign_and_restores_the_other(
    pair: list[SystemdHost], tmp_path: Path
) -> None:
    """node1's unit is not on b1: the campaign stops before any start (exit 3) naming the
    unit and b1, and b0's unit, opened first, is as found."""
    pair[0].install_unit(NODE_UNITS[0], LAB_UNIT)
    pair[1].ssh_run(f"rm -f {UNIT_DIR}/{NODE_UNITS[1]} && systemctl daemon-reload", timeout=60)
    found = unit_state(pair[0], NODE_UNITS[0])
    hosts = tmp_path / "hosts.yaml"
    env = {"PYTHONPATH": "/opt/orchestrator"}
    entries = {f"b{i}": box.hosts_entry(env=env) for i, box in enumerate(pair)}
    hosts.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    good, bad = two_node_pair(tmp_path, node1_host="b1", init_host=pair[0].address)
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "b0", "--hosts", hosts]
    res = cli(*argv, "--results", tmp_path / "results", "--no-report")
    text = " ".join(res.stderr.split())
    assert res.returncode == 3, res.stdout + res.stderr
    assert NODE_UNITS[1] in text and "b1" in text, text
    assert unit_state(pair[0], NODE_UNITS[0]) == found
    lock = pair[0].ssh_run("ls /run/orchestrator 2>/dev/null; ls /var/lib/orchestrator 2>/dev/null")
    assert "lab-node0" not in str(lock.stdout), lock.stdout
