"""Exact search for decision trees that meet the single / AND-pair bounds with evidence.

Hypotheses: one culprit {x} or one interacting pair {a, b} among n deltas. A query is
any subset Q (the variant good + Q); it FAILs iff the culprit set is inside Q. A leaf
naming h must have run good + h (FAIL) and bad - {x} for every member x (no FAIL).
Budgets: singles <= ceil(log2 n) + 2, pairs <= 2 ceil(log2 n) + 3 runs.

Depth-first search over all queries up to the symmetry of interchangeable deltas, with
a Kraft-inequality cut and memoised failures. Prints whether a tree exists and, if so,
its first levels.

    .venv/bin/python bench/pair_tree_search.py 8 [single_budget pair_budget]
"""

from __future__ import annotations

import itertools
import math
import sys
from functools import cache

sys.setrecursionlimit(10000)


def solve(n: int, sb: int, pb: int, *, symmetry: bool = True) -> tuple | None:
    full = (1 << n) - 1
    pairs = itertools.combinations(range(n), 2)
    hyps = [1 << i for i in range(n)] + [(1 << a) | (1 << b) for a, b in pairs]
    budget = [sb if h.bit_count() == 1 else pb for h in hyps]
    req = [frozenset([h] + [full & ~(1 << i) for i in range(n) if h >> i & 1]) for h in hyps]

    def swap(mask: int, i: int, j: int) -> int:
        bi, bj = mask >> i & 1, mask >> j & 1
        if bi == bj:
            return mask
        return mask ^ ((1 << i) | (1 << j))

    def classes(C: tuple[int, ...], done: frozenset[int]) -> list[list[int]]:
        if not symmetry:  # every delta its own class: all 2^n queries
            return [[i] for i in range(n)]
        hs = {hyps[k] for k in C}
        out: list[list[int]] = []
        for i in range(n):
            for cls in out:
                j = cls[0]
                if {swap(h, i, j) for h in hs} == hs and {swap(q, i, j) for q in done} == done:
                    cls.append(i)
                    break
            else:
                out.append([i])
        return out

    @cache
    def feasible(C: tuple[int, ...], done: frozenset[int], d: int) -> tuple | None:
        # C: hypothesis indices; done: relevant queries already run; d: depth used
        for k in C:
            if len(req[k] - done) > budget[k] - d:
                return None
        if len(C) == 1:
            return ("leaf", C[0], sorted(req[C[0]] - done))
        if sum(2.0 ** -(budget[k] - d) for k in C) > 1 + 1e-12:
            return None
        relevant = frozenset().union(*(req[k] for k in C))
        cands: list[tuple[float, int, tuple, tuple]] = []
        cl = classes(C, done)
        for counts in itertools.product(*(range(len(c) + 1) for c in cl)):
            q = 0
            for c, m in zip(cl, counts, strict=True):
                for i in c[:m]:
                    q |= 1 << i
            if q in done or q == 0 or q == full:
                continue
            F = tuple(k for k in C if hyps[k] & ~q == 0)
            P = tuple(k for k in C if hyps[k] & ~q)
            if (not F or not P) and q not in relevant:
                continue
            kr = max(sum(2.0 ** -(budget[k] - d - 1) for k in part) for part in (F, P))
            if kr > 1 + 1e-12:
                continue
            cands.append((kr, q, F, P))
        cands.sort()
        for _, q, F, P in cands:
            nd = done | {q} if q in relevant else done
            kids = []
            for part in (F, P):
                if not part:
                    kids.append(None)
                    continue
                rel = frozenset().union(*(req[k] for k in part))
                sub = feasible(part, nd & rel, d + 1)
                if sub is None:
                    break
                kids.append(sub)
            else:
                return ("q", q, kids[0], kids[1])
        return None

    tree = feasible(tuple(range(len(hyps))), frozenset(), 0)
    if tree is not None:
        verify(tree, n, hyps, budget, req)
    return tree


def verify(
    tree: tuple, n: int, hyps: list[int], budget: list[int], req: list[frozenset[int]]
) -> None:
    """Independent check of a found tree: each hypothesis reaches its own leaf, in budget."""
    for k, h in enumerate(hyps):
        node, path = tree, []
        while node[0] == "q":
            q = node[1]
            path.append(q)
            node = node[2] if h & ~q == 0 else node[3]
            assert node is not None, "hypothesis fell off the tree"
        assert node[1] == k, f"hypothesis {k} named as {node[1]}"
        path += node[2]
        assert req[k] <= set(path), f"evidence missing for {k}"
        assert len(set(path)) <= budget[k], f"over budget for {k}: {len(path)}"


def show(tree: tuple | None, n: int, depth: int = 0, maxdepth: int = 4) -> None:
    if tree is None:
        return
    pad = "  " * depth
    if tree[0] == "leaf":
        print(f"{pad}-> {bin(0)} h={tree[1]} then {[fmt(q, n) for q in tree[2]]}")
        return
    _, q, f, p = tree
    if depth >= maxdepth:
        print(f"{pad}{fmt(q, n)} ...")
        return
    print(f"{pad}Q={fmt(q, n)}")
    print(f"{pad} F:")
    show(f, n, depth + 1, maxdepth)
    print(f"{pad} P:")
    show(p, n, depth + 1, maxdepth)


def fmt(q: int, n: int) -> str:
    return "{" + ",".join(str(i) for i in range(n) if q >> i & 1) + "}"


def main(argv: list[str]) -> int:
    flags = [a for a in argv if a.startswith("--")]
    argv = [a for a in argv if not a.startswith("--")] + flags
    n = int(argv[0]) if argv else 8
    lg = math.ceil(math.log2(n))
    sb = int(argv[1]) if len(argv) > 1 else lg + 2
    pb = int(argv[2]) if len(argv) > 2 else 2 * lg + 3
    tree = solve(n, sb, pb, symmetry="--no-symmetry" not in argv)
    print(f"n={n} single<={sb} pair<={pb}: {'tree exists' if tree else 'NO tree'}")
    show(tree, n, maxdepth=int(argv[3]) if len(argv) > 3 else 3)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
