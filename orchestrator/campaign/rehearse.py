"""A bisection rehearsed on dummy weights: its course (the pure helpers are
`campaign/rehearsal.py`).

The bad config on real weights fixes the target; then on dummy weights. When that shows
the target too, the search runs on dummy weights and its answer is called found only once
good + each culprit set fails with the target on real weights. The course receives the
campaign's runs and, as callables, what it drives: the search (endpoints to an outcome),
the confirmation of an outcome's culprit sets, and the dispatch loop.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.campaign import flaky, rehearsal
from orchestrator.campaign.confirm import Drive
from orchestrator.campaign.pool import Pool
from orchestrator.campaign.records import Outcome
from orchestrator.campaign.runs import BisectionRuns
from orchestrator.diagnosis.verdicts import Signature, Verdict
from orchestrator.events import Listener, Notice
from orchestrator.store.store import RunRow

#: the search from the endpoints to an outcome, on the weights the runs are read on now
SearchFn = Callable[[Pool], Outcome]
#: good + each culprit set of an outcome on the weights now: the confirming run per set
#: and, if one did not confirm, what it showed
ConfirmFn = Callable[[Pool, Outcome], tuple[dict[str, str], str | None]]


class Rehearsal:
    """The course of a rehearsal on dummy weights, and the weights a campaign searched on
    (`weights_summary`, said for every campaign)."""

    def __init__(
        self,
        runs: BisectionRuns,
        *,
        emit: Listener,
        host: str,
        search: SearchFn,
        confirm: ConfirmFn,
        drive: Drive,
        reused: Callable[[], int],
    ) -> None:
        self.runs = runs
        self.emit = emit
        #: the host notices are said on (the pool's first)
        self.host = host
        self.search = search
        self.confirm = confirm
        #: the dispatch loop (`Bisection._drive`)
        self.drive = drive
        self.reused = reused
        #: what the course said and did, for the outcome's weights summary
        self.note: dict[str, object] = {}

    def run(self, pool: Pool) -> Outcome:
        """The bad config on real weights (the target), then on dummy weights: when that
        shows the target too, the search runs on dummy weights and its answer is called
        found only once good + each culprit set fails with the target on real weights;
        otherwise (a failure of the checkpoint's values) the search runs on real weights."""
        runs = self.runs
        why = rehearsal.refused(runs.real_plan)
        if why:
            self.say(f"no rehearsal on dummy weights: {why}", rehearsal="refused")
            return self.search(pool)
        full = tuple(range(runs.plan.n))
        bad, stop = self.bad_until_target(pool, target=None)
        if bad is None or bad.verdict is not Verdict.FAIL or bad.signature is None:
            return self.search(pool)  # stopped, or the bad config does not fail: as ever
        if runs.target is None:
            runs.target = bad.signature
            runs.store.update_campaign(runs.cid, target=runs.target)
        real = flaky.counts(flaky.bad_starts(runs.rows(), full), runs.target, runs.relative)
        seen = real.get(full)
        runs.use("dummy")
        # as many dummy starts as a failure of the bad config's rate needs to show once
        attempts = rehearsal.check_attempts(seen.fails if seen else 1, seen.runs if seen else 1)
        check, stop = self.bad_until_target(pool, target=runs.target, attempts=attempts)
        if stop:
            runs.use("real")
            return self.search(pool)
        starts = flaky.bad_starts(runs.rows(), full)
        if (
            check is None
            or runs.relative(check.verdict, check.signature, runs.target) is not Verdict.FAIL
        ):
            shown = "; ".join(sorted({rehearsal.shown(r) for r in starts})) or "no verdict"
            self.say(
                f"the target failure does not show with dummy weights ({shown} on "
                f"{len(starts)} start(s)); it needs the real weights: the search runs "
                f"on real weights",
                rehearsal="not reproduced",
                check_run=starts[-1].id if starts else None,
            )
            runs.use("real")
            return self.search(pool)
        self.say(
            f"the target failure shows with dummy weights too [run {check.id}]: the "
            "search runs on dummy weights; the answer is confirmed on real weights",
            rehearsal="reproduced",
            check_run=check.id,
        )
        outcome = self.search(pool)
        if not outcome.found:
            return outcome
        runs.use("real")
        confirmed, missed = self.confirm(pool, outcome)
        outcome.runs_executed, outcome.runs_reused = runs.executed, self.reused()
        if missed is None:
            self.note["confirmed_by"] = confirmed
            self.say(
                "the answer holds on real weights: "
                + ", ".join(
                    f"good + {flags} fails with the target [run {rid}]"
                    for flags, rid in confirmed.items()
                ),
                rehearsal="confirmed",
            )
            return outcome
        self.say(
            f"the answer found on dummy weights does not hold on real weights: "
            f"{missed}; the search runs on real weights",
            rehearsal="not confirmed",
        )
        return self.search(pool)

    def say(self, message: str, **note: object) -> None:
        self.note.update(note)
        self.note["note"] = message
        self.emit(Notice(host=self.host, message=message))

    def bad_until_target(
        self,
        pool: Pool,
        *,
        target: Signature | None,
        attempts: int = flaky.BAD_ATTEMPTS,
    ) -> tuple[RunRow | None, str | None]:
        """Start the bad config until it fails (with `target`, when given), at most
        `attempts` starts; the failing start, else the last, and why it stopped early."""
        runs = self.runs
        full = tuple(range(runs.plan.n))

        def starts() -> list[RunRow]:
            return flaky.bad_starts(runs.rows(), full)

        def hit(r: RunRow) -> bool:
            return runs.relative(r.verdict, r.signature, target) is Verdict.FAIL

        def want() -> list[tuple[int, ...]]:
            got = starts()
            return [] if any(map(hit, got)) or len(got) >= attempts else [full]

        stop = self.drive(
            pool,
            want,
            lambda v, row: None,
            target=target,
            purpose=lambda v: "endpoint" if target is None else "rehearsal",
            fresh_runs=lambda v: bool(starts()),
        )
        got = starts()
        return next((r for r in got if hit(r)), got[-1] if got else None), stop

    def weights_summary(self) -> dict[str, object]:
        runs = self.runs
        executed = [r for r in runs.all_rows() if r.cached_from is None]
        out: dict[str, object] = {
            "search": runs.weights if self.note.get("rehearsal") != "confirmed" else "dummy",
            "real_starts": sum(1 for r in executed if r.weights == "real"),
            "dummy_starts": sum(1 for r in executed if r.weights == "dummy"),
        }
        return out | self.note


__all__ = ["Rehearsal"]
