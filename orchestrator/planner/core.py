"""The planner's driver: rounds, answers, and the `Planner` that feeds verdicts to a strategy.

A strategy is a generator: it yields `Round`s of variants (sets of delta indices applied
to the good config) and receives a mapping variant -> verdict for the round; it returns
an `Answer`. The `Planner` wraps it: it proposes a variant once (verdicts are cached)
unless a round asks for its variants `again` (a noise-aware search weighs repeated runs),
reruns `infra` verdicts, closes variants under coupling rules, and counts runs. Runs
recorded earlier (`evidence`, with repeats) reach a strategy that declares
`takes_evidence`; the others see the last verdict of each variant.
It is a plain state machine: the campaign runner asks `pending()`, runs those variants
anywhere it likes (one host or a pool), and calls `record()`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.verdicts import Verdict

Variant = frozenset[int]
Results = Mapping[Variant, Verdict]


@dataclass(frozen=True)
class Culprit:
    """A minimal set of deltas that causes the target failure, with the runs that prove it."""

    deltas: frozenset[int]
    #: good + deltas: reproduced the target failure.
    reproduced_by: Variant
    #: for each member: a variant of bad without that member that did not fail.
    cleared_by: tuple[tuple[int, Variant], ...] = ()
    confirmed: bool = True


@dataclass(frozen=True)
class Answer:
    culprits: tuple[Culprit, ...]
    complete: bool = True
    reason: str = ""
    #: posterior probability that the culprit sets are exactly right (noise-aware search;
    #: None when not computed)
    confidence: float | None = None
    #: measured share of runs carrying the (first) culprit set that failed with the target
    reproduction_rate: float | None = None
    #: True when the answer comes from the noise-aware search (a posterior, not proofs)
    noise_aware: bool = False

    @property
    def culprit_sets(self) -> list[frozenset[int]]:
        return [c.deltas for c in self.culprits]

    def suspects(self) -> frozenset[int]:
        out: set[int] = set()
        for c in self.culprits:
            out |= c.deltas
        return frozenset(out)


@dataclass(frozen=True)
class Round:
    """Variants that can run independently (in parallel on a pool)."""

    variants: tuple[Variant, ...]
    #: True when the first FAIL decides the round: the rest may be cancelled or skipped.
    stop_on_fail: bool = False
    purpose: str = "search"
    #: True when each variant needs one more run even if it has verdicts already
    #: (a noise-aware search repeats variants; their earlier verdicts are evidence)
    again: bool = False
    #: the answer the search would give if stopped now (a noise-aware search's partial answer)
    best: Answer | None = None
    #: why the search runs as it does (e.g. the flakiness that switched it to noise-aware)
    note: str = ""
    #: with `again`: the first fresh verdict of any variant decides the round, and the others
    #: keep running (the next round names them again); a variant named twice runs twice
    #: (a noise-aware search keeping k slots busy: planner.batch)
    any_verdict: bool = False


Search = Generator[Round, Results, Answer]
StrategyFn = Callable[[int], Search]


class Planner:
    """Drives one strategy to an answer, one verdict at a time."""

    def __init__(
        self,
        n: int,
        strategy: StrategyFn,
        *,
        known: Mapping[Variant, Verdict] | None = None,
        closure: Callable[[Variant], Variant] | None = None,
        max_infra_retries: int = 2,
        evidence: Iterable[tuple[Variant, Verdict]] = (),
    ) -> None:
        self.n = n
        self.closure = closure or (lambda v: v)
        self.max_infra_retries = max_infra_retries
        #: verdicts by (closed) variant: everything known, including `known` endpoints
        self.results: dict[Variant, Verdict] = {}
        #: the order in which verdicts were recorded (excluding `known`)
        self.history: list[tuple[Variant, Verdict]] = []
        self.infra_attempts: dict[Variant, int] = {}
        self._preset = dict(known or {})
        #: runs recorded before this planner (resume): a strategy that weighs repeated runs
        #: (`takes_evidence`) gets them all; the others see the last verdict per variant
        self.evidence = [(frozenset(v), x) for v, x in evidence if x is not Verdict.INFRA]
        for v, x in self.evidence:
            self.results[v] = x
        self.results.update(self._preset)
        self._strategy = strategy
        if getattr(strategy, "takes_evidence", False):
            self._gen = strategy(n, evidence=tuple(self.evidence), closure=self.closure)
        else:
            self._gen = strategy(n)
        self._round: Round | None = None
        #: verdicts recorded for the current `again` round (fresh runs only)
        self._fresh: dict[Variant, Verdict] = {}
        self._answer: Answer | None = None
        self._advance(None)

    # ---- state
    @property
    def done(self) -> bool:
        return self._answer is not None

    @property
    def answer(self) -> Answer:
        if self._answer is None:
            raise RuntimeError("the search has not finished")
        return self._answer

    @property
    def current_round(self) -> Round | None:
        return self._round

    @property
    def runs(self) -> int:
        """Verdicts recorded through `record` (endpoint checks given as `known` excluded)."""
        return len(self.history)

    def verdict(self, variant: Variant) -> Verdict | None:
        return self.results.get(self.closure(variant))

    def pending(self) -> list[Variant]:
        """Closed variants of the current round that still need a verdict, in round order."""
        if self._round is None:
            return []
        if self._round.again and self._round.any_verdict:
            # a multiset: none has its fresh verdict yet (the first one decides the round)
            return [self.closure(raw) for raw in self._round.variants]
        done = self._fresh if self._round.again else self.results
        out: list[Variant] = []
        for raw in self._round.variants:
            v = self.closure(raw)
            if v not in done and v not in out:
                out.append(v)
        return out

    # ---- input
    def record(self, variant: Variant, verdict: Verdict) -> None:
        """Record a verdict for a pending variant and move the search on."""
        variant = frozenset(variant)
        if self._round is not None and self._round.again:
            if variant not in self.pending():
                return  # a late duplicate of a run this round no longer needs
            if verdict is Verdict.INFRA:
                tries = self.infra_attempts.get(variant, 0) + 1
                self.infra_attempts[variant] = tries
                self.history.append((variant, verdict))
                if tries <= self.max_infra_retries:
                    return
            else:
                self.infra_attempts.pop(variant, None)
                self.history.append((variant, verdict))
                self.results[variant] = verdict
            self._fresh[variant] = verdict
            self._advance(None)
            return
        if verdict is Verdict.INFRA:
            tries = self.infra_attempts.get(variant, 0) + 1
            self.infra_attempts[variant] = tries
            self.history.append((variant, verdict))
            if tries <= self.max_infra_retries:
                return  # stays pending: run it again
        elif variant in self.results:
            return  # a late duplicate (e.g. a cancelled parallel run that finished)
        else:
            self.history.append((variant, verdict))
        self.results[variant] = verdict
        self._advance(None)

    def lookahead(self, limit: int) -> list[Variant]:
        """Variants the search will want next, whatever the variants now pending turn out to
        be: for spare hosts of a pool to run ahead (speculation). Pure: the strategy is
        replayed on the known verdicts plus hypothetical ones, breadth first, nearest
        first; nothing already known or pending is returned."""
        if limit <= 0 or self.done or (self._round is not None and self._round.again):
            return []  # a noise-aware round names every run it wants: nothing to speculate on
        out: list[Variant] = []
        skip = set(self.results) | set(self.pending())
        frontier: list[dict[Variant, Verdict]] = [{}]
        for _ in range(8):  # depth bound: a spare host rarely pays off further ahead
            nxt: list[dict[Variant, Verdict]] = []
            for hyp in frontier:
                sim = Planner(
                    self.n, self._strategy, known={**self.results, **hyp}, closure=self.closure
                )
                pending = sim.pending()
                if sim.done or not pending:
                    continue
                v = pending[0]
                if v not in skip and v not in out:
                    out.append(v)
                    if len(out) >= limit:
                        return out
                nxt += [{**hyp, v: Verdict.FAIL}, {**hyp, v: Verdict.PASS}]
            frontier = nxt[: 4 * limit + 2]
            if not frontier:
                break
        return out

    def preload(self, results: Iterable[tuple[Variant, Verdict]]) -> None:
        """Feed verdicts known from earlier runs (resume, cache) without counting them."""
        for v, verdict in results:
            if verdict is not Verdict.INFRA:
                self.results.setdefault(frozenset(v), verdict)
        self._advance(None)

    # ---- internals
    def _satisfied(self, rnd: Round) -> dict[Variant, Verdict] | None:
        got: dict[Variant, Verdict] = {}
        known = self._fresh if rnd.again else self.results
        if rnd.again and rnd.any_verdict:
            raw = next((r for r in rnd.variants if self.closure(r) in known), None)
            return None if raw is None else {raw: known[self.closure(raw)]}
        for raw in rnd.variants:
            v = self.closure(raw)
            if v in known:
                got[raw] = known[v]
                if rnd.stop_on_fail and known[v] is Verdict.FAIL:
                    return got
            elif not rnd.stop_on_fail:
                return None
        if len(got) == len(rnd.variants):
            return got
        return None

    def _advance(self, _: object) -> None:
        for _ in range(100_000):  # bounded: each step consumes a round
            if self._answer is not None:
                return
            if self._round is None:
                try:
                    self._round = next(self._gen)
                except StopIteration as stop:
                    self._finish(stop.value)
                    return
                self._fresh = {}
            got = self._satisfied(self._round)
            if got is None:
                return
            self._fresh = {}
            try:
                self._round = self._gen.send(got)
            except StopIteration as stop:
                self._finish(stop.value)
                return
        raise RuntimeError("strategy did not converge")

    def _finish(self, answer: Answer) -> None:
        self._round = None
        self._answer = answer


# ------------------------------------------------------------------ helpers for strategies


@dataclass
class Probe:
    """What a strategy knows: verdicts seen so far, with monotone inference from passes."""

    n: int
    seen: dict[Variant, Verdict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.all = frozenset(range(self.n))
        self.seen.setdefault(frozenset(), Verdict.PASS)
        self.seen.setdefault(self.all, Verdict.FAIL)

    def test(
        self, variant: Iterable[int], purpose: str = "search"
    ) -> Generator[Round, Results, Verdict]:
        v = frozenset(variant)
        if v in self.seen:
            return self.seen[v]
        got = yield Round((v,), purpose=purpose)
        self.seen[v] = got[v]
        return got[v]

    def test_round(
        self,
        variants: Iterable[Iterable[int]],
        *,
        stop_on_fail: bool = False,
        purpose: str = "search",
    ) -> Generator[Round, Results, dict[Variant, Verdict]]:
        vs = tuple(dict.fromkeys(frozenset(v) for v in variants))
        todo = tuple(v for v in vs if v not in self.seen)
        if stop_on_fail and any(self.seen.get(v) is Verdict.FAIL for v in vs):
            todo = ()
        if todo:
            got = yield Round(todo, stop_on_fail=stop_on_fail, purpose=purpose)
            self.seen.update(got)
        return {v: self.seen[v] for v in vs if v in self.seen}

    def fails(self, v: Variant) -> bool:
        return self.seen.get(v) is Verdict.FAIL

    def known_not_failing(self, v: Variant) -> bool:
        """True if v, or a superset of v, passed (a failure needs all its deltas)."""
        return any(verdict is Verdict.PASS and v <= other for other, verdict in self.seen.items())
