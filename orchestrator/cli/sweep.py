"""`orchestrator sweep SWEEP.yaml`: run a list or matrix of configs, then a table + report."""

from __future__ import annotations

import argparse
import json

from rich.markup import escape
from rich.table import Table

from orchestrator.cli import common
from orchestrator.cli.live import LiveView, verdict_text
from orchestrator.cli.output import console
from orchestrator.config.experiment import Experiment, parse_duration
from orchestrator.errors import UsageError
from orchestrator.executor import Executor
from orchestrator.sweep import (
    Sweep,
    SweepCampaign,
    SweepItem,
    SweepOutcome,
    load_sweep,
    parse_until,
)
from orchestrator.sweep_report import write_sweep_reports


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a list or matrix of configs (overnight sweeps)")
    p.add_argument("sweep", nargs="?", help="sweep YAML")
    p.add_argument("--host", help="host or pool (default: the sweep file's host)")
    p.add_argument("--pool", help="a pool of equivalent hosts (same as --host POOL)")
    p.add_argument("--resume", metavar="ID", help="continue an interrupted sweep")
    p.add_argument("--max-runs", type=int, metavar="N")
    p.add_argument("--until", metavar="HH:MM", help="stop starting runs at this time of day")
    p.add_argument("--deadline", metavar="DURATION", help="stop starting runs after this long")
    p.add_argument("--fresh", action="store_true", help="run configs even if measured before")
    p.add_argument("--accept-new-host-key", action="store_true")
    p.add_argument("--json", action="store_true")
    common.add_hosts_option(p)
    common.add_results_option(p)
    p.set_defaults(handler=run)


def _sweep_from_spec(spec: dict) -> Sweep:
    items = tuple(SweepItem(i, it["label"], Experiment.from_dict(it["config"],
                                                                 resolve_secrets=True),
                            tuple(tuple(v) for v in it.get("values") or []))
                  for i, it in enumerate(spec["items"]))  # fmt: skip
    return Sweep(spec["name"], spec["sweep"], items, spec["repeat"], None, None)


def run(args: argparse.Namespace) -> int:
    store = common.store(args)
    budget = None
    if args.until:
        budget = parse_until(args.until)
    if args.deadline:
        try:
            d = parse_duration(args.deadline)
        except ValueError as exc:
            raise UsageError(f"--deadline: {exc}") from None
        budget = min(budget, d) if budget else d
    inv = common.inventory(args)
    if args.resume:
        camp = store.campaign(args.resume)
        sweep = _sweep_from_spec(camp.spec)
        hosts = [inv.host(h) for h in camp.spec["hosts"]]
        resume_id = camp.id
    else:
        if not args.sweep:
            raise UsageError("sweep needs a SWEEP.yaml (or --resume ID)")
        sweep = load_sweep(args.sweep)
        where = args.pool or args.host or sweep.host
        if not where:
            raise UsageError("no host: give --host/--pool or `host:` in the sweep file")
        hosts = inv.resolve(where)
        resume_id = None
    view = LiveView(console(), verbose=args.verbose) if not args.json else (lambda e: None)

    def factory(host, service, campaign, listener):  # noqa: ANN001, ANN202
        return Executor(host, service=service, campaign=campaign, listener=listener,
                        accept_new_host_key=args.accept_new_host_key)  # fmt: skip

    camp_run = SweepCampaign(store, sweep, hosts, fresh=args.fresh, max_runs=args.max_runs,
                             deadline_s=budget, listener=view, command=common.command_line(),
                             resume_id=resume_id, executor_factory=factory)  # fmt: skip
    camp_run.resume_options = common.resume_options(args)
    outcome = common.run_campaign(camp_run.run, view, "sweep", as_json=args.json)
    if outcome is None:
        return 130
    paths = [str(p) for p in write_sweep_reports(store, outcome.campaign_id)]
    if args.json:
        console().print_json(json.dumps(outcome.to_json() | {"reports": paths}))
    else:
        print_table(outcome, paths)
    return 0 if outcome.status == "done" else 1


def print_table(outcome: SweepOutcome, paths: list[str]) -> None:
    c = console()
    t = Table(title=f"sweep {outcome.campaign_id}", title_justify="left")
    t.add_column("config", min_width=24)
    for col in ("rep", "verdict", "signature", "metric", "time", "run"):
        t.add_column(col)
    for r in outcome.rows:
        run = r.run
        t.add_row(escape(r.item.label), str(r.repeat + 1),
                  verdict_text(run.verdict) if run else "[dim]not run[/]",
                  escape(str(run.signature or "")) if run else "",
                  f"{run.probe_metric:g}" if run and run.probe_metric is not None else "",
                  f"{run.duration:.0f}s" if run else "", run.id if run else "")  # fmt: skip
    c.print(t)
    if outcome.message:
        c.print(f"[yellow]{escape(outcome.message)}[/]", highlight=False)
    for host, why in outcome.removed_hosts:
        c.print(f"[yellow]host {host} was taken out of the pool[/]: {escape(why)}", highlight=False)
    c.print(f"runs: {outcome.executed} executed, {outcome.reused} reused from the cache",
            highlight=False)  # fmt: skip
    for p in paths:
        c.print(f"report: {p}", highlight=False)
