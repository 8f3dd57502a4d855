"""A bisection whose target is a probe metric (`pass_if: ">= 0.95 * good"`): the measured
search's side of the dispatch loop and its answer, an effect table.

One benchmark number of a variant against one of good's reads the benchmark's noise as a
flag's effect. Here every start runs the probe `warmup + repeats` times (the executor
keeps each figure with the run), and the measured-effect search (`planner/effects.py`)
asks which variant to start next; each start it asks for is a run of this campaign
(purpose `measure`), fed back as that start's sample. The endpoint runs are its first
samples, and a resumed campaign's recorded starts are fed back in the order they ran.

A start that gives no figure is not a slow variant: a crash is a finding of its own and a
probe that fails to run (its command's error, no figure its metric matches) is the probe's
failure; either ends the search with that run named, never with a measured slowdown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.campaign.records import Culprit, Status
from orchestrator.campaign.runs import BisectionRuns
from orchestrator.config.experiment import Experiment
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.planner.effect_stats import LATENCY, THROUGHPUT, Direction
from orchestrator.planner.effects import (
    Effect,
    EffectAnswer,
    EffectSearch,
    EffectSettings,
    Measure,
)
from orchestrator.store.store import RunRow

PURPOSE = "measure"
#: an `infra` start says nothing about the variant: started again, this many times at most
INFRA_RETRIES = 3


def bar_of(exp: Experiment) -> float | None:
    """The smallest effect that matters when `exp`'s probe bar is relative to good's
    metric (`>= 0.95 * good`: 0.05), else None (a bisection of failures)."""
    return exp.probe.bar if exp.probe is not None else None


def target_of(exp: Experiment) -> Signature:
    """What a measured campaign bisects, said like a probe miss."""
    bar = exp.probe.pass_if if exp.probe is not None else "its bar"
    return Signature(Phase.PROBE, "probe_threshold", f"metric missed {bar}")


def is_sample(row: RunRow) -> bool:
    """A start whose verdict is a measurement: it passed, or only its metric missed the bar."""
    if row.verdict is Verdict.PASS:
        return True
    sig = row.signature
    return row.verdict is Verdict.FAIL and sig is not None and sig.error_class == "probe_threshold"


def settings_for(exp: Experiment, confidence: float) -> EffectSettings:
    """The search's settings from the probe: its bar, direction, warm-up and repeats."""
    probe = exp.probe
    assert probe is not None and probe.bar is not None
    return EffectSettings(
        direction=THROUGHPUT if probe.higher_is_better else LATENCY,
        bar=probe.bar,
        confidence=confidence,
        warmup=probe.warmup,
        # every start runs the probe as configured: the search's allocation stays there
        min_runs=probe.repeats,
        max_runs=probe.repeats,
    )


class MeasuredRuns:
    """The measured search's side of the dispatch loop (`Bisection._drive`): the variant
    it wants started now, and each start fed back as a sample."""

    def __init__(
        self,
        runs: BisectionRuns,
        figures: Callable[[RunRow], list[float] | None],
        settings: EffectSettings,
    ) -> None:
        self.runs = runs
        self.figures = figures
        self.settings = settings
        self.search = EffectSearch(runs.plan.n, settings)
        self._gen = self.search.run()
        self.pending: Measure | None = next(self._gen)
        self.answer: EffectAnswer | None = None
        #: the start that gave no sample (a crash, the probe's own failure), if one did
        self.failed: RunRow | None = None
        self.used: set[str] = set()
        self.infra = 0
        #: every start gave the very same figure: the search has no noise to weigh by
        self.flat = False
        self.good_figures: list[list[float]] = []
        #: recorded starts not run for the search (the endpoints', a resumed campaign's)
        self.recorded: list[RunRow] = []

    def replay(self, rows: list[RunRow]) -> None:
        """Feed the recorded starts (the endpoints', a resumed campaign's) in the order
        they ran, whenever one is what the search asks for next."""
        self.recorded = [r for r in rows if r.verdict is not Verdict.INFRA]
        self._take_recorded()

    def _take_recorded(self) -> None:
        while self.pending is not None and self.failed is None:
            want = tuple(sorted(self.pending.variant))
            row = next(
                (r for r in self.recorded if r.id not in self.used and r.variant == want),
                None,
            )
            if row is None:
                return
            self._feed(row)

    def wanted(self) -> list[tuple[int, ...]]:
        if self.pending is None or self.failed is not None:
            return []
        return [tuple(sorted(self.pending.variant))]

    def got(self, v: tuple[int, ...], row: RunRow) -> None:
        if self.pending is None or v != tuple(sorted(self.pending.variant)):
            return  # a start no longer wanted (a cancelled round's)
        self._feed(row)
        self._take_recorded()

    def _feed(self, row: RunRow) -> None:
        self.used.add(row.id)
        if row.verdict is Verdict.INFRA:
            self.infra += 1
            if self.infra > INFRA_RETRIES:
                self.failed = row
            return  # wanted again
        figures = self.figures(row) if is_sample(row) else None
        if not figures:
            self.failed = row
            return
        if tuple(sorted(self.pending.variant)) == ():
            self.good_figures.append(list(figures[self.settings.warmup :] or figures))
            if len(self.good_figures) >= 3 and len({x for f in self.good_figures for x in f}) == 1:
                # a benchmark without any noise (a deterministic one): one figure against
                # one is exact, and the bisection of a missed bar answers it
                self.pending, self.flat = None, True
                return
        try:
            self.pending = self._gen.send(figures)
        except StopIteration as stop:
            self.pending, self.answer = None, stop.value
        except ZeroDivisionError:  # every figure the same: no noise to weigh an effect by
            self.pending, self.flat = None, True


