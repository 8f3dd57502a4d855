"""`orchestrator plan --good G --bad B`: deltas, the first round, and run estimates. No host."""

from __future__ import annotations

import argparse
import json

from rich.markup import escape
from rich.table import Table

from orchestrator.campaign.planning import make_plan
from orchestrator.cli.output import console
from orchestrator.planner import STRATEGIES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="show the deltas and the search plan for two configs (touches no host)",
        description="Diff a good and a bad experiment config and show how the search would go.",
    )
    p.add_argument("--good", required=True, help="experiment YAML that works")
    p.add_argument("--bad", required=True, help="experiment YAML that fails")
    p.add_argument("--strategy", default="auto", choices=sorted(STRATEGIES))
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    plan = make_plan(args.good, args.bad, args.strategy)
    planner = plan.planner()
    first = planner.pending()
    est = plan.estimates()
    if args.json:
        from orchestrator.config.secrets import Redactor

        red = Redactor(plan.good.secrets() | plan.bad.secrets())
        out = {
            "good": plan.good.source,
            "bad": plan.bad.source,
            "strategy": plan.strategy,
            "deltas": [red.obj(d.to_dict()) | {"index": i} for i, d in enumerate(plan.deltas)],
            "endpoint_checks": 2,
            "first_round": [
                {"deltas": sorted(v), "describe": plan.describe(v),
                 "argv": red.obj(plan.variant(v).argv())}
                for v in first
            ],
            "estimated_runs": est,
        }
        console().print_json(json.dumps(out))
        return 0
    c = console()
    c.print(f"good: {escape(plan.good.name)} ({escape(plan.good.source)})", highlight=False)
    c.print(f"bad:  {escape(plan.bad.name)} ({escape(plan.bad.source)})", highlight=False)
    table = Table(title=f"{plan.n} deltas", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("change")
    table.add_column("kind")
    for i, d in enumerate(plan.deltas):
        table.add_row(str(i), escape(d.describe()), d.kind)
    c.print(table)
    c.print(f"strategy: {plan.strategy}", highlight=False)
    c.print("runs first: the two endpoint checks (good must pass, bad must fail), then:")
    for v in first:
        c.print(f"  - {escape(plan.describe(v))}", highlight=False)
    c.print(
        f"expected runs after the endpoints: single culprit {est['single_mean']:.1f} "
        f"(worst {est['single_worst']:.0f}), interacting pair {est['pair_mean']:.1f} "
        f"(worst {est['pair_worst']:.0f})",
        highlight=False,
    )
    return 0
