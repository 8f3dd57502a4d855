"""A deployment's runs on real hosts: two host names on OpenSSH's sshd at 127.0.0.1, each
role a detached lab server of its own (process manager), the ranks meeting over real TCP.

What is proven here: every role installed, started and polled through its own member
executor; the first failure across the roles named with its role and host (node-rank 1's
crash in graph capture, not rank 0's watchdog timeout that follows it); every role's log
tail kept; and every role's service as found after `close()`.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.config import load_experiment
from orchestrator.diagnosis.verdicts import Phase, Verdict
from orchestrator.execution.backends import executor_for
from orchestrator.execution.deployment import DeploymentExecutor, deployment_factory
from orchestrator.lab.sshd import SshdEndpoint
from tests.support.campaign_lab import our_processes
from tests.support.deployment_lab import PD_TP, inventory, pd_files, two_node_pair, two_sshd_hosts

pytestmark = pytest.mark.sshd

#: a role's record, as the readers of a run (show, reports, --json) take it
RECORD_KEYS = (
    "role kind rank host unit verdict signature failed_at clock_offset log_tail rendered invocation"
).split()


@pytest.fixture
def hosts(sshd: SshdEndpoint, tmp_path: Path) -> Iterator[Path]:
    path = two_sshd_hosts(sshd, tmp_path)
    yield path
    for name in ("n0", "n1"):  # nothing of ours may outlive a test
        for pid in our_processes(str(tmp_path / f"run-{name}")):
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except OSError:
                pass


def executor(hosts: Path, exp_path: Path) -> DeploymentExecutor:
    inv = inventory(hosts)
    exp = load_experiment(exp_path)
    make = deployment_factory(executor_for, exp, inv)
    ex = make(inv.host("n0"), "lab-two-node", "c1", lambda e: None)
    assert isinstance(ex, DeploymentExecutor)
    return ex


def test_rank1_crash_is_the_first_failure_and_rank1_is_named(hosts: Path, tmp_path: Path) -> None:
    good, bad = two_node_pair(tmp_path)
    ex = executor(hosts, bad)
    with ex:
        assert {m.site.host.name for m in ex.members} == {"n0", "n1"}
        assert set(ex.offsets) == {"n0", "n1"} and all(abs(o) < 5 for o in ex.offsets.values())
        result = ex.run(load_experiment(bad), run_id="r1")
    assert result.verdict is Verdict.FAIL, result.detail
    assert result.signature is not None
    assert result.signature.error_class == "cublas" and result.signature.phase is Phase.CUDA_GRAPH
    assert result.host == "n1"
    assert result.detail.startswith("node1 on n1: cuda_graph"), result.detail
    assert "CUBLAS_STATUS_EXECUTION_FAILED" in result.log_tail
    rec = result.host_record
    assert rec is not None and rec["manager"] == "deployment"
    assert rec["first_failure"] == {"role": "node1", "host": "n1", "describe": result.detail}
    roles = {r["role"]: r for r in rec["roles"]}  # type: ignore[union-attr]
    assert [r["role"] for r in rec["roles"]] == ["node0", "node1"]  # type: ignore[union-attr]
    assert set(roles["node0"]) == set(RECORD_KEYS)
    assert roles["node1"]["host"] == "n1" and roles["node0"]["host"] == "n0"
    assert roles["node1"]["rank"] == 1 and roles["node1"]["kind"] == "node"
    assert roles["node1"]["unit"] == "lab-node1.service"
    assert "--node-rank 1" in str(roles["node1"]["rendered"])
    assert "Capture cuda graph begin." in str(roles["node0"]["log_tail"])  # rank 0's own
    assert roles["node1"]["failed_at"] is not None
    assert ex.left == [] and ex.left_by_host == {"n0": [], "n1": []}
    assert not our_processes(str(tmp_path / "run-n0")) and not our_processes(
        str(tmp_path / "run-n1")
    )


def test_both_ranks_up_is_a_pass(hosts: Path, tmp_path: Path) -> None:
    good, _ = two_node_pair(tmp_path)
    ex = executor(hosts, good)
    with ex:
        result = ex.run(load_experiment(good), run_id="r1")
    assert result.verdict is Verdict.PASS, result.detail
    assert result.host == "n0"  # the health role's host when nothing failed
    assert result.host_record is not None and result.host_record["first_failure"] is None
    assert ex.left == []


HANG_SCENARIO = """
name: two-node-hang
startup: {init: 0.3, load_weights: 0.5, kv_cache: 0.2, cuda_graph: 0.6, warmup: 0.2}
known_flags: sglang
faults:
  - when: {node-rank: 1, enable-nccl-nvls: true}
    phase: cuda_graph
    effect: hang
