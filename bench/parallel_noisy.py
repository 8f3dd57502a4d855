"""Wall time of a flaky bisection with k slots: the noise-aware search keeping them busy.

The campaign's dispatch (`campaign/dispatch.py`) simulated event by event on the noise oracle
of `bench/noise.py` (a culprit set among n deltas, placed at random; a run of a variant
that carries it fails with probability p). k slots are the hosts of a pool or a Slurm
host's `max_jobs`. Every run takes one time unit times a random factor in [1 - j, 1 + j]
(`--jitter`, default 0.2: runs do not all end together), so a slot freed by a run gets
its next variant after that run's verdict reached the search, as in the campaign:

- the endpoints: good and bad side by side, bad started again while it only passed (at
  most BAD_ATTEMPTS starts), as `Bisection._search` does;
- then the default search (`auto` switching to the noise-aware one, the campaign's
  `--strategy auto`) with the campaign's k: while it is `auto`, slots its round leaves
  idle run ahead (`Planner.lookahead`); once noise-aware, every slot holds a run
  (`orchestrator.planner.batch`); runs a decided round no longer wants are cancelled and
  their slots freed at once.

Columns per k: `wall` mean wall time in run units (endpoints included), `runs` mean runs
started (cancelled ones included), `ok%` the exact culprit set, `sure%` answers reported
with confidence >= 0.95, and `wall/k=1` the ratio of mean wall times.

    .venv/bin/python bench/parallel_noisy.py [--slots 1,2,4] [--p 0.5,0.3]
        [--shapes single,AND-pair] [--n 8] [--cases 200] [--jitter 0.2] [--markdown]
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import noise  # noqa: E402

from orchestrator.diagnosis.verdicts import Verdict  # noqa: E402
from orchestrator.planner import Planner  # noqa: E402
from orchestrator.planner.adaptive import BAD_ATTEMPTS, Adaptive  # noqa: E402
from orchestrator.planner.noisy import NoiseModel  # noqa: E402

P, F = Verdict.PASS, Verdict.FAIL


@dataclass
class Cost:
    right: bool
    wall: float
    runs: int
    sure: bool


class Slots:
    """k slots; runs end at their own times; the earliest ending is read first."""

    def __init__(self, k: int, jitter: float, rng: random.Random) -> None:
        self.k, self.jitter, self.rng = k, jitter, rng
        self.now = 0.0
        self.running: list[tuple[float, int, frozenset[int], str]] = []
        self.seq = 0
        self.started = 0

    def free(self) -> int:
        return self.k - len(self.running)

    def start(self, v: frozenset[int], tag: str) -> None:
        d = 1.0 + self.rng.uniform(-self.jitter, self.jitter)
        self.seq += 1
        self.started += 1
        heapq.heappush(self.running, (self.now + d, self.seq, v, tag))

    def cancel(self, v: frozenset[int]) -> None:
        """The newest run of v stops now (its slot is free at once)."""
        i = max(
            (j for j, r in enumerate(self.running) if r[2] == v), key=lambda j: self.running[j][1]
        )
        self.running.pop(i)
        heapq.heapify(self.running)

    def next(self) -> tuple[frozenset[int], str]:
        end, _, v, tag = heapq.heappop(self.running)
        self.now = end
        return v, tag


def endpoints(o: noise.Oracle, n: int, slots: Slots) -> list[tuple[frozenset[int], Verdict]]:
    """Good once and bad until it fails (at most BAD_ATTEMPTS starts), side by side."""
    good, full = frozenset(), frozenset(range(n))
    runs: list[tuple[frozenset[int], Verdict]] = []
    good_done = bad_done = False
    bad_starts = 0
    for _ in range(BAD_ATTEMPTS + 2):
        running = {v for _, _, v, _ in slots.running}
        if not good_done and good not in running and slots.free():
            slots.start(good, "end")
        if not bad_done and full not in running and bad_starts < BAD_ATTEMPTS and slots.free():
            slots.start(full, "end")
        if not slots.running:
            break
        v, _ = slots.next()
        x = o(v)
        runs.append((v, x))
        if v == good:
            good_done = True
        else:
            bad_starts += 1
            bad_done = x is F
    return runs


def campaign(n: int, o: noise.Oracle, k: int, jitter: float, seed: str) -> Cost:
    slots = Slots(k, jitter, random.Random(f"durations:{seed}"))
    ends = endpoints(o, n, slots)
    full = frozenset(range(n))
    if not any(v == full and x is F for v, x in ends):
        return Cost(False, slots.now, slots.started, False)
    strategy = Adaptive(NoiseModel(confidence=noise.CONFIDENCE), slots=k)
    planner = Planner(n, strategy, known={frozenset(): P, full: F}, evidence=ends)
    for _ in range(100 * n + 1000):
        if planner.done:
            break
        want = Counter(planner.pending())
        have = Counter(v for _, _, v, _ in slots.running)
        ahead: list[frozenset[int]] = []
        missing = sum(max(0, c - have[v]) for v, c in want.items())
        spare = slots.free() - missing
        speculating = [v for _, _, v, tag in slots.running if tag == "ahead"]
        if k > 1 and (spare > 0 or speculating):
            ahead = planner.lookahead(max(spare, 0) + len(speculating))
        for v in list(have):  # a decided round: the runs it no longer wants stop
            surplus = have[v] - want[v] - (v in ahead)
            for _ in range(max(0, surplus)):
                slots.cancel(v)
                have[v] -= 1
        for v, c in want.items():
            for _ in range(c - have[v]):
                if slots.free():
                    slots.start(v, "search")
                    have[v] += 1
        for v in ahead:
            if slots.free() and not have[v]:
                slots.start(v, "ahead")
                have[v] += 1
        if not slots.running:
            break
        v, _ = slots.next()
        planner.record(v, o(v))
    a = planner.answer if planner.done else None
    if a is None:
        return Cost(False, slots.now, slots.started, False)
    sure = a.confidence is not None and a.confidence >= noise.CONFIDENCE
    return Cost(set(a.culprit_sets) == set(o.terms), slots.now, slots.started, sure)


def table(
    ps: list[float], shapes: list[str], n: int, cases: int, ks: list[int], jitter: float
) -> tuple[list[str], list[list[str]]]:
    header = ["p", "shape", "n"]
    for k in ks:
        header += [f"k={k} wall", f"k={k} runs", f"k={k} ok%", f"k={k} sure%"]
        if k != ks[0]:
            header.append(f"k={k} wall/k={ks[0]}")
    rows: list[list[str]] = []
    for p in ps:
        for shape in shapes:
            row = [f"{p:g}", shape, str(n)]
            first: float | None = None
            for k in ks:
                # the same placements and the same verdict streams for every k
                costs = [
                    campaign(
                        n, noise.make_case(shape, n, p, s)(), k, jitter, f"{shape}:{n}:{p}:{s}:{k}"
                    )
                    for s in range(cases)
                ]
                m = len(costs)
                wall = sum(c.wall for c in costs) / m
                row += [
                    f"{wall:.1f}",
                    f"{sum(c.runs for c in costs) / m:.1f}",
                    f"{100 * sum(c.right for c in costs) / m:.1f}",
                    f"{100 * sum(c.sure for c in costs) / m:.1f}",
                ]
                if first is None:
                    first = wall
                else:
                    row.append(f"{wall / first:.2f}")
                print(f"  p={p:g} {shape} k={k}: wall {wall:.1f}", file=sys.stderr, flush=True)
            rows.append(row)
    return header, rows


def main(argv: list[str] | None = None) -> int:
    from runs_to_answer import print_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", default="1,2,4", help="comma-separated k values")
    ap.add_argument("--p", default="0.5,0.3", help="reproduction rates")
    ap.add_argument("--shapes", default="single,AND-pair")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--cases", type=int, default=200, help="placements per row")
    ap.add_argument("--jitter", type=float, default=0.2, help="run time spread (+- share)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    start = time.monotonic()
    print(
        f"wall time in runs with k slots: n = {args.n}, {args.cases} placements per row, "
        f"run times 1 +- {args.jitter:g}, endpoints included"
    )
    print_table(
        *table(
            [float(x) for x in args.p.split(",")],
            args.shapes.split(","),
            args.n,
            args.cases,
            [int(x) for x in args.slots.split(",")],
            args.jitter,
        ),
        args.markdown,
    )
    print(f"({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
