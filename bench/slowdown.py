"""Which flags cost the throughput (or gave it), under benchmark noise: the measured-effect
search (`orchestrator.planner.effects`) against a scripted host that draws every start's
figures from the lab's noise model (`orchestrator.lab.scenario_model.MetricModel`).

    .venv/bin/python bench/slowdown.py [--placements 200] [--rows NAME,...] [--markdown]

8 deltas per case; each placement puts the row's culprit flags at random among them, with
its own random stream (seeded: the table repeats). The noise of a row's CV c: a start's
level varies by c/sqrt(2) (CV) and each run inside it by c/sqrt(2) again, so one run of a
fresh start varies by about c; the first run of a start is 15 % worse (the warm-up, which
the search discards) and one run in 100 is 40 % worse (an outlier). A start costs 10 runs.

Columns: right % (the exact culprit terms named, for the below-the-bar row: no culprit
named, the answer `none` or `unsure`), benign % (a flag that costs nothing named), sure %
(answers given with confidence >= 0.95) and their right %, mean starts (every start,
endpoints and good's repeats included) and mean benchmark runs.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.lab.scenario_model import Condition, Factor, MetricModel, MetricNoise, When
from orchestrator.planner.effect_stats import LATENCY, THROUGHPUT, Direction
from orchestrator.planner.effects import EffectSearch, EffectSettings, Measure, drive

N = 8
SEED = 20261207


@dataclass(frozen=True)
class Row:
    name: str
    cv: float
    #: each factor: the culprit flags (by their place among the culprits) and its multiplier
    factors: tuple[tuple[tuple[int, ...], float], ...]
    culprits: int
    direction: Direction = THROUGHPUT
    bar: float = 0.05
    #: the right answer names no culprit (an effect below the bar)
    below_bar: bool = False


ROWS = (
    Row("one flag -10%, CV 2%", 0.02, (((0,), 0.90),), 1),
    Row("one flag -10%, CV 5%", 0.05, (((0,), 0.90),), 1),
    Row("one flag -10%, CV 10%", 0.10, (((0,), 0.90),), 1),
    Row("two flags -6% each, CV 2%", 0.02, (((0,), 0.94), ((1,), 0.94)), 2),
    Row("two flags -15% only together, CV 2%", 0.02, (((0, 1), 0.85),), 2),
    Row("one flag +10% (speedup), CV 2%", 0.02, (((0,), 1.10),), 1),
    Row("latency +10% from one flag, CV 2%", 0.02, (((0,), 1.10),), 1, direction=LATENCY),
    Row("-3% at CV 5%, bar 5%", 0.05, (((0,), 0.97),), 1, below_bar=True),
)


@dataclass
class Outcome:
    right: bool
    benign: bool
    sure: bool
    starts: int
    runs: int


def model(row: Row, culprits: Sequence[int]) -> MetricModel:
    factors = tuple(
        Factor(When(tuple(Condition(f"f{culprits[i]}", "present") for i in flags)), mult)
        for flags, mult in row.factors
    )
    part = row.cv / 2**0.5
    noise = MetricNoise(
        within=part,
        between=part,
        warmup_runs=1,
        warmup_worse=0.15,
        outlier_probability=0.01,
        outlier_worse=0.4,
    )
    base = 4000.0 if row.direction.higher_is_better else 0.05
    return MetricModel(base, factors, row.direction.higher_is_better, noise)


def place(row: Row, case: int) -> Outcome:
    rng = random.Random(f"{SEED}:{row.name}:{case}")
    culprits = rng.sample(range(N), row.culprits)
    m = model(row, culprits)

    def oracle(req: Measure) -> list[float]:
        flags = {f"f{i}": True for i in req.variant}
        return m.start(flags, {}, rng, req.runs)

    settings = EffectSettings(direction=row.direction, bar=row.bar)
    answer = drive(EffectSearch(N, settings), oracle)
    terms = {frozenset(culprits[i] for i in flags) for flags, _ in row.factors}
    named = {e.deltas for e in answer.named}
    benign = any(not any(d in t for t in terms) for e in named for d in e)
    right = not named if row.below_bar else (answer.status == "found" and named == terms)
    sure = answer.status == "found" and answer.confidence >= 0.95
    return Outcome(right, benign, sure, answer.starts, answer.runs)


def table(rows: Sequence[Row], placements: int) -> list[tuple[Row, list[Outcome]]]:
    return [(row, [place(row, c) for c in range(placements)]) for row in rows]


def render(results: list[tuple[Row, list[Outcome]]], markdown: bool) -> str:
    head = ("row", "placements", "right %", "benign %", "sure %", "sure right %", "starts", "runs")
    lines = []
    for row, outs in results:
        n = len(outs)
        sure = [o for o in outs if o.sure]
        cells = (
            row.name,
            str(n),
            f"{100 * sum(o.right for o in outs) / n:.1f}",
            f"{100 * sum(o.benign for o in outs) / n:.1f}",
            f"{100 * len(sure) / n:.1f}",
            f"{100 * sum(o.right for o in sure) / len(sure):.1f}" if sure else "-",
            f"{sum(o.starts for o in outs) / n:.1f}",
            f"{sum(o.runs for o in outs) / n:.1f}",
        )
        lines.append(cells)
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c) + " |" for c in lines]
        return "\n".join(out)
    widths = [max(len(r[i]) for r in (head, *lines)) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in (head, *lines)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placements", type=int, default=200)
    ap.add_argument("--rows", help="comma-separated row numbers (from 1)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    rows = [ROWS[int(i) - 1] for i in args.rows.split(",")] if args.rows else list(ROWS)
    print(render(table(rows, args.placements), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
