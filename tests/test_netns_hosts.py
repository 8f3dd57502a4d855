"""Hosts with networks of their own: two OpenSSH sshd servers, each started inside a network
namespace of its own (`orchestrator.lab.nshosts`), routed to each other through this
machine. Each is reached over SSH at its own address, reaches the other over TCP, and
keeps its own loopback and ports; at teardown the sshd, whatever still runs in the
namespaces, the namespaces with their routes and the veth pairs are gone. The lab's
two-node pair bisected over them (rank 1 dials rank 0's address across the namespaces)
answers as it does on one machine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.execution.localproc import pid_alive
from orchestrator.lab.nshosts import (
    NetnsSshdHost,
    cleanup_stale,
    netns_sshd_hosts,
    stale_cleanup_held,
)
from orchestrator.lab.sdhosts import REPO
from orchestrator.lab.sshd import session_env
from tests.hosts.prereq import require_netns, require_sshd
from tests.support.campaign_lab import TIME_SCALE, cli_json
from tests.support.deployment_lab import two_node_pair

pytestmark = pytest.mark.sshd

REACH = (
    "python3 -c \"import socket; socket.create_connection(('{}', {}), timeout=5); "
    "print('reached')\""
)


def netns_of(host: NetnsSshdHost) -> str:
    return host.endpoint.ssh_run("readlink /proc/self/ns/net", check=True).stdout.strip()


def test_two_hosts_each_in_a_network_of_its_own_reach_each_other(
    netns_hosts: list[NetnsSshdHost],
) -> None:
    a, b = netns_hosts
    ours = Path("/proc/self/ns/net").readlink().as_posix()
    # every session runs inside its host's namespace, not this machine's
    assert len({ours, netns_of(a), netns_of(b)}) == 3
    assert a.address != b.address
    # each reaches the other's address over TCP (through the routes between them) ...
    for src, dst in ((a, b), (b, a)):
        out = src.endpoint.ssh_run(REACH.format(dst.address, dst.endpoint.port), check=True)
        assert "reached" in out.stdout, out
    # ... and a port listened on in one namespace is free in the other: a listener on
    # a's loopback is not b's
    listen = (
        "python3 -c \"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 23456)); "
        "s.listen(); print('listening', flush=True); time.sleep(30)\""
    )
    with subprocess.Popen(
        a.endpoint.ssh_command(listen), stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None and "listening" in child.stdout.readline()
            assert "reached" in a.endpoint.ssh_run(REACH.format("127.0.0.1", 23456)).stdout
            refused = b.endpoint.ssh_run(REACH.format("127.0.0.1", 23456))
            assert refused.returncode != 0 and "ConnectionRefusedError" in refused.stderr
        finally:
            child.kill()


#: a server a session leaves running in its own session, as the process manager does;
#: waited for until it is `sleep` (the shell's child execs setsid, which execs sleep, a
#: moment after the shell returns: a busy machine once showed the shell's fork instead)
LEAVE_A_SLEEPER = (
    "setsid sleep 600 </dev/null >/dev/null 2>&1 & p=$!; "
    "for i in $(seq 200); do grep -qx sleep /proc/$p/comm && break; sleep 0.05; done"
)


def test_teardown_removes_every_trace_also_of_what_runs_there() -> None:
    require_sshd()
    require_netns()
    with netns_sshd_hosts(2, env=session_env(REPO)) as hosts:
        names = [h.netns.name for h in hosts]
        veths = [h.netns.veth for h in hosts]
        addresses = [h.address for h in hosts]
        sshds = [h.sshd_pid for h in hosts]
        dirs = [h.dir for h in hosts]
        # a server a session left running in its own session, as the process manager does
        hosts[0].endpoint.ssh_run(LEAVE_A_SLEEPER, check=True)
        left = hosts[0].processes()
        assert [line for _, line in left] == ["sleep 600"], left
        assert hosts[1].processes() == []
        assert all(p is not None and Path(f"/proc/{p}").exists() for p in sshds)
    assert all(not Path("/run/netns", n).exists() for n in names)
    assert all(not Path("/sys/class/net", v).exists() for v in veths)
    assert all(p is not None and not pid_alive(p) for p in sshds)
    assert all(not pid_alive(pid) for pid, _ in left)  # a zombie waits for init: gone
    assert all(not d.exists() for d in dirs)
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    addr = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    for a in addresses:
        net = re.escape(a.rsplit(".", 1)[0]) + r"\."
        assert not re.search(net, routes + addr), (a, routes, addr)


def test_two_node_pair_across_the_namespaces(
    netns_hosts: list[NetnsSshdHost], tmp_path: Path
) -> None:
    entries = {
        f"n{i}": h.endpoint.hosts_entry(
            run_dir=str(tmp_path / f"run-n{i}"), env={"ORCH_LAB_TIME_SCALE": TIME_SCALE}
        )
        for i, h in enumerate(netns_hosts)
    }
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    # rank 1 reaches rank 0's init address on rank 0's host, across the namespaces
    good, bad = two_node_pair(tmp_path, init_host=netns_hosts[0].address)
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts]
    code, out = cli_json(*argv, "--results", tmp_path / "results", "--no-report")
    assert code == 0, out
    assert [c["flags"] for c in out["culprits"]] == [["--enable-nccl-nvls"]], out
    assert out["target"].startswith("cuda_graph: cublas: CUBLAS_STATUS_EXECUTION_FAILED")
    assert all(h.processes() == [] for h in netns_hosts)


def test_a_rank_that_serves_no_port_is_not_held_to_rank0s_port_on_its_host(
    netns_hosts: list[NetnsSshdHost], tmp_path: Path
) -> None:
    """Only rank 0 serves HTTP (SGLang's other ranks, vLLM's `--headless` ones): a rank
    that names no port listens on none, so a server not ours on rank 0's port number on
    rank 1's host is no conflict of the deployment's."""
    entries = {
        f"n{i}": h.endpoint.hosts_entry(
            run_dir=str(tmp_path / f"run-n{i}"), env={"ORCH_LAB_TIME_SCALE": TIME_SCALE}
        )
        for i, h in enumerate(netns_hosts)
    }
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(yaml.safe_dump({"hosts": entries}, sort_keys=False))
    good, _ = two_node_pair(tmp_path, init_host=netns_hosts[0].address)
    doc = yaml.safe_load(good.read_text())
    doc["roles"]["node1"]["flags"]["port"] = None  # rank 1 serves nothing
    good.write_text(yaml.safe_dump(doc, sort_keys=False))
    port = doc["roles"]["node0"]["flags"]["port"]
    listen = (
        'python3 -c "import socket, time; s = socket.socket(); '
        f"s.bind(('0.0.0.0', {port})); s.listen(); print('listening', flush=True); "
        'time.sleep(120)"'
    )
    with subprocess.Popen(
        netns_hosts[1].endpoint.ssh_command(listen), stdout=subprocess.PIPE, text=True
    ) as other:
        try:
            assert other.stdout is not None and "listening" in other.stdout.readline()
            argv = ["run", good, "--host", "n0", "--hosts", hosts]
            code, out = cli_json(*argv, "--results", tmp_path / "results")
        finally:
            other.kill()
    assert code == 0, out
    assert out["verdict"] == "pass", out


KILLED_OWNER = """
import sys
from orchestrator.lab.nshosts import netns_sshd_hosts
from orchestrator.lab.sdhosts import REPO
from orchestrator.lab.sshd import session_env
with netns_sshd_hosts(2, env=session_env(REPO)) as hosts:
    hosts[1].endpoint.ssh_run(sys.argv[1], check=True)  # LEAVE_A_SLEEPER
    print(" ".join(f"{h.netns.name},{h.netns.veth},{h.sshd_pid},{h.dir}" for h in hosts))
    sys.stdout.flush()
    sys.stdin.read()
