"""The planner: pure search over the differences between a good and a bad config.

No I/O, no clock, no printing, no randomness it is not given. `deltas` diffs two
configs; a strategy (`linear`, `dd`, `auto`) is a generator that proposes rounds of
variants and receives verdicts; `Planner` drives it, caches verdicts, retries `infra`,
and closes variants under coupling rules.
"""

from __future__ import annotations

from orchestrator.planner.core import (
    Answer,
    Culprit,
    Planner,
    Round,
    Variant,
)
from orchestrator.planner.deltas import Delta, apply_deltas, coupling_closure, diff
from orchestrator.planner.strategies import STRATEGIES, estimate_runs, make_strategy

__all__ = [
    "STRATEGIES",
    "Answer",
    "Culprit",
    "Delta",
    "Planner",
    "Round",
    "Variant",
    "apply_deltas",
    "coupling_closure",
    "diff",
    "estimate_runs",
    "make_strategy",
]
