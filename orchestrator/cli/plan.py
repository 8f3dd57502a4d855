"""`orchestrator plan --good G --bad B`: deltas, the first round, and run estimates.

With `--host`, both configs' flags also go to the server's own parser on that host (the
bisection's preflight: its `--help`, then a dry parse that starts nothing); nothing else
on the host is touched (no lock, no unit, no start)."""

from __future__ import annotations

import argparse
import json

from rich.markup import escape
from rich.table import Table

from orchestrator.campaign import timing
from orchestrator.campaign.planning import Plan, make_plan, read_builds, with_order
from orchestrator.cli import common
from orchestrator.cli.output import console
from orchestrator.config.deployment import split_warnings
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
    p.add_argument(
        "--host",
        help="also put both configs' flags to the server's own parser on "
        "this host or pool (its --help, then a dry parse that starts nothing)",
    )
    p.add_argument("--accept-new-host-key", action="store_true")
    p.add_argument(
        "--no-repair",
        action="store_true",
        help="say the plan of a bisection run with --no-repair (no repair moves)",
    )
    p.add_argument(
        "--no-split",
        action="store_true",
        help="a flag whose value is a JSON object stays one delta (by default each "
        "changed key path in it is a delta of its own)",
    )
    p.add_argument(
        "--rehearse",
        action="store_true",
        help="price the search on dummy weights, as `bisect --rehearse` runs it "
        "(`rehearse: dummy-weights` in either config asks the same)",
    )
    p.add_argument(
        "--builds",
        metavar="A,B,C|FILE",
        help="the builds from good's to bad's in order: bisected with the flags",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_hosts_option(p)
    common.add_results_option(p)
    p.set_defaults(handler=run)


def known_run_time(args: argparse.Namespace, plan: Plan, weights: str = "real") -> timing.RunTime:
    """A start's time: declared in the configs, else learned from the results store (on
    the host of --host when given), else unknown."""
    from orchestrator.errors import OrchestratorError

    store = None
    try:
        store = common.store(args, readonly=True)
    except OrchestratorError:
        store = None  # no results yet: nothing to learn from
    try:
        return timing.run_time(
            plan,
            store,
            args.host if getattr(args, "host", None) and "," not in args.host else None,
            weights,
        )
    finally:
        if store is not None:
            store.close()


def rehearsed(args: argparse.Namespace, plan: Plan) -> tuple[bool, str]:
    """(whether the bisection of this pair would rehearse on dummy weights, why not when it
    was asked and cannot)."""
    from orchestrator.campaign import rehearsal
    from orchestrator.cli.bisect import wants_rehearsal

    if not (getattr(args, "rehearse", False) or wants_rehearsal(plan)):
        return False, ""
    why = rehearsal.refused(plan)
    return not why, why


def time_lines(rt: timing.RunTime, casts: list[timing.Forecast]) -> list[str]:
    """The forecast in words: runs, and hours where a start's time is known."""
    dur = timing.duration_text
    if rt.seconds is not None:
        head = f"runs and time to the answer at {dur(rt.seconds)} a start ({rt.source}):"
    else:
        head = (
            f"runs to the answer (a start's time is {rt.source}; the worst case takes "
            f"every start to its health deadline, {dur(rt.worst)}):"
        )
    out = [head]
    for f in casts:
        time = f", about {dur(f.seconds)}" if f.seconds is not None else ""
        worst = "p95" if "flaky" in f.shape else "worst"
        real = f" ({f.real_runs:.0f} on real weights)" if f.real_runs is not None else ""
        out.append(
            f"  {f.shape}: {f.runs:.0f} runs{real}{time} ({worst} "
            f"{f.worst_runs:.0f} runs, {dur(f.worst_seconds)} at {dur(rt.worst)} "
            "a start)"
        )
    if rt.seconds is not None and all(f.real_runs is None for f in casts):
        low, high = casts[0].seconds or 0, (casts[-1].worst_runs * rt.seconds)
        what = "a pair" if "pair" in casts[-1].shape else "one flag"
        out.append(
            f"  expect {dur(low)} to {dur(high)}: {dur(low)} for one flag that fails "
            f"every time, {dur(high)} for {what} that fails on half of the starts (p95)"
        )
    return out


def plural(count: int, word: str) -> str:
    """`1 delta`, `3 deltas`."""
    return f"{count} {word}" + ("" if count == 1 else "s")


def check_flags(args: argparse.Namespace, plan: Plan) -> list[str]:
    """Both configs' flags put to the server on each host of --host, as a bisection does
    before its first start: a refusal raises FlagsRefused (exit 2, naming the file and what
    the server said). Returns what the check said (a help it does not trust, ...)."""
    from orchestrator.campaign.pool import refused_flags
    from orchestrator.events import Notice
    from orchestrator.execution.executor import service_name

    said: list[str] = []

    def listen(event: object) -> None:
        if isinstance(event, Notice):
            said.append(f"{event.host}: {event.message}")

    hosts = common.hosts_for(args, args.host)
    # a deployment's roles are asked on their own hosts, each its own launch (as a
    # bisection asks them); a pool with roles that name their hosts is refused here too
    common.deployment_setup(args, hosts, plan.good, plan.bad)
    make = common.executor_factory(args)
    for host in hosts:
        executor = make(host, service_name(plan.good), "", listen)
        try:
            for exp in (plan.good, plan.bad):
                refused_flags(executor, exp)
                # a cluster's job that could never run (a deployment of more ranks than nodes)
                check_jobs = getattr(executor, "check_jobs", None)
                if check_jobs is not None:
                    check_jobs(exp)
        finally:
            executor.close(restore=False)
        asked = [m.site.host.name for m in getattr(executor, "members", ())] or [host.name]
        for name in dict.fromkeys(asked):
            if not any(line.startswith(f"{name}: ") for line in said):
                said.append(
                    f"{name}: the server takes both configs' flags (its --help, "
                    "and its own parser where the help foresaw a refusal)"
                )
    return said


def repair_moves(args: argparse.Namespace, plan: Plan) -> list[dict[str, str]]:
    """The repair moves in force (built in, the host's, the files') and whether each may
    run in this campaign."""
    from orchestrator.config.repair import policy
    from orchestrator.planner.repair import may_run

    host = common.hosts_for(args, args.host)[0] if args.host else None
    pol = policy(
        [host.repair if host else None, plan.good.repair, plan.bad.repair],
        enabled=not args.no_repair,
    )
    return [
        {"move": m.describe(), "source": m.source, "status": why, "steps": str(pol.steps)}
        for m, why in may_run(pol, plan.good, plan.bad, plan.deltas)
    ]


def roles_of(exp: object) -> list[dict[str, object]]:
    """A deployment's roles in start order: name, kind, rank, host, unit, and which one
    health is polled on (one role, `server`, for a single unit)."""
    dep = exp.deployment()  # type: ignore[attr-defined]
    return [
        {
            "role": r.name,
            "kind": r.kind,
            "rank": r.rank,
            "host": r.host,
            "unit": r.unit or exp.unit,  # type: ignore[attr-defined]
            "health": r.name == dep.health_role,
        }
        for r in (dep.role(n) for n in dep.start_order)
    ]


def refused_start(exp: object, plan: Plan) -> str | None:
    """Why this launch is `invalid` before it starts: its roles would split a flag they
    must agree on (None: it may start, or either config says to start it anyway)."""
    from orchestrator.config.deployment import refusal, starts_anyway

    why = refusal(exp, start=starts_anyway(plan.good, plan.bad))  # type: ignore[arg-type]
    return why.reason if why else None


def _role_words(r: dict[str, object]) -> str:
    rank = f" rank {r['rank']}" if r["rank"] is not None and r["kind"] != "router" else ""
    host = f"on {r['host']}" if r["host"] else "on the campaign's host"
    unit = f" ({r['unit']})" if r["unit"] else ""
    polled = ", health polled here" if r["health"] else ""
    return f"{r['role']} [{r['kind']}{rank}] {host}{unit}{polled}"


def run(args: argparse.Namespace) -> int:
    plan = make_plan(args.good, args.bad, args.strategy, split=not args.no_split)
    plan = with_order(plan, read_builds(args.builds) if args.builds else ())
    for line in plan.notes:
        common.note(f"note: {line}")
    for line in split_warnings(plan.good, plan.bad):  # type: ignore[arg-type]
        common.note(f"warning: {line}")
    flag_notes = check_flags(args, plan) if args.host else []
    moves = repair_moves(args, plan)
    planner = plan.planner()
    first = planner.pending()
    est = plan.estimates()
    rt = known_run_time(args, plan)
    rehearse, refused = rehearsed(args, plan)
    dummy = known_run_time(args, plan, "dummy") if rehearse else None
    casts = timing.forecasts(est, rt, n=plan.n, rehearse=rehearse, dummy=dummy)
    if args.json:
        from orchestrator.config.secrets import Redactor

        red = Redactor(plan.good.secrets() | plan.bad.secrets())
        out = {
            "good": plan.good.source,
            "bad": plan.bad.source,
            "strategy": plan.strategy,
            "deltas": [red.obj(d.to_dict()) | {"index": i} for i, d in enumerate(plan.deltas)],
            "endpoint_checks": 2,
            "builds": {"good": plan.good.build, "bad": plan.bad.build, "order": list(plan.order)},
            "first_round": [
                {
                    "deltas": sorted(v),
                    "describe": plan.describe(v),
                    "argv": red.obj(plan.variant(v).argv()),
                    "build": plan.builds_of(v),
                    "refused": refused_start(plan.variant(v), plan),
                }
                for v in first
            ],
            "roles": roles_of(plan.bad),
            "refused": {
                "good": refused_start(plan.good, plan),
                "bad": refused_start(plan.bad, plan),
            },
            "estimated_runs": est,
            "run_time": rt.to_dict(),
            "rehearse": rehearse,
            "forecast": [f.to_dict() for f in casts],
        }
        if dummy is not None:
            out["dummy_run_time"] = dummy.to_dict()
        if refused:
            out["rehearsal_refused"] = refused
        if rt.seconds is not None and not rehearse:
            out["hours_range"] = [
                round((casts[0].seconds or 0) / 3600, 2),
                round(casts[-1].worst_runs * rt.seconds / 3600, 2),
            ]
        if args.host:
            out["flag_check"] = flag_notes
        out["repair_moves"] = moves
        console().print_json(json.dumps(out))
        return 0
    c = console()
    c.print(f"good: {escape(plan.good.name)} ({escape(plan.good.source)})", highlight=False)
    c.print(f"bad:  {escape(plan.bad.name)} ({escape(plan.bad.source)})", highlight=False)
    if plan.bad.roles:
        c.print("roles, in start order (stopped in reverse):", highlight=False)
        for r in roles_of(plan.bad):
            c.print(f"  - {escape(_role_words(r))}", highlight=False)
    for which, exp in (("good", plan.good), ("bad", plan.bad)):
        why = refused_start(exp, plan)
        if why:
            c.print(
                f"{which} is refused before it starts (invalid): {escape(why)}; "
                "`mismatched_roles: start` in the config starts it anyway",
                highlight=False,
            )
    table = Table(title=plural(plan.n, "delta"), title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("change")
    table.add_column("kind")
    for i, d in enumerate(plan.deltas[: plan.n]):
        table.add_row(str(i), escape(d.describe()), d.kind)
    c.print(table)
    c.print(f"strategy: {plan.strategy}", highlight=False)
    builds = {plan.good.build, plan.bad.build} - {None}
    if plan.order:
        c.print(
            f"builds, in order (bisected with the flags): {escape(', '.join(plan.order))}",
            highlight=False,
        )
    if first:
        c.print("runs first: the two endpoint checks (good must pass, bad must fail), then:")
        for v in first:
            build = f"  [build {plan.builds_of(v) or 'as installed'}]" if builds else ""
            why = refused_start(plan.variant(v), plan)
            no = f"  [refused before it starts: {why}]" if why else ""
            c.print(f"  - {escape(plan.describe(v))}{escape(build)}{escape(no)}", highlight=False)
    else:  # one change: good + it is the bad config, so the endpoints are the whole search
        c.print(
            "runs: the two endpoint checks (good must pass, bad must fail); with one "
            "change they are the answer",
            highlight=False,
        )
    if builds:
        c.print(
            f"builds the host needs: {escape(', '.join(plan.order or sorted(builds)))}",
            highlight=False,
        )
    for line in flag_notes:
        c.print(f"flags: {escape(line)}", highlight=False)
    if plan.n >= 2:  # no interacting pair among fewer than two changes
        c.print(
            f"expected runs after the endpoints: single culprit {est['single_mean']:.1f} "
            f"(worst {est['single_worst']:.0f}), interacting pair {est['pair_mean']:.1f} "
            f"(worst {est['pair_worst']:.0f})",
            highlight=False,
        )
    if rehearse:
        c.print(
            "rehearsal on dummy weights: the search runs on them; the bad config and "
            "good + each culprit set start on real weights too"
            + (f" (a start on dummy weights: {dummy.source})" if dummy else ""),
            highlight=False,
        )
    elif refused:
        c.print(f"no rehearsal on dummy weights: {escape(refused)}", highlight=False)
    for line in time_lines(rt, casts):
        c.print(escape(line), highlight=False)
    running = [m for m in moves if m["status"].startswith("may run")]
    if running or args.no_repair:  # (no line when neither config sets a knob a move turns)
        c.print(
            f"repair moves (a variant that dies of a resource starts again, at most "
            f"{moves[0]['steps'] if moves else 0} times):"
            if running
            else "repair moves: none may run (--no-repair)",
            highlight=False,
        )
    for m in running:
        c.print(f"  - {escape(m['move'])}; {escape(m['status'])}", highlight=False)
    return 0
