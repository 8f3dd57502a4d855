"""Runs to the right answer: each strategy against scripted oracles, one table.

For n deltas in {2,3,4,6,8,12,16,24,32} and each culprit shape, every placement of the
culprits (evenly sampled when there are many) is run through the planner with a scripted
oracle. Columns per strategy: correct % (the exact culprit sets, all of them), worst and
mean runs after the two endpoint checks (which every strategy needs and are counted
separately). picire's ddmin (a peer implementation from PyPI) runs on the same oracles.

    .venv/bin/python bench/runs_to_answer.py [--max-cases 200] [--n 8,16] [--markdown]
        [--pools 1,2,4] [--noise [--p 1.0,0.8,0.5,0.3] [--policies default,noisy,go,...]
        [--shapes single,AND-pair,...] [--quick]]

`--json-option` prints only the table of one JSON-valued option (a `--compilation-config`)
carrying 8 changed keys beside 4 other changed flags: the runs when each key path is a delta
of its own (the default), against the option taken as one delta (`--no-split`) and then
edited by hand, counted as a linear search over its keys (`linear`, good + the rest of the
first answer as the base, both of whose verdicts the first search already has). The
default run prints it after the main table.

`--noise` prints the table for failures that reproduce only on some starts: the policies,
oracles and columns are described in `bench/noise.py`.

`--pools 1,2,4` adds a table for pools of k hosts, simulating the campaign's dispatch rule
(`campaign/dispatch.py`): each step the round's pending variants go to the idle hosts, every
run takes one time unit, and once a round is decided (a stop-on-fail round's first
failure) the runs still in progress are cancelled. Per strategy, shape and k: rounds
(time units, i.e. wall time in runs), runs with a verdict, cancelled runs, and idle host
slots (a host with nothing to run during a time unit); the endpoint checks are excluded
as above (with k >= 2 they take one round instead of two). Hosts the round leaves idle
run ahead (`Planner.lookahead`: what the search wants next whatever the runs in progress
show), as the campaign does; those runs count.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.diagnosis.verdicts import Verdict  # noqa: E402
from orchestrator.planner import Planner  # noqa: E402
from orchestrator.planner.strategies import STRATEGIES  # noqa: E402

Oracle = Callable[[frozenset[int]], Verdict]
NS = (2, 3, 4, 6, 8, 12, 16, 24, 32)


@dataclass(frozen=True)
class Case:
    oracle: Oracle
    expected: frozenset[frozenset[int]]


def _spread(items: list, k: int) -> list:
    if len(items) <= k:
        return items
    step = len(items) / k
    return [items[int(i * step)] for i in range(k)]


def _and(*terms: frozenset[int]) -> Oracle:
    def oracle(v: frozenset[int]) -> Verdict:
        return Verdict.FAIL if any(t <= v for t in terms) else Verdict.PASS

    return oracle


def cases(shape: str, n: int, limit: int) -> Iterator[Case]:
    r = range(n)
    if shape == "single":
        for a in r:
            yield Case(_and(frozenset({a})), frozenset({frozenset({a})}))
    elif shape == "AND-pair":
        for a, b in _spread(list(itertools.combinations(r, 2)), limit):
            t = frozenset({a, b})
            yield Case(_and(t), frozenset({t}))
    elif shape == "OR-pair":
        for a, b in _spread(list(itertools.combinations(r, 2)), limit):
            ta, tb = frozenset({a}), frozenset({b})
            yield Case(_and(ta, tb), frozenset({ta, tb}))
    elif shape == "AND-triple":
        for t in _spread(list(itertools.combinations(r, 3)), limit):
            yield Case(_and(frozenset(t)), frozenset({frozenset(t)}))
    elif shape == "single+other":
        # variants with delta y but without the culprit c crash differently (`other`):
        # an unrelated failure that the target masks when both are present.
        for c, y in _spread(list(itertools.permutations(r, 2)), limit):

            def oracle(v: frozenset[int], c: int = c, y: int = y) -> Verdict:
                if c in v:
                    return Verdict.FAIL
                return Verdict.OTHER if y in v else Verdict.PASS

            yield Case(oracle, frozenset({frozenset({c})}))


SHAPES = ("single", "AND-pair", "OR-pair", "AND-triple", "single+other")


def run_ours(name: str, n: int, case: Case) -> tuple[bool, int]:
    full = frozenset(range(n))
    planner = Planner(n, STRATEGIES[name], known={frozenset(): Verdict.PASS, full: Verdict.FAIL})
    for _ in range(20 * n * n + 100):
        if planner.done:
            break
        v = planner.pending()[0]
        planner.record(v, case.oracle(v))
    found = frozenset(frozenset(s) for s in planner.answer.culprit_sets)
    return found == case.expected, planner.runs


def run_picire(n: int, case: Case) -> tuple[bool, int]:
    import picire

    full = frozenset(range(n))
    seen: set[frozenset[int]] = set()

    def test(config: list[int], config_id: object) -> picire.Outcome:
        v = frozenset(config)
        if v not in (frozenset(), full):
            seen.add(v)
        return picire.Outcome.FAIL if case.oracle(v) is Verdict.FAIL else picire.Outcome.PASS

    result = picire.DD(test, cache=picire.ConfigCache())(list(range(n)))
    return frozenset({frozenset(result)}) == case.expected, len(seen)


@dataclass
class PoolCost:
    rounds: int = 0
    runs: int = 0
    cancelled: int = 0
    idle: int = 0
    correct: bool = True


def run_pool(name: str, n: int, case: Case, k: int) -> PoolCost:
    """One search on a pool of k hosts (see the module docstring for the rule)."""
    full = frozenset(range(n))
    planner = Planner(n, STRATEGIES[name], known={frozenset(): Verdict.PASS, full: Verdict.FAIL})
    cost = PoolCost()
    for _ in range(20 * n * n + 100):
        if planner.done:
            break
        batch = planner.pending()[:k]  # idle hosts take the pending variants in round order
        ahead = planner.lookahead(k - len(batch)) if k > 1 else []  # spare hosts run ahead
        cost.rounds += 1
        cost.idle += k - len(batch) - len(ahead)
        for i, v in enumerate(batch):  # all end together; the coordinator reads them in order
            if v not in planner.pending():  # the round was decided: this run was cancelled
                cost.cancelled += len(batch) - i
                break
            planner.record(v, case.oracle(v))
            cost.runs += 1
        for v in ahead:  # speculative runs end with the round; their verdicts are kept
            if planner.verdict(v) is None:
                planner.record(v, case.oracle(v))
                cost.runs += 1
    found = frozenset(frozenset(s) for s in planner.answer.culprit_sets)
    cost.correct = found == case.expected
    return cost


def pool_rows(ns: list[int], pools: list[int], max_cases: int) -> tuple[list[str], list[list[str]]]:
    header = ["strategy", "n", "shape"]
    for k in pools:
        header += [f"k={k} rounds", f"k={k} runs", f"k={k} cancel", f"k={k} idle"]
    rows: list[list[str]] = []
    for name in ("linear", "dd", "auto"):
        for n in ns:
            for shape in SHAPES:
                if shape in ("AND-pair", "OR-pair") and n < 2 or shape == "AND-triple" and n < 3:
                    continue
                row = [name, str(n), shape]
                answers: list[bool] | None = None
                for k in pools:
                    costs = [run_pool(name, n, c, k) for c in cases(shape, n, max_cases)]
                    m = len(costs)
                    # cancelling decided rounds must not change any answer
                    answers = answers or [c.correct for c in costs]
                    assert [c.correct for c in costs] == answers, (name, n, shape, k)
                    row += [
                        f"{sum(c.rounds for c in costs) / m:.1f}",
                        f"{sum(c.runs for c in costs) / m:.1f}",
                        f"{sum(c.cancelled for c in costs) / m:.1f}",
                        f"{sum(c.idle for c in costs) / m:.1f}",
                    ]
                rows.append(row)
    return header, rows


JSON_KEYS, JSON_OTHER = 8, 4
JSON_SHAPES = ("single key", "AND-pair of keys", "key + other flag")


def json_cases(shape: str) -> Iterator[Case]:
    """Deltas 0..3: the other flags; 4..11: the option's keys. The culprit sets."""
    keys = range(JSON_OTHER, JSON_OTHER + JSON_KEYS)
    if shape == "single key":
        terms = [frozenset({k}) for k in keys]
    elif shape == "AND-pair of keys":
        terms = [frozenset(t) for t in itertools.combinations(keys, 2)]
    else:
        terms = [frozenset({f, k}) for f in range(JSON_OTHER) for k in keys]
    for t in terms:
        yield Case(_and(t), frozenset({t}))


