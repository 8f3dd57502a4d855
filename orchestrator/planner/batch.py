"""The noise-aware search with several runs at once: k slots, each refilled as a run ends.

With k slots (the hosts of a pool, a Slurm host's `max_jobs`) the search keeps k runs
going. When one ends, its verdict updates the posterior (`noisy.Noisy`, unchanged: the same
prior, posterior and stopping rule as one run at a time) before the freed slot is filled,
and the slot gets the variant that adds the most to the runs still in progress:

    argmax_v  I(T; Y_pending, Y_v)

the expected information about the culprit set T of all those runs together, the
reproduction rate integrated out. The runs of one culprit set share its rate, so their
outcomes are not independent: every joint outcome of the runs in progress is weighed by
its chance under each hypothesis (a fantasized outcome, not a guess of one), and a variant
whose information the runs in progress already bring scores low. k copies of the best
single variant are chosen only when nothing else is worth as much.

While the search confirms a culprit set (bad without each member, to rule out another
cause behind it), the runs in progress count as the passes they most likely are, and each
slot goes to the member whose "no other cause" is least sure under that assumption.
Once the answer is sure, the runs in progress are read before it is given (at 4 slots
this made the answers at least as often right as with one; bench/parallel_noisy.py).

The joint outcome of m runs has 2^m values: the runs in progress weighed jointly are the
newest `JOINT` ones (a cluster with more slots than that weighs the rest as not there).
The generator protocol: each round names every run the search wants in progress
(`Round.any_verdict`); it is decided by the first verdict, and the next round names the
runs still going again, with the new ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.planner.core import Round, Search, Variant
from orchestrator.planner.noisy import (
    MIN_GAIN,
    REPEAT_WORTH,
    Analysis,
    Belief,
    NoiseModel,
    Noisy,
    Run,
    _bits,
    _mask,
    noisy_search,
)
from orchestrator.verdicts import Verdict

#: runs in progress weighed jointly with a candidate (2^(JOINT + 1) outcomes each)
JOINT = 6
#: candidates scored jointly per slot: the best ones by their own information
CANDIDATES = 12


# ------------------------------------------------------------------------------ information


class _Predictive:
    """P(one given outcome of m runs carrying T with f target failures | T, runs so far),
    for a culprit set whose carrying variants passed s times (p integrated out)."""

    def __init__(self, belief: Belief) -> None:
        m = belief.model
        self.a, self.b, self.spike, self.fails = m.a, m.b, m.spike, belief.fails
        self._cache: dict[tuple[int, int], list[float]] = {}

    def _lbeta(self, x: float, y: float) -> float:
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)

    def probs(self, s: int, m: int) -> list[float]:
        """Index f: the chance of one particular outcome with f failures among m runs."""
        got = self._cache.get((s, m))
        if got is not None:
            return got
        a, b = self.a + self.fails, self.b + s
        base = self._lbeta(a, b)
        slab = [math.exp(self._lbeta(a + f, b + m - f) - base) for f in range(m + 1)]
        pi = 0.0  # posterior mass on a rate of exactly 1 (no carrying variant passed yet)
        if self.spike > 0.0 and s == 0:
            lb = self._lbeta(a, b) - self._lbeta(self.a, self.b)
            pi = self.spike / (self.spike + (1.0 - self.spike) * math.exp(lb))
        out = [(1.0 - pi) * x for x in slab]
        out[m] += pi
        self._cache[(s, m)] = out
        return out


def _plogp(x: float) -> float:
    return x * math.log(x) if x > 0.0 else 0.0


def _info(groups: dict[tuple[int, int], float], width: int, pred: _Predictive) -> float:
    """I(T; Y) for runs whose carrying pattern per hypothesis group is (mask c, passes s)."""
    joint = [0.0] * (1 << width)
    cond = 0.0
    for (c, s), w in groups.items():
        m = c.bit_count()
        probs = pred.probs(s, m)
        cond += w * sum(math.comb(m, f) * _plogp(probs[f]) for f in range(m + 1))
        y = c
        while True:  # every outcome with failures only among the carrying runs
            joint[y] += w * probs[y.bit_count()]
            if y == 0:
                break
            y = (y - 1) & c
    return cond - sum(_plogp(x) for x in joint)  # H(Y) - H(Y | T)


def joint_gain(belief: Belief, variants: Sequence[int]) -> float:
    """Expected information (nats) about the culprit set from one run of each variant."""
    ws, _ = belief.weights()
    groups: dict[tuple[int, int], float] = {}
    for w, h, s in zip(ws, belief.hyps, belief.passes, strict=True):
        c = 0
        for j, v in enumerate(variants):
            if h & ~v == 0:
                c |= 1 << j
        groups[(c, s)] = groups.get((c, s), 0.0) + w
    return _info(groups, len(variants), _Predictive(belief))


# ------------------------------------------------------------------------------ choice


def _candidates(state: Noisy, belief: Belief) -> list[int]:
    """The variants the one-at-a-time search weighs (prefixes and suffixes of a few orders,
    the leading set, bad without each member), closed, the best `CANDIDATES` by their own
    information, blocked ones left out."""
    mu = belief.marginals()
    items = sorted(mu)
    by_mu = sorted(items, key=lambda i: (-mu[i], i))
    term, _, _, _ = belief.best()
    rest = [i for i in by_mu if i not in term]
    scored: dict[int, float] = {}
    for order in (by_mu, items, [*sorted(term), *sorted(rest)]):
        for g, v in belief.prefix_gains(order):
            scored.setdefault(v, g)
    for v in [_mask(term)] + [belief.work & ~(1 << x) for x in term]:
        if v and v != belief.work and v not in scored:
            scored[v] = belief.gain(v)
    blocked = state.invalid | {v for v, c in state.unresolved.items() if c >= 2}
    ranked = sorted(scored.items(), key=lambda kv: (-kv[1], kv[0].bit_count(), kv[0]))
    if not state.model.repeats and not state.looks_flaky:  # variants not run yet first
        ran = state.ran() | blocked
        allowed = state.passed_changes() | _mask(term)
        fresh = [
            (v, g)
            for v, g in ranked
            if g > MIN_GAIN
            and (c := _mask(state.closure(frozenset(_bits(v))))) not in ran
            and not c & ~allowed
        ]
        if fresh and fresh[0][1] >= REPEAT_WORTH * ranked[0][1]:
            ranked, blocked = fresh, ran
    out: list[int] = []
    for v, _ in ranked[:CANDIDATES]:
        closed = _mask(state.closure(frozenset(_bits(v))))
        if closed not in blocked and closed not in out:
            out.append(closed)
    return out or [_mask(term)]


def _search_slot(state: Noisy, belief: Belief, chosen: Sequence[int]) -> int:
    """The variant that adds the most information to the runs in `chosen`."""
    ws, _ = belief.weights()
    held = list(chosen)[-JOINT:]
    base: list[tuple[int, int, int, float]] = []  # (hypothesis, passes, carry mask, weight)
    for w, h, s in zip(ws, belief.hyps, belief.passes, strict=True):
        if w < 1e-15:
            continue
        c = 0
        for j, v in enumerate(held):
            if h & ~v == 0:
                c |= 1 << j
        base.append((h, s, c, w))
    pred = _Predictive(belief)
    bit = 1 << len(held)
    best: tuple[float, int] | None = None
    for v in dict.fromkeys([*_candidates(state, belief), *held]):
        groups: dict[tuple[int, int], float] = {}
        for h, s, c, w in base:
            key = (c | bit if h & ~v == 0 else c, s)
            groups[key] = groups.get(key, 0.0) + w
        g = _info(groups, len(held) + 1, pred)
        # ties: the smaller variant, then the lower mask (deterministic)
        if (
            best is None
            or g > best[0] + 1e-12
            or (g > best[0] - 1e-12 and (v.bit_count(), v) < (best[1].bit_count(), best[1]))
        ):
            best = (g, v)
    assert best is not None
    return best[1]


def _confirm_slot(state: Noisy, a: Analysis, chosen: Sequence[int]) -> int | None:
    """Bad without the member whose "no other cause" is least sure, the runs in progress
    counted as passes."""
    f = a.found[-1]
    q = state.model.other
    best: tuple[float, int] | None = None
    for x in sorted(f.no_other):
        rest = f.work & ~(1 << x)
        if not rest:
            continue
        k = state._clears_of(rest) + sum(1 for v in chosen if v == rest)
        miss = state._miss(f.belief, f.term, k)
        sure = (1 - q) / ((1 - q) + q * miss)
        if best is None or sure < best[0]:
            best = (sure, rest)
    return best[1] if best else None


def next_batch(state: Noisy, a: Analysis, room: int, pending: Sequence[int]) -> list[int]:
    """`room` variants to start beside the runs in progress (`pending`, with repeats),
    chosen one after the other, each conditioned on all chosen before it. Pure."""
    out: list[int] = []
    chosen = list(pending)
    for _ in range(room):
        v: int | None
        if a.purpose == "confirm":
            v = _confirm_slot(state, a, chosen)
        elif a.purpose == "search" and a.found:
            v = _search_slot(state, a.found[-1].belief, chosen)
        else:
            v = None
        if v is None:  # the bad config again (no target failure recorded yet), or as chosen
            v = _mask(a.next) if a.next is not None else (1 << state.n) - 1
        out.append(v)
        chosen.append(v)
    return out


# ------------------------------------------------------------------------------ the search


def batch_search(
    n: int,
    evidence: Sequence[Run] = (),
    *,
    model: NoiseModel | None = None,
    closure: Callable[[Variant], Variant] | None = None,
    note: str = "",
    slots: int = 2,
) -> Search:
    """`noisy_search` with `slots` runs in progress: each round names them all and is
    decided by the first verdict. Once the posterior is sure, nothing new starts and the
    runs still in progress are read (each may still change the answer; their slots are
    taken either way); then the search answers."""
    model = model or NoiseModel()
    state = Noisy(n, model, closure)
    for v, verdict in evidence:
        state.add(v, verdict)
    budget = model.max_runs if model.max_runs is not None else 60 + 25 * n
    pending: list[int] = []
    started = 0
    for _ in range(10 * budget + 10):  # bounded: each round takes a verdict
        a = state.analyze()
        if a.next is None and not pending:
            return state.answer(a, complete=True)
        # sure already: the runs in progress are read before the answer is given (their
        # slots are taken either way, and each may still change it); nothing new starts
        room = 0 if a.next is None else min(slots - len(pending), budget - started)
        if room <= 0 and not pending:
            break
        new = next_batch(state, a, room, pending) if room > 0 else []
        started += len(new)
        pending += new
        best = (
            state.answer(a, complete=True)
            if a.next is None
            else state.answer(a, complete=False, reason="the search was stopped")
        )
        got = yield Round(
            tuple(frozenset(_bits(v)) for v in pending),
            purpose=f"noise-{a.purpose}",
            again=True,
            any_verdict=True,
            best=best,
            note=note,
        )
        for v, verdict in got.items():
            m = _mask(v)
            if m in pending:
                pending.remove(m)
            state.add(state.closure(v), verdict)
    a = state.analyze()
    return state.answer(
        a, complete=False, reason=f"run budget of the noise-aware search spent ({budget} runs)"
    )


def search(
    n: int,
    evidence: Sequence[Run] = (),
    *,
    model: NoiseModel | None = None,
    closure: Callable[[Variant], Variant] | None = None,
    note: str = "",
    slots: int = 1,
) -> Search:
    """The noise-aware search for `slots` runs at a time (one: `noisy_search` itself)."""
    model = model or NoiseModel()
    if slots <= 1:
        return noisy_search(n, evidence, model=model, closure=closure, note=note)
    return batch_search(n, evidence, model=model, closure=closure, note=note, slots=slots)


@dataclass(frozen=True)
class NoisyFromStart:
    """`--strategy noisy`: the noise-aware search from the first run (`takes_evidence`)."""

    model: NoiseModel = NoiseModel()
    slots: int = 1
    takes_evidence = True

    def __call__(
        self,
        n: int,
        evidence: Sequence[Run] = (),
        closure: Callable[[Variant], Variant] | None = None,
    ) -> Search:
        runs = list(evidence) or [(frozenset(), Verdict.PASS), (frozenset(range(n)), Verdict.FAIL)]
        return search(n, runs, model=self.model, closure=closure, slots=self.slots)


__all__ = ["JOINT", "NoisyFromStart", "batch_search", "joint_gain", "next_batch", "search"]