"""


def test_what_a_killed_session_left_is_removed_by_the_next() -> None:
    require_sshd()
    require_netns()
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_OWNER, LEAVE_A_SLEEPER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    ) as owner:
        try:
            assert owner.stdout is not None
            left = [w.split(",") for w in owner.stdout.readline().split()]
        except BaseException:
            owner.kill()
            raise
        # no other test worker's set-up may clean up after the killed owner before the
        # leftovers are looked at (the owner's own set-up took the lock: it is done now)
        with stale_cleanup_held():
            owner.kill()  # no teardown runs
            owner.wait(timeout=30)
            assert len(left) == 2, left
            names = [n for n, _, _, _ in left]
            assert all(Path("/run/netns", n).exists() for n in names)
            sleepers = [
                p.parent.name
                for p in Path("/proc").glob("[0-9]*/cmdline")
                if _read(p) == b"sleep\x00600\x00" and _netns_name(p.parent.name) in names
            ]
            assert sleepers  # the server the session left running in its namespace
    cleanup_stale()
    for name, veth, sshd, state in left:
        assert not Path("/run/netns", name).exists()
        assert not Path("/sys/class/net", veth).exists()
        assert not pid_alive(int(sshd))
        assert not Path(state).exists()
    assert all(not pid_alive(int(p)) for p in sleepers)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _netns_name(pid: str) -> str | None:
    """The name of the namespace `pid` runs in (`ip netns identify`), if it has one."""
    res = subprocess.run(["ip", "netns", "identify", pid], capture_output=True, text=True)
    return res.stdout.strip() or None