def _drive(n: int, name: str, oracle: Oracle) -> tuple[frozenset[frozenset[int]], int]:
    full = frozenset(range(n))
    planner = Planner(n, STRATEGIES[name], known={frozenset(): Verdict.PASS, full: Verdict.FAIL})
    for _ in range(20 * n * n + 100):
        if planner.done:
            break
        v = planner.pending()[0]
        planner.record(v, oracle(v))
    return frozenset(frozenset(c) for c in planner.answer.culprit_sets), planner.runs


def run_json_case(case: Case) -> tuple[tuple[bool, int], tuple[bool, int, int]]:
    """(split: correct, runs), (one delta then by hand: correct, search runs, hand runs)."""
    n = JSON_OTHER + JSON_KEYS
    split = _drive(n, "auto", case.oracle)
    split_ok = split[0] == case.expected
    # the option as one delta: index JSON_OTHER stands for all of its keys at once
    keys = frozenset(range(JSON_OTHER, n))

    def whole(v: frozenset[int]) -> Verdict:
        expanded = frozenset(i for i in v if i < JSON_OTHER) | (keys if JSON_OTHER in v else set())
        return case.oracle(expanded)

    found, search = _drive(JSON_OTHER + 1, "auto", whole)
    with_option = [c for c in found if JSON_OTHER in c]
    if len(found) != 1 or not with_option:
        return (split_ok, split[1]), (False, search, 0)
    rest = frozenset(i for i in with_option[0] if i != JSON_OTHER)  # the flags named beside it

    def by_hand(v: frozenset[int]) -> Verdict:  # keys 0..7 of the option over good + rest
        return case.oracle(rest | frozenset(JSON_OTHER + i for i in v))

    sub, hand = _drive(JSON_KEYS, "linear", by_hand)
    answer = frozenset(frozenset(rest | {JSON_OTHER + i for i in c}) for c in sub)
    return (split_ok, split[1]), (answer == case.expected, search, hand)


