"""A bisection of a deployment through the command line, on real hosts: two host names on
OpenSSH's sshd at 127.0.0.1, each role a detached lab server of its own.

(a) two nodes where one flag makes node-rank 1 crash in graph capture while rank 0 only
times out in its watchdog: answered with the flag, rank 1's crash and rank 1 named;
(c) the B300 incident's pair spread over two nodes gives the answer it gives on one.
After each campaign every role's service is as found on every host.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.lab.sshd import SshdEndpoint
from orchestrator.store.store import Store
from tests.support.campaign_lab import cli_json, our_processes, read_runs
from tests.support.deployment_lab import two_node_pair, two_sshd_hosts

pytestmark = pytest.mark.sshd


@pytest.fixture
def hosts(sshd: SshdEndpoint, tmp_path: Path) -> Iterator[Path]:
    path = two_sshd_hosts(sshd, tmp_path)
    yield path
    for name in ("n0", "n1"):
        for pid in our_processes(str(tmp_path / f"run-{name}")):
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass


def nothing_left(tmp_path: Path) -> None:
    """No server of ours runs and no launch script or pid file is left on either host."""
    for name in ("n0", "n1"):
        run = tmp_path / f"run-{name}"
        assert our_processes(str(run)) == []
        for svc in run.iterdir() if run.is_dir() else ():
            if svc.is_dir() and svc.name not in ("locks",):
                assert not (svc / "pid").exists() and not (svc / "launch.sh").exists(), svc


def host_records(results: Path, ids: list[str]) -> list[dict]:
    store = Store(results)
    try:
        return [store.host_record(i) or {} for i in ids]
    finally:
        store.close()


def bisect(hosts: Path, tmp_path: Path, good: Path, bad: Path) -> tuple[int, dict]:
    argv = ["bisect", "--good", good, "--bad", bad, "--host", "n0", "--hosts", hosts]
    return cli_json(*argv, "--results", tmp_path / "results", "--no-report")


def test_two_node_pair_names_the_flag_rank1s_crash_and_rank1(hosts: Path, tmp_path: Path) -> None:
    good, bad = two_node_pair(tmp_path)
    code, out = bisect(hosts, tmp_path, good, bad)
    assert code == 0, out
    assert out["status"] == "found"
    assert [c["flags"] for c in out["culprits"]] == [["--enable-nccl-nvls"]], out
    assert out["target"].startswith("cuda_graph: cublas: CUBLAS_STATUS_EXECUTION_FAILED")
    # every failing run names rank 1 on its host, never rank 0's watchdog timeout
    runs = read_runs(tmp_path / "results", out["campaign"])
    failed = [r for r in runs if r.verdict is Verdict.FAIL]
    assert failed and all(r.host == "n1" for r in failed)
    records = host_records(tmp_path / "results", [r.id for r in failed])
    for record in records:
        ff = record["first_failure"]
        assert ff["role"] == "node1" and ff["host"] == "n1", ff
        assert ff["describe"].startswith("node1 on n1: cuda_graph: cublas"), ff
        roles = {x["role"]: x for x in record["roles"]}
        assert roles["node0"]["host"] == "n0" and roles["node0"]["log_tail"]
    nothing_left(tmp_path)
