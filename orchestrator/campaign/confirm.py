"""Confirming a bisection's answer: the variants that decide it started again (`--repeat`),
and good + each culprit set started on the real weights after a search on dummy ones.

Both receive the campaign's runs and its dispatch loop (`drive`, `Bisection._drive`).
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.campaign import rehearsal
from orchestrator.campaign.pool import Pool
from orchestrator.campaign.records import Outcome
from orchestrator.campaign.runs import BisectionRuns
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.planner import Answer
from orchestrator.store.store import RunRow

#: the dispatch loop: verdicts for what `wanted()` names, until it names none
Drive = Callable[..., str | None]


def confirm_sets(
    runs: BisectionRuns, drive: Drive, pool: Pool, outcome: Outcome
) -> tuple[dict[str, str], str | None]:
    """Good + each culprit set on real weights, started until it fails with the target
    (as many starts as its rate on dummy weights needs to show once at the confidence
    asked). Returns the confirming run per set and, if one did not, what it showed."""
    dummy = [r for r in runs.all_rows() if r.weights == "dummy"]
    confirmed: dict[str, str] = {}
    for c in outcome.culprits:
        v = tuple(sorted(c.indices))
        # its rate on dummy weights: every resolved run that carries the set
        got = [
            runs.relative(r.verdict, r.signature, runs.target)
            for r in dummy
            if set(v) <= set(r.variant)
        ]
        got = [x for x in got if x.resolved]
        attempts = rehearsal.confirm_attempts(
            sum(x is Verdict.FAIL for x in got), len(got), rate_cap=rehearsal.CHECK_RATE
        )

        def starts(v: tuple[int, ...] = v) -> list[RunRow]:
            return [r for r in runs.rows() if r.variant == v and r.verdict is not Verdict.INFRA]

        def hit(r: RunRow) -> bool:
            return runs.relative(r.verdict, r.signature, runs.target) is Verdict.FAIL

        def want(v: tuple[int, ...] = v, most: int = attempts) -> list[tuple[int, ...]]:
            got = starts(v)
            return [] if any(map(hit, got)) or len(got) >= most else [v]

        drive(
            pool,
            want,
            lambda v, row: None,
            target=runs.target,
            purpose=lambda v: "confirm",
            fresh_runs=lambda v: bool(starts(v)),
        )
        got = starts(v)
        ok = next((r for r in got if hit(r)), None)
        flags = " + ".join(c.flags)
        if ok is None:
            shown = "; ".join(sorted({rehearsal.shown(r) for r in got})) or "no verdict"
            return confirmed, f"good + {flags}: {shown} on {len(got)} start(s)"
        confirmed[flags] = ok.id
    return confirmed, None


def repeat(runs: BisectionRuns, drive: Drive, pool: Pool, answer: Answer, times: int) -> list[str]:
    """Run the variants that decide the answer again (`times` starts in all); report any that
    disagree."""
    expected: dict[tuple[int, ...], Verdict] = {
        (): Verdict.PASS,
        tuple(range(runs.plan.n)): Verdict.FAIL,
    }
    for c in answer.culprits:
        expected[tuple(sorted(c.reproduced_by))] = Verdict.FAIL
        for _, v in c.cleared_by:
            expected[tuple(sorted(v))] = Verdict.PASS

    def repeats(v: tuple[int, ...]) -> list[RunRow]:
        # (a repeat that was repaired speaks through its repaired start)
        return [
            r
            for r in runs.rows()
            if r.variant == v
            and runs.first_purpose(r) == "repeat"
            and r.verdict is not Verdict.INFRA
        ]

    drive(
        pool,
        lambda: [v for v in expected if len(repeats(v)) < times - 1],
        lambda v, row: None,
        target=runs.target,
        purpose=lambda v: "repeat",
        fresh_runs=True,
        reuse=False,
    )
    flaky: list[str] = []
    for v, want in expected.items():
        for r in repeats(v):
            got = runs.relative(r.verdict, r.signature, runs.target)
            if (got is Verdict.FAIL) != (want is Verdict.FAIL):
                flaky.append(
                    f"{r.label}: {got.value} on repeat (run {r.id}), expected {want.value}"
                )
    return flaky


__all__ = ["Drive", "confirm_sets", "repeat"]
