"""The planner: pure search over the differences between a good and a bad config.

No I/O, no clock, no printing, no randomness it is not given. `deltas` diffs two
configs; a strategy (`linear`, `dd`, `auto`, `noisy`) is a generator that proposes rounds
of variants and receives verdicts; `Planner` drives it, caches verdicts, retries `infra`,
and closes variants under coupling rules. `noisy` (module `noisy`) keeps a posterior over
culprit sets for failures that reproduce only sometimes; `adaptive` runs `auto` and
switches to it once the runs show flakiness.
"""

from __future__ import annotations

from orchestrator.planner.adaptive import Adaptive, NoisyFromStart
from orchestrator.planner.core import (
    Answer,
    Culprit,
    Planner,
    Round,
    StrategyFn,
    Variant,
)
from orchestrator.planner.deltas import Delta, apply_deltas, coupling_closure, diff
from orchestrator.planner.strategies import STRATEGIES, estimate_runs, make_strategy

# `noisy`: the noise-aware search from the first run, for a failure known to be flaky
# (`auto` in a campaign switches to it by itself once the runs show flakiness)
STRATEGIES["noisy"] = NoisyFromStart()

__all__ = [
    "STRATEGIES",
    "Adaptive",
    "NoisyFromStart",
    "Answer",
    "Culprit",
    "Delta",
    "Planner",
    "Round",
    "StrategyFn",
    "Variant",
    "apply_deltas",
    "coupling_closure",
    "diff",
    "estimate_runs",
    "make_strategy",
]
