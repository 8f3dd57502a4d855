"""A deployment's run judged role by role (orchestrator/execution/roles.py), pure: the lab
server's recorded two-node logs (tests/data/multinode/) as each role's evidence, the
hosts' clocks and time zones put on one clock, and the record every reader of a run takes.
The same judgement on real hosts is in tests/test_deployment_sshd.py."""

from __future__ import annotations

from dataclasses import replace
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


def _silent_rank1(**kw: object) -> RoleOutcome:
    """Rank 1 silent in graph capture: its recorded log up to the line it hung after, the
    process still running when the run ended."""
    lines = (DATA / "rank1_cublas.rank1.log").read_text(encoding="utf-8").splitlines()
    text = "\n".join(lines[:18]) + "\n"
    return RoleOutcome(
        role=Role("node1", "node", rank=1),
        host=HOSTS[1],
        unit="lab-node1.service",
        evidence=RunEvidence(log_tail=text, timed_out=True),
        **kw,  # type: ignore[arg-type]
    )


def test_a_rank_silent_when_anothers_watchdog_ended_the_run_never_says_deadline() -> None:
    """Rank 0's watchdog ended the run 13 s into a 60 s deadline while rank 1 was silent in
    graph capture: rank 1 is the one rank 0 waited for, and its hang says the run ended
    when another role failed, never that the deadline passed."""
    roles = [outcome("rank1_cublas", 0), _silent_rank1(cut_short=True)]
    got = judge_roles(roles, target=None, answers=None, health_role="node0")
    assert got.first_failure is not None and got.first_failure["role"] == "node1"
    assert got.signature is not None and got.signature.error_class == "hang"
    assert "deadline" not in got.signature.message, got.signature
    assert got.signature.message.startswith("no readiness when another role failed after '")
    assert got.detail.endswith("node0 then timed out in a collective"), got.detail
    # at the deadline itself (no role ended the run) the same hang says the deadline
    at_deadline = judge_roles(
        [outcome("rank1_cublas", 0), _silent_rank1()],
        target=None,
        answers=None,
        health_role="node0",
    )
    assert at_deadline.signature is not None
    assert at_deadline.signature.message.startswith("no readiness before the deadline")


def test_two_ranks_silent_alike_name_no_first_role_in_any_reader() -> None:
    """Both ranks still running at the deadline, their logs ending on the same line: the
    record names no role first, and the answer says the order cannot be told."""
    from orchestrator.reports.deployment_view import CampaignDeployment, of_record, role_lines

    rank0 = replace(_silent_rank1(), role=Role("node0", "node", rank=0), host=HOSTS[0])
    got = judge_roles([rank0, _silent_rank1()], target=None, answers=None, health_role="node0")
    assert got.first_failure is not None
    assert [t["role"] for t in got.first_failure["tied"]] == ["node0", "node1"]
    assert "cannot be told" in got.detail and "then hung" not in got.detail, got.detail
    record = {
        "manager": "deployment",
        "roles": [r.to_record() for r in got.roles],
        "first_failure": got.first_failure,
    }
    dep = of_record(record)
    assert dep is not None and dep.first_role is None
    assert dep.first_failure == (
        "node0 on b300-01 or node1 on b300-02 (which one first cannot be told)"
    )
    assert not any("<- failed first" in line for line in role_lines(dep))
    line = CampaignDeployment(dep.roles, {"c.1": dep}, ("c.1", dep)).answer_line()
    assert line is not None and "happens first on" not in line
    assert line.startswith("the target failure: which role failed first cannot be told (run c.1)")
    assert dep.to_json()["first_failure"]["tied"] == [
        {"role": "node0", "host": "b300-01"},
        {"role": "node1", "host": "b300-02"},
    ]
