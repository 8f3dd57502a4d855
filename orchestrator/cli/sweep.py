"""`orchestrator sweep SWEEP.yaml`: run a list or matrix of configs, then a table + report."""

from __future__ import annotations

import argparse
import json

from rich.markup import escape
from rich.table import Table

from orchestrator.campaign.records import Status, SweepSpec
from orchestrator.campaign.sweep import SweepCampaign, SweepOutcome, parse_until
from orchestrator.cli import common, detached, notifying
from orchestrator.cli.live import verdict_text
from orchestrator.cli.output import console
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host, Inventory
from orchestrator.config.schema import parse_duration
from orchestrator.config.sweep import (
    Sweep,
    SweepItem,
    answers_judged,
    load_sweep,
    relative_bar,
)
from orchestrator.errors import EXIT_REGRESSION, UsageError
from orchestrator.reports import env_report
from orchestrator.reports.sweep_report import Comparison, comparison, write_sweep_reports
from orchestrator.store.store import CampaignRow

KIND_WORDS = {
    "bisect": "a bisection",
    "sweep": "a sweep",
    "run": "a single run (`run`)",
    "rerun": "a single run (`rerun`)",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a list or matrix of configs (overnight sweeps)",
        description="Run every config of a sweep file once per repeat, then print a table and "
        "write a report (with a plot of the probe metric, and the comparison with the "
        "previous run of the same sweep). Every config is measured afresh.",
        epilog="Budgets: --until HH:MM and --deadline stop starting runs at that time of day / "
        "after that long (the runs in progress finish); --max-runs N starts at most N runs in "
        "this invocation. A sweep stopped by a budget prints its resume command; running the "
        "same command again also resumes it, with a new budget.",
    )
    p.add_argument("sweep", nargs="?", help="sweep YAML")
    p.add_argument("--host", help="host or pool (default: the sweep file's host)")
    p.add_argument("--pool", help="a pool of equivalent hosts (same as --host POOL)")
    p.add_argument("--resume", metavar="ID", help="continue an interrupted or budget-stopped sweep")
    p.add_argument(
        "--max-runs",
        type=common.positive_int,
        metavar="N",
        help="start at most N runs in this invocation (a resume gets N more)",
    )
    p.add_argument(
        "--until",
        metavar="HH:MM",
        help="stop starting runs at this time of day (runs in progress finish)",
    )
    p.add_argument(
        "--deadline",
        metavar="DURATION",
        help="stop starting runs after this long, e.g. 6h (runs in progress finish)",
    )
    p.add_argument(
        "--reuse",
        action="store_true",
        help="reuse verdicts recorded by earlier campaigns for the same config and "
        "host class instead of measuring (first repeat only; the reference is always "
        "measured); reused rows are marked and judged by this sweep's bar",
    )
    p.add_argument("--fresh", action="store_true", help=argparse.SUPPRESS)  # the default now
    p.add_argument("--accept-new-host-key", action="store_true")
    p.add_argument("--json", action="store_true")
    notifying.add_option(p)
    detached.add_option(p)
    common.add_hosts_option(p)
    common.add_results_option(p)
    p.set_defaults(handler=run)


def wrong_kind(camp: CampaignRow, wanted: str, options: str) -> UsageError:
    """`sweep --resume` of a bisection (or the reverse): say what it is and what resumes it."""
    what = KIND_WORDS.get(camp.kind, f"a {camp.kind} campaign")
    if camp.kind in ("bisect", "sweep"):
        how = f"resume it with: orchestrator {camp.kind} --resume {camp.id}{options}"
    else:
        how = f"nothing to resume; run it again with: orchestrator rerun {camp.id}.1{options}"
    return UsageError(f"campaign {camp.id} is {what}, not {KIND_WORDS[wanted]}: {how}")


def _sweep_from_spec(spec: SweepSpec) -> Sweep:
    # the recorded configs, with their secrets taken from this environment again
    items = tuple(
        SweepItem(
            i, it.label, Experiment.from_dict(it.config, resolve_secrets=True), tuple(it.values)
        )
        for i, it in enumerate(spec.items)
    )
    return Sweep(spec.name, spec.sweep, items, spec.repeat, None, None, spec.reference)


