"""A deployment's run judged role by role: each role's evidence through the classifier,
each failure put on the controller's clock, and the first failure across the roles
(`orchestrator.diagnosis.first_failure`) as the run's verdict, signature and detail.

Also the clock read that measures a host's offset: `date` on the host, as epoch seconds
and the host's UTC offset (log stamps are the host's local time)."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config.deployment import Role
from orchestrator.diagnosis.classify.analyze import analyze_log
from orchestrator.diagnosis.classify.judge import HANG_MESSAGE, RunEvidence, judge
from orchestrator.diagnosis.first_failure import (
    CUT_SHORT_MESSAGE,
    RoleResult,
    first_failure,
    first_stamp,
)
from orchestrator.diagnosis.verdicts import Signature, Verdict, relative
from orchestrator.execution import answers as answers_mod

NOW_MARK = "@@NOW"
_NOW = re.compile(rf"^{NOW_MARK} (\d+(?:\.\d+)?) ([+-]\d{{4}})\s*$", re.MULTILINE)


def offset_command() -> str:
    """Shell printing `@@NOW <epoch seconds> <UTC offset>` (the host's clock)."""
    return f'echo "{NOW_MARK} $(date +%s.%N) $(date +%z)"'


def parse_now(text: str) -> tuple[float, float] | None:
    """(the host's epoch seconds, its UTC offset in seconds) from `offset_command`'s output."""
    m = _NOW.search(text)
    if m is None:
        return None
    z = m[2]
    tz = (1 if z[0] == "+" else -1) * (int(z[1:3]) * 3600 + int(z[3:5]) * 60)
    return float(m[1]), float(tz)


def parse_offset(text: str) -> float | None:
    """The host's epoch seconds from `offset_command`'s output."""
    got = parse_now(text)
    return None if got is None else got[0]


@dataclass(frozen=True)
class RoleOutcome:
    """What the executor saw of one role in one run."""

    role: Role
    host: str
    unit: str
    evidence: RunEvidence
    #: host clock minus controller clock, seconds
    offset: float = 0.0
    #: the host's UTC offset, seconds (its log stamps are local time)
    utc_offset: float = 0.0
    #: the host's clock when the role was first seen dead
    died_host_time: float | None = None
    absent: str | None = None
    infra: bool = False
    rendered: str | None = None
    invocation: str | None = None
    #: the HTTP status its own health check answered when last polled (0: no answer)
    health_code: int = 0
    #: still running, not ready, when another role's failure ended the run before its
    #: deadline: a silent hang then says so, never "before the deadline"
    cut_short: bool = False


@dataclass(frozen=True)
class RoleRecord:
    """One role's part of the run's record (`host_record["roles"]`)."""

    outcome: RoleOutcome
    verdict: str
    signature: Signature | None
    failed_at: float | None

    def to_record(self) -> dict[str, object]:
        o = self.outcome
        return {
            "role": o.role.name,
            "kind": o.role.kind,
            "rank": o.role.rank,
            "host": o.host,
            "unit": o.unit,
            "verdict": self.verdict,
            "signature": self.signature.key() if self.signature else None,
            "failed_at": self.failed_at,
            "clock_offset": o.offset,
            "log_tail": o.evidence.log_tail,
            "rendered": o.rendered,
            "invocation": o.invocation,
        }


@dataclass(frozen=True)
class Judged:
    """The deployment's run: verdict, signature and detail, the host and log tail that
    name it, every role's record, and the first failure (`role`, `host`, `describe`)."""

    verdict: Verdict
    signature: Signature | None
    detail: str
    host: str | None
    roles: tuple[RoleRecord, ...]
    first_failure: dict[str, Any] | None = None
    log_tail: str = ""


#: a role's verdict when it never joined the run
ABSENT = "absent"


def _judge_one(
    o: RoleOutcome, target: Signature | None
) -> tuple[RoleRecord, RoleResult, Verdict | None]:
    if o.absent is not None:
        rec = RoleRecord(o, ABSENT, None, None)
        return (
            rec,
            RoleResult(o.role.name, o.host, absent=o.absent, infra=o.infra, clock_offset=o.offset),
            None,
        )
    verdict, sig = judge(o.evidence, target)
    if verdict is Verdict.INFRA:
        rec = RoleRecord(o, verdict.value, None, None)
        why = "host trouble during the run"
        return (
            rec,
            RoleResult(o.role.name, o.host, absent=why, infra=True, clock_offset=o.offset),
            verdict,
        )
    if sig is None or verdict is Verdict.PASS:
        return RoleRecord(o, verdict.value, None, None), RoleResult(o.role.name, o.host), verdict
    if o.cut_short and sig.error_class == "hang" and sig.message.startswith(HANG_MESSAGE):
        # the run ended when another role failed, long before the deadline: say that
        sig = Signature(sig.phase, "hang", CUT_SHORT_MESSAGE + sig.message[len(HANG_MESSAGE) :])
        verdict = Verdict.FAIL if target is None or sig == target else Verdict.TIMEOUT
    analysis = analyze_log(o.evidence.log_tail)
    kind = analysis.kind if analysis.signature is not None and analysis.signature == sig else None
    year = time.gmtime(o.died_host_time if o.died_host_time is not None else time.time()).tm_year
    stamp = first_stamp(analysis.excerpt, year) if analysis.excerpt else None
    failed_at = stamp - o.utc_offset if stamp is not None else o.died_host_time
    rec = RoleRecord(o, verdict.value, sig, failed_at)
    result = RoleResult(
        o.role.name,
        o.host,
        signature=sig,
        kind=kind,
        failed_at=failed_at,
        clock_offset=o.offset,
        health_code=o.health_code,
    )
    return rec, result, verdict


def judge_roles(
    outcomes: Sequence[RoleOutcome],
    *,
    target: Signature | None,
    answers: dict[str, object] | None,
    health_role: str,
) -> Judged:
    """The run of a deployment from each role's outcome (in start order)."""
    judged = [_judge_one(o, target) for o in outcomes]
    records = tuple(r for r, _, _ in judged)
    results = [res for _, res, _ in judged]
    verdicts = {o.role.name: v for o, (_, _, v) in zip(outcomes, judged, strict=True)}
    ff = first_failure(results)
    health = next(o for o in outcomes if o.role.name == health_role)
    if ff is None:
        verdict = verdicts.get(health_role) or Verdict.PASS
        sig: Signature | None = None
        detail = ""
        if verdict is Verdict.PASS and answers is not None:
            no_answer = answers_mod.not_ready(answers)
            if no_answer is not None:  # /health passed, yet no real completion returned
                sig = answers_mod.NO_COMPLETION
                verdict = relative(Verdict.FAIL, sig, target)
                detail = no_answer
        return Judged(verdict, sig, detail, health.host, records, None, health.evidence.log_tail)
    winner = next(o for o in outcomes if o.role.name == ff.role)
    detail = ff.describe()
    if ff.infra:
        verdict, sig = Verdict.INFRA, None
    else:
        sig = ff.signature
        own = verdicts.get(ff.role)
        verdict = own if own is not None else relative(Verdict.FAIL, sig, target)
    if any(o.evidence.timed_out for o in outcomes) and not any(
        o.evidence.exit_code is not None or o.absent for o in outcomes
    ):
        detail = "no role died and the deployment was not ready by the deadline; " + detail
    record: dict[str, Any] = {"role": ff.role, "host": ff.host, "describe": ff.describe()}
    if ff.tied:  # the order cannot be told: no role is named as the first
        record["tied"] = [{"role": r.role, "host": r.host} for r in ff.tied]
    return Judged(verdict, sig, detail, ff.host, records, record, winner.evidence.log_tail)


def poll_sections(text: str, mark: str) -> dict[str, str]:
    """A combined poll's output cut at each role's mark: role -> its poll's text."""
    out: dict[str, str] = {}
    current: str | None = None
    lines: list[str] = []
    for line in text.split("\n"):
        if line.startswith(mark + " "):
            if current is not None:
                out[current] = "\n".join(lines)
            current, lines = line[len(mark) + 1 :].strip(), []
        elif current is not None:
            lines.append(line)
    if current is not None:
        out[current] = "\n".join(lines)
    return out
