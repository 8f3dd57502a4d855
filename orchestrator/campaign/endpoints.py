"""The endpoint runs of a bisection: good must pass, bad must fail (its failure is the
target); a flaky failure may need several starts of bad to show.
"""

from __future__ import annotations

from orchestrator.campaign import answers_check, flaky, measured
from orchestrator.campaign.runs import BisectionRuns
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.events import Listener, Notice
from orchestrator.store.store import RunRow


class Endpoints:
    """The endpoint runs of a bisection (`Bisection._endpoints`): what the dispatch loop
    is asked to run, and what it hands back."""

    def __init__(self, runs: BisectionRuns, emit: Listener) -> None:
        self.runs = runs
        self.emit = emit
        self.full = tuple(range(runs.plan.n))
        self.ends: dict[tuple[int, ...], RunRow] = {}
        # An `infra` verdict says nothing about the config: the endpoint is wanted again
        # (3 in a row stop the campaign with the resume command, see _note_infra).
        # A probe bar relative to the good config (">= 0.95 * good") judges bad against the
        # good run's metric: good runs first then, and bad's task carries its metric.
        # So are answers: good's are the reference every other run is judged against.
        self.relative_bar = any(
            (
                e.probe is not None
                and e.probe.condition is not None
                and e.probe.condition.relative_to_good
            )
            or answers_check.judged(e)
            for e in (runs.plan.good, runs.plan.bad)
        )

        #: a probe metric measured against good's: bad passing once is a sample, not an
        #: answer, so it is not started again here (the measured search decides)
        self.measured = measured.bar_of(runs.plan.bad) is not None

    def good_failed(self) -> RunRow | None:
        """The good config's endpoint run when it did not pass: it contradicts its role
        whatever bad does, so bad is not started (again) and a run of it in progress
        is cancelled; a failure of the good config is proof, never noise."""
        row = self.ends.get(())
        return row if row is not None and row.verdict is not Verdict.PASS else None

    def wanted(self) -> list[tuple[int, ...]]:
        if self.good_failed() is not None:
            return []
        want = [v for v in ((), self.full) if v not in self.ends]
        return want[:1] if self.relative_bar and () in want else want

    def got(self, v: tuple[int, ...], row: RunRow) -> None:
        runs, full = self.runs, self.full
        written = runs.as_written(row) if v == full else None
        if written is not None:  # it passed only under a repair: its failure as written
            self.ends[v] = written
        elif row.verdict is not Verdict.INFRA:
            if v == full:  # a flaky failure may need several starts of bad to show
                starts = flaky.bad_starts(runs.rows(), full)
                row = next((r for r in starts if r.verdict is Verdict.FAIL), row)
                if (
                    flaky.retry_bad(starts)
                    and not self.unjudgeable()
                    and not self.settled()
                    and not self.measured
                ):
                    self.emit(
                        Notice(
                            host=row.host,
                            message=(
                                f"the bad config passed on start {len(starts)} [run {row.id}]; "
                                f"starting it again (at most {flaky.BAD_ATTEMPTS} starts)"
                            ),
                        )
                    )
                    return
            self.ends[v] = row
            if v == ():
                runs.good_metric = row.probe_metric
                runs.references[runs.weights] = row

    def bad_again(self, v: tuple[int, ...]) -> bool:  # only passes so far: a new start
        return (
            v == self.full
            and not self.measured
            and flaky.retry_bad(flaky.bad_starts(self.runs.rows(), self.full))
            and not self.unjudgeable()
            and not self.settled()
        )

    def settled(self) -> bool:
        """True when bad's last two starts passed its answers check with the very same
        answers, which differ from good's within the rule: the rule passes them, not luck,
        and a start more would answer the same (the answer says what a stricter rule
        would say). Starts that answered as good did may still show a flaky wrong answer."""
        if not answers_check.judged(self.runs.plan.bad):
            return False
        starts = flaky.bad_starts(self.runs.rows(), self.full)
        if len(starts) < 2 or any(r.verdict is not Verdict.PASS for r in starts[-2:]):
            return False
        judged = [((r.answers or {}).get("judged") or {}) for r in starts[-2:]]
        return all(j.get("passed") is True and j.get("differs") for j in judged) and (
            answers_check.same_answers(starts[-2], starts[-1])
        )

    def unjudgeable(self) -> bool:
        """True when bad's answers are to be judged but good answered no prompt: starting
        bad again cannot show the failure the check was meant to find (the campaign says
        why instead of starting bad up to BAD_ATTEMPTS times)."""
        ref = self.runs.references.get(self.runs.weights)
        return (
            ref is not None
            and answers_check.judged(self.runs.plan.bad)
            and answers_check.answered_nothing(ref)
        )


__all__ = ["Endpoints"]
