"""Time, not only runs: how long one start of a pair takes on its host, and what a search
of so many runs costs in wall time.

A start's time is known, in this order, from: the configs' `expect.run_time` (declared),
the earlier starts of the same config family on that host in the results store (learned:
the same command and model, real weights, judged, executed here, not reused: their
median), or not at all; the worst case of a start is its health deadline plus its probe's
timeout (a start that never becomes ready is stopped at the deadline), or the known time
when that is longer.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from orchestrator.campaign.planning import Plan
from orchestrator.config.experiment import Experiment
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.planner.noise_estimate import flaky_runs
from orchestrator.store.store import RunRow, Store

#: the earlier runs read to learn a start's time (the newest first)
LEARN_FROM = 2000
#: the flaky case `plan` prices: a failure that shows on half of the starts
PLAN_RATE = 0.5


@dataclass(frozen=True)
class RunTime:
    """One start's time: `seconds` (None: unknown), where it came from, the worst case."""

    seconds: float | None
    source: str  # "declared in FILE", "learned from N runs on HOST", "unknown"
    worst: float

    def to_dict(self) -> dict[str, object]:
        return {"seconds": self.seconds, "source": self.source, "worst_seconds": self.worst}


def family(exp: Experiment) -> tuple[str, ...]:
    """What makes runs comparable in time: the command and the model it serves."""
    flags = exp.flag_map()
    model = flags.get("model-path", flags.get("model", ""))
    return (*exp.exec, str(model), exp.unit or "")


def _family_of(row: RunRow) -> tuple[str, ...] | None:
    try:
        return family(row.experiment())
    except Exception:  # noqa: BLE001 (an old or redacted record: not comparable)
        return None


def worst_start(plan: Plan) -> float:
    """A start that hangs is stopped at its health deadline; then its probe may run."""

    def worst(e: Experiment) -> float:
        return e.health.timeout + (e.probe.timeout if e.probe else 0.0)

    return max(worst(plan.good), worst(plan.bad))


def run_time(
    plan: Plan, store: Store | None = None, host: str | None = None, weights: str = "real"
) -> RunTime:
    """What one start of this pair takes, as far as it is known: on real weights, or on
    dummy ones (`weights`: learned only; `expect.run_time` is a start on real weights)."""
    worst = worst_start(plan)
    for exp in (plan.bad, plan.good) if weights == "real" else ():
        if exp.run_time is not None:
            return RunTime(
                exp.run_time,
                f"declared in {exp.source or exp.name} (expect.run_time)",
                max(worst, exp.run_time),
            )
    if store is not None:
        want = {family(plan.good), family(plan.bad)}
        took = [
            r.duration
            for r in store.runs(limit=LEARN_FROM)
            if r.cached_from is None
            and r.weights == weights
            and r.duration > 0
            and r.verdict not in (Verdict.INFRA, Verdict.INVALID)
            and (host is None or r.host == host)
            and _family_of(r) in want
        ]
        if took:
            where = f" on {host}" if host else ""
            what = "" if weights == "real" else f" on {weights} weights"
            return RunTime(
                statistics.median(took),
                f"learned from {len(took)} earlier run(s){what}{where}",
                max(worst, max(took)),
            )
    if weights != "real":
        return RunTime(None, f"unknown (no earlier start on {weights} weights)", worst)
    return RunTime(None, "unknown: declare it with expect.run_time", worst)


@dataclass(frozen=True)
class Forecast:
    """Runs and wall time to the answer, every run counted (the endpoint checks included)."""

    shape: str  # "one flag", "interacting pair", "interacting pair, flaky (p = 0.5)"
    runs: float
    worst_runs: float
    seconds: float | None  # at the known time per start
    worst_seconds: float  # the worst runs, each at the health deadline
    #: with a rehearsal: the starts on real weights among `runs` (the rest on dummy ones)
    real_runs: float | None = None

    def to_dict(self) -> dict[str, object]:
        out = {
            "shape": self.shape,
            "runs": round(self.runs, 1),
            "worst_runs": round(self.worst_runs, 1),
            "hours": round(self.seconds / 3600, 2) if self.seconds is not None else None,
            "worst_hours": round(self.worst_seconds / 3600, 2),
        }
        if self.real_runs is not None:
            out["real_weight_runs"] = round(self.real_runs, 1)
        return out


