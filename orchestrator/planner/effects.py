"""The search that explains a measured effect: which deltas cost the throughput (or gave
it, or made a latency worse), each with its effect and interval, under benchmark noise.

Pure: the search is a generator that yields what to measure next (`Measure`: one start of
a variant, the benchmark run so many times in it) and is sent back the figures of those
runs; `drive` runs it against any oracle. No clock, no I/O, no randomness.

The method (docs/search.md, "A slower deployment"):

1. **The noise.** Good is started three times and bad twice; a start's value is the median
   of its runs after the warm-up (`effect_stats.start_value`), on a log scale, so effects are
   ratios. The noise between starts is pooled over every configuration started more than
   once; the noise inside a start comes from the runs themselves. How many runs a start
   gets follows the classic two-stage allocation: sqrt(cost of a start / cost of a run *
   within-start variance / between-start variance), so a noisy benchmark on a quiet start
   runs more often and a start-to-start noise is met with more starts instead.
2. **Bad against good.** The search begins when bad's effect exceeds the bar and its
   interval clears zero; bad meets the bar when the whole interval lies within it
   ("nothing misses the bar"); past a budget of endpoint starts the answer is `unsure`.
   Before an answer names anything bad is started afresh (the starts that let the search
   begin were chosen by their luck) and must then miss the bar with its interval clear
   of half of it.
3. **Screening by group effects** (sequential bifurcation, Bettonvil and Kleijnen): a group
   of deltas that carries an effect is split in halves; only good + the first half is a new
   variant: the first half's effect is that variant against the base, the second half's is
   the whole group's variant against it (its effect given the first half, so flags that
   cost only together show there). A ratio test of "the first half carries all of it"
   against "none of it" settles a single culprit in a start or two; otherwise a half is
   *active* when its interval clears a quarter of the bar and its estimate half of it,
   *inactive* when its interval lies below the bar. A comparison asks for more starts of
   the variant with fewer, up to a budget. A term found under a base other than good is
   tried from good alone; when it does nothing there, its partners are searched in that
   base.
4. **Each candidate measured from both ends**: bad minus the term is measured too (a term
   is kept only when removing it gives the effect back), what the kept terms leave is
   searched again, and one linear model over every start (a level, each term's effect, and
   a drift in time when good drifted) gives each term's effect with its interval. A term
   is named when that interval clears zero at the campaign's confidence (shared among the
   terms) and its estimate is at least three quarters of the bar; every other group or
   term is cleared with its interval. The model reads the starts after the search began
   alone (those before were chosen by their luck), and the named terms together must
   miss the bar on their own interval, not only bad's total: while that interval
   straddles the bar, bad and bad without them are started again, in turn.
5. **Drift.** Good is started again after every few starts of the variants; good's own
   trend, when beyond the noise, is taken out of the effects, and the answer states it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

from orchestrator.planner.effect_stats import THROUGHPUT, Direction, start_value, t_quantile

Variant = frozenset[int]
#: a run further than this from its start's median (log scale: about 25 %) is an outlier
OUTLIER = 0.22


@dataclass(frozen=True)
class Measure:
    """Start `variant` once and run the benchmark `runs` times in it (warm-up included)."""

    variant: Variant
    runs: int


@dataclass(frozen=True)
class EffectSettings:
    direction: Direction = THROUGHPUT
    #: the smallest effect that matters, as a share (0.05: 5 % slower or later)
    bar: float = 0.05
    confidence: float = 0.95
    #: runs of a start discarded as warm-up
    warmup: int = 1
    #: a start costs this many benchmark runs (a big MoE start is minutes, a run one)
    start_cost: float = 10.0
    #: starts of bad and good before "unsure" is said of bad against good
    endpoint_budget: int = 24
    #: starts of a half's variant for the all-or-nothing test before each half is
    #: compared on its own
    sprt_starts: int = 4
    #: the one-sided confidence with which screening clears a group (a wrong clear is
    #: caught when bad minus the named terms still misses the bar)
    screen_confidence: float = 0.8
    #: starts added for one comparison before it is decided on its estimate
    decide_budget: int = 12
    #: bad's starts before an answer names anything
    fresh_bad: int = 6
    #: good is started again after this many starts of the variants
    good_every: int = 4
    #: runs per start: the allocation's bounds (warm-up not counted)
    min_runs: int = 3
    max_runs: int = 8


@dataclass(frozen=True)
class Effect:
    """A term's effect (a cost difference on the log scale, positive: worse) and its
    interval at the answer's confidence."""

    deltas: Variant
    effect: float
    low: float
    high: float

    def percent(self, direction: Direction) -> tuple[float, float, float]:
        """(change, low, high) in the metric's own percent, low <= high."""
        a, b = direction.as_percent(self.low), direction.as_percent(self.high)
        return direction.as_percent(self.effect), min(a, b), max(a, b)


