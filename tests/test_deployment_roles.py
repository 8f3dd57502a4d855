"""A deployment's run judged role by role (orchestrator/execution/roles.py), pure: the lab
server's recorded two-node logs (tests/data/multinode/) as each role's evidence, the
hosts' clocks and time zones put on one clock, and the record every reader of a run takes.
The same judgement on real hosts is in tests/test_deployment_sshd.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.deployment import Role
from orchestrator.diagnosis.classify.judge import RunEvidence
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.execution import answers as answers_mod
from orchestrator.execution.roles import RoleOutcome, judge_roles, offset_command, parse_now
from orchestrator.execution.roles import poll_sections as _sections

DATA = Path(__file__).parent / "data" / "multinode"
HOSTS = {0: "b300-01", 1: "b300-02"}
RECORD_KEYS = {
    "role",
    "kind",
    "rank",
    "host",
    "unit",
    "verdict",
    "signature",
    "failed_at",
    "clock_offset",
    "log_tail",
    "rendered",
    "invocation",
}


def outcome(pair: str, rank: int, **kw: object) -> RoleOutcome:
    text = (DATA / f"{pair}.rank{rank}.log").read_text(encoding="utf-8")
    return RoleOutcome(
        role=Role(f"node{rank}", "node", rank=rank),
        host=HOSTS[rank],
        unit=f"lab-node{rank}.service",
        evidence=RunEvidence(log_tail=text, exit_code=1),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("pair", "failing", "error_class"),
    [
        ("rank1_cublas", 1, "cublas"),
        ("rank0_oom", 0, "cuda_oom"),
    ],
)
@pytest.mark.parametrize("reverse", [False, True])
def test_the_crash_names_the_run_in_any_order(
    pair: str, failing: int, error_class: str, reverse: bool
) -> None:
    roles = [outcome(pair, 0), outcome(pair, 1)]
    got = judge_roles(
        roles[::-1] if reverse else roles, target=None, answers=None, health_role="node0"
    )
    assert got.verdict is Verdict.FAIL
    assert got.signature is not None and got.signature.error_class == error_class
    assert got.host == HOSTS[failing]
    assert got.first_failure is not None and got.first_failure["role"] == f"node{failing}"
    assert got.detail.startswith(f"node{failing} on {HOSTS[failing]}: ")
    assert got.detail.endswith("then timed out in a collective")
    assert got.log_tail == roles[failing].evidence.log_tail
    records = [r.to_record() for r in got.roles]
    assert all(set(r) == RECORD_KEYS for r in records)
    other = next(r for r in records if r["role"] == f"node{1 - failing}")
    assert str(other["signature"]).split("|")[1] == "nccl_timeout"
    assert other["failed_at"] is not None


def test_log_stamps_are_read_in_their_hosts_time_zone() -> None:
    """Rank 0's host stamps its log in local time two hours ahead of UTC: its watchdog's
    lines were written two hours before rank 1's crash, which came in its teardown; read
    as UTC, the crash would look first."""
    roles = [outcome("rank1_cublas", 0, utc_offset=7200.0), outcome("rank1_cublas", 1)]
    got = judge_roles(roles, target=None, answers=None, health_role="node0")
    assert got.first_failure is not None and got.first_failure["role"] == "node0"
    same_zone = judge_roles(
        [outcome("rank1_cublas", 0), outcome("rank1_cublas", 1)],
        target=None,
        answers=None,
        health_role="node0",
    )
    assert same_zone.first_failure is not None and same_zone.first_failure["role"] == "node1"


def test_a_role_whose_host_failed_makes_the_run_infra() -> None:
    roles = [
        outcome("rank1_cublas", 0),
        RoleOutcome(
            role=Role("node1", "node", rank=1),
            host=HOSTS[1],
            unit="lab-node1.service",
            evidence=RunEvidence(),
            absent="its host failed: connection refused",
            infra=True,
        ),
    ]
    got = judge_roles(roles, target=None, answers=None, health_role="node0")
    assert got.verdict is Verdict.INFRA and got.signature is None
    assert got.detail.startswith("node1 on b300-02 never joined (its host failed")
    assert got.roles[1].verdict == "absent"


def test_a_ready_deployment_that_completes_nothing_fails() -> None:
    ok = RunEvidence(log_tail="", became_ready=True)
    roles = [
        RoleOutcome(Role("router", "router"), "h", "r.service", ok),
        RoleOutcome(Role("prefill", "prefill"), "h", "p.service", ok),
    ]
    passed = judge_roles(roles, target=None, answers=None, health_role="router")
    assert passed.verdict is Verdict.PASS and passed.first_failure is None
    hung = {"ready": False, "error": "timed out", "sets": {}}
    got = judge_roles(roles, target=None, answers=hung, health_role="router")
    assert got.verdict is Verdict.FAIL and got.signature == answers_mod.NO_COMPLETION
    assert "no completion returned: timed out" in got.detail


def test_the_host_clock_read_and_a_combined_poll_cut_by_role() -> None:
    assert parse_now("x\n@@NOW 1764892800.250000000 +0130\n") == (1764892800.25, 5400.0)
    assert parse_now("@@NOW 1764892800.5 -0800") == (1764892800.5, -28800.0)
    assert parse_now("date: invalid") is None
    assert "date +%s.%N" in offset_command() and "date +%z" in offset_command()
    text = "@@NOW 1 +0000\n@@R node0\n@@STATE alive\n@@R node1\n@@STATE dead 1\nlog line\n"
    assert _sections(text, "@@R") == {
        "node0": "@@STATE alive",
        "node1": "@@STATE dead 1\nlog line\n",
    }