"""


def hanging_bad(tmp_path: Path, *, watchdog: float, timeout: str) -> Path:
    """The two-node bad config whose rank 1 hangs without a word in graph capture, rank 0
    waiting for it under a watchdog of `watchdog` seconds, the run's deadline `timeout`."""
    scenario = tmp_path / "hang.yaml"
    scenario.write_text(HANG_SCENARIO)
    _, bad = two_node_pair(tmp_path, watchdog=watchdog)
    doc = yaml.safe_load(bad.read_text())
    doc["service"]["exec"] = f"python3 -m orchestrator.lab.server --scenario {scenario}"
    doc["health"]["timeout"] = timeout
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    return bad


def test_two_ranks_silent_past_the_deadline_are_given_no_invented_order(
    hosts: Path, tmp_path: Path
) -> None:
    """Rank 1 hangs without a word and rank 0 waits for it past the run's deadline (a long
    dist-timeout). Both logs stop at one line: no role is named first, and the run says
    which one the other waited for cannot be told."""
    bad = hanging_bad(tmp_path, watchdog=600, timeout="10s")
    with executor(hosts, bad) as ex:
        result = ex.run(load_experiment(bad), run_id="r1")
    assert result.verdict is Verdict.FAIL, result.detail
    ff = result.host_record["first_failure"]  # type: ignore[index]
    logs = {r["role"]: r["log_tail"] for r in result.host_record["roles"]}  # type: ignore[index]
    last = {role: [x for x in tail.splitlines() if x.strip()][-1] for role, tail in logs.items()}
    assert last["node0"] == last["node1"], last  # both stop at one line of graph capture
    assert [t["role"] for t in ff["tied"]] == ["node0", "node1"], ff
    assert "cannot be told" in result.detail and "then hung" not in result.detail
    assert "no readiness before the deadline" in str(result.signature)
    assert ex.left == []


def test_rank0s_watchdog_ending_the_run_is_not_called_the_deadline(
    hosts: Path, tmp_path: Path
) -> None:
    """A short dist-timeout: rank 0's watchdog ends the run long before the 60 s deadline
    while rank 1 is silent: rank 1 is the one it waited for, and its hang says the run
    ended when another role failed, never that the deadline passed."""
    bad = hanging_bad(tmp_path, watchdog=3, timeout="60s")
    with executor(hosts, bad) as ex:
        result = ex.run(load_experiment(bad), run_id="r1")
    assert result.verdict is Verdict.FAIL, result.detail
    assert result.host == "n1", result.detail
    assert result.signature is not None and result.signature.error_class == "hang"
    assert result.signature.message.startswith("no readiness when another role failed")
    assert "deadline" not in result.detail, result.detail
    assert result.detail.endswith("node0 then timed out in a collective"), result.detail
    assert ex.left == []


PREFILL_DIES_SCENARIO = """
name: pd-prefill-dies
startup: {init: 0.2, load_weights: 0.4, kv_cache: 0.1, cuda_graph: 0.3, warmup: 0.1}
faults:
  - when: {disaggregation-mode: prefill, enable-mixed-chunk: true}
    phase: cuda_graph
    error: "RuntimeError: CUDA error: misaligned address"
"""


def test_roles_up_and_answering_when_prefill_dies_are_never_said_to_hang(
    hosts: Path, tmp_path: Path
) -> None:
    """Prefill crashes in graph capture; decode stays up and healthy, and the router up,
    answering 503 for its missing worker: prefill failed first, and the others are said to
    have stayed up, never to have hung without a word."""
    scenario = tmp_path / "prefill-dies.yaml"
    scenario.write_text(PREFILL_DIES_SCENARIO)
    bad = pd_files(tmp_path, pair=PD_TP)["bad"]
    doc = yaml.safe_load(bad.read_text())
    doc["service"] = {"exec": f"python3 -m orchestrator.lab.server --scenario {scenario}"}
    bad.write_text(yaml.safe_dump(doc, sort_keys=False))
    with executor(hosts, bad) as ex:
        result = ex.run(load_experiment(bad), run_id="r1")
    assert result.verdict is Verdict.FAIL, result.detail
    assert result.detail.startswith("prefill on n0: cuda_graph: "), result.detail
    assert "misaligned address" in result.detail and "hung" not in result.detail, result.detail
    assert "decode stayed up and healthy meanwhile" in result.detail, result.detail
    assert "router stayed up meanwhile (its health check answered 503)" in result.detail
    assert ex.left == []
