"""The shape of `auto`'s prefix search: where to split so that every outcome stays in budget.

`auto` first searches prefixes of the delta list for `b`, the last delta a failure
needs. What it pays after finding `b` depends on where `b` sits:

- a single culprit {b} still needs good + {b} and bad - {b}, except that good + {b}
  is the prefix of length 1 when b = 0, and bad - {b} is the prefix of length m - 1
  when b is the last delta (both are runs the prefix search makes anyway);
- an interacting pair {a, b} also needs the partner search over the b deltas before
  `b` (ceil(log2 b) runs) plus good + {a, b} and bad - {a}, and good + {b} to rule
  out the single (for b = 1 the pair is the prefix of length 2, already run).

So a late `b` has more partner candidates and should be found with fewer prefix runs.
A plain halving search gives every `b` the same depth and overshoots the pair budget
by one run whenever b lands just below m; a skewed (still order-preserving) search tree
gives late positions shallower leaves. The budgets are the worst-case targets:
ceil(log2 m) + 2 runs for a single culprit, 2 ceil(log2 m) + 3 for a pair. When no
prefix tree meets both (m = 7, 8, 13-16, 25-32, ...: the leaves' Kraft sum exceeds 1),
the pair budget is relaxed one run at a time; the single budget never is.

Everything here is a pure function of m, cached.
"""

from __future__ import annotations

from functools import lru_cache


def ceil_log2(k: int) -> int:
    """Runs a halving search needs to single out one of k candidates."""
    return max(k - 1, 0).bit_length()


def single_budget(m: int) -> int:
    """Worst-case runs allowed for a single culprit among m deltas."""
    return ceil_log2(m) + 2


def pair_budget(m: int) -> int:
    """Worst-case runs allowed for an interacting pair among m deltas."""
    return 2 * ceil_log2(m) + 3


def _partner_cost(k: int) -> int:
    """Runs to find and confirm the partner among k earlier deltas.

    The search, then good + pair, then bad - partner.
    """
    if k == 1:
        return 1  # the pair {0, 1} is the prefix of length 2: only bad - {0} is new
    return ceil_log2(k) + 2


def allowed_depths(m: int, slack: int = 0) -> tuple[int, ...]:
    """For each position b, the deepest prefix-search leaf that keeps b's outcomes in budget."""
    single, pair = single_budget(m), pair_budget(m) + slack
    out: list[int] = []
    for b in range(m):
        remove_b = 0 if b == m - 1 else 1  # bad - {b} is a prefix only for the last delta
        alone = 0 if b == 0 else 1  # good + {b} is a prefix only for the first delta
        depth = single - remove_b - alone
        if b >= 1:
            depth = min(depth, pair - remove_b - alone - _partner_cost(b))
        out.append(depth)
    return tuple(out)


@lru_cache(maxsize=256)
def _reach(m: int, slack: int) -> tuple[tuple[int, ...], ...]:
    """reach[d][lo]: the largest hi such that positions lo..hi-1 fit in a subtree rooted at depth d.

    Greedy is exact here: a feasible interval stays feasible when shrunk, so the left
    child should take as many positions as it can.
    """
    allowed = allowed_depths(m, slack)
    top = max(allowed, default=0) + 1
    # past every allowance nothing fits: reach is lo itself
    reach = [list(range(m + 1)) for _ in range(top + 1)]
    for d in range(top - 1, -1, -1):
        for lo in range(m):
            if allowed[lo] < d:
                continue
            left = reach[d + 1][lo]
            reach[d][lo] = max(lo + 1, reach[d + 1][left] if left > lo else lo + 1)
    return tuple(tuple(row) for row in reach)


@lru_cache(maxsize=256)
def pair_slack(m: int) -> int:
    """The fewest extra runs over the pair budget for which a prefix tree exists."""
    slack = 0
    while _reach(m, slack)[0][0] < m:
        slack += 1
    return slack


def split(m: int, lo: int, hi: int, depth: int) -> int:
    """Where to cut the candidate positions lo..hi-1 (at this search depth): returns mid.

    Among the cuts that keep both halves within budget, the one closest to the middle,
    so the mean cost stays near a plain halving search. Falls back to halving if the
    interval is outside the plan (it never is when the search follows `split` itself).
    """
    half = (lo + hi) // 2
    if m < 2 or hi - lo < 2:
        return half
    reach = _reach(m, pair_slack(m))
    if depth + 1 >= len(reach) or reach[depth][lo] < hi:
        return half
    row = reach[depth + 1]
    best: int | None = None
    for mid in range(lo + 1, min(row[lo], hi - 1) + 1):
        if row[mid] >= hi and (best is None or abs(2 * mid - lo - hi) < abs(2 * best - lo - hi)):
            best = mid
    return half if best is None else best