@dataclass(frozen=True)
class EffectAnswer:
    #: "found" (named terms explain the effect), "none" (bad meets the bar), "unsure"
    status: str
    total: Effect
    named: tuple[Effect, ...] = ()
    cleared: tuple[Effect, ...] = ()
    #: the share of bad's effect the named terms explain
    explained: float = 0.0
    confidence: float = 0.0
    #: the noise measured: CV between starts and between runs of one start
    noise_between: float = 0.0
    noise_within: float = 0.0
    #: the host's own drift over the campaign, as a cost difference first to last start
    drift: float = 0.0
    starts: int = 0
    runs: int = 0
    reason: str = ""


@dataclass
class _Data:
    warmup: int
    values: dict[Variant, list[float]] = field(default_factory=dict)
    times: dict[Variant, list[int]] = field(default_factory=dict)
    within_ss: float = 0.0
    within_df: int = 0
    starts: int = 0
    runs: int = 0
    kept: int = 0

    def add(self, v: Variant, figures: Sequence[float], cost: Callable[[float], float]) -> None:
        self.starts += 1
        self.runs += len(figures)
        self.values.setdefault(v, []).append(cost(start_value(figures, self.warmup)))
        self.times.setdefault(v, []).append(self.starts)
        kept = [cost(x) for x in figures[self.warmup :]]
        mid = statistics.median(kept) if kept else 0.0
        # a run this far from its start's median is a broken run (an outlier), not the
        # benchmark's noise: it leaves the median alone and is kept out of the variance
        kept = [y for y in kept if abs(y - mid) <= OUTLIER]
        self.kept += len(kept)
        if len(kept) >= 2:
            self.within_ss += statistics.variance(kept) * (len(kept) - 1)
            self.within_df += len(kept) - 1

    def n(self, v: Variant) -> int:
        return len(self.values.get(v, ()))

    def mean(self, v: Variant) -> float:
        return statistics.fmean(self.values[v])

    def pooled(self) -> tuple[float, int]:
        """The variance of a start's value (between starts of one config) and its df."""
        ss, df = 0.0, 0
        for vals in self.values.values():
            if len(vals) >= 2:
                ss += statistics.variance(vals) * (len(vals) - 1)
                df += len(vals) - 1
        var = ss / df if df else 0.0
        # a start's value varies at least as much as the median of its own runs does
        # (pi/2 times the variance of a mean): a floor for a pooled figure read from few
        # starts, which otherwise makes every comparison overconfident
        kept = self.kept / self.starts if self.starts else 1.0
        return max(var, math.pi / 2 * self.within() / max(kept, 1.0)), df

    def within(self) -> float:
        return self.within_ss / self.within_df if self.within_df else 0.0


Search = Generator[Measure, Sequence[float], EffectAnswer]