def sweep_and_hosts(args: argparse.Namespace, inv: Inventory) -> tuple[Sweep, list[Host]]:
    """The sweep file named on the command line and the hosts it runs on (--host/--pool,
    else the file's `host:`), checked as `sweep` and `schedule add` both need them."""
    if not args.sweep:
        raise UsageError("sweep needs a SWEEP.yaml (or --resume ID)")
    sweep = load_sweep(args.sweep)
    where = args.pool or args.host or sweep.host
    if not where:
        raise UsageError("no host: give --host/--pool or `host:` in the sweep file")
    return sweep, inv.resolve(where)


def run(args: argparse.Namespace) -> int:
    if args.detach:
        return detached.detach(args)
    budget = None
    if args.until:
        budget = parse_until(args.until)
    if args.deadline:
        try:
            d = parse_duration(args.deadline)
        except ValueError as exc:
            raise UsageError(f"--deadline: {exc}") from None
        budget = min(budget, d) if budget else d
    if args.max_runs is not None and args.max_runs < 1:
        raise UsageError("--max-runs must be at least 1")
    reuse = args.reuse
    if args.resume:
        # the store is opened once the command line is checked: a resume writes where its
        # campaign is recorded, a new sweep once its inputs are (a typo makes nothing)
        store = common.store(args, create=False)
        camp = store.campaign(args.resume)
        if camp.kind != "sweep":
            raise wrong_kind(camp, "sweep", common.resume_options(args))
        common.recorded_hosts(args, camp)
    inv = common.inventory(args)
    if args.resume:
        spec = SweepSpec.from_dict(camp.spec)
        sweep = _sweep_from_spec(spec)
        hosts = [inv.host(h) for h in spec.hosts]
        resume_id = camp.id
        reuse = reuse or spec.reuse
        common.deployment_setup(args, hosts, *(it.exp for it in sweep.items))
    else:
        sweep, hosts = sweep_and_hosts(args, inv)
        resume_id = None
        # configs with roles run as deployments (each role on its host), checked before
        # the campaign is recorded
        common.deployment_setup(args, hosts, *(it.exp for it in sweep.items))
        store = common.store(args)
    notify_url = notifying.url_for(args, sweep.notify, inv.notify)
    notifying.register_secret(store, notify_url)  # never in the recorded command line
    view = common.live_view(args)
    camp_run = SweepCampaign(
        store,
        sweep,
        hosts,
        reuse=reuse,
        max_runs=args.max_runs,
        deadline_s=budget,
        listener=view,
        command=common.command_line(),
        resume_id=resume_id,
        executor_factory=common.executor_factory(args),
        resume_text=lambda ref: common.resume_command(args, ref),
    )
    outcome = notifying.conduct(args, store, notify_url, "sweep", camp_run, view, "sweep")
    if outcome is None:
        return 130
    paths = [str(p) for p in write_sweep_reports(store, outcome.campaign_id)]
    envs = env_report.to_json(store.campaign_environments(outcome.campaign_id))
    comp = comparison(store, store.campaign(outcome.campaign_id))
    regressions = tuple(comp.regression_lines()) if comp is not None else ()
    if args.json:
        extra = {
            "reports": paths,
            "comparison": _comparison_json(comp),
            "environment": envs,
            "regressions": list(regressions),
        }
        console().print_json(json.dumps(outcome.answer().to_dict() | extra))
    else:
        print_table(outcome, paths, comp)
        for line in env_report.text_lines(store.campaign_environments(outcome.campaign_id)):
            console().print(escape(line), highlight=False)
        if comp is not None and comp.regressions:  # the last word, as the exit code says it
            console().print(
                f"[bold red]REGRESSION[/] against campaign {comp.previous.id}: "
                + escape("; ".join(f"{ch.config}: {ch.regression}" for ch in comp.regressions))
                + f" (exit {EXIT_REGRESSION})",
                highlight=False,
            )
    # after the answer is printed: the receiver decides neither the answer nor the exit code
    notifying.concluded(
        store,
        notify_url,
        "sweep",
        outcome.campaign_id,
        outcome.status,
        next((p for p in paths if p.endswith(".html")), None),
        detail=outcome.message,
        regressions=regressions,
    )
    if outcome.status is not Status.DONE:
        return 1
    return EXIT_REGRESSION if comp is not None and comp.regressions else 0


