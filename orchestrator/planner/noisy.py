"""Noise-aware search: a posterior over culprit sets when a failure shows up only sometimes.

The model. A culprit is a set T of deltas (1, 2 or 3 of them: single flags and interacting
sets). A variant v "carries" T when T is a subset of v. A run of a variant that carries T
fails with the target signature with probability p (the reproduction rate, unknown, Beta
prior, learned from the runs); a run of a variant that does not carry T never fails with
the target. So a target failure is proof (every T not inside the failing variant is
ruled out) and a pass is only evidence (it multiplies the weight of every T it carries by
the chance of a miss). `other`, `timeout` and `invalid` say nothing about T.

With F failing runs (all of which must carry T) and S_T passing runs of variants that
carry T, the rate integrates out in closed form:

    P(runs | T) = B(a + F, b + S_T) / B(a, b)     (Beta(a, b) prior on p)

so the posterior is a pure function of the multiset of recorded runs: their order does
not matter, and a campaign resumed from its records has exactly the posterior it had.

Independent causes are peeled off as `auto` does: within a work set W (at first every
delta) the search looks for one culprit set; once it is sure of T it asks whether bad
without a member x of T (W - {x}) still fails. A target failure of a variant inside
W - {x} proves another cause there and the search goes on in W - {x}; passes of W - {x}
make "another cause" less likely (prior `other`, or `other_per_change` for each change of
W - {x}). When the runs inside W cannot be
explained by one culprit set (two failing variants with nothing in common), the search
narrows to the smallest failing variant, which must hold a complete cause.

The next variant is the one with the largest expected information about T per run
(mutual information between its verdict and T, with p integrated out), among prefixes
and suffixes of a few orders of the deltas (by how likely each is a member, and by
index), the leading set itself and bad without each of its members. The search stops
when the answer's confidence (its posterior, times the chance that no other cause hides
behind it) reaches the confidence asked for, or at its run budget with the best answer
and its confidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from orchestrator.planner.core import Answer, Culprit, Round, Search, Variant
from orchestrator.verdicts import Verdict

Run = tuple[Variant, Verdict]
#: the least information (nats) a run not run yet must promise to be taken over a repeat
MIN_GAIN = 1e-6
#: ... and the share of the best candidate's information (repeats included) it must promise
REPEAT_WORTH = 0.9
#: verdicts of a run that ran and did not show the target failure
_CLEARING = frozenset({Verdict.PASS, Verdict.OTHER, Verdict.TIMEOUT})


@dataclass(frozen=True)
class NoiseModel:
    """The prior and the stopping rule of the noise-aware search."""

    confidence: float = 0.95
    #: prior mass of a culprit set of 1, 2 and 3 deltas (uniform within a size)
    sizes: tuple[float, ...] = (0.5, 0.35, 0.15)
    #: model 3-delta sets only while a work set has at most this many of them (cost)
    max_triples: int = 1500
    #: prior chance that another independent cause hides behind a found one
    other: float = 0.1
    #: Beta(a, b) prior of the reproduction rate
    a: float = 1.0
    b: float = 1.0
    #: prior mass on a rate of exactly 1 (a deterministic failure): none for a failure known
    #: to be flaky (a set that explains every run deterministically would be favoured over
    #: the right one after a single unlucky pass). Once a run of a variant carrying a set
    #: passed, that set has no part of it anyway.
    spike: float = 0.0
    #: runs the search may ask for before it answers with what it has (None: 60 + 25 n)
    max_runs: int | None = None
    #: True: a run that failed otherwise (`other`, `timeout`) counts as a run without the
    #: target failure, as `auto` reads it (the default search); False: it says nothing
    #: (a different failure may have come first and hidden the target)
    other_clears: bool = False
    #: prior mass on a rate of 1 when the chance is weighed that runs of bad without a
    #: member of a found set all missed another cause, if no run carrying the set passed
    #: (the rate is shared: a set that failed on every start makes a missed failure of
    #: another cause unlikely); 0: the rate over the slab only
    miss_spike: float = 0.0
    #: > 0: the prior chance that another cause hides among m changes is 1 - (1 - this)^m
    #: (each change independently a further cause) instead of `other`
    other_per_change: float = 0.0
    #: False: while no run has looked flaky (a variant that both failed and passed, a pass
    #: of a superset of a failing variant), a variant already run is not run again when
    #: one not run yet tells about as much (`REPEAT_WORTH`): `auto`'s answer weighed
    #: before anything looked flaky, where a repeat asks again what every start agreed on
    repeats: bool = True
    #: True: bad without a member of the leading set is weighed by what its run tells about
    #: the set and about another cause hiding there, in the search and in the confirmation
    #: alike (one rule); False: the confirmation runs the member least sure of, in turn
    joint: bool = True


# ------------------------------------------------------------------------------ posterior


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _mask(items: Iterable[int]) -> int:
    m = 0
    for i in items:
        m |= 1 << i
    return m


def _h(x: float) -> float:
    if x <= 0.0 or x >= 1.0:
        return 0.0
    return -x * math.log(x) - (1.0 - x) * math.log(1.0 - x)


class Belief:
    """The posterior over one culprit set inside a work set, updated run by run."""

    def __init__(self, work: int, model: NoiseModel) -> None:
        self.work = work
        self.model = model
        members = _bits(work)
        self.size = len(members)
        sizes = list(model.sizes)
        if math.comb(self.size, 3) > model.max_triples:
            sizes = sizes[:2]
        # log prior per size, uniform within a size; normalised over the sizes modelled
        total = sum(sizes[k - 1] for k in range(1, len(sizes) + 1) if math.comb(self.size, k))
        self.hyps: list[int] = []
        self.members: list[tuple[int, ...]] = []
        self.logprior: list[float] = []
        for k in range(1, len(sizes) + 1):
            count = math.comb(self.size, k)
            if not count or sizes[k - 1] <= 0:
                continue
            lp = math.log(sizes[k - 1] / total / count)
            for combo in combinations(members, k):
                self.hyps.append(_mask(combo))
                self.members.append(combo)
                self.logprior.append(lp)
        self.passes: list[int] = [0] * len(self.hyps)
        self.fails = 0
        self.runs = 0
        self._weights: tuple[list[float], list[float]] | None = None

    def add(self, variant: int, fail: bool) -> None:
        """One resolved run of a variant inside the work set."""
        self.runs += 1
        self._weights = None
        if fail:
            self.fails += 1
            keep = [i for i, h in enumerate(self.hyps) if h & ~variant == 0]
            if len(keep) < len(self.hyps):
                self.hyps = [self.hyps[i] for i in keep]
                self.members = [self.members[i] for i in keep]
                self.logprior = [self.logprior[i] for i in keep]
                self.passes = [self.passes[i] for i in keep]
            return
        nv = ~variant
        passes = self.passes
        for i, h in enumerate(self.hyps):
            if h & nv == 0:
                passes[i] += 1

    @property
    def consistent(self) -> bool:
        return bool(self.hyps)

    def _like(self, s: int) -> tuple[float, float]:
        """(log P(runs | T), E[p | T, runs]) for a set carried by s passing runs."""
        m, f = self.model, self.fails
        lb = (
            math.lgamma(m.a + f)
            + math.lgamma(m.b + s)
            - math.lgamma(m.a + m.b + f + s)
            - (math.lgamma(m.a) + math.lgamma(m.b) - math.lgamma(m.a + m.b))
        )
        mean = (m.a + f) / (m.a + m.b + f + s)
        if m.spike <= 0.0 or s > 0:
            return math.log1p(-m.spike) + lb if m.spike > 0 else lb, mean
        slab = (1.0 - m.spike) * math.exp(lb)
        like = m.spike + slab
        return math.log(like), (m.spike + slab * mean) / like

    def likelihood(self, s: int) -> float:
        """log P(runs | T) for a set T carried by s passing runs."""
        return self._like(s)[0]

    def log_evidence(self) -> float:
        """log of the sum over the sets of prior times likelihood (for weighing models)."""
        logs = [lp + self._like(s)[0] for lp, s in zip(self.logprior, self.passes, strict=True)]
        if not logs:
            return -math.inf
        top = max(logs)
        return top + math.log(sum(math.exp(x - top) for x in logs))

    def weights(self) -> tuple[list[float], list[float]]:
        """(normalised posterior weights, expected reproduction rate) per hypothesis."""
        if self._weights is not None:
            return self._weights
        cache: dict[int, tuple[float, float]] = {}
        logs, rates = [], []
        for lp, s in zip(self.logprior, self.passes, strict=True):
            got = cache.get(s)
            if got is None:
                got = cache[s] = self._like(s)
            logs.append(lp + got[0])
            rates.append(got[1])
        top = max(logs) if logs else 0.0
        ws = [math.exp(x - top) for x in logs]
        total = sum(ws) or 1.0
        self._weights = ([w / total for w in ws], rates)
        return self._weights

    def best(self) -> tuple[frozenset[int], float, float, int]:
        """(leading set, its posterior, its expected rate, passes of variants carrying it)."""
        ws, rates = self.weights()
        i = max(
            range(len(ws)),
            key=lambda j: (ws[j], -len(self.members[j]), [-x for x in self.members[j]]),
        )
        return frozenset(self.members[i]), ws[i], rates[i], self.passes[i]

    def marginals(self) -> dict[int, float]:
        ws, _ = self.weights()
        mu = dict.fromkeys(_bits(self.work), 0.0)
        for w, mem in zip(ws, self.members, strict=True):
            for i in mem:
                mu[i] += w
        return mu

    def gain(self, variant: int, other: float = 0.0, rate: float = 0.0) -> float:
        """Expected information (nats) from one run of `variant` about the culprit set
        and, with `other` > 0, about whether another cause (failing at `rate`) hides in
        it: the chance the search gives that, where no culprit set is carried."""
        ws, rates = self.weights()
        nv = ~variant
        pf = c = carried = 0.0
        for w, r, h in zip(ws, rates, self.hyps, strict=True):
            if h & nv == 0:
                pf += w * r
                c += w * _h(r)
                carried += w
        if other > 0.0:  # a variant without the culprit set fails only by the other cause
            free = max(0.0, 1.0 - carried)
            pf += free * other * rate
            c += free * other * _h(rate)
        return _h(pf) - c

    def prefix_gains(self, order: Sequence[int]) -> list[tuple[float, int]]:
        """Information of every prefix and every suffix of `order` (one pass over the sets)."""
        ws, rates = self.weights()
        pos = {d: k for k, d in enumerate(order)}
        n = len(order)
        pre_pf = [0.0] * (n + 1)
        pre_c = [0.0] * (n + 1)
        suf_pf = [0.0] * (n + 1)
        suf_c = [0.0] * (n + 1)
        for w, r, mem in zip(ws, rates, self.members, strict=True):
            if w < 1e-15:
                continue
            ps = [pos[i] for i in mem]
            hi, lo = max(ps), min(ps)
            hr = w * _h(r)
            pre_pf[hi + 1] += w * r  # carried by prefixes of length > hi
            pre_c[hi + 1] += hr
            suf_pf[lo] += w * r  # carried by suffixes starting at <= lo
            suf_c[lo] += hr
        out: list[tuple[float, int]] = []
        acc_pf = acc_c = 0.0
        prefix = 0
        for k in range(1, n):
            acc_pf += pre_pf[k]
            acc_c += pre_c[k]
            prefix |= 1 << order[k - 1]
            out.append((_h(acc_pf) - acc_c, prefix))
        acc_pf = acc_c = 0.0
        suffix = 0
        for k in range(n - 1, 0, -1):
            acc_pf += suf_pf[k]
            acc_c += suf_c[k]
            suffix |= 1 << order[k]
            out.append((_h(acc_pf) - acc_c, suffix))
        return out


# ------------------------------------------------------------------------------ analysis


@dataclass
class Found:
    """A culprit set the runs point at, inside work set `work`, with its posterior."""

    term: frozenset[int]
    posterior: float
    rate: float
    work: int
    belief: Belief
    #: member -> P(no other cause in work - {member}) from the runs of that variant
    no_other: dict[int, float] = field(default_factory=dict)


@dataclass
class Analysis:
    """What the recorded runs say: the causes found, the confidence, the next run."""

    found: list[Found]
    confidence: float
    next: Variant | None
    purpose: str
    rate: float | None
    fails: int
    carried: int


class Noisy:
    """The posterior over culprit sets given recorded runs, with the choice of the next run.

    `analyze()` depends only on the multiset of runs added; beliefs are kept per work set
    and brought up to date incrementally (the same sums in any order).
    """

    def __init__(
        self, n: int, model: NoiseModel, closure: Callable[[Variant], Variant] | None = None
    ) -> None:
        self.n = n
        self.model = model
        self.closure = closure or (lambda v: v)
        self.runs: list[tuple[int, Verdict]] = []
        self._beliefs: dict[int, tuple[Belief, int]] = {}
        self.unresolved: dict[int, int] = {}
        self.invalid: set[int] = set()
        #: variants that failed with the target / passed, as run (for `looks_flaky`)
        self._failed: set[int] = set()
        self._passed: set[int] = set()
        self.looks_flaky = False

    def add(self, variant: Iterable[int], verdict: Verdict) -> None:
        m = _mask(variant)
        if verdict is Verdict.INFRA:
            return
        if verdict is Verdict.FAIL and not self.looks_flaky:
            self._failed.add(m)
            self.looks_flaky = any(m & ~p == 0 for p in self._passed)
        elif verdict is Verdict.PASS and not self.looks_flaky:
            self._passed.add(m)
            self.looks_flaky = any(f & ~m == 0 for f in self._failed)
        if self.model.other_clears and verdict in (Verdict.OTHER, Verdict.TIMEOUT):
            verdict = Verdict.PASS  # it ran, and did not show the target failure
        self.runs.append((m, verdict))
        if not verdict.resolved:
            self.unresolved[m] = self.unresolved.get(m, 0) + 1
            if verdict is Verdict.INVALID:
                self.invalid.add(m)

    def belief(self, work: int) -> Belief:
        got = self._beliefs.get(work)
        b, seen = got if got else (Belief(work, self.model), 0)
        for v, verdict in self.runs[seen:]:
            if verdict.resolved and v & ~work == 0:
                b.add(v, verdict is Verdict.FAIL)
        self._beliefs[work] = (b, len(self.runs))
        return b

    def _fails_inside(self, work: int) -> list[int]:
        return [v for v, x in self.runs if x is Verdict.FAIL and v & ~work == 0]

    def _clears_of(self, v: int) -> int:
        return sum(1 for u, x in self.runs if u == v and x in _CLEARING)

    def _passes_of(self, v: int) -> int:
        return sum(1 for u, x in self.runs if u == v and x is Verdict.PASS)

    def analyze(self) -> Analysis:
        full = (1 << self.n) - 1
        work = full
        found: list[Found] = []
        conf = 1.0
        for _ in range(self.n + 1):  # each pass removes a member from the work set
            fails = self._fails_inside(work)
            if not fails:
                if not found:  # no target failure recorded at all: bad again
                    return Analysis([], 0.0, frozenset(range(self.n)), "endpoint", None, 0, 0)
                break  # nothing proves a cause in here; `no_other` covered it
            belief = self.belief(work)
            search = work
            if not belief.consistent:
                # two causes at least: the smallest failing variant holds a whole one
                search = min(fails, key=lambda v: (bin(v).count("1"), _bits(v)))
                belief = self.belief(search)
            term, post, rate, _ = belief.best()
            f = Found(term, post, rate, work, belief)
            found.append(f)
            conf *= post
            if post < self.model.confidence:
                doubts = {rest: 1.0 - q for rest, q in self._no_other(f).items()}
                return self._result(found, conf, belief, "search", doubts=doubts)
            # another cause: proven by a failure inside work - {x}, else weighed by the
            # passes of bad without x
            proven = next((x for x in sorted(term) if self._fails_inside(work & ~(1 << x))), None)
            if proven is not None:
                work &= ~(1 << proven)
                continue
            sure = self._no_other(f)
            for x in sorted(term):
                rest = work & ~(1 << x)
                f.no_other[x] = sure.get(rest, 1.0)
                conf *= f.no_other[x]
            if conf < self.model.confidence:
                if self._joint():  # bad without a member, or what else tells more
                    doubts = {rest: 1.0 - q for rest, q in sure.items()}
                    return self._result(found, conf, belief, "confirm", doubts=doubts)
                x = min(f.no_other, key=lambda y: (f.no_other[y], y))
                return self._result(found, conf, None, "confirm", work & ~(1 << x))
            break
        return self._result(found, conf, None, "done")

    def _joint(self) -> bool:
        """Whether the run after this one is weighed for another cause too: in the search
        for a failure known to be flaky (while nothing looked flaky, the confirmation of
        a deterministic answer runs bad without each member in turn, as `auto` would)."""
        return self.model.joint and (self.model.repeats or self.looks_flaky)

    def _no_other(self, f: Found) -> dict[int, float]:
        """W - {x} -> P(no other cause in it) for each member x of the found set (W its
        work set), from the runs of that variant that did not show the target."""
        out: dict[int, float] = {}
        for x in sorted(f.term):
            rest = f.work & ~(1 << x)
            if not rest:
                continue
            # runs of W - {x} that did not show the target: a pass, or another failure
            # (a run that failed differently did not fail with the target either)
            k = self._clears_of(rest)
            miss = self._miss(f.belief, f.term, k)
            q = self.model.other
            if self.model.other_per_change > 0:
                q = 1.0 - (1.0 - self.model.other_per_change) ** rest.bit_count()
            out[rest] = (1 - q) / ((1 - q) + q * miss)
        return out

    def _clearing(self, preferred: int, rest: int, x: int) -> int | None:
        """A variant that passed with `rest` and without `x` (the work set without x first,
        else the largest such run): the evidence that x is needed."""
        if self._passes_of(preferred):
            return preferred
        runs = [
            v for v, got in self.runs if got is Verdict.PASS and not v >> x & 1 and rest & ~v == 0
        ]
        return max(runs, key=lambda v: (v.bit_count(), v), default=None)

    def _miss(self, belief: Belief, term: frozenset[int], k: int) -> float:
        """E[(1 - p)^k]: the chance that k runs of a variant with another cause all pass."""
        m = self.model
        if k == 0:  # no run of it yet: nothing missed (the spike's 0^0 is 1 too)
            return 1.0
        _, _, _, s = belief.best()
        f = belief.fails
        # The rate over the slab, unless no run carrying the found set passed: then the
        # rate is 1 with the posterior weight of `miss_spike` (with the found set's own
        # spike, 0.3 in the default, it made the default confidently wrong more often at
        # p = 0.5; a weight of 0.5 here spares a deterministic pair about two runs;
        # bench/runs_to_answer.py --noise)
        slab = math.exp(
            math.lgamma(m.b + s + k)
            - math.lgamma(m.b + s)
            + math.lgamma(m.a + m.b + f + s)
            - math.lgamma(m.a + m.b + f + s + k)
        )
        if m.miss_spike > 0 and s == 0:
            lb = (
                math.lgamma(m.a + f)
                + math.lgamma(m.b)
                - math.lgamma(m.a + m.b + f)
                - (math.lgamma(m.a) + math.lgamma(m.b) - math.lgamma(m.a + m.b))
            )
            w = (1 - m.miss_spike) * math.exp(lb)
            return slab * w / (m.miss_spike + w)
        return slab

    def _result(
        self,
        found: list[Found],
        conf: float,
        belief: Belief | None,
        purpose: str,
        nxt: int | None = None,
        doubts: dict[int, float] | None = None,
    ) -> Analysis:
        if belief is not None:
            nxt = self.choose(belief, doubts if self._joint() else None)
        rate, fails, carried = self.rate(found[0].term) if found else (None, 0, 0)
        variant = frozenset(_bits(nxt)) if nxt is not None else None
        return Analysis(found, conf, variant, purpose, rate, fails, carried)

    def rate(self, term: frozenset[int]) -> tuple[float | None, int, int]:
        """(measured reproduction rate, target failures, resolved runs) of variants with term."""
        t = _mask(term)
        carried = [x for v, x in self.runs if x.resolved and t & ~v == 0]
        fails = sum(1 for x in carried if x is Verdict.FAIL)
        return (fails / len(carried) if carried else None), fails, len(carried)

    # ---- the next run
    def choose(self, belief: Belief, doubts: dict[int, float] | None = None) -> int:
        """The candidate with the most expected information; `doubts`: W - {x} -> the
        chance another cause hides there (its runs then tell about that too)."""
        doubts = doubts or {}
        mu = belief.marginals()
        items = sorted(mu)
        by_mu = sorted(items, key=lambda i: (-mu[i], i))
        orders = [by_mu, items]
        term, _, _, _ = belief.best()
        rest = [i for i in by_mu if i not in term]
        orders.append([*sorted(term), *sorted(rest)])
        scored: dict[int, float] = {}
        for order in orders:
            for g, v in belief.prefix_gains(order):
                if v not in scored:
                    scored[v] = g
        extra = [_mask(term)] + [belief.work & ~(1 << x) for x in term]
        for v in extra:
            if v and v != belief.work and v not in scored:
                scored[v] = belief.gain(v)
        _, _, rate, _ = belief.best()
        for v, q in doubts.items():  # bad without a member: about the set and another cause
            scored[v] = belief.gain(v, q, rate)
        blocked = self.invalid | {v for v, c in self.unresolved.items() if c >= 2}
        # ties: the smaller variant, then the lower mask (deterministic, cheap)
        ranked = sorted(scored.items(), key=lambda kv: (-kv[1], kv[0].bit_count(), kv[0]))
        new = (
            None
            if self.model.repeats or self.looks_flaky
            else self._not_run(belief, ranked, blocked)
        )
        best: tuple[float, int] | None = None
        for v, g in ranked[:12]:
            closed = _mask(self.closure(frozenset(_bits(v))))
            if closed in blocked:
                continue
            if closed != v:
                g = belief.gain(closed, doubts.get(closed, 0.0), rate)
            if best is None or g > best[0] + 1e-12:
                best = (g, closed)
        if new is not None and (best is None or new[0] >= REPEAT_WORTH * best[0]):
            return new[1]  # a variant not run yet, worth about as much as the best
        if best is None:  # everything informative is blocked: run the leading set again
            return _mask(term)
        return best[1]

    def passed_changes(self) -> int:
        """The changes some run that passed carried (as run: another failure is no pass)."""
        out = 0
        for v in self._passed:
            out |= v
        return out

    def ran(self) -> set[int]:
        """Every variant run so far (closed), whatever its verdict."""
        return {v for v, _ in self.runs}

    def _not_run(
        self, belief: Belief, ranked: Sequence[tuple[int, float]], blocked: set[int]
    ) -> tuple[float, int] | None:
        """The most informative candidate not run yet and its information (None: none
        would tell anything). Besides the leading set's changes it may carry only changes
        some passing run carried: it asks the question of the repeat it replaces, not one
        about changes only failing runs (or other failures) have carried."""
        ran = self.ran() | blocked
        term, _, _, _ = belief.best()
        allowed = self.passed_changes() | _mask(term)
        best: tuple[float, int] | None = None
        seen = 0
        for v, g in ranked:
            if seen >= 12:
                break
            closed = _mask(self.closure(frozenset(_bits(v))))
            if closed in ran or closed & ~allowed:
                continue
            seen += 1
            if closed != v:
                g = belief.gain(closed)
            if g > MIN_GAIN and (best is None or g > best[0] + 1e-12):
                best = (g, closed)
        return best

    # ---- the answer
    def answer(self, a: Analysis, *, complete: bool, reason: str = "") -> Answer:
        culprits = []
        for f in a.found:
            t = _mask(f.term)
            fails = [v for v, x in self.runs if x is Verdict.FAIL and t & ~v == 0]
            repro = min(fails, key=lambda v: (bin(v).count("1"), _bits(v))) if fails else t
            cleared = []
            for x in sorted(f.term):
                rest = self._clearing(f.work & ~(1 << x), t & ~(1 << x), x)
                if rest is not None:
                    cleared.append((x, frozenset(_bits(rest))))
            culprits.append(
                Culprit(f.term, frozenset(_bits(repro)), tuple(cleared), confirmed=repro == t)
            )
        return Answer(
            tuple(culprits),
            complete=complete and bool(culprits),
            reason=reason,
            confidence=a.confidence,
            reproduction_rate=a.rate,
            noise_aware=True,
        )


def noisy_search(
    n: int,
    evidence: Sequence[Run] = (),
    *,
    model: NoiseModel = NoiseModel(),
    closure: Callable[[Variant], Variant] | None = None,
    note: str = "",
) -> Search:
    """The search as a strategy generator: each round is one variant to run once more."""
    state = Noisy(n, model, closure)
    for v, verdict in evidence:
        state.add(v, verdict)
    budget = model.max_runs if model.max_runs is not None else 60 + 25 * n
    for _ in range(budget):
        a = state.analyze()
        if a.next is None:
            return state.answer(a, complete=True)
        best = state.answer(a, complete=False, reason="the search was stopped")
        got = yield Round((a.next,), purpose=f"noise-{a.purpose}", again=True, best=best, note=note)
        for v, verdict in got.items():
            state.add(state.closure(v), verdict)
    a = state.analyze()
    return state.answer(
        a, complete=False, reason=f"run budget of the noise-aware search spent ({budget} runs)"
    )
