"""The answer of a bisection, read from its recorded runs: culprits backed by runs,
findings, invalid variants, and contradictions.

Pure: a `CampaignAnswer` is taken over the runs that speak for their variants at one
moment (`Bisection._answer()`); every evidence line cites a run of exactly the variant it
describes, with the verdict it claims, and a recorded run the answer cannot explain is a
contradiction that keeps it from being `found`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.campaign import answers_check
from orchestrator.campaign.planning import Plan
from orchestrator.campaign.records import Culprit, Finding, InvalidRun, Narrowed, Outcome, Status
from orchestrator.diagnosis.verdicts import Signature, Verdict
from orchestrator.planner import Answer
from orchestrator.planner.strategies import CLEARING
from orchestrator.store.store import RunRow

#: a recorded verdict re-read against the campaign's target (`verdicts.relative`, bound)
Relative = Callable[[Verdict, Signature | None, Signature | None], Verdict]


@dataclass(frozen=True)
class CampaignAnswer:
    """The answer as the runs that speak for their variants give it (`rows`, oldest first)."""

    cid: str
    plan: Plan
    rows: list[RunRow]
    target: Signature | None
    relative: Relative
    #: the confidence asked (`--confidence`)
    confidence: float
    executed: int
    reused: int
    #: the repair moves a run carried, described (`BisectionRuns.moves_of`)
    moves_of: Callable[[RunRow], list[str]]

    def conclude(self, answer: Answer, flaky: list[str]) -> Outcome:
        flaky = flaky + self.answers_noise()
        culprits = []
        unbacked: list[str] = []
        for c in answer.culprits:
            flags = [self.plan.deltas[i].short() for i in sorted(c.deltas)]
            # Every evidence line cites a run of exactly the variant it describes, with
            # the verdict it claims; a claim without such a run is not evidence.
            rep = self.run_of(c.reproduced_by, fails=True)
            cleared: dict[str, str | None] = {}
            claims: dict[str, str] = {}
            for i, v in c.cleared_by:
                row = self.run_of(v, fails=False)
                cleared[self.plan.deltas[i].short()] = row.id if row else None
                if row is not None:
                    claims[self.plan.deltas[i].short()] = self.clear_claim(i, v, row)
            confirmed = (
                c.confirmed
                and rep is not None
                and c.reproduced_by == c.deltas
                and len(claims) == len(c.deltas)
            )
            if not confirmed:
                unbacked.append(" + ".join(flags))
            culprits.append(
                Culprit(
                    deltas=[self.plan.deltas[i].describe() for i in sorted(c.deltas)],
                    flags=flags,
                    indices=sorted(c.deltas),
                    interacting=len(c.deltas) > 1,
                    reproduced_by=rep.id if rep else None,
                    cleared_by=cleared,
                    clearing=claims,
                    confirmed=confirmed,
                    whats=[self.plan.deltas[i].what for i in sorted(c.deltas)],
                    repaired_with=self.moves_of(rep) if rep is not None else [],
                )
            )
        # A noise-aware answer stands on its posterior (its confidence reached what was
        # asked): its evidence lines cite the runs there are, and misses are expected.
        contradictions = self.contradictions(
            [c.deltas for c in answer.culprits], misses=answer.noise_aware
        )
        status = (
            Status.FOUND
            if (
                answer.culprits
                and answer.complete
                and (answer.noise_aware or not unbacked)
                and not contradictions
            )
            else Status.INCOMPLETE
        )
        message = ""
        sure = answer.confidence is None or answer.confidence >= self.confidence
        if (
            answer.culprits
            and answer.noise_aware
            and not contradictions
            and (status is Status.INCOMPLETE or not sure)
        ):
            # a best answer that has not reached the confidence asked (its budget ended)
            status = Status.UNSURE
        elif status is Status.FOUND and not sure:
            status = Status.UNSURE
        if status is Status.UNSURE:
            message = (
                f"the best answer is {answer.confidence or 0:.3f} likely to be right, "
                f"below the {self.confidence:g} asked"
                + (f" ({answer.reason})" if answer.reason else "")
            )
            for cul in culprits:  # "confirmed" only at the confidence asked
                cul.confirmed = False
        elif status is not Status.FOUND:
            message = answer.reason or (
                "no evidence run backs " + ", ".join(unbacked)
                if unbacked
                else "the recorded runs contradict the answer (flaky?): "
                + "; ".join(contradictions[:3])
            )
        return Outcome(
            self.cid,
            status,
            message=message,
            target=self.target,
            culprits=culprits,
            findings=self.findings(),
            invalid=self.invalid(),
            runs_executed=self.executed,
            runs_reused=self.reused,
            flaky=flaky,
        )

    def answers_line(self) -> str:
        """With an answers check, what the answer says of it: the rule, good's run, and
        what bad's answers were under it and a stricter rule ('' without a check)."""
        check = self.plan.bad.answers
        if check is None or not answers_check.judged(self.plan.bad):
            return ""
        full = tuple(range(self.plan.n))
        goods = [
            r for r in self.rows if r.variant == () and r.answers and r.verdict is Verdict.PASS
        ]
        bads = [r for r in self.rows if r.variant == full and r.answers]
        return answers_check.rule_line(
            check, goods[-1] if goods else None, bads[-1] if bads else None
        )

    def answers_noise(self) -> list[str]:
        """What the good config's self-comparison of its answers said, when it disagreed
        with itself (campaign/answers_check): the host's own noise, said with the answer."""
        out = []
        for r in self.rows:
            passed = r.variant == () and r.verdict is Verdict.PASS  # a crash is no noise
            noise = (r.answers or {}).get("noise") if passed else None
            said = answers_check.noise_message(noise, r.id) if noise else None
            if said and said not in out:
                out.append(said)
        return out

    def incomplete(self, why: str) -> Outcome:
        verdicts = self.verdicts()
        fails = [v for v, x in verdicts.items() if x is Verdict.FAIL]
        passes = [v for v, x in verdicts.items() if x is Verdict.PASS]
        smallest = min(fails, key=len) if fails else tuple(range(self.plan.n))
        largest = max(passes, key=len) if passes else ()
        narrowed = Narrowed(
            [self.plan.deltas[i].describe() for i in smallest],
            [self.plan.deltas[i].describe() for i in largest],
        )
        return Outcome(
            self.cid,
            Status.INCOMPLETE,
            message=f"stopped before an answer: {why}",
            target=self.target,
            runs_executed=self.executed,
            runs_reused=self.reused,
            narrowed=narrowed,
            findings=self.findings(),
            invalid=self.invalid(),
        )

    def at_endpoints(self, message: str) -> Outcome:
        return Outcome(
            self.cid,
            Status.ENDPOINTS,
            message=message,
            target=self.target,
            runs_executed=self.executed,
            runs_reused=self.reused,
            findings=self.findings(),
        )

    def findings(self) -> list[Finding]:
        by_sig: dict[Signature, Finding] = {}
        for r in self.rows:
            verdict = self.relative(r.verdict, r.signature, self.target)
            if verdict not in (Verdict.OTHER, Verdict.TIMEOUT) or r.signature is None:
                continue
            f = by_sig.get(r.signature)
            if f is None:
                by_sig[r.signature] = Finding(r.signature, r.variant, r.id, r.label)
            else:
                f.count += 1
                if len(r.variant) < len(f.variant):
                    f.variant, f.run_id, f.label = r.variant, r.id, r.label
        # a wrong answer names its prompts, as the run that stands for it was judged
        by_id = {r.id: r for r in self.rows}
        for f in by_sig.values():
            f.prompts = answers_check.wrong_prompts(getattr(by_id.get(f.run_id), "answers", None))
        # a failure needs all of its deltas: a pass of a variant that has them all shows
        # that it comes on some starts only
        for f in by_sig.values():
            f.passed = sum(
                1
                for r in self.rows
                if r.verdict is Verdict.PASS and set(f.variant) <= set(r.variant)
            )
        return list(by_sig.values())

    def invalid(self) -> list[InvalidRun]:
        return [
            InvalidRun(r.label, r.id, r.detail) for r in self.rows if r.verdict is Verdict.INVALID
        ]

    def verdicts(self) -> dict[tuple[int, ...], Verdict]:
        out: dict[tuple[int, ...], Verdict] = {}
        for r in self.rows:
            if r.verdict is not Verdict.INFRA:
                out[r.variant] = self.relative(r.verdict, r.signature, self.target)
        return out

    def run_of(self, variant: frozenset[int], *, fails: bool) -> RunRow | None:
        """The newest run of exactly this variant whose verdict backs the claim: the target
        failure (`fails`), or a run that ran without it (pass, other, timeout)."""
        key = tuple(sorted(variant))
        for r in reversed(self.rows):
            if r.variant != key:
                continue
            got = self.relative(r.verdict, r.signature, self.target)
            if (got is Verdict.FAIL) if fails else got in CLEARING:
                return r
        return None

    def clear_claim(self, x: int, variant: frozenset[int], row: RunRow) -> str:
        """What a clearing run shows, worded for the variant it really is."""
        flag = self.plan.deltas[x].short()
        if variant == frozenset(range(self.plan.n)) - {x}:
            what = f"bad without {flag}"
        else:
            what = f"{self.plan.describe(variant)} (without {flag})"
        got = self.relative(row.verdict, row.signature, self.target)
        if got is Verdict.PASS:
            return f"{what} does not fail"
        return f"{what} does not show the target failure ({got.value}: {row.signature})"

    def contradictions(self, sets: list[frozenset[int]], misses: bool = False) -> list[str]:
        """Recorded runs the answer cannot explain: a target failure without any culprit
        set, or a pass with one (a flaky failure, or a cause the search did not see).
        With `misses` (a noise-aware answer) a pass with a culprit set is a miss its
        posterior has weighed, not a contradiction."""
        out: list[str] = []
        for r in self.rows:
            got = self.relative(r.verdict, r.signature, self.target)
            has = any(self.plan.carries(c, r.variant) for c in sets)
            if got is Verdict.FAIL and not has:
                out.append(
                    f"run {r.id} ({r.label}) shows the target failure without any culprit set"
                )
            elif got is Verdict.PASS and has and not misses:
                out.append(f"run {r.id} ({r.label}) passes with a culprit set in it")
        return out


