"""Rehearsal on dummy weights: a bisection's search on random weights of the same shapes.

SGLang and vLLM both take `--load-format dummy`: the same shapes, kernels, graph capture
and communication, with random weights that load in seconds instead of the minutes a
checkpoint of hundreds of GB takes. A campaign with `rehearse: dummy-weights` (or
`--rehearse`) starts the bad config on real weights (the target), then on dummy weights;
when that shows the target too, the search runs on dummy weights, and the answer is
called found only once good + each culprit set fails with the target on real weights.
A failure of the checkpoint's values (a missing tensor, a NaN from real values) does not
show on dummy weights: the campaign says so once and searches on real weights.

Pure helpers; the course itself is `Rehearsal.run` (campaign/rehearse.py).
"""

from __future__ import annotations

import math
from dataclasses import replace

from orchestrator.campaign.planning import Plan
from orchestrator.config.experiment import LOAD_FORMAT
from orchestrator.store.store import RunRow

#: how sure a config's starts on the other weights must be to show a failure it showed
#: (a miss costs a whole search on real weights)
SHOW_CONFIDENCE = 0.99
#: the highest rate a few starts are read as, before more starts on the other weights: the
#: search's runs overstate a flaky set's rate (it runs where failures show), and a miss
#: costs a whole search on real weights while extra starts cost only when it misses
CHECK_RATE = 0.4
#: at most this many starts of a config on the other weights to see a failure once (the bad
#: config on dummy weights, good + a culprit set on real ones)
MAX_CONFIRM_STARTS = 12


def refused(plan: Plan) -> str:
    """Why this pair cannot be rehearsed on dummy weights, or ''."""
    if plan.good.weights == "dummy" and plan.bad.weights == "dummy":
        return f"both configs already load dummy weights (--{LOAD_FORMAT} dummy)"
    for exp in (plan.good, plan.bad):
        cond = exp.probe.condition if exp.probe else None
        if cond is not None and cond.relative_to_good:
            return (
                "the probe's bar is relative to the good config's metric, which the bad "
                "config's start on real weights would need first"
            )
    if any(e.answers is not None and e.answers.enabled for e in (plan.good, plan.bad)):
        return "answers are checked: random weights answer nothing a real bug changes"
    for d in plan.deltas:
        if d.kind == "flag" and d.key == LOAD_FORMAT:
            return f"the configs differ in --{LOAD_FORMAT}, which a rehearsal replaces"
    for exp in (plan.good, plan.bad):
        fmt = exp.flag_map().get(LOAD_FORMAT)
        if fmt is not None and str(fmt) not in ("auto", "dummy"):
            return (
                f"{exp.source or exp.name} loads its weights with --{LOAD_FORMAT} {fmt}; "
                "dummy weights would not have its shapes"
            )
    return ""


def on_dummy(plan: Plan) -> Plan:
    """The same pair, both configs on dummy weights (the deltas are unchanged)."""
    # (a copy of the plan: its order of builds and its other settings stay)
    return replace(plan, good=plan.good.with_dummy_weights(), bad=plan.bad.with_dummy_weights())


def check_attempts(fails: int, runs: int) -> int:
    """Starts of the bad config on dummy weights before its target counts as needing the
    real weights. The bad config's few starts on real weights say little of its rate (1 of
    1 is as likely from a failure that shows on a third of the starts), and a miss costs a
    whole search on real weights while the extra starts cost only when the target does not
    show: its rate is taken as at most CHECK_RATE (10 starts)."""
    return confirm_attempts(min(fails, runs), runs, rate_cap=CHECK_RATE)


def confirm_attempts(
    fails: int, runs: int, confidence: float = SHOW_CONFIDENCE, rate_cap: float = 1.0
) -> int:
    """Starts on the other weights that show a failure seen `fails` of `runs` times at
    least once, with the confidence asked (the rate estimated with one pseudo-start each
    way, so a config that failed 1 of 1 gets 5)."""
    rate = min((fails + 1) / (runs + 2), rate_cap)
    if rate >= 1:
        return 1
    need = math.ceil(math.log(1 - confidence) / math.log(1 - rate))
    return max(1, min(MAX_CONFIRM_STARTS, need))


def shown(row: RunRow) -> str:
    """A run's verdict as a few words: `pass`, `fail: RuntimeError: ...`."""
    return row.verdict.value + (f": {row.signature}" if row.signature else "")


__all__ = [
    "CHECK_RATE",
    "MAX_CONFIRM_STARTS",
    "SHOW_CONFIDENCE",
    "check_attempts",
    "confirm_attempts",
    "on_dummy",
    "refused",
    "shown",
]