def _comparison_json(comp: Comparison | None) -> dict | None:
    if comp is None:
        return None
    return {
        "previous": comp.previous.id,
        "headline": comp.headline(),
        "reference_moved": comp.reference_moved or None,
        "changes": [
            {
                "config": c.config,
                "metric_before": c.before,
                "metric_now": c.now,
                "change": c.ratio,
                "verdict_before": c.verdict_before,
                "verdict_now": c.verdict_now,
                "regression": c.regression,
            }
            for c in comp.changes
        ],
    }


def reference_judges(outcome: SweepOutcome) -> list[str]:
    """What the sweep's reference judges the configs by: a probe bar relative to it, the
    answers check (with its rule), or both."""
    exps = [r.item.exp for r in outcome.rows]
    out = []
    if any(relative_bar(e) for e in exps):
        out.append("relative probe bars")
    rules = sorted({e.answers.rule for e in exps if answers_judged(e) and e.answers})
    if rules:
        out.append(f"answers (rule {', '.join(rules)})")
    return out


def print_table(outcome: SweepOutcome, paths: list[str], comp: Comparison | None = None) -> None:
    c = console()
    if comp is not None and comp.regressions:
        c.print(f"[bold red]{escape(comp.headline())}[/]", highlight=False)
    t = Table(title=f"sweep {outcome.campaign_id}", title_justify="left")
    t.add_column("config", min_width=24)
    for col in ("rep", "verdict", "signature", "metric", "time", "run"):
        t.add_column(col)
    for r in outcome.rows:
        run = r.run
        label = escape(r.item.label) + (
            " [dim](reference)[/]" if r.item.label == outcome.reference else ""
        )
        verdict = verdict_text(run.verdict) if run else "[dim]not run[/]"
        if run and run.cached_from:
            verdict += " [dim](reused)[/]"
        t.add_row(
            label,
            str(r.repeat + 1),
            verdict,
            escape(str(run.signature or "")) if run else "",
            f"{run.probe_metric:g}" if run and run.probe_metric is not None else "",
            f"{run.duration:.0f}s" if run else "",
            (run.id + (f" (from {run.cached_from})" if run.cached_from else "")) if run else "",
        )
    c.print(t)
    if outcome.reference:
        for what in reference_judges(outcome):
            c.print(
                f"{what} judged against the reference {escape(outcome.reference)}, "
                "measured in this sweep",
                highlight=False,
            )
    if outcome.message:
        c.print(f"[yellow]{escape(outcome.message)}[/]", highlight=False)
    for host, why in outcome.removed_hosts:
        c.print(f"[yellow]host {host} was taken out of the pool[/]: {escape(why)}", highlight=False)
    now = ""
    if (outcome.executed, outcome.reused) != (outcome.total_executed, outcome.total_reused):
        now = f" ({outcome.executed} executed and {outcome.reused} reused by this invocation)"
    c.print(
        f"runs: {outcome.total_executed} executed, {outcome.total_reused} reused from "
        f"earlier campaigns{now}",
        highlight=False,
    )
    if comp is not None:
        c.print(
            escape(comp.headline())
            if not comp.regressions
            else f"against campaign {comp.previous.id}:",
            highlight=False,
        )
        for ch in comp.changes:
            mark = "[red]regression[/]: " if ch.regression else ""
            c.print(f"  {escape(ch.config)}: {mark}{escape(ch.describe())}", highlight=False)
    if outcome.resume:
        c.print(
            f"resume with: [bold]{escape(outcome.resume)}[/] (or the same command again)",
            highlight=False,
        )
    for p in paths:
        c.print(f"report: {p}", highlight=False)
    if comp is not None and comp.reference_moved:
        c.print(f"[yellow]note:[/] {escape(comp.reference_moved)}", highlight=False)
