"""Flaky failures in a campaign: the bad endpoint retried, the search chosen, the switch
announced, and how sure the answer is.

The bisection (`campaign/bisect.py`) calls these few functions; the search itself is the
planner's (`planner.adaptive`, `planner.noisy`). Everything here is read from the runs
recorded in the store, so a resumed campaign sees exactly what the interrupted one saw:
the planner gets every recorded run as evidence (repeats included) and the noise-aware
posterior is a pure function of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.campaign.records import Culprit
from orchestrator.diagnosis.verdicts import Signature, Verdict
from orchestrator.events import Listener, SearchSwitched
from orchestrator.planner import Answer, Planner, StrategyFn, make_strategy
from orchestrator.planner.adaptive import BAD_ATTEMPTS, Adaptive, flakiness
from orchestrator.planner.batch import NoisyFromStart
from orchestrator.planner.noisy import NoiseModel
from orchestrator.store.store import RunRow

__all__ = [
    "BAD_ATTEMPTS",
    "Counts",
    "NoiseWatch",
    "add_counts",
    "bad_starts",
    "counts",
    "strategy_for",
]


def strategy_for(
    name: str, confidence: float, describe: Callable[[frozenset[int]], str], slots: int = 1
) -> StrategyFn:
    """The search a campaign runs: `auto` switches to the noise-aware search by itself,
    which keeps `slots` runs in progress (the pool's hosts, a Slurm host's max_jobs)."""
    model = NoiseModel(confidence=confidence)
    if name == "auto":
        return Adaptive(model, describe, slots=max(1, slots))
    if name == "noisy":
        return NoisyFromStart(model, slots=max(1, slots))
    return make_strategy(name)


def bad_starts(rows: Iterable[RunRow], full: tuple[int, ...]) -> list[RunRow]:
    """The recorded starts of the bad config with a verdict (infra excluded), in order."""
    return [r for r in rows if r.variant == full and r.verdict is not Verdict.INFRA]


def retry_bad(starts: list[RunRow]) -> bool:
    """True while the bad config has only passed, and fewer than BAD_ATTEMPTS times."""
    return (
        bool(starts)
        and all(r.verdict is Verdict.PASS for r in starts)
        and len(starts) < BAD_ATTEMPTS
    )


@dataclass(frozen=True)
class Counts:
    """Target failures among the resolved runs of one variant."""

    fails: int
    runs: int

    def __str__(self) -> str:
        return f"fail {self.fails} of {self.runs}"


def counts(
    rows: Iterable[RunRow],
    target: Signature | None,
    relative: Callable[[Verdict, Signature | None, Signature | None], Verdict],
) -> dict[tuple[int, ...], Counts]:
    """Per variant: how many of its resolved runs (pass or target failure) failed."""
    fails: dict[tuple[int, ...], int] = {}
    runs: dict[tuple[int, ...], int] = {}
    for r in rows:
        v = relative(r.verdict, r.signature, target)
        if not v.resolved:
            continue
        runs[r.variant] = runs.get(r.variant, 0) + 1
        fails[r.variant] = fails.get(r.variant, 0) + (v is Verdict.FAIL)
    return {k: Counts(fails[k], n) for k, n in runs.items()}


def add_counts(
    culprits: list[Culprit], answer: Answer | None, by_variant: dict[tuple[int, ...], Counts]
) -> None:
    """Give each culprit's evidence its counts ("fail 2 of 3"): the variant that reproduced
    the failure and the variants of bad without each member."""
    if answer is None:
        return
    for c, cul in zip(culprits, answer.culprits, strict=False):
        got = by_variant.get(tuple(sorted(cul.reproduced_by)))
        c.reproduced_counts = str(got) if got else None
        cleared: dict[str, str | None] = {}
        for flag, (_, v) in zip(c.cleared_by, cul.cleared_by, strict=False):
            got = by_variant.get(tuple(sorted(v)))
            cleared[flag] = str(got) if got else None
        c.cleared_counts = cleared


@dataclass
class NoiseWatch:
    """Notices when the search switches to the noise-aware search, and says so once."""

    emit: Listener
    campaign_id: str
    switched: str = ""
    notes: list[str] = field(default_factory=list)
    #: (runs the campaign is now expected to take in all, runs so far), for the switch
    estimate: Callable[[], tuple[float, int]] | None = None
    expected_at_switch: float | None = None

    def _switch(self, reason: str) -> None:
        self.switched = reason
        expected, done = self.estimate() if self.estimate is not None else (None, 0)
        self.expected_at_switch = expected
        self.emit(
            SearchSwitched(
                campaign_id=self.campaign_id, reason=reason, expected_runs=expected, done=done
            )
        )

    def check(self, planner: Planner) -> None:
        rnd = planner.current_round
        note = rnd.note if rnd is not None else ""
        if note and not self.switched:
            self._switch(note)

    def settled(
        self,
        answer: Answer | None,
        runs: Iterable[tuple[frozenset[int], Verdict]],
        describe: Callable[[frozenset[int]], str],
    ) -> None:
        """An `auto` search that was noise-aware from its first round (the recorded runs,
        reused or resumed, already showed the flakiness) never announced the switch: say
        it now, in the words the switch uses."""
        if self.switched or answer is None or not answer.noise_aware:
            return
        reason = flakiness(list(runs), describe)
        if reason:
            self._switch(f"the failure is flaky: {reason}; switched to the noise-aware search")

    def summary(
        self,
        answer: Answer | None,
        rows: list[RunRow],
        target: Signature | None,
        relative: Callable[..., Verdict],
    ) -> dict[str, Any]:
        """The `noise` part of an outcome: the switch, the confidence, the measured rate."""
        out: dict[str, Any] = {
            "switched": self.switched or None,
            "confidence": None,
            "reproduction_rate": None,
            "reproduction_counts": None,
        }
        if self.expected_at_switch is not None:
            out["expected_runs_at_switch"] = round(self.expected_at_switch, 1)
        if answer is None:
            return out
        out["confidence"] = answer.confidence
        if answer.culprits:
            term = answer.culprits[0].deltas
            got = [
                relative(r.verdict, r.signature, target)
                for r in rows
                if term <= frozenset(r.variant)
            ]
            got = [v for v in got if v.resolved]
            fails = sum(v is Verdict.FAIL for v in got)
            out["reproduction_rate"] = fails / len(got) if got else None
            out["reproduction_counts"] = str(Counts(fails, len(got))) if got else None
        return out