def json_rows() -> tuple[list[str], list[list[str]]]:
    header = [
        "shape",
        "placements",
        "split ok%",
        "split mean",
        "split worst",
        "one delta ok%",
        "search mean",
        "by hand mean",
        "total mean",
        "total worst",
    ]
    rows = []
    for shape in JSON_SHAPES:
        results = [run_json_case(c) for c in json_cases(shape)]
        k = len(results)
        split_runs = [r[0][1] for r in results]
        totals = [r[1][1] + r[1][2] for r in results]
        rows.append(
            [
                shape,
                str(k),
                f"{100 * sum(r[0][0] for r in results) / k:.0f}",
                f"{sum(split_runs) / k:.1f}",
                str(max(split_runs)),
                f"{100 * sum(r[1][0] for r in results) / k:.0f}",
                f"{sum(r[1][1] for r in results) / k:.1f}",
                f"{sum(r[1][2] for r in results) / k:.1f}",
                f"{sum(totals) / k:.1f}",
                str(max(totals)),
            ]
        )
    return header, rows


def print_json_table(markdown: bool) -> None:
    print(
        f"one JSON option with {JSON_KEYS} changed keys beside {JSON_OTHER} other changed "
        "flags: runs after the 2 endpoint checks; split = each key a delta (auto); one "
        "delta = the option whole (auto), then its keys by hand (linear)"
    )
    print_table(*json_rows(), markdown)


