"""Driving a pure `Planner` with a scripted oracle, for the planner tests."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.planner import Planner

P, F = Verdict.PASS, Verdict.FAIL


def drive(
    planner: Planner, oracle: Callable[[frozenset[int]], Verdict], limit: int = 500
) -> list[frozenset[int]]:
    """Answer the planner's first pending variant until it is done; the variants asked."""
    asked = []
    for _ in range(limit):
        if planner.done:
            return asked
        v = planner.pending()[0]
        asked.append(v)
        planner.record(v, oracle(v))
    raise AssertionError("the planner did not finish")


def endpoints(n: int) -> dict[frozenset[int], Verdict]:
    """The endpoint verdicts every campaign starts from: good passes, bad fails."""
    return {frozenset(): P, frozenset(range(n)): F}
