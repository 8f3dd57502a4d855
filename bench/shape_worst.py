"""Worst-case runs per culprit shape: `auto` (and others) vs the issue's bounds and picire's ddmin.

Research aid for the `auto` strategy, not the benchmark table: for each n and shape it
enumerates every culprit position (sampled evenly above a cap), checks that `auto`
names exactly the culprit sets with their evidence, and prints the worst runs next to
the bounds. picire counts unique variants it tests (its cache on), endpoints excluded.

    .venv/bin/python bench/shape_worst.py [n ...]
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Iterator

from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.planner.core import Answer, Variant
from orchestrator.planner.strategies import auto, simulate

Oracle = Callable[[Variant], Verdict]
NS = (2, 3, 4, 6, 8, 12, 16, 24, 32)
CAP = 600


def _sample(items: list, cap: int = CAP) -> list:
    if len(items) <= cap:
        return items
    step = len(items) / cap
    return [items[int(k * step)] for k in range(cap)]


def shapes(n: int) -> dict[str, list[tuple[list[frozenset[int]], Oracle]]]:
    """shape -> [(expected culprit sets, oracle)] over culprit positions."""

    def dnf(terms: list[frozenset[int]], other: int | None = None) -> Oracle:
        def oracle(v: Variant) -> Verdict:
            if any(t <= v for t in terms):
                return Verdict.FAIL
            if other is not None and other in v:
                return Verdict.OTHER
            return Verdict.PASS

        return oracle

    out: dict[str, list[tuple[list[frozenset[int]], Oracle]]] = {}
    out["single"] = [([frozenset({i})], dnf([frozenset({i})])) for i in range(n)]
    pairs = _sample(list(itertools.combinations(range(n), 2)))
    out["and-pair"] = [([frozenset(p)], dnf([frozenset(p)])) for p in pairs]
    out["or-pair"] = [
        ([frozenset({a}), frozenset({b})], dnf([frozenset({a}), frozenset({b})])) for a, b in pairs
    ]
    triples = _sample(list(itertools.combinations(range(n), 3)))
    out["and-triple"] = [([frozenset(t)], dnf([frozenset(t)])) for t in triples]
    others = _sample([(x, y) for x in range(n) for y in range(n) if x != y])
    out["other"] = [([frozenset({x})], dnf([frozenset({x})], other=y)) for x, y in others]
    return out


def evidence_ok(
    ans: Answer, expected: list[frozenset[int]], seen: dict[Variant, Verdict], n: int
) -> bool:
    """Exactly the expected sets, each reproduced by good + set and cleared member by member."""
    if sorted(map(sorted, ans.culprit_sets)) != sorted(map(sorted, expected)):
        return False
    D = frozenset(range(n))
    for c in ans.culprits:
        if c.reproduced_by != c.deltas or seen.get(c.deltas) is not Verdict.FAIL:
            return False
        cleared = dict(c.cleared_by)
        if set(cleared) != set(c.deltas):
            return False
        if len(expected) == 1:
            # one cause: bad - x itself must have been run and not failed
            if any(cleared[x] != D - {x} or seen.get(D - {x}) is Verdict.FAIL for x in c.deltas):
                return False
    return True


def run_auto(n: int, oracle: Oracle) -> tuple[Answer, int, dict[Variant, Verdict]]:
    seen: dict[Variant, Verdict] = {}

    def spy(v: Variant) -> Verdict:
        seen[v] = oracle(v)
        return seen[v]

    ans, runs = simulate(auto, n, spy)
    seen[frozenset()] = Verdict.PASS
    seen[frozenset(range(n))] = Verdict.FAIL
    return ans, runs, seen


def picire_runs(n: int, oracle: Oracle) -> int:
    """Unique variants picire's ddmin tests (cache on), endpoints excluded."""
    import picire

    tested: set[frozenset[int]] = set()

    def test(config: list[int], config_id: object) -> picire.Outcome:
        v = frozenset(config)
        tested.add(v)
        return picire.Outcome.FAIL if oracle(v) is Verdict.FAIL else picire.Outcome.PASS

    picire.DD(test, cache=picire.ConfigCache())(list(range(n)))
    tested -= {frozenset(), frozenset(range(n))}
    return len(tested)


def bounds(n: int) -> dict[str, int]:
    lg = math.ceil(math.log2(n)) if n > 1 else 0
    return {"single": lg + 2, "and-pair": 2 * lg + 3}


def rows(ns: tuple[int, ...]) -> Iterator[tuple[int, str, int, int, int | None, bool]]:
    for n in ns:
        for shape, cases in shapes(n).items():
            worst, wrong, pic = 0, 0, 0
            for expected, oracle in cases:
                ans, runs, seen = run_auto(n, oracle)
                worst = max(worst, runs)
                wrong += not evidence_ok(ans, expected, seen, n)
                pic = max(pic, picire_runs(n, oracle))
            yield n, shape, worst, pic, bounds(n).get(shape), wrong == 0


def main(argv: list[str]) -> int:
    ns = tuple(int(a) for a in argv) or NS
    print(f"{'n':>3} {'shape':<11} {'auto':>5} {'bound':>5} {'picire':>6}  ok")
    bad = 0
    for n, shape, worst, pic, bound, ok in rows(ns):
        over = (bound is not None and worst > bound) or (n >= 6 and worst > pic)
        bad += over or not ok
        flag = "  OVER" if over else ""
        shown = "-" if bound is None else str(bound)
        print(f"{n:>3} {shape:<11} {worst:>5} {shown:>5} {pic:>6}  {'yes' if ok else 'NO'}{flag}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
