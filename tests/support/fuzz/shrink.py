"""A wrong answer made small: fewer deltas and fewer rules, as long as the incident still
gives the same kind of wrong answer.

The moves, cheapest first: the deltas no rule reads, all at once and then in ever smaller
chunks (as ddmin does), each rule that is not the first, then each delta left, one at a
time. Every candidate is a
whole bisection through the CLI, so the number of tries is bounded (`budget`); a flaky
incident may not repeat its wrong answer on a candidate, which then is simply not taken.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from orchestrator.lab.sshd import SshdEndpoint
from tests.support.fuzz import runner
from tests.support.fuzz.incident import Incident

BUDGET = 12


def category(problem: str) -> str:
    """The kind of a problem, its words before the first detail."""
    for word in ("traceback", "host left", "error", "no JSON", "deltas", "target", "culprits"):
        if problem.startswith(word):
            return word
    if problem.startswith("finding"):
        return "finding"
    if problem.startswith("run "):
        return "missing finding" if "missing from the findings" in problem else "run verdict"
    return problem.split(" ", 1)[0]


def minimize(
    incident: Incident, still_wrong: Callable[[Incident], bool], budget: int = BUDGET
) -> Incident:
    """The smallest incident found, within `budget` calls of `still_wrong`, that still is."""
    tries = 0

    def attempt(candidate: Incident) -> bool:
        nonlocal tries
        if tries >= budget or not candidate.faults or candidate == incident:
            return False
        tries += 1
        return still_wrong(candidate)

    read = {c.key for f in incident.faults for c in f.conds}
    idle = [d.key for d in incident.deltas if d.key not in read]
    # the deltas no rule reads: all at once, then in ever smaller chunks (ddmin's way)
    parts = 1
    while idle and tries < budget:
        size = -(-len(idle) // parts)
        chunks = [idle[i : i + size] for i in range(0, len(idle), size)]
        for chunk in chunks:
            if attempt(incident.without(deltas=frozenset(chunk))):
                incident = incident.without(deltas=frozenset(chunk))
                idle = [k for k in idle if k not in chunk]
                parts = max(parts - 1, 1)
                break
        else:
            if parts >= len(idle):
                break
            parts = min(len(idle), parts * 2)
    # each rule but the first (the target's), last first
    for i in reversed(range(1, len(incident.faults))):
        if i < len(incident.faults) and attempt(incident.without(faults=frozenset({i}))):
            incident = incident.without(faults=frozenset({i}))
    # each delta left, one at a time
    for key in [d.key for d in incident.deltas]:
        if len(incident.deltas) > 1 and attempt(incident.without(deltas=frozenset({key}))):
            incident = incident.without(deltas=frozenset({key}))
    return incident


def shrink(
    result: runner.Result, sshd: SshdEndpoint, work: Path, budget: int = BUDGET
) -> runner.Result:
    """The wrong `result` shrunk through the CLI: the smallest incident that still gives
    a wrong answer of the same kind, with that answer."""
    want = {category(p) for p in result.problems}
    last = {"result": result}

    def still_wrong(candidate: Incident) -> bool:
        res = runner.run(candidate, sshd, work)
        if res.wrong and want & {category(p) for p in res.problems}:
            last["result"] = res
            return True
        return False

    small = minimize(result.incident, still_wrong, budget)
    return last["result"] if last["result"].incident == small else result
