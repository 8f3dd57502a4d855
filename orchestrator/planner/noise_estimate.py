"""How many runs the noise-aware search takes, roughly, when the failure shows on only
some of the starts: a pure estimate for `plan` and for the moment a campaign turns
noise-aware (the search itself is `planner.noisy`; this module only reads its figures).

The runs of the noise-aware search grow with 1/p (p: the share of starts that show the
failure) over what the same answer costs when it shows every time. Fitted to the default
search's means in `bench/runs_to_answer.py --noise` (n = 8, every run counted, endpoints
included; the table of docs/search.md): mean(p) = deterministic * (a + b / p) per culprit size,
within 5 % of the table at p = 0.8, 0.5 and 0.3 (least squares in 1/p); its 95th
percentile is about 1.9 times the mean there (1.7-1.9 measured). An estimate, not a
bound: it is meant to tell minutes from hours.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.planner.core import StrategyFn, Variant
from orchestrator.verdicts import Verdict

#: culprit size -> (a, b) of mean(p) = deterministic runs * (a + b / p)
_FIT = {1: (0.23, 1.25), 2: (-1.13, 2.56), 3: (-0.99, 2.46)}
#: the 95th percentile of the runs over their mean (the table's p95 column)
P95_OVER_MEAN = 1.9
#: simulated searches per estimate of the runs still to come (`remaining_runs`)
SAMPLES = 16
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


def remaining_runs(
    n: int,
    evidence: Sequence[tuple[Variant, Verdict]],
    strategy: StrategyFn,
    *,
    closure: Callable[[Variant], Variant] | None = None,
    samples: int = SAMPLES,
    seed: int = 0,
) -> tuple[float, float] | None:
    """(mean, 95th percentile) of the runs the search `strategy` still takes from the
    recorded runs `evidence`, measured on simulated runs: `samples` culprit sets and rates
    drawn from the posterior the runs leave (the default search's prior), each answered by
    a scripted failure of that set at that rate until the search ends. Pure: the draws
    come from a generator seeded with `seed`. None when the runs point at no culprit set
    (then the fit above is all there is)."""
    import random

    from orchestrator.planner.adaptive import _default_model
    from orchestrator.planner.core import Planner
    from orchestrator.planner.noisy import NoiseModel, Noisy, _bits

    runs = [(frozenset(v), x) for v, x in evidence if x is not Verdict.INFRA]
    model = _default_model(NoiseModel())
    state = Noisy(n, model, closure)
    for v, x in runs:
        state.add(v, x)
    found = state.analyze().found
    if not found or not found[0].belief.consistent:
        return None
    belief = found[0].belief
    weights, _ = belief.weights()
    rng = random.Random(seed)
    full = frozenset(range(n))
    limit = 60 + 25 * n + 10  # the noise-aware search's own budget, and a margin
    taken: list[int] = []
    # a search among many changes weighs thousands of sets per run: fewer draws there
    for _ in range(max(4, min(samples, 1600 // max(1, n * n)))):
        i = rng.choices(range(len(weights)), weights=weights)[0]
        term = frozenset(_bits(belief.hyps[i]))
        rate = rng.betavariate(model.a + belief.fails, model.b + belief.passes[i])

        def oracle(v: Variant, term: Variant = term, rate: float = rate) -> Verdict:
            hit = term <= v and rng.random() < rate
            return Verdict.FAIL if hit else Verdict.PASS

        planner = Planner(
            n,
            strategy,
            known={frozenset(): Verdict.PASS, full: Verdict.FAIL},
            closure=closure,
            evidence=runs,
        )
        count = 0
        while not planner.done and count < limit:
            v = planner.pending()[0]
            planner.record(v, oracle(v))
            count += 1
        taken.append(count)
    taken.sort()
    return sum(taken) / len(taken), float(taken[min(len(taken) - 1, int(0.95 * len(taken)))])


__all__ = [
    "MAX_RATE",
    "MIN_RATE",
    "P95_OVER_MEAN",
    "SAMPLES",
    "flaky_runs",
    "observed_rate",
    "remaining_runs",
]
