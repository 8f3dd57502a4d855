"""A benchmark metric as a sample: a variant's sample compared with good's whole sample.

Pure: no I/O, no clock, and the only randomness is the `random.Random` a caller passes in
(the bootstrap's resampling), so a comparison repeats exactly under a fixed seed.

Words used throughout:

- a *start* is one start of the server; inside it the benchmark runs several times (its
  *repeats*). The first repeats of a start are a warm-up (caches, JIT, CUDA graphs still
  settling) and are discarded; a start's value is the median of the rest, so one outlier
  run does not move it.
- the *cost* of a value is how much worse it is, on a log scale: `-log(x)` for a metric
  where higher is better (throughput), `+log(x)` where lower is better (latency). An
  effect is a difference of costs; `as_ratio` turns it back into the metric's own ratio.
- the *bar* is the smallest effect that matters, as a share (0.05: a variant 5 % slower
  than good, or 5 % later for a latency, misses the bar).

`compare` gives the verdict of one variant against good: `fail` when the variant misses the
bar with the campaign's confidence, `pass` when it meets it, `more` while neither is shown
and the variant has fewer starts than the budget, then `unsure` (counted as neither).
The interval is a percentile bootstrap of the ratio of medians (start values resampled
within each sample): no assumption on the noise's shape, and the standard library is enough
for the few starts a campaign affords. `t_interval` is the parametric counterpart the
measured-effect search uses (`planner.effects`), where one noise estimate pooled over every
configuration measured is worth more than each sample's own.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class MetricVerdict(StrEnum):
    FAIL = "fail"
    PASS = "pass"
    MORE = "more"
    UNSURE = "unsure"


@dataclass(frozen=True)
class Direction:
    """Which way a metric is better: throughput higher, latency (TTFT, ITL, p99) lower."""

    higher_is_better: bool = True

    def cost(self, value: float) -> float:
        """How much worse a value is, on a log scale (positive: worse)."""
        if value <= 0:
            raise ValueError(f"a metric value must be positive, got {value}")
        return -math.log(value) if self.higher_is_better else math.log(value)

    def as_ratio(self, effect: float) -> float:
        """A cost difference as the metric's own ratio (variant / reference)."""
        return math.exp(-effect) if self.higher_is_better else math.exp(effect)

    def as_percent(self, effect: float) -> float:
        """A cost difference as the metric's change in percent (-9.8: 9.8 % less)."""
        return 100.0 * (self.as_ratio(effect) - 1.0)


THROUGHPUT = Direction(True)
LATENCY = Direction(False)


def start_value(repeats: Sequence[float], warmup: int = 1) -> float:
    """One start's value: the median of its repeats after the first `warmup` are dropped
    (all of them when there are no more than that)."""
    if not repeats:
        raise ValueError("a start without a single benchmark run has no value")
    kept = repeats[warmup:] if len(repeats) > warmup else repeats
    return float(statistics.median(kept))


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile, by the Cornish-Fisher expansion around the normal one (within
    about 1 % of the exact value from 3 degrees of freedom on; exact as df grows)."""
    z = statistics.NormalDist().inv_cdf(p)
    if df <= 0 or math.isinf(df):
        return z
    df = max(df, 1.0)
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def t_interval(estimate: float, se: float, df: float, confidence: float) -> tuple[float, float]:
    """A two-sided interval at `confidence` around an estimate with standard error `se`."""
    half = t_quantile(0.5 + confidence / 2, df) * se
    return estimate - half, estimate + half


@dataclass(frozen=True)
class Comparison:
    """A variant's sample against good's: the ratio of medians (variant / good) and its
    interval at the confidence asked, the change in percent, and the verdict."""

    ratio: float
    low: float
    high: float
    verdict: MetricVerdict
    starts: int

    @property
    def percent(self) -> float:
        return 100.0 * (self.ratio - 1.0)

    def describe(self) -> str:
        return f"{self.percent:+.1f}% [{100 * (self.low - 1):+.1f}, {100 * (self.high - 1):+.1f}]"


def bootstrap_ratio(
    good: Sequence[float],
    variant: Sequence[float],
    confidence: float,
    rng: random.Random,
    resamples: int = 2000,
) -> tuple[float, float, float]:
    """(ratio of medians variant / good, low, high): a percentile bootstrap, each sample
    resampled on its own."""
    if not good or not variant:
        raise ValueError("both samples need at least one value")
    point = statistics.median(variant) / statistics.median(good)
    ratios = sorted(
        statistics.median(rng.choices(variant, k=len(variant)))
        / statistics.median(rng.choices(good, k=len(good)))
        for _ in range(resamples)
    )
    tail = (1 - confidence) / 2
    lo = ratios[min(int(tail * resamples), resamples - 1)]
    hi = ratios[min(int((1 - tail) * resamples), resamples - 1)]
    return point, lo, hi


def compare(
    good: Sequence[float],
    variant: Sequence[float],
    *,
    direction: Direction = THROUGHPUT,
    bar: float = 0.05,
    confidence: float = 0.95,
    budget: int = 6,
    rng: random.Random,
    resamples: int = 2000,
) -> Comparison:
    """A variant's start values against good's whole sample, one verdict.

    `fail`: the whole interval lies beyond the bar (slower than `1 - bar` times good for a
    throughput, later than `1 + bar` times for a latency); `pass`: the whole interval lies
    within it; otherwise `more` until the variant has `budget` starts, then `unsure`."""
    if not 0 < bar < 1:
        raise ValueError(f"the bar is a share between 0 and 1, got {bar}")
    ratio, lo, hi = bootstrap_ratio(good, variant, confidence, rng, resamples)
    if direction.higher_is_better:
        limit = 1 - bar
        missed, met = hi < limit, lo >= limit
    else:
        limit = 1 + bar
        missed, met = lo > limit, hi <= limit
    if missed:
        verdict = MetricVerdict.FAIL
    elif met:
        verdict = MetricVerdict.PASS
    elif len(variant) >= budget:
        verdict = MetricVerdict.UNSURE
    else:
        verdict = MetricVerdict.MORE
    return Comparison(ratio, lo, hi, verdict, len(variant))
