"""Builds and flags together: the ordered search against "bisect the builds, then the flags".

Six builds in order (good's first, bad's last) and six flag deltas; every placement of the
cause, for four kinds of cause: the build alone (a first bad build), a flag alone or a pair
of flags (the build does not matter), and a build together with one flag or two (an
interaction: neither alone fails). Both searches run on the same scripted oracle, through
the planner (`planner.ordered`, the default `auto` inside), and runs are counted after the
two endpoint checks (good passes, bad fails), which both need.

- *joint* (the campaign with `--builds`): the builds bisected with bad's flags, good's
  build among the candidates; the first failing build tried without flags; then the flags
  searched on it;
- *builds, then flags*: git bisect on the builds with bad's flags (good's build taken as
  good), then the default flag search on the first failing build, its endpoints taken as
  known. Its answer names the first failing build and the flags found.

Right means the exact cause: the build step (last good -> first bad) when the build
matters and no build when it does not, and the exact flag set. `bound` is the issue's
target per case: log2(builds) + the flag search's own runs (the default on the six flags
alone, the same flag cause) + 2; `over` counts the cases above it.

    .venv/bin/python bench/builds.py [--markdown]
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.diagnosis.verdicts import Verdict  # noqa: E402
from orchestrator.planner import Planner, make_strategy  # noqa: E402
from orchestrator.planner.ordered import Ordered  # noqa: E402

BUILDS = 6  # b0 (good's) .. b5 (bad's)
FLAGS = 6
K = BUILDS - 1
AXIS = FLAGS  # the build delta b0 -> b5
STEPS = tuple(range(FLAGS + 1, FLAGS + 1 + K))  # hidden: b(m-1) -> bm, m = 1..5
P, F = Verdict.PASS, Verdict.FAIL

Cause = tuple[int | None, frozenset[int]]  # (first bad build or None, flags needed)


def build_of(v: frozenset[int]) -> int:
    if AXIS in v:
        return K
    steps = [STEPS.index(i) + 1 for i in v if i in STEPS]
    return steps[0] if steps else 0


def oracle(cause: Cause) -> Callable[[frozenset[int]], Verdict]:
    first, flags = cause

    def verdict(v: frozenset[int]) -> Verdict:
        ok_build = first is None or build_of(v) >= first
        return F if ok_build and flags <= v else P

    return verdict


def drive(planner: Planner, ask: Callable[[frozenset[int]], Verdict]) -> int:
    runs = 0
    while not planner.done:
        v = planner.pending()[0]
        planner.record(v, ask(v))
        runs += 1
    return runs


def joint(cause: Cause) -> tuple[bool, int]:
    strat = Ordered(make_strategy("auto"), axis=AXIS, steps=STEPS)
    planner = Planner(FLAGS + 1, strat, known={frozenset(): P, frozenset(range(FLAGS + 1)): F})
    runs = drive(planner, oracle(cause))
    got = set()
    for c in planner.answer.culprits:
        build = next((STEPS.index(i) + 1 for i in c.deltas if i in STEPS), None)
        got.add((build, frozenset(i for i in c.deltas if i < FLAGS)))
    return got == {cause}, runs


def flag_search(
    cause_flags: frozenset[int], ask: Callable[[frozenset[int]], Verdict]
) -> tuple[set[frozenset[int]], int]:
    planner = Planner(
        FLAGS, make_strategy("auto"), known={frozenset(): P, frozenset(range(FLAGS)): F}
    )
    runs = drive(planner, ask)
    return {c.deltas for c in planner.answer.culprits}, runs


def baseline(cause: Cause) -> tuple[bool, int]:
    ask = oracle(cause)
    allflags = frozenset(range(FLAGS))
    lo, hi, runs = 0, K, 0  # git bisect: good's build taken as good, bad's as bad
    while hi - lo > 1:
        m = (lo + hi) // 2
        runs += 1
        if ask(allflags | {STEPS[m - 1]}) is F:
            hi = m
        else:
            lo = m
    step = {STEPS[hi - 1]} if hi < K else {AXIS}
    sets, more = flag_search(cause[1], lambda v: ask(frozenset(v) | step))
    got = {(hi, s) for s in sets}
    return got == {cause}, runs + more


def flag_cost(flags: frozenset[int]) -> int:
    """The default search's own runs on the flags alone, for the same flag cause."""
    if not flags:
        return 0
    return flag_search(flags, lambda v: F if flags <= v else P)[1]


def causes(kind: str) -> list[Cause]:
    singles = [frozenset({f}) for f in range(FLAGS)]
    pairs = [frozenset(p) for p in itertools.combinations(range(FLAGS), 2)]
    if kind == "first bad build":
        return [(n, frozenset()) for n in range(1, BUILDS)]
    if kind == "one flag":
        return [(None, s) for s in singles]
    if kind == "two flags":
        return [(None, s) for s in pairs]
    if kind == "build + one flag":
        return [(n, s) for n in range(1, BUILDS) for s in singles]
    return [(n, s) for n in range(1, BUILDS) for s in pairs]


KINDS = ("first bad build", "one flag", "two flags", "build + one flag", "build + two flags")


def table() -> list[list[str]]:
    rows = []
    for kind in KINDS:
        cs = causes(kind)
        j = [joint(c) for c in cs]
        b = [baseline(c) for c in cs]
        bounds = [math.log2(BUILDS) + flag_cost(c[1]) + 2 for c in cs]
        over = sum(r > bd for (_, r), bd in zip(j, bounds, strict=True))

        def pct(xs: list[tuple[bool, int]]) -> str:
            return f"{100 * sum(ok for ok, _ in xs) / len(xs):.0f} %"

        def mean(xs: list[tuple[bool, int]]) -> str:
            return f"{sum(r for _, r in xs) / len(xs):.1f}"

        rows.append(
            [
                kind,
                str(len(cs)),
                pct(j),
                mean(j),
                str(max(r for _, r in j)),
                f"{sum(bounds) / len(bounds):.1f}",
                str(over),
                pct(b),
                mean(b),
                str(max(r for _, r in b)),
            ]
        )
    return rows


HEADER = [
    "cause",
    "cases",
    "joint: right",
    "mean",
    "worst",
    "bound (mean)",
    "over",
    "builds, then flags: right",
    "mean",
    "worst",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args()
    rows = table()
    if args.markdown:
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(x) for x in col) for col in zip(HEADER, *rows, strict=True)]
        for r in [HEADER, *rows]:
            print("  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
