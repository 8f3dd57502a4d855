"""Search strategies: `linear`, `dd` (ddmin), and `auto` (log-cost search + confirmation).

Each is a generator function `strategy(n) -> Search` over deltas 0..n-1 of a campaign
whose endpoints are known (good = {} passes, bad = all deltas fails). Only FAIL counts
as the target failure: `other`, `invalid`, `timeout` and exhausted `infra` are
unresolved and never taken as the target. A PASS of a variant implies every subset of
it passes (a failure needs all of its deltas); nothing is inferred from unresolved.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from orchestrator.planner import prefix_tree
from orchestrator.planner.batch import NoisyFromStart
from orchestrator.planner.core import Answer, Culprit, Probe, Search, StrategyFn, Variant
from orchestrator.verdicts import Verdict

FAIL = Verdict.FAIL
#: verdicts that show a variant does not carry the target failure: it ran, and either
#: passed or failed in another way (a different signature, a hang that is not the target).
#: `invalid` and exhausted `infra` never ran the config: they clear nothing.
CLEARING = frozenset({Verdict.PASS, Verdict.OTHER, Verdict.TIMEOUT})


def _cleared(verdict: Verdict | None) -> bool:
    return verdict in CLEARING


def _culprit(p: Probe, term: frozenset[int], cleared: dict[int, Variant]) -> Culprit:
    """A culprit is confirmed only with its evidence: good + term fails, and for every
    member a run without it (with the rest of the term) that ran and did not fail."""
    confirmed = p.fails(term) and all(x in cleared for x in term)
    return Culprit(term, term, tuple(sorted(cleared.items())), confirmed)


def _answer(culprits: tuple[Culprit, ...], complete: bool = True, reason: str = "") -> Answer:
    unproven = [c for c in culprits if not c.confirmed]
    if unproven and complete:
        complete = False
        reason = "unresolved variants leave a culprit set without its evidence"
    return Answer(culprits, complete=complete, reason=reason)


# ---------------------------------------------------------------------------- linear


def linear(n: int) -> Search:
    """One delta at a time, both directions: good + each delta, bad - each delta.

    The baseline an engineer runs by hand (2n runs). Deltas that fail alone are culprits
    on their own; deltas whose removal clears the failure but that do not fail alone are
    reported together as one interacting set (confirmed with one more run).
    """
    p = Probe(n)
    D = p.all
    singles = [frozenset({i}) for i in range(n)]
    removals = [D - {i} for i in range(n)]
    yield from p.test_round([*singles, *removals], purpose="linear")
    culprits = []
    for i in range(n):
        if p.fails(frozenset({i})):
            v = D - {i} if _cleared(p.seen.get(D - {i})) else _clearing_run(p, frozenset({i}), i)
            culprits.append(_culprit(p, frozenset({i}), {i: v} if v is not None else {}))
    needed = frozenset(i for i in range(n) if not p.fails(D - {i}) and not p.fails(frozenset({i})))
    if len(needed) > 1 or (needed and not culprits):
        yield from p.test(needed, purpose="confirm")
        cleared = {i: D - {i} for i in sorted(needed) if _cleared(p.seen.get(D - {i}))}
        culprits.append(_culprit(p, needed, cleared))
    if not culprits:
        return Answer((), complete=False, reason="no single delta or removal explains the failure")
    return _answer(tuple(culprits))


# ---------------------------------------------------------------------------- ddmin


def dd(n: int) -> Search:
    """Zeller's ddmin: a 1-minimal failing subset of the deltas (one cause only).

    Subsets and complements of a round are independent, so a round runs in parallel and
    its first failure decides it.
    """
    p = Probe(n)
    config = list(range(n))
    gran = 2
    for _ in range(n * n + 8):  # bounded: ddmin makes at most O(n^2) steps
        if len(config) < 2:
            break
        subsets = _split(config, gran)
        got = yield from p.test_round(subsets, stop_on_fail=True, purpose="subsets")
        hit = next((s for s in subsets if got.get(frozenset(s)) is FAIL), None)
        if hit is not None:
            config, gran = hit, 2
            continue
        if gran > 2:
            complements = [[c for c in config if c not in set(s)] for s in subsets]
            got = yield from p.test_round(complements, stop_on_fail=True, purpose="complements")
            hit = next((s for s in complements if got.get(frozenset(s)) is FAIL), None)
            if hit is not None:
                config, gran = hit, max(gran - 1, 2)
                continue
        if gran >= len(config):
            break
        gran = min(len(config), gran * 2)
    found = frozenset(config)
    cleared = {x: v for x in sorted(found) if (v := _clearing_run(p, found, x)) is not None}
    return _answer((_culprit(p, found, cleared),))


def _split(items: Sequence[int], parts: int) -> list[list[int]]:
    out, start = [], 0
    for k in range(parts):
        stop = start + (len(items) - start) // (parts - k)
        out.append(list(items[start:stop]))
        start = stop
    return [s for s in out if s]


# ---------------------------------------------------------------------------- auto


def auto(n: int) -> Search:
    """Log-cost search for a failure-inducing set, then confirmation, then further causes.

    1. Prefix search over the deltas finds the last delta `b` a failure needs. Its
       split points come from `prefix_tree`: later positions (which have more partner
       candidates) get shallower leaves, so a single culprit costs at most
       ceil(log2 n) + 2 runs and an interacting pair 2 ceil(log2 n) + 3 wherever a
       prefix tree allows it (one more for n = 7, 8, 13-16, 25-32, ...; for n = 8 no
       decision tree of any queries does better: `bench/pair_tree_search.py 8 5 9`).
    2. If good + {b} does not fail, a partner search over the deltas before `b` finds the
       next member, and so on until good + the set reproduces the failure: interacting
       flags are named as a set.
    3. Each member is checked for minimality (the set without it must not fail) using
       passes already seen, or a run where only an unresolved verdict covers it.
    4. Confirmation: bad minus each member must not fail. If it still fails, another
       independent cause exists without that member: it is removed and the search goes
       on, so every cause is reported, each as its own set. A cause found earlier gets
       its clearing run from a later pass (bad minus one member of every cause found).
    5. Completeness: bad minus one member of every cause found, for every such choice,
       must not fail; one that fails holds a cause not found yet (one sharing a member
       with a found one), searched for within it.
    """
    p = Probe(n)
    removed: set[int] = set()  # members taken out of "bad" to expose further causes
    found: list[tuple[frozenset[int], dict[int, Variant]]] = []  # (term, member -> clearing run)
    complete, reason = True, ""
    for _ in range(n + 1):  # each pass removes one more delta: bounded by n
        work = [i for i in range(n) if i not in removed]
        work_set = frozenset(work)
        if not p.fails(work_set):
            break
        term = yield from _find_term(p, work)
        if term is None:
            complete, reason = False, "unresolved variants hide the cause"
            break
        term = yield from _minimize(p, term)
        cleared: dict[int, Variant] = {}
        survivor: int | None = None
        for x in sorted(term):
            v = work_set - {x}
            verdict = yield from p.test(v, purpose="confirm")
            if verdict is FAIL:
                survivor = x if survivor is None else survivor
            elif _cleared(verdict):
                cleared[x] = v
        found.append((term, cleared))
        if survivor is None:
            break
        removed.add(survivor)
    else:
        complete = bool(found)
    # 5. The list of causes is complete only when bad without one member of every cause
    #    found passes for every such choice: a cause that shares a member with one found
    #    (the survivor taken out above) hides from the passes of step 4.
    for _ in range(n + 1):  # each turn finds one more cause: bounded by n
        if not (complete and found):
            break
        missed = yield from _missed_cause(p, [t for t, _ in found])
        if missed is None:
            break
        if not missed:
            complete, reason = False, "too many causes to check that the list is complete"
            break
        term = yield from _find_term(p, sorted(missed))
        if term is None:
            complete, reason = False, "unresolved variants hide a further cause"
            break
        term = yield from _minimize(p, term)
        found.append((term, {}))
    # A cause found before another had no clearing run of its own (bad minus a member
    # still failed through the other cause); a later pass's run clears it instead.
    for term, cleared in found:
        for x in sorted(term - cleared.keys()):
            v = _clearing_run(p, term, x)
            if v is not None:
                cleared[x] = v
    culprits = tuple(_culprit(p, term, cleared) for term, cleared in found)
    if not culprits:
        return Answer((), complete=False, reason=reason or "no cause found")
    return _answer(culprits, complete=complete, reason=reason)


#: the most choices of one member per cause `auto` checks before it calls its list complete
MAX_HITTING_SETS = 256


def hitting_sets(
    terms: Sequence[frozenset[int]], limit: int = MAX_HITTING_SETS
) -> list[frozenset[int]] | None:
    """The minimal sets that hold a member of every term (None: more than `limit` choices)."""
    choices = [frozenset()]
    for t in terms:
        choices = list({c if c & t else c | {x} for c in choices for x in sorted(t)})
        if len(choices) > limit:
            return None
    minimal = [c for c in choices if not any(o < c for o in choices)]
    return sorted(set(minimal), key=lambda c: (len(c), sorted(c)))


def _missed_cause(p: Probe, terms: Sequence[frozenset[int]]) -> Search:
    """A variant that holds no cause found and still fails (None: every such variant bad
    leaves ran without the target failure; an empty set: too many to check)."""
    choices = hitting_sets(terms)
    if choices is None:
        return frozenset()
    for h in choices:
        v = p.all - h
        if not v or p.known_not_failing(v):
            continue
        verdict = yield from p.test(v, purpose="confirm")
        if verdict is FAIL:
            return v
    return None


def _clearing_run(p: Probe, term: frozenset[int], x: int) -> Variant | None:
    """The largest run that has all of `term` but `x` and ran without the target failure
    (a pass first): it shows `x` is needed."""
    rest = term - {x}
    runs = [v for v, verdict in p.seen.items() if _cleared(verdict) and x not in v and rest <= v]
    return max(runs, key=lambda v: (p.seen[v] is Verdict.PASS, len(v), sorted(v)), default=None)


def _find_term(p: Probe, work: list[int]) -> Search:
    """A set of deltas within `work` that fails with good (work itself is known to fail)."""
    lo, hi, depth = 0, len(work), 0  # work[:lo] does not fail, work[:hi] fails
    while hi - lo > 1:
        mid = prefix_tree.split(len(work), lo, hi, depth)
        verdict = yield from p.test(work[:mid])
        depth += 1
        if verdict is FAIL:
            hi = mid
        else:
            lo = mid
    term = frozenset({work[hi - 1]})
    context = work[: hi - 1]
    for _ in range(len(work)):  # each step adds one member: bounded
        verdict = yield from p.test(term, purpose="confirm")
        if verdict is FAIL:
            return term
        if not context:
            return None
        # smallest j with good + term + context[:j] failing; j = len(context) is known to fail
        lo, hi = 0, len(context)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            verdict = yield from p.test(term | frozenset(context[:mid]), purpose="partner")
            if verdict is FAIL:
                hi = mid
            else:
                lo = mid
        term = term | {context[hi - 1]}
        context = context[: hi - 1]
    return None


def _minimize(p: Probe, term: frozenset[int]) -> Search:
    """Make sure no member can be dropped: every term - {x} must be known not to fail."""
    for _ in range(len(term) + 1):
        shrunk = False
        for x in sorted(term):
            rest = term - {x}
            if not rest or p.known_not_failing(rest):
                continue
            verdict = yield from p.test(rest, purpose="minimize")
            if verdict is FAIL:
                smaller = yield from _find_term(p, sorted(rest))
                if smaller is not None:
                    term, shrunk = smaller, True
                    break
        if not shrunk:
            return term
    return term


#: `noisy`: the noise-aware search from the first run, for a failure known to be flaky
#: (`auto` in a campaign switches to it by itself once the runs show flakiness)
STRATEGIES: dict[str, StrategyFn] = {
    "auto": auto,
    "dd": dd,
    "linear": linear,
    "noisy": NoisyFromStart(),
}


def make_strategy(name: str) -> StrategyFn:
    from orchestrator.errors import UsageError

    try:
        return STRATEGIES[name]
    except KeyError:
        raise UsageError(
            f"unknown strategy '{name}'", hint="choose one of: " + ", ".join(STRATEGIES)
        ) from None


# ---------------------------------------------------------------------------- estimates


def simulate(
    strategy: StrategyFn, n: int, oracle: Callable[[Variant], Verdict]
) -> tuple[Answer, int]:
    """Run a strategy against a scripted oracle; returns (answer, runs excluding endpoints)."""
    from orchestrator.planner.core import Planner

    planner = Planner(n, strategy, known={frozenset(): Verdict.PASS, frozenset(range(n)): FAIL})
    for _ in range(10 * n * n + 100):
        if planner.done:
            break
        for v in planner.pending()[:1]:
            planner.record(v, oracle(v))
    return planner.answer, planner.runs


def and_oracle(*terms: frozenset[int]) -> Callable[[Variant], Verdict]:
    def oracle(v: Variant) -> Verdict:
        return FAIL if any(t <= v for t in terms) else Verdict.PASS

    return oracle


#: how many delta positions the simulations of one estimate may touch in all: each
#: simulated search costs about n, so the number of placements tried shrinks as n grows
#: and an estimate for thousands of deltas costs what one for a few hundred does
ESTIMATE_BUDGET = 100_000
#: placements tried at least (for the largest n) and at most (pairs, for any n)
ESTIMATE_MIN_SAMPLES, ESTIMATE_MAX_PAIRS = 16, 400


def _evenly(count: int, k: int) -> list[int]:
    """`k` indices spread evenly over range(count), first and last included (all if fewer)."""
    if count <= k:
        return list(range(count))
    return sorted({round(j * (count - 1) / (k - 1)) for j in range(k)})


def _pair_at(n: int, k: int) -> tuple[int, int]:
    """The k-th pair (a, b), a < b, in the order a for-loop over a then b gives."""
    a = 0
    while k >= n - 1 - a:  # bounded by n: each step moves past one row of pairs
        k -= n - 1 - a
        a += 1
    return a, a + 1 + k


@functools.lru_cache(maxsize=256)
def estimate_runs(strategy: StrategyFn, n: int, budget: int = ESTIMATE_BUDGET) -> dict[str, float]:
    """Runs after the two endpoint checks, for a single culprit and an interacting pair.

    Exhaustive over culprit positions for small n, sampled evenly for large n (never
    more simulated work than `budget` positions' worth); pure.
    """
    samples = max(ESTIMATE_MIN_SAMPLES, budget // max(n, 1))
    singles = [
        simulate(strategy, n, and_oracle(frozenset({i})))[1] for i in _evenly(n, samples)
    ] or [0]
    n_pairs = n * (n - 1) // 2
    k_pairs = min(ESTIMATE_MAX_PAIRS, samples)
    picks = (
        range(n_pairs)
        if n_pairs <= k_pairs
        else (int(k * n_pairs / k_pairs) for k in range(k_pairs))
    )
    pairs_idx = [_pair_at(n, k) for k in picks]
    pairs = [simulate(strategy, n, and_oracle(frozenset(pr)))[1] for pr in pairs_idx] or [0]
    return {
        "single_mean": sum(singles) / len(singles),
        "single_worst": max(singles),
        "pair_mean": sum(pairs) / len(pairs),
        "pair_worst": max(pairs),
    }
