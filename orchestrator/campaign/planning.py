"""Planning a campaign from two config files: deltas, closure, first round, run estimates.

Shared by `orchestrator plan` and the campaign runner; pure apart from reading the two
YAML files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.experiment import Experiment, load_experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.planner import (
    Delta,
    Planner,
    apply_deltas,
    coupling_closure,
    diff,
    estimate_runs,
    make_strategy,
)
from orchestrator.planner.deltas import check_differ


@dataclass(frozen=True)
class Plan:
    good: Experiment
    bad: Experiment
    deltas: tuple[Delta, ...]
    strategy: str
    #: a JSON-valued flag's changed key paths are deltas of their own (off: `--no-split`)
    split: bool = True

    @property
    def n(self) -> int:
        return len(self.deltas)

    def closure(self):  # noqa: ANN201
        return coupling_closure(list(self.deltas), self.good, self.bad)

    def planner(self) -> Planner:
        return Planner(
            self.n,
            make_strategy(self.strategy),
            known={frozenset(): Verdict.PASS, frozenset(range(self.n)): Verdict.FAIL},
            closure=self.closure(),
        )

    @property
    def env_keys(self) -> frozenset[str]:
        """Every environment variable either config sets or removes: a variant that does
        not set one removes it (the unit's or the host's value never stands in for it)."""
        return frozenset((*self.good.env_map(), *self.good.unset, *self.bad.env_map(),
                          *self.bad.unset))  # fmt: skip

    def variant(self, indices: frozenset[int]) -> Experiment:
        """The launch of a variant, as it runs and is recorded (its removals included)."""
        if indices == frozenset(range(self.n)):
            exp = self.bad
        elif not indices:
            exp = self.good
        else:
            chosen = [self.deltas[i] for i in sorted(indices)]
            exp = apply_deltas(self.good, chosen, name=f"{self.good.name}+{len(chosen)}")
        return exp.unsetting(self.env_keys)

    def describe(self, indices: frozenset[int]) -> str:
        """`good + --ep-size 8, --enable-nccl-nvls` or `bad - --ep-size 8`, whichever is shorter."""
        if not indices:
            return "good"
        if indices == frozenset(range(self.n)):
            return "bad"
        missing = frozenset(range(self.n)) - indices
        if len(missing) < len(indices):
            return "bad - " + ", ".join(self.deltas[i].short() for i in sorted(missing))
        return "good + " + ", ".join(self.deltas[i].short() for i in sorted(indices))

    def estimates(self) -> dict[str, float]:
        """Runs after the endpoints, for a single culprit and an interacting pair that fail
        on every start (`*_mean`, `*_worst`), and what `auto` alone costs (`auto_*`: the
        base of the flaky estimates, planner.noise_estimate)."""
        if self.strategy in ("auto", "noisy"):  # searches that weigh every run: simulated
            from orchestrator.planner.adaptive import estimate_search

            return dict(estimate_search(self.strategy, self.n))  # cached: a copy
        strategy = make_strategy(self.strategy)
        est = dict(estimate_runs(strategy, self.n))
        return est | {f"auto_{k}": v for k, v in estimate_runs(make_strategy("auto"),
                                                                self.n).items()}  # fmt: skip


def make_plan(good_path: str | Path, bad_path: str | Path, strategy: str = "auto", *,
              split: bool = True) -> Plan:  # fmt: skip
    make_strategy(strategy)  # validate the name early
    good = load_experiment(good_path)
    bad = load_experiment(bad_path)
    deltas = diff(good, bad, split=split)
    check_differ(deltas, good, bad)
    return Plan(good=good, bad=bad, deltas=tuple(deltas), strategy=strategy, split=split)