def print_table(header: list[str], rows: list[list[str]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-cases", type=int, default=200, help="placements per (n, shape)")
    ap.add_argument("--n", help="comma-separated n values (default: the full grid)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--pools", help="comma-separated pool sizes k, e.g. 1,2,4: the pool table")
    ap.add_argument(
        "--noise",
        action="store_true",
        help="the table for failures that reproduce only sometimes (bench/noise.py)",
    )
    ap.add_argument("--p", default="1.0,0.8,0.5,0.3", help="--noise: reproduction rates")
    ap.add_argument("--policies", help="--noise: comma-separated subset of the policies")
    ap.add_argument(
        "--shapes",
        help="--noise: comma-separated subset of the shapes "
        "(single, AND-pair, AND-triple, masked, decoy)",
    )
    ap.add_argument(
        "--json-option",
        action="store_true",
        help="only the table of one JSON option with 8 changed keys",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="--noise: n = 8 and 50 placements per row (a minute, not a quarter hour)",
    )
    args = ap.parse_args(argv)
    if args.noise:
        import time

        import noise

        ns = [int(x) for x in args.n.split(",")] if args.n else [8] if args.quick else [8, 16, 32]
        cases_per_row = min(args.max_cases, 50) if args.quick else args.max_cases
        policies = tuple(args.policies.split(",")) if args.policies else noise.POLICIES
        shapes = tuple(args.shapes.split(",")) if args.shapes else noise.SHAPES
        print(
            f"runs to the right answer with noise: {cases_per_row} random placements and "
            "seeds per row, every run counted (endpoints included); masked: the other "
            "failure deterministic, decoy: the target deterministic and p the other's rate"
        )

        def progress(header: list[str], row: list[str]) -> None:
            print(
                " | ".join(f"{h}={c}" for h, c in zip(header, row, strict=True)),
                file=sys.stderr,
                flush=True,
            )

        start = time.monotonic()
        print_table(
            *noise.table(
                [float(x) for x in args.p.split(",")], ns, cases_per_row, policies, progress, shapes
            ),
            args.markdown,
        )
        print(f"({time.monotonic() - start:.0f} s)")
        return 0
    if args.json_option:
        print_json_table(args.markdown)
        return 0
    ns = [int(x) for x in args.n.split(",")] if args.n else list(NS)
    if args.pools:
        pools = [int(x) for x in args.pools.split(",")]
        print(
            "pools of k hosts: mean per placement, after the 2 endpoint checks; rounds = wall "
            "time in runs"
        )
        print_table(*pool_rows(ns, pools, args.max_cases), args.markdown)
        return 0
    try:
        import picire  # noqa: F401

        have_picire = True
    except ImportError:
        have_picire = False
    names = ["linear", "dd", "auto"] + (["picire"] if have_picire else [])
    header = ["n", "shape"] + [f"{s} {col}" for s in names for col in ("ok%", "worst", "mean")]
    header += ["bound"]
    rows: list[list[str]] = []
    for n in ns:
        L = math.ceil(math.log2(n)) if n > 1 else 0
        for shape in SHAPES:
            if shape in ("AND-pair", "OR-pair") and n < 2 or shape == "AND-triple" and n < 3:
                continue
            row = [str(n), shape]
            for name in names:
                ok = total = worst = count = 0
                for case in cases(shape, n, args.max_cases):
                    if name == "picire":
                        good, runs = run_picire(n, case)
                    else:
                        good, runs = run_ours(name, n, case)
                    ok += good
                    total += runs
                    worst = max(worst, runs)
                    count += 1
                row += [f"{100 * ok / count:.0f}", str(worst), f"{total / count:.1f}"]
            bound = {"single": f"<= {L + 2}", "AND-pair": f"<= {2 * L + 3}"}.get(shape, "")
            row.append(bound)
            rows.append(row)
    print("runs after the 2 endpoint checks (good must pass, bad must fail; not counted)")
    print_table(header, rows, args.markdown)
    print()
    print_json_table(args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