class EffectSearch:
    """One search over `n` deltas (variant = good + a set of delta indices)."""

    def __init__(self, n: int, settings: EffectSettings | None = None) -> None:
        self.n = n
        self.s = settings or EffectSettings()
        self.data = _Data(self.s.warmup)
        self.m = abs(math.log(1 - self.s.bar))
        self.sign = 1.0
        self.cleared: list[Effect] = []
        self.since_good = 0
        self.forced = 0
        #: starts before the search began: chosen by their luck (it begins when bad looked
        #: worse than good), so the effects named are read from the later starts alone
        self.begun = 0
        #: one comparison's one-sided confidence: a search makes about a dozen, and a wrong
        #: one sends it down the wrong half
        self.decide_conf = 1 - (1 - self.s.confidence) / 4

    # -- measuring

    def _runs(self) -> int:
        var, df = self.data.pooled()
        w = self.data.within()
        if df < 2 or w <= 0:
            r = 3
        else:
            r_now = max(self.s.min_runs, 3)
            between = max(var - w / r_now, var * 0.05, 1e-12)
            r = round(math.sqrt(self.s.start_cost * w / between))
        return self.s.warmup + min(max(r, self.s.min_runs), self.s.max_runs)

    def _start(self, v: Variant) -> Generator[Measure, Sequence[float], None]:
        if v and self.since_good >= self.s.good_every:
            yield from self._start(frozenset())
        figures = yield Measure(v, self._runs())
        if not figures:
            raise ValueError(f"a start of {sorted(v)} returned no figures")
        self.data.add(v, figures, self.s.direction.cost)
        self.since_good = 0 if not v else self.since_good + 1

    def _diff(self, x: Variant, y: Variant, conf: float) -> tuple[float, float, float]:
        """(effect of x over y in the search's direction, half-width, se)."""
        var, df = self.data.pooled()
        se = math.sqrt(var * (1 / self.data.n(x) + 1 / self.data.n(y)))
        e = self.sign * (self.data.mean(x) - self.data.mean(y))
        return e, t_quantile(conf, max(df, 1)) * se, se

    def _decide(
        self, x: Variant, y: Variant, *, kind: str = "screen"
    ) -> Generator[Measure, Sequence[float], bool]:
        """Does x (y plus a group) carry an effect over y? More starts until it shows.

        `kind` says what a mistake costs. `screen`: a group while screening; clearing a
        group wrongly is caught later (what the named terms leave unexplained is searched
        again), so it asks less, and a group still within the noise after the budget is
        looked into. `rest`: what the named terms leave; cleared at the campaign's
        confidence, and past the budget taken as explained. `recheck`: a group looked at
        again because neither of its halves showed; cleared at the naming confidence.
        `term`: a term's last check, cleared at the naming confidence; past the budget the
        answer is unsure."""
        conf = self.decide_conf
        clear = {"screen": self.s.screen_confidence, "rest": self.s.confidence}.get(kind, conf)
        added = 0
        while True:
            for v in (x, y):
                while self.data.n(v) < 1:
                    yield from self._start(v)
            e, half, se = self._diff(x, y, conf)
            if e - half > self.m / 4 and e >= self.m / 2:
                return True
            _, df = self.data.pooled()
            if e + t_quantile(clear, max(df, 1)) * se < self.m:
                self.cleared.append(
                    Effect(x - y, self.sign * e, self.sign * (e - half), self.sign * (e + half))
                )
                return False
            if added >= self.s.decide_budget:
                if kind == "term":
                    self.forced += 1
                    return e >= self.m / 2
                return kind in ("screen", "recheck") and e >= self.m / 4
            yield from self._start(x if self.data.n(x) <= self.data.n(y) else y)
            added += 1

    # -- the search

    def run(self) -> Search:
        good, bad = frozenset(), frozenset(range(self.n))
        for v in (good, good, good, bad, bad):
            yield from self._start(v)
        while True:
            d = self.data.mean(bad) - self.data.mean(good)
            self.sign = 1.0 if d >= 0 else -1.0
            e, half, _ = self._diff(bad, good, self.s.confidence)
            # to search, bad must be worse than good beyond doubt and by the bar on its
            # estimate; the answer asks more of it (its interval clear of half the bar)
            # once every start of the search has measured it again
            if e >= self.m and e - half > 0:
                break
            if e + half < self.m:
                return self._answer("none", [], "bad meets the bar")
            if self.data.n(good) + self.data.n(bad) >= self.s.endpoint_budget:
                return self._answer("unsure", [], "bad against good stays within the noise")
            yield from self._start(bad if self.data.n(bad) < self.data.n(good) else good)
        self.begun = self.data.starts
        confirmed: list[Variant] = []
        rest = bad
        for _ in range(3):  # what the named terms leave unexplained is searched again
            terms = yield from self._explain(rest, good)
            terms = yield from self._partners(terms)
            for t in terms:
                if any(c <= t for c in confirmed):
                    continue
                if (yield from self._decide(bad, bad - t, kind="term")):
                    confirmed.append(t)
            rest = bad - frozenset().union(*confirmed)
            if not rest or not confirmed:
                break
            if not (yield from self._decide(rest, good, kind="rest")):
                break
        # bad measured afresh: the starts that let the search begin were chosen by their
        # own luck (a search begins when bad looked worse), fresh ones are not
        while confirmed and self.data.n(bad) < self.s.fresh_bad:
            yield from self._start(bad)
        # the named terms must miss the bar on their own interval: while that interval
        # straddles the bar, bad and bad without them are started again, in turn
        without = bad - frozenset().union(*confirmed) if confirmed else bad
        for _ in range(self.s.decide_budget if confirmed else 0):
            beta, _, sum_se = self._fit(confirmed, False)
            _, df = self.data.pooled()
            q = t_quantile(self.s.confidence, max(df, 1)) * sum_se
            effect = self.sign * sum(beta)
            if effect - q >= self.m or effect + q < self.m:
                break
            yield from self._start(bad if self.data.n(bad) <= self.data.n(without) else without)
        return self._answer("found", confirmed, "")

    def _explain(
        self, full: Variant, base: Variant
    ) -> Generator[Measure, Sequence[float], list[tuple[Variant, Variant]]]:
        """Terms (a set of deltas, the base it was found in) inside full - base, which is
        known to carry an effect over base."""
        group = sorted(full - base)
        if len(group) == 1:
            return [(frozenset(group), base)]
        h1 = frozenset(group[: len(group) // 2])
        x = base | h1
        first, second = yield from self._split(full, base, x)
        if not first and not second:  # the group acts but neither half showed: look again
            first = yield from self._decide(x, base, kind="recheck")
            second = yield from self._decide(full, x, kind="recheck")
            if not first and not second:
                e1 = self._diff(x, base, self.s.confidence)[0]
                first = e1 >= self._diff(full, x, self.s.confidence)[0]
                second = not first
        out: list[tuple[Variant, Variant]] = []
        if first:
            out += yield from self._explain(x, base)
        if second:
            out += yield from self._explain(full, x)
        return out

    def _split(
        self, full: Variant, base: Variant, x: Variant
    ) -> Generator[Measure, Sequence[float], tuple[bool, bool]]:
        """Which halves of full - base carry its effect: (the first, x - base; the second).

        First a sequential probability ratio test of "the first half carries all of the
        group's effect" against "none of it" (a single culprit, the common case, is
        settled in a start or two); an effect shared between the halves leaves that test
        undecided, and each half is then compared on its own."""
        a = math.log(self.decide_conf / (1 - self.decide_conf))
        for _ in range(self.s.sprt_starts):
            v = x if self.data.n(x) <= self.data.n(base) else base
            if self.data.n(x) < 1 or v == base:
                yield from self._start(v)
            total, _, _ = self._diff(full, base, self.s.confidence)
            e1, _, se1 = self._diff(x, base, self.s.confidence)
            if total < self.m or se1 <= 0:
                break
            llr = total / se1**2 * (e1 - total / 2)
            if llr > a:
                return True, False
            if llr < -a:
                return False, True
            yield from self._start(x)
        first = yield from self._decide(x, base)
        second = yield from self._decide(full, x)
        return first, second

    def _partners(
        self, terms: list[tuple[Variant, Variant]]
    ) -> Generator[Measure, Sequence[float], list[Variant]]:
        """Each term tried from good; one that does nothing there needs partners from the
        base it was found in."""
        out: list[Variant] = []
        good = frozenset()
        for term, base in terms:
            if not base or (yield from self._decide(term, good, kind="term")):
                out.append(term)
                continue
            if not (yield from self._decide(base | term, term)):
                out.append(term)  # the base adds nothing: the term acts alone
                continue
            partners = yield from self._explain(base | term, term)
            found = frozenset().union(*(p for p, _ in partners))
            if (yield from self._decide(found, good, kind="recheck")):
                out.append(found)  # the partners act alone: the term was noise
            else:
                out.append(term | found)
        # a term that holds another is that one's effect seen twice, not an interaction
        return [t for t in dict.fromkeys(out) if not any(o < t for o in out)]

    # -- the answer

    def _drift(self) -> tuple[float, float]:
        """Good's own trend: (slope per start, its se), from good's starts alone."""
        ts, ys = self.data.times[frozenset()], self.data.values[frozenset()]
        if len(ts) < 3 or len(set(ts)) < 2:
            return 0.0, math.inf
        tm, ym = statistics.fmean(ts), statistics.fmean(ys)
        sxx = sum((t - tm) ** 2 for t in ts)
        slope = sum((t - tm) * (y - ym) for t, y in zip(ts, ys, strict=True)) / sxx
        var, _ = self.data.pooled()
        return slope, math.sqrt(var / sxx)

    def _fit(self, terms: list[Variant], trend: bool) -> tuple[list[float], list[float], float]:
        """Least squares of every start's value on a level and each term (and, when good
        drifted, the time): each term's coefficient and its standard error, and the
        standard error of the terms' sum."""
        rows, ys = [], []
        for v, vals in self.data.values.items():
            for y, t in zip(vals, self.data.times[v], strict=True):
                if t <= self.begun:
                    continue
                row = [1.0, *(1.0 if term <= v else 0.0 for term in terms)]
                rows.append([*row, float(t)] if trend else row)
                ys.append(y)
        k = len(rows[0])
        xtx = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
        xty = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(k)]
        inv = _invert(xtx)
        if inv is None:
            return [0.0] * len(terms), [math.inf] * len(terms), math.inf
        beta = [sum(inv[i][j] * xty[j] for j in range(k)) for i in range(k)]
        var, _ = self.data.pooled()
        ses = [math.sqrt(max(inv[i][i], 0.0) * var) for i in range(k)]
        idx = range(1, 1 + len(terms))
        sum_se = math.sqrt(max(sum(inv[i][j] for i in idx for j in idx), 0.0) * var)
        return beta[1 : 1 + len(terms)], ses[1 : 1 + len(terms)], sum_se

    def _answer(self, status: str, terms: list[Variant], reason: str) -> EffectAnswer:
        good, bad = frozenset(), frozenset(range(self.n))
        var, df = self.data.pooled()
        e, half, _ = self._diff(bad, good, self.s.confidence)
        total = Effect(bad, self.sign * e, self.sign * (e - half), self.sign * (e + half))
        slope, slope_se = self._drift()
        drifted = abs(slope) > t_quantile(self.s.confidence, max(df, 1)) * slope_se
        beta, ses, sum_se = self._fit(terms, drifted)
        named, cleared = [], list(self.cleared)
        conf_each = 1 - (1 - self.s.confidence) / max(len(terms), 1)
        confidence = 1.0
        for term, b, se in zip(terms, beta, ses, strict=True):
            b *= self.sign
            q = t_quantile(conf_each, max(df, 1)) * se
            eff = Effect(term, self.sign * b, self.sign * (b - q), self.sign * (b + q))
            if b - q > 0 and b >= 0.75 * self.m:
                named.append(eff)
                confidence = min(confidence, _t_cdf(b / se if se else math.inf, df))
            else:
                cleared.append(eff)
        if status == "found" and not named:
            status, reason = "unsure", "no term's effect clears the noise"
        elif status == "found" and self.forced:
            status = "unsure"
            reason = f"{self.forced} comparison(s) stayed within the noise after their budget"
        elif status == "found" and not (e >= self.m and e - half > self.m / 2):
            status, reason = "unsure", "bad against good no longer clearly misses the bar"
        elif status == "found" and sum(self.sign * x.effect for x in named) < self.m:
            status, reason = "unsure", "the named terms together do not miss the bar"
        elif (
            status == "found"
            and len(named) == len(terms)
            and (
                sum(self.sign * x.effect for x in named)
                - t_quantile(self.s.confidence, max(df, 1)) * sum_se
                < self.m
            )
        ):
            # the named terms' own interval must lie beyond the bar, not only bad's total:
            # a flag whose effect may be inside the bar is no culprit
            status, reason = "unsure", "the named terms' effect may lie within the bar"
        if status == "found":
            confidence = min(
                confidence, _t_cdf(e / (half / t_quantile(self.s.confidence, max(df, 1))), df)
            )
            if confidence < self.s.confidence:
                status, reason = "unsure", f"confidence {confidence:.3f} below the campaign's"
        explained = sum(self.sign * x.effect for x in named) / e if status == "found" and e else 0.0
        within = self.data.within()
        kept = max(self.data.kept / max(self.data.starts, 1), 1.0)
        span = self.data.starts
        return EffectAnswer(
            status=status,
            total=total,
            named=tuple(named) if status == "found" else (),
            cleared=tuple(cleared),
            explained=explained,
            confidence=confidence if status == "found" else 0.0,
            noise_between=math.sqrt(max(var - math.pi / 2 * within / kept, 0.0)),
            noise_within=math.sqrt(within),
            drift=slope * span,
            starts=self.data.starts,
            runs=self.data.runs,
            reason=reason,
        )


def drive(search: EffectSearch, oracle: Callable[[Measure], Sequence[float]]) -> EffectAnswer:
    """Run a search to its answer, each start measured by `oracle`."""
    gen = search.run()
    try:
        request = next(gen)
        while True:
            request = gen.send(oracle(request))
    except StopIteration as stop:
        return stop.value


def _t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t, through a normal approximation good to a few parts per
    thousand from 3 degrees of freedom on."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    df = max(df, 1.0)
    z = t * (1 - 1 / (4 * df)) / math.sqrt(1 + t * t / (2 * df))
    return statistics.NormalDist().cdf(z)


def _invert(a: list[list[float]]) -> list[list[float]] | None:
    """The inverse of a small symmetric matrix (Gauss-Jordan), None when singular."""
    k = len(a)
    m = [[*row, *(1.0 if i == j else 0.0 for j in range(k))] for i, row in enumerate(a)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-9:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        p = m[col][col]
        m[col] = [x / p for x in m[col]]
        for r in range(k):
            if r != col and m[r][col]:
                f = m[r][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [row[k:] for row in m]