def effect_dict(e: Effect, runs: BisectionRuns, direction: Direction) -> dict[str, Any]:
    """One term's effect as the answer keeps it: its flags and its change in percent."""
    change, low, high = e.percent(direction)
    idx = sorted(e.deltas)
    return {
        "flags": [runs.plan.deltas[i].short() for i in idx],
        "deltas": [runs.plan.deltas[i].describe() for i in idx],
        "indices": idx,
        "change": round(change, 2),
        "low": round(low, 2),
        "high": round(high, 2),
    }


def outcome_of(
    measured: MeasuredRuns, runs: BisectionRuns, cid: str, stop: str | None
) -> tuple[Status, str, list[Culprit], dict[str, Any] | None]:
    """The campaign's status, message, culprits and effect table from the search."""
    plan = runs.plan
    direction = measured.settings.direction
    if measured.failed is not None:
        row = measured.failed
        what = runs.label(row.variant)
        why = f"{row.verdict.value}" + (f" ({row.signature})" if row.signature else "")
        if row.signature is not None and row.signature.error_class == "probe_error":
            why += ": the probe failed to run, which is no measurement of the server"
        return (
            Status.INCOMPLETE,
            f"{what} could not be measured: {why} [run {row.id}]; `orchestrator show "
            f"{row.id}` tells what it did (campaign {cid})",
            [],
            None,
        )
    answer = measured.answer
    if measured.flat:
        return (
            Status.INCOMPLETE,
            "the probe gave the very same figure on every run: a benchmark without noise "
            "is judged by its bar alone (use an absolute pass_if, e.g. '>= 3000')",
            [],
            None,
        )
    if answer is None:
        return Status.INCOMPLETE, f"stopped before an answer: {stop or 'no answer'}", [], None
    table: dict[str, Any] = {
        "metric": plan.bad.probe.metric if plan.bad.probe else None,
        "bar": plan.bad.probe.pass_if if plan.bad.probe else None,
        "higher_is_better": direction.higher_is_better,
        "status": answer.status,
        "total": effect_dict(answer.total, runs, direction),
        "named": [effect_dict(e, runs, direction) for e in answer.named],
        "cleared": [effect_dict(e, runs, direction) for e in answer.cleared],
        "explained": round(answer.explained, 3),
        "confidence": round(answer.confidence, 4),
        "noise_within": round(answer.noise_within, 4),
        "noise_between": round(answer.noise_between, 4),
        "drift": round(direction.as_percent(answer.drift), 2),
        "starts": answer.starts,
        "runs": answer.runs,
        "reason": answer.reason,
    }
    culprits = [
        Culprit(
            deltas=[plan.deltas[i].describe() for i in sorted(e.deltas)],
            flags=[plan.deltas[i].short() for i in sorted(e.deltas)],
            indices=sorted(e.deltas),
            interacting=len(e.deltas) > 1,
            reproduced_by=None,
            cleared_by={},
            whats=[plan.deltas[i].what for i in sorted(e.deltas)],
        )
        for e in answer.named
    ]
    total = table["total"]
    bad_vs_good = (
        f"bad against good {total['change']:+.1f}% [{total['low']:+.1f}, {total['high']:+.1f}]"
    )
    if answer.status == "found":
        named = ", ".join(" + ".join(c.flags) for c in culprits)
        return (
            Status.FOUND,
            f"{named} explain {100 * answer.explained:.0f}% of the effect ({bad_vs_good})",
            culprits,
            table,
        )
    if answer.status == "none":
        return (
            Status.ENDPOINTS,
            f"the bad config meets the bar ({bad_vs_good}, bar {table['bar']}); nothing to bisect",
            [],
            table,
        )
    return (
        Status.UNSURE,
        f"no flag named: {answer.reason} ({bad_vs_good})",
        [],
        table,
    )


__all__ = [
    "PURPOSE",
    "MeasuredRuns",
    "bar_of",
    "is_sample",
    "outcome_of",
    "settings_for",
    "target_of",
]
