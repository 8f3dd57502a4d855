"""Runs to the right answer when the failure reproduces only on some starts (`--noise`).

Oracles: a culprit set (one flag, an AND-pair or an AND-triple) among n deltas, placed at
random; a run of a variant that carries it fails with probability p, every other run
passes. Each case has its own random placement and its own random stream (seeded, so the
table repeats). Two more shapes put a second, different failure (`other`) beside it, on
one more delta placed at random (the target's rule comes first, as in a lab scenario):

- `masked`: the target flaky (rate p), the other failure deterministic: a run that carries
  both shows the other failure whenever the target misses, so a miss looks like `other`
  and not like a pass;
- `decoy`: the target deterministic, the other failure flaky (rate p: the p column is the
  other failure's here): the decoy must never be named.

The bad config is started until it shows the target (a pass or the other failure: again),
at most BAD_ATTEMPTS times.

Every run counts here, the endpoint checks included (unlike the deterministic table,
whose two endpoint checks are fixed and left out): with noise the bad endpoint may need
several starts before it fails, and that is part of the cost. Policies:

- `default`: the campaign's default (`--strategy auto`): good once, bad until it fails (at
  most BAD_ATTEMPTS starts), then `auto`, which switches to the noise-aware search with
  every run so far as evidence as soon as a run shows flakiness, and otherwise goes on
  with the posterior search (a prior that weighs a deterministic failure) until its
  answer reaches the confidence (`orchestrator.planner.adaptive`);
- `noisy`: the noise-aware search from the first run (`--strategy noisy`: a failure known
  to be intermittent);
- `posterior` (only when asked with `--policies`): the default's prior, stop and runs alone
  with the posterior search from the first run, no `auto` phase (`Adaptive(posterior=True)`);
- `go`: Go's cmd/bisect policy: every trial (endpoints too) runs twice and the search gives
  up when the two disagree; its search is our `auto` (a log-cost minimal-set search);
- `fixed r=3`, `fixed r=5`: `auto` with each variant run up to r times, a variant failing
  if any of its runs fails (a failure is proof, so a run after it is never needed);
- `bayesect`: a posterior over single flags only with a learned rate (git-bayesect's model
  applied to flags), the same endpoint policy and stopping rule as `noisy`.

Columns per policy: ok% (the exact culprit set, nothing else), mean and 95th-percentile
runs; for the posterior policies `sure%` (the share of all answers reported with
confidence >= 0.95) and `cal%` (of those, the share that is right). `vs fixed`: mean runs
of `default`/`noisy` over those of the cheapest fixed-repeat peer whose ok% is at least as
high ("-" when no fixed-repeat peer gets there). `bound`: the information bound in runs,
log2(sets of the culprit's size) over the Z-channel's capacity log2(1 + p (1-p)^((1-p)/p))
bits per run (no search does better on average, even one told p and the set's size);
`<policy> / bound`: its mean runs over the bound.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.planner import Planner
from orchestrator.planner.adaptive import BAD_ATTEMPTS, Adaptive
from orchestrator.planner.batch import NoisyFromStart
from orchestrator.planner.noisy import NoiseModel, Noisy
from orchestrator.planner.strategies import auto

P, F, OTHER = Verdict.PASS, Verdict.FAIL, Verdict.OTHER
Variant = frozenset[int]
POLICIES = ("default", "noisy", "go", "fixed r=3", "fixed r=5", "bayesect")
POSTERIOR = ("default", "noisy", "posterior", "bayesect")
SHAPES = ("single", "AND-pair", "AND-triple", "masked", "decoy")
CONFIDENCE = 0.95


@dataclass
class Result:
    right: bool
    runs: int
    confidence: float | None = None


@dataclass
class Oracle:
    terms: tuple[Variant, ...]
    p: float
    rng: random.Random
    runs: int = 0
    #: a different failure (its deltas, its rate), checked after the target's rule
    other: Variant | None = None
    q: float = 1.0

    def __call__(self, v: Variant) -> Verdict:
        self.runs += 1
        carried = any(t <= v for t in self.terms)
        if carried and (self.p >= 1.0 or self.rng.random() < self.p):
            return F
        if (
            self.other is not None
            and self.other <= v
            and (self.q >= 1.0 or self.rng.random() < self.q)
        ):
            return OTHER
        return P


def _endpoints(o: Oracle, n: int) -> list[tuple[Variant, Verdict]] | None:
    """Good once, bad until it fails (the campaign's rule); None if bad never failed."""
    runs = [(frozenset(), o(frozenset()))]
    full = frozenset(range(n))
    for _ in range(BAD_ATTEMPTS):  # a pass or the other failure: start it again
        x = o(full)
        runs.append((full, x))
        if x is F:
            return runs
    return None


def _drive(planner: Planner, o: Oracle, limit: int) -> None:
    for _ in range(limit):
        if planner.done:
            return
        v = planner.pending()[0]
        planner.record(v, o(v))


def run_ours(n: int, o: Oracle, strategy: Callable) -> Result:
    ends = _endpoints(o, n)
    if ends is None:
        return Result(False, o.runs)
    full = frozenset(range(n))
    planner = Planner(n, strategy, known={frozenset(): P, full: F}, evidence=ends)
    _drive(planner, o, 100 * n + 1000)
    a = planner.answer if planner.done else None
    if a is None:
        return Result(False, o.runs)
    return Result(set(a.culprit_sets) == set(o.terms), o.runs, a.confidence)


def run_repeated(n: int, o: Oracle, r: int, give_up_on_disagreement: bool) -> Result:
    """`auto` where each trial runs r times: Go's policy (r = 2, disagreement: give up) or
    fixed repeats (up to r runs, any failure decides)."""

    class GiveUp(Exception):
        pass

    def trial(v: Variant) -> Verdict:
        if give_up_on_disagreement:
            got = {o(v) for _ in range(r)}
            if len(got) > 1:
                raise GiveUp
            return got.pop()
        for _ in range(r):
            if o(v) is F:
                return F
        return P

    full = frozenset(range(n))
    try:
        if trial(frozenset()) is not P or trial(full) is not F:
            return Result(False, o.runs)
        planner = Planner(n, auto, known={frozenset(): P, full: F})
        for _ in range(20 * n * n + 100):
            if planner.done:
                break
            v = planner.pending()[0]
            planner.record(v, trial(v))
    except GiveUp:
        return Result(False, o.runs)
    return Result(set(planner.answer.culprit_sets) == set(o.terms), o.runs)


def run_bayesect(n: int, o: Oracle) -> Result:
    model = NoiseModel(confidence=CONFIDENCE, sizes=(1.0,), other=0.0, spike=0.0)
    ends = _endpoints(o, n)
    if ends is None:
        return Result(False, o.runs)
    state = Noisy(n, model)
    for v, x in ends:
        state.add(v, x)
    for _ in range(30 + 12 * n):  # its budget (pairs, which it cannot name, use it up)
        a = state.analyze()
        if a.next is None:
            break
        state.add(a.next, o(a.next))
    a = state.analyze()
    found = {f.term for f in a.found}
    return Result(found == set(o.terms), o.runs, a.confidence)


def run_policy(name: str, n: int, o: Oracle) -> Result:
    if name in ("default", "ours"):
        return run_ours(n, o, Adaptive(NoiseModel(confidence=CONFIDENCE)))
    if name == "noisy":
        return run_ours(n, o, NoisyFromStart(NoiseModel(confidence=CONFIDENCE)))
    if name == "posterior":  # the default's prior and confirmation, the posterior from the start
        return run_ours(n, o, Adaptive(NoiseModel(confidence=CONFIDENCE), posterior=True))
    if name == "go":
        return run_repeated(n, o, 2, True)
    if name.startswith("fixed r="):
        return run_repeated(n, o, int(name.split("=")[1]), False)
    if name == "bayesect":
        return run_bayesect(n, o)
    raise ValueError(name)


@dataclass
class Row:
    p: float
    shape: str
    n: int
    results: dict[str, list[Result]] = field(default_factory=dict)


def capacity(p: float) -> float:
    """Bits one run can tell at most when a variant with the culprit fails with chance p
    and one without never fails: the Z-channel's capacity log2(1 + p (1-p)^((1-p)/p))."""
    if p >= 1.0:
        return 1.0
    return math.log2(1.0 + p * (1.0 - p) ** ((1.0 - p) / p))


def information_bound(shape: str, n: int, p: float) -> float:
    """The fewest runs on average any search needs to name the row's culprit set: the bits
    that name one set among the candidates of its size, over the capacity of a run (the
    target's rate: the decoy's target fails on every start)."""
    size = {"AND-pair": 2, "AND-triple": 3}.get(shape, 1)
    return math.log2(math.comb(n, size)) / capacity(1.0 if shape == "decoy" else p)


def make_case(shape: str, n: int, p: float, seed: int) -> Callable[[], Oracle]:
    place = random.Random(f"place:{shape}:{n}:{seed}")
    size = {"AND-pair": 2, "AND-triple": 3}.get(shape, 1)
    if shape == "single":  # (the placements the table has always used)
        picked = [place.randrange(n)]
    else:
        picked = place.sample(range(n), size + (shape in ("masked", "decoy")))
    terms = (frozenset(picked[:size]),)
    runs = random.Random(f"runs:{shape}:{n}:{p}:{seed}")
    if shape == "masked":  # a flaky target, a deterministic other failure
        return lambda: Oracle(terms, p, runs, other=frozenset(picked[size:]), q=1.0)
    if shape == "decoy":  # a deterministic target, a flaky other failure
        return lambda: Oracle(terms, 1.0, runs, other=frozenset(picked[size:]), q=p)
    return lambda: Oracle(terms, p, runs)


def table(
    ps: list[float],
    ns: list[int],
    cases: int,
    policies: tuple[str, ...] = POLICIES,
    on_row: Callable[[list[str], list[str]], None] | None = None,
    shapes: tuple[str, ...] = SHAPES,
) -> tuple[list[str], list[list[str]]]:
    header = ["p", "shape", "n"]
    for name in policies:
        header += [f"{name} ok%", f"{name} mean", f"{name} p95"]
        if name in POSTERIOR:
            header += [f"{name} sure%", f"{name} cal%"]
    header += ["default vs fixed", "noisy vs fixed", "bound"]
    header += [f"{name} / bound" for name in policies if name in POSTERIOR]
    rows: list[list[str]] = []
    for p in ps:
        for n in ns:
            for shape in shapes:
                stats: dict[str, tuple[float, float]] = {}
                row = [f"{p:g}", shape, str(n)]
                for name in policies:
                    res = [run_policy(name, n, make_case(shape, n, p, s)()) for s in range(cases)]
                    ok = 100 * sum(r.right for r in res) / len(res)
                    runs = sorted(r.runs for r in res)
                    mean = sum(runs) / len(runs)
                    p95 = runs[min(len(runs) - 1, int(0.95 * len(runs)))]
                    stats[name] = (ok, mean)
                    row += [f"{ok:.1f}", f"{mean:.1f}", str(p95)]
                    if name in POSTERIOR:
                        sure = [
                            r
                            for r in res
                            if r.confidence is not None and r.confidence >= CONFIDENCE
                        ]
                        cal = 100 * sum(r.right for r in sure) / len(sure) if sure else 0.0
                        row.append(f"{100 * len(sure) / len(res):.1f}")
                        row.append(f"{cal:.1f}" if sure else "-")
                for ours in ("default", "noisy"):
                    if ours not in stats:
                        row.append("")
                        continue
                    ok, mean = stats[ours]
                    peers = [
                        stats[f]
                        for f in ("fixed r=3", "fixed r=5")
                        if f in stats and stats[f][0] >= ok
                    ]
                    row.append(f"{mean / min(m for _, m in peers):.2f}" if peers else "-")
                bound = information_bound(shape, n, p)
                row.append(f"{bound:.1f}")
                for name in policies:
                    if name in POSTERIOR:
                        row.append(f"{stats[name][1] / bound:.2f}")
                rows.append(row)
                if on_row is not None:  # long runs: each row as soon as it is done
                    on_row(header, row)
    return header, rows