def resource_answer(outcome: Outcome, n: int) -> None:
    """Say what a repair made of bad's own failure, when bad as written fails on a resource
    (the target is always what bad shows as written):

    - a move got bad past it and bad then passed: the failure is a resource failure that
      the change under test brings and the repair avoids; each culprit `needs` the moves
      that made bad pass (`--mem-fraction-static >= 0.89`);
    - the moves found no working value (still a resource failure, or no window between
      two failures): said with both starts, and the answer is not `found` (what bad shows
      with enough of the resource cannot be seen);
    - no move could run: why, and what to set.
    """
    full = list(range(n))
    note = next((r for r in outcome.repairs if r.deltas == full), None)
    if note is None or outcome.target is None or str(outcome.target) not in note.before:
        return
    written = f"bad as written {note.before} [run {note.before_run}]"
    if note.state == "repaired" and note.after == "passed":
        needs = note.needs or note.moves
        for cul in outcome.culprits:
            cul.needs = list(needs)
        outcome.resource = (
            f"a resource failure the repair avoids: {written}; with {', '.join(note.moves)} "
            f"it passed [run {note.after_run}]: the failure needs {', '.join(needs)} to go "
            "away (`--no-repair` bisects the failure alone)"
        )
    elif note.state == "unrepaired" and note.after_run not in (None, note.before_run):
        runs = (
            f"bad as written: run {note.before_run}; with {', '.join(note.moves)}: "
            f"run {note.after_run}"
        )
        said = (
            f"{note.why} [{runs}]"
            if note.why.startswith("no working window")
            else f"no working window found: {written}; with {', '.join(note.moves)} it "
            f"{note.after} [run {note.after_run}]; {note.why}"
        )
        outcome.resource = (
            f"{said}. The answer is that of the failure as written; what bad shows with "
            "enough of the resource cannot be seen"
        )
        if outcome.status is Status.FOUND:
            outcome.status = Status.INCOMPLETE
            outcome.message = outcome.resource
    elif note.state == "unrepaired":
        outcome.resource = (
            f"the target is a resource failure the repair could not address: {written}; "
            f"not repaired: {note.why}"
        )


__all__ = ["CampaignAnswer", "resource_answer"]
