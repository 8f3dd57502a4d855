"""The search of a bisection: the planner it drives (what the dispatch loop is asked to
run, and the verdicts it hands back), what the search still costs once the failure shows
only on some starts, and what a resumed search would run first.
"""

from __future__ import annotations

from orchestrator.campaign import flaky
from orchestrator.campaign.runs import BisectionRuns
from orchestrator.diagnosis.verdicts import Verdict, relative
from orchestrator.planner import Planner, StrategyFn
from orchestrator.planner.noise_estimate import flaky_runs, observed_rate, remaining_runs
from orchestrator.store.store import RunRow


class Search:
    """The planner a bisection's search drives (`Bisection._search`): what the dispatch
    loop is asked to run, and the verdicts it hands back."""

    watch: flaky.NoiseWatch

    def __init__(self, runs: BisectionRuns, strategy: StrategyFn) -> None:
        self.runs = runs
        self.strategy = strategy
        self.full = tuple(range(runs.plan.n))
        self.planner = self.new_planner()

    def new_planner(self) -> Planner:
        runs = self.runs
        evidence = [
            (frozenset(r.variant), runs.relative(r.verdict, r.signature, runs.target))
            for r in runs.rows()
            if r.verdict is not Verdict.INFRA
        ]
        return Planner(
            runs.plan.n,
            self.strategy,
            known={frozenset(): Verdict.PASS, frozenset(self.full): Verdict.FAIL},
            closure=runs.plan.closure(),
            evidence=evidence,
        )

    def wanted(self) -> list[tuple[int, ...]]:
        planner = self.planner
        return [] if planner.done else [tuple(sorted(v)) for v in planner.pending()]

    def purpose(self, _: tuple[int, ...]) -> str:
        rnd = self.planner.current_round
        return rnd.purpose if rnd else "search"

    def ahead(self, limit: int) -> list[tuple[int, ...]]:
        return [tuple(sorted(v)) for v in self.planner.lookahead(limit)]

    def record(self, v: tuple[int, ...], row: RunRow) -> None:
        starts = sum(
            1 for r in self.runs.rows() if r.variant == v and r.verdict is not Verdict.INFRA
        )
        if row.cached_from is not None and starts > 1:
            # Reused starts of a variant: all of them count (a flaky config that failed
            # 1 of 4 times is not one that failed once). The search is a function of the
            # recorded runs, so it starts again from all of them, as a resume does.
            self.planner = self.new_planner()
        else:
            self.planner.record(frozenset(v), row.verdict)
        self.watch.check(self.planner)

    def again(self, _: tuple[int, ...]) -> bool:  # a noise-aware round wants a new start
        rnd = self.planner.current_round
        return rnd is not None and rnd.again

    def estimate(self) -> tuple[float, int]:
        """(runs the campaign is expected to take in all now that the failure shows on only
        some starts, runs so far): the runs so far and what the search still takes from
        them, measured on simulated runs of the culprit sets and rates they leave likely
        (`planner.noise_estimate.remaining_runs`; a fit of the bench's means when they
        point at none). The fit alone priced the search from its start, and said "about
        1 more run" where 16 came."""
        runs = self.runs
        got = [
            (r.variant, runs.relative(r.verdict, r.signature, runs.target))
            for r in runs.all_rows()
            if r.verdict is not Verdict.INFRA
        ]
        mine = [
            (frozenset(r.variant), relative(r.verdict, r.signature, runs.target))
            for r in runs.rows()
            if r.verdict is not Verdict.INFRA
        ]
        left = remaining_runs(runs.plan.n, mine, self.strategy, closure=runs.plan.closure())
        if left is not None:
            return len(got) + left[0], len(got)
        failing = {v for v, x in got if x is Verdict.FAIL}
        starts = [x for v, x in got if v in failing and x.resolved]
        rate = observed_rate(sum(x is Verdict.FAIL for x in starts), len(starts))
        size = 1 if any(len(v) == 1 for v in failing) or runs.plan.n == 1 else 2
        est = runs.plan.estimates()
        base = est["auto_single_mean" if size == 1 else "auto_pair_mean"]  # the fit's base
        mean, _ = flaky_runs(2 + base, rate, size)
        return max(mean, len(got) + 1.0), len(got)

    def next_runs(self) -> list[str]:
        """The variants a resumed search would run first (pure: the planner on the records)."""
        runs = self.runs
        evidence = [
            (frozenset(r.variant), runs.relative(r.verdict, r.signature, runs.target))
            for r in runs.rows()
            if r.verdict is not Verdict.INFRA
        ]
        full = frozenset(range(runs.plan.n))
        planner = Planner(
            runs.plan.n,
            self.strategy,
            known={frozenset(): Verdict.PASS, full: Verdict.FAIL},
            closure=runs.plan.closure(),
            evidence=evidence,
        )
        return [runs.plan.describe(v) for v in dict.fromkeys(planner.pending())]


__all__ = ["Search"]