def _starts_until(fails: int, rate: float, q: float = 0.95) -> int:
    """The `q` quantile of the starts it takes to see `fails` failures at `rate` per start
    (a negative binomial count)."""
    if rate >= 1:
        return fails
    k, below = fails, 0.0
    while True:  # P(the fails-th failure on start k): C(k-1, fails-1) r^fails (1-r)^(k-fails)
        below += math.comb(k - 1, fails - 1) * rate**fails * (1 - rate) ** (k - fails)
        if below >= q or k > 10_000:
            return k
        k += 1


def rehearsal_starts(n: int, rate: float = 1.0) -> tuple[float, float]:
    """(mean, 95th percentile) of the starts on real weights a rehearsal adds: the bad
    config until it fails (the target), and good + the culprit set until it fails (the
    confirmation); with one change good + it is the bad config, already seen failing.
    At `rate` 1 that is one start each (campaign/rehearse.py, `Rehearsal.run`)."""
    fails = 1 if n < 2 else 2
    return fails / min(max(rate, 1e-3), 1.0), float(_starts_until(fails, rate))


def forecasts(
    est: dict[str, float],
    rt: RunTime,
    n: int = 2,
    *,
    rehearse: bool = False,
    dummy: RunTime | None = None,
) -> list[Forecast]:
    """One flag, an interacting pair, and that pair flaky (showing on half of the starts);
    with one change (`n`), one flag and that flag flaky: there is no pair to find. With
    `rehearse` the search runs on dummy weights (each start at `dummy`'s time, when known)
    and the rehearsal's starts on real weights are added (`rehearsal_starts`)."""
    if n < 2:
        # the endpoints are the search: good once, bad until it fails (p95 of a geometric)
        flaky = (1 + 1 / PLAN_RATE, float(1 + _starts_until(1, PLAN_RATE)))
        shapes = [
            ("one flag", 2 + est["single_mean"], 2 + est["single_worst"], 1.0),
            (f"one flag, flaky (fails on {PLAN_RATE:.0%} of the starts)", *flaky, PLAN_RATE),
        ]
    else:
        mean, p95 = flaky_runs(2 + est["auto_pair_mean"], PLAN_RATE, 2)
        shapes = [
            ("one flag", 2 + est["single_mean"], 2 + est["single_worst"], 1.0),
            ("interacting pair", 2 + est["pair_mean"], 2 + est["pair_worst"], 1.0),
            (
                f"interacting pair, flaky (fails on {PLAN_RATE:.0%} of the starts)",
                mean,
                p95,
                PLAN_RATE,
            ),
        ]
    out = []
    for shape, runs, worst_runs, rate in shapes:
        if not rehearse:
            out.append(
                Forecast(
                    shape,
                    runs,
                    worst_runs,
                    runs * rt.seconds if rt.seconds is not None else None,
                    worst_runs * rt.worst,
                )
            )
            continue
        real, real_worst = rehearsal_starts(n, rate)
        runs, worst_runs = runs + real, worst_runs + real_worst
        seconds = (
            real * rt.seconds + (runs - real) * dummy.seconds
            if rt.seconds is not None and dummy is not None and dummy.seconds is not None
            else None
        )
        out.append(
            Forecast(shape, runs, worst_runs, seconds, worst_runs * rt.worst, real_runs=real)
        )
    return out


def duration_text(seconds: float) -> str:
    """`40 s`, `25 min`, `3.2 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


__all__ = [
    "Forecast",
    "RunTime",
    "duration_text",
    "family",
    "forecasts",
    "rehearsal_starts",
    "run_time",
    "worst_start",
]
