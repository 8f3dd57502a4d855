"""How many runs the noise-aware search takes, roughly, when the failure shows on only
some of the starts: a pure estimate for `plan` and for the moment a campaign turns
noise-aware (the search itself is `planner.noisy`; this module only reads its figures).

The runs of the noise-aware search grow with 1/p (p: the share of starts that show the
failure) over what the same answer costs when it shows every time. Fitted to the default
search's means in `bench/runs_to_answer.py --noise` (n = 8, every run counted, endpoints
included; the README's table): mean(p) = deterministic * (a + b / p) per culprit size,
within 5 % of the table at p = 0.8, 0.5 and 0.3 (least squares in 1/p); its 95th
percentile is about 1.9 times the mean there (1.7-1.9 measured). An estimate, not a
bound: it is meant to tell minutes from hours.
"""

from __future__ import annotations

#: culprit size -> (a, b) of mean(p) = deterministic runs * (a + b / p)
_FIT = {1: (0.23, 1.25), 2: (-1.13, 2.56), 3: (-0.99, 2.46)}
#: the 95th percentile of the runs over their mean (the table's p95 column)
P95_OVER_MEAN = 1.9
#: rates outside these are read as these (a rate below 0.2 is not estimated from the fit)
MIN_RATE, MAX_RATE = 0.2, 0.95


def flaky_runs(deterministic_runs: float, rate: float, size: int = 2) -> tuple[float, float]:
    """(mean, 95th percentile) of the runs to the answer, every run counted, when the
    failure shows on `rate` of the starts; `deterministic_runs` is what the same answer
    costs when it shows on every start (endpoints included). `rate` >= 1: unchanged."""
    if rate >= 1:
        return deterministic_runs, deterministic_runs
    rate = min(max(rate, MIN_RATE), MAX_RATE)
    a, b = _FIT[min(max(size, 1), 3)]
    mean = deterministic_runs * max(a + b / rate, 1.0)
    return mean, mean * P95_OVER_MEAN


def observed_rate(fails: int, starts: int) -> float:
    """The share of starts that showed the failure, with one pseudo-start each way (so
    that 1 of 1 is not read as certain)."""
    return (fails + 1) / (starts + 2)


__all__ = ["MAX_RATE", "MIN_RATE", "P95_OVER_MEAN", "flaky_runs", "observed_rate"]
