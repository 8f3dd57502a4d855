"""`orchestrator bisect --good G --bad B --host H`: the main job, end to end."""

from __future__ import annotations

import argparse
import json

from rich.markup import escape

from orchestrator.campaign.bisect import Bisection
from orchestrator.campaign.planning import (
    Plan,
    make_plan,
    read_builds,
    with_order,
    with_packages,
)
from orchestrator.campaign.records import BisectOptions, BisectSpec, Culprit, Outcome, Status
from orchestrator.cli import common, detached, effect_table, notifying
from orchestrator.cli.live import verdict_text
from orchestrator.cli.output import console, err_console
from orchestrator.config.deployment import split_warnings
from orchestrator.config.experiment import Experiment, option_word
from orchestrator.config.hosts import Host
from orchestrator.config.schema import parse_duration
from orchestrator.diagnosis.verdicts import Verdict
from orchestrator.errors import EXIT_UNSURE, CampaignRef, ConfigError, OrchestratorError, UsageError
from orchestrator.planner import STRATEGIES
from orchestrator.planner.deltas import Delta, check_differ, diff
from orchestrator.reports import env_report
from orchestrator.reports.deployment_view import CampaignDeployment, of_campaign
from orchestrator.store.store import Store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bisect",
        help="find which flag (or set of flags) makes the bad config fail",
        description="Run the good and bad configs, then bisect their difference on the host.",
    )
    p.add_argument("--good", help="experiment YAML that works")
    p.add_argument("--bad", help="experiment YAML that fails")
    p.add_argument(
        "--host",
        "--pool",
        dest="host",
        help="host or pool name from the hosts file (a pool runs variants in parallel)",
    )
    p.add_argument("--resume", metavar="ID", help="continue an interrupted campaign")
    p.add_argument("--strategy", default="auto", choices=sorted(STRATEGIES))
    p.add_argument(
        "--repeat",
        type=common.positive_int,
        default=1,
        metavar="N",
        help="run the variants that decide the answer N times (flaky failures)",
    )
    p.add_argument(
        "--confidence",
        type=float,
        metavar="P",
        help="search until the answer is this likely to be right (default 0.95); "
        "an answer below it is `unsure` (exit 4) and --resume goes on",
    )
    p.add_argument(
        "--max-runs",
        type=common.positive_int,
        metavar="N",
        help="stop after N runs of this campaign (counted across resumes)",
    )
    p.add_argument(
        "--deadline",
        metavar="DURATION",
        help="stop after this wall time (e.g. 8h) with the difference narrowed so far",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="start a new campaign (also where the same command was interrupted: "
        "--resume ID goes on with that one) and reuse no recorded verdict",
    )
    p.add_argument(
        "--no-split",
        action="store_true",
        help="a flag whose value is a JSON object stays one delta (by default each "
        "changed key path in it is a delta of its own)",
    )
    p.add_argument(
        "--builds",
        metavar="A,B,C|FILE",
        help="the builds from good's to bad's in order (names, paths or images; "
        "or a file with one a line): the build is bisected on this order, "
        "together with the flags",
    )
    p.add_argument(
        "--packages",
        action="store_true",
        help="open the difference of the two builds (virtualenvs or prefixes on "
        "the host) into the distributions that differ: each is a delta, and a set "
        "`pip check` refuses is `invalid`",
    )
    p.add_argument(
        "--rehearse",
        action="store_true",
        help="search on dummy weights (--load-format dummy: seconds to load, not "
        "minutes) and confirm the answer on real weights; the experiment's "
        "`rehearse: dummy-weights` asks the same",
    )
    p.add_argument(
        "--no-repair",
        action="store_true",
        help="a variant that dies of a resource (out of memory, a KV cache too "
        "small) is not started again with a repair move",
    )
    p.add_argument(
        "--accept-new-host-key",
        action="store_true",
        help="record a host key seen for the first time (never a changed one)",
    )
    p.add_argument("--no-report", action="store_true", help="do not write the report files")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    notifying.add_option(p)
    detached.add_option(p)
    common.add_hosts_option(p)
    common.add_results_option(p)
    p.set_defaults(handler=run)


def _plan_from_spec(spec: BisectSpec) -> Plan:
    # the recorded configs, with their secrets taken from this environment again
    good = Experiment.from_dict(spec.good, source=spec.good_source or "good", resolve_secrets=True)
    bad = Experiment.from_dict(spec.bad, source=spec.bad_source or "bad", resolve_secrets=True)
    split = spec.options.split
    deltas = diff(good, bad, split=split)
    check_differ(deltas, good, bad)
    plan = with_order(
        Plan(good=good, bad=bad, deltas=tuple(deltas), strategy=spec.options.strategy, split=split),
        spec.options.builds,
        as_searched=True,
    )
    pk = spec.options.packages
    return with_packages(plan, pk["good"], pk["bad"]) if pk else plan


def _opened(
    plan: Plan,
    host: Host,
    args: argparse.Namespace,
) -> tuple[Plan, dict[str, dict[str, str]]]:
    """`--packages`: the two builds' distributions read on the host, their differences the
    plan's deltas in place of the build."""
    from orchestrator.execution.executor import service_name

    ex = common.executor_factory(args)(host, service_name(plan.good), "", lambda e: None)
    try:
        got = {"good": ex.packages_of(plan.good), "bad": ex.packages_of(plan.bad)}
    finally:
        ex.close(restore=False)
    return with_packages(plan, got["good"], got["bad"]), got


def _respelled(plan: Plan, host: Host, args: argparse.Namespace) -> Plan:
    """The plan with both configs' flags named as the server's parser reads them: two
    spellings of one option (`max_num_seqs` / `max-num-seqs`, a unique prefix, an alias)
    are one option, not a removed flag and an added one. Without a help trusted to tell
    (or a host that cannot be reached yet), the plan as written."""
    from orchestrator.execution.executor import service_name
    from orchestrator.execution.preflight import respell

    ex = common.executor_factory(args)(host, service_name(plan.good), "", lambda e: None)
    try:
        facts = getattr(ex, "parser_facts", lambda exp: None)(plan.good)
    except OrchestratorError:
        return plan  # the campaign itself will say what is wrong with the host
    finally:
        ex.close(restore=False)
    if facts is None:
        return plan
    good, g = respell(plan.good, facts)
    bad, b = respell(plan.bad, facts)
    if not g and not b:
        return plan
    said = ", ".join(f"{option_word(a)} -> --{c}" for a, c in dict(g + b).items())
    err_console().print(f"flags as the server's parser reads them: {escape(said)}", highlight=False)
    deltas = diff(good, bad, split=plan.split)
    check_differ(deltas, good, bad)
    return Plan(good=good, bad=bad, deltas=tuple(deltas), strategy=plan.strategy, split=plan.split)


def _known_run_time(view: object, plan: Plan, store: Store, hosts: list[Host]) -> None:
    """The live view's time per start before the first one ends: declared, else learned
    from the earlier runs of the same config family on the (one) host."""
    from orchestrator.campaign import timing
    from orchestrator.cli.live import LiveView

    if isinstance(view, LiveView):
        host = hosts[0].name if len(hosts) == 1 else None
        view.run_time_s = timing.run_time(plan, store, host).seconds


def wants_rehearsal(plan: Plan) -> bool:
    """Either config asks for it (`rehearse: dummy-weights`) and neither turns it `off`."""
    asked = {plan.good.rehearse, plan.bad.rehearse}
    return "dummy-weights" in asked and "off" not in asked


def weights_lines(weights: dict | None) -> list[str]:
    """Which weights the runs loaded, and the rehearsal's course."""
    if not weights:
        return []
    out = []
    if weights.get("note"):
        out.append(f"weights: {weights['note']}")
    out.append(
        f"starts on real weights: {weights.get('real_starts', 0)}, on dummy weights: "
        f"{weights.get('dummy_starts', 0)}"
    )
    return out


def run(args: argparse.Namespace) -> int:
    if args.detach:
        return detached.detach(args)
    if args.repeat < 1:
        raise UsageError("--repeat must be at least 1")
    if args.confidence is not None and not 0.5 <= args.confidence < 1:
        raise UsageError("--confidence must be at least 0.5 and below 1 (e.g. 0.95)")
    deadline = None
    if args.deadline:
        try:
            deadline = parse_duration(args.deadline)
        except ValueError as exc:
            raise UsageError(f"--deadline: {exc}") from None
    if args.resume:
        given = [f"--{o}" for o in ("good", "bad", "host") if getattr(args, o)]
        if args.strategy != "auto":
            given.append("--strategy")
        if args.no_split:
            given.append("--no-split")
        if args.no_repair:
            given.append("--no-repair")
        if args.builds:
            given.append("--builds")
        if args.packages:
            given.append("--packages")
        if given:
            raise UsageError(
                f"--resume continues a campaign with its recorded configs, hosts "
                f"and strategy; {', '.join(given)} cannot be given with it",
                hint="drop them, or start a new campaign without --resume",
            )
        # the store is opened once the command line is checked: a resume writes where its
        # campaign is recorded, a new campaign once its inputs are (a typo makes nothing)
        store = common.store(args, create=False)
        camp = store.campaign(args.resume)
        if camp.kind != "bisect":
            from orchestrator.cli.sweep import wrong_kind

            raise wrong_kind(camp, "bisect", common.resume_options(args))
        spec = BisectSpec.from_dict(camp.spec)
        plan = _plan_from_spec(spec)
        opts = spec.options
        options = BisectOptions(
            strategy=plan.strategy,
            repeat=args.repeat if args.repeat > 1 else opts.repeat,
            max_runs=args.max_runs or opts.max_runs,
            deadline_s=deadline or opts.deadline_s,
            fresh=args.fresh or opts.fresh,
            confidence=args.confidence or opts.confidence,
            rehearse=opts.rehearse,
            repair=opts.repair,
            builds=opts.builds,
            packages=opts.packages,
        )
        common.recorded_hosts(args, camp)  # the same hosts, not another file's of that name
        inv = common.inventory(args)
        hosts = [inv.host(h) for h in spec.hosts]
        common.deployment_setup(args, hosts, plan.good, plan.bad)
        resume_id = camp.id
    else:
        if not (args.good and args.bad and args.host):
            raise UsageError("bisect needs --good, --bad and --host (or --resume ID)")
        plan = make_plan(args.good, args.bad, args.strategy, split=not args.no_split)
        hosts = common.hosts_for(args, args.host)
        common.deployment_setup(args, hosts, plan.good, plan.bad)
        refuse_split_endpoints(plan.good, plan.bad)
        for line in split_warnings(plan.good, plan.bad):
            common.note(f"warning: {line}")
        plan = _respelled(plan, hosts[0], args)
        plan = with_order(plan, read_builds(args.builds) if args.builds else ())
        for line in plan.notes:
            common.note(f"note: {line}")
        packages = None
        if args.packages:
            plan, packages = _opened(plan, hosts[0], args)
        options = BisectOptions(
            strategy=args.strategy,
            repeat=args.repeat,
            max_runs=args.max_runs,
            deadline_s=deadline,
            fresh=args.fresh,
            confidence=args.confidence or 0.95,
            split=not args.no_split,
            rehearse=args.rehearse or wants_rehearsal(plan),
            repair=not args.no_repair,
            builds=plan.order,
            packages=packages,
        )
        resume_id = None
        store = common.store(args)
    notify_url = notifying.url_for(args, common.inventory(args).notify)
    notifying.register_secret(store, notify_url)  # never in the recorded command line
    view = common.live_view(args)
    _known_run_time(view, plan, store, hosts)
    bisection = Bisection(
        store,
        plan,
        hosts,
        options=options,
        listener=view,
        command=common.command_line(),
        resume_id=resume_id,
        executor_factory=common.executor_factory(args),
    )
    outcome = notifying.conduct(args, store, notify_url, "bisect", bisection, view, "campaign")
    if outcome is None:
        return 130
    report_paths: list[str] = []
    if not args.no_report:
        from orchestrator.reports.report import write_reports

        report_paths = [str(p) for p in write_reports(store, outcome.campaign_id)]
    resume, detail = None, outcome.message
    if outcome.status is Status.UNSURE:
        resume = common.resume_command(args, CampaignRef("bisect", outcome.campaign_id))
        detail = "; ".join(
            [outcome.message, *unsure_details(outcome.noise), f"continue with: {resume}"]
        )
    envs = store.campaign_environments(outcome.campaign_id)
    deployment = of_campaign(store.runs(outcome.campaign_id), store.host_record, outcome.target)
    if args.json:
        data = outcome.to_dict() | {
            "reports": report_paths,
            "environment": env_report.to_json(envs),
            "deployment": deployment.to_json() if deployment is not None else None,
        }
        if resume:
            data["resume"] = resume
        console().print_json(json.dumps(data))
    else:
        print_outcome(outcome, plan, report_paths, resume, deployment)
        for line in env_report.text_lines(envs):
            console().print(escape(line), highlight=False)
    # after the answer is printed: the receiver decides neither the answer nor the exit code
    notifying.concluded(
        store,
        notify_url,
        "bisect",
        outcome.campaign_id,
        outcome.status,
        next((p for p in report_paths if p.endswith(".html")), None),
        detail=detail,
    )
    if outcome.status is Status.UNSURE:
        return EXIT_UNSURE
    return 0 if outcome.found else 1


def _evidence(cul: Culprit) -> list[str]:
    """A culprit's evidence lines: only runs that exist, each with its counts."""
    out = []
    if cul.reproduced_by is not None:
        under = f" (repaired with {', '.join(cul.repaired_with)})" if cul.repaired_with else ""
        out.append(
            f"good + these reproduces the failure{under}: run {cul.reproduced_by}"
            + _counts(cul.reproduced_counts)
        )
    for flag, rid in cul.cleared_by.items():
        if rid is not None:
            out.append(f"{cul.claim(flag)}: run {rid}{_counts(cul.cleared_count(flag))}")
    return out


def unsure_details(noise: dict | None) -> list[str]:
    """The reproduction counts and the next runs of an answer below the confidence asked."""
    noise = noise or {}
    out = []
    if noise.get("reproduction_counts"):
        out.append(f"runs with the best set: {noise['reproduction_counts']}")
    if noise.get("next_runs"):
        out.append("next runs: " + ", ".join(noise["next_runs"]))
    return out


def _unsure(outcome: Outcome, resume: str | None) -> None:
    """A best answer below the confidence asked: it, its evidence, and how to go on."""
    c = console()
    noise = outcome.noise or {}
    conf, asked = noise.get("confidence"), noise.get("asked_confidence")
    sure = f"confidence {conf or 0:.3f}" + (f", below the {asked:g} asked" if asked else "")
    c.print(f"[yellow]unsure[/]: {escape(outcome.message)}", highlight=False)
    for cul in outcome.culprits:
        kind = cul.kind
        c.print(
            f"[yellow]best answer ({kind}):[/] [bold]{escape(' + '.join(cul.flags))}[/] ({sure})",
            highlight=False,
        )
        for line in _evidence(cul):
            c.print(f"  {escape(line)} (not yet conclusive)", highlight=False)
    nxt = noise.get("next_runs") or []
    if nxt:
        c.print("next runs: " + escape("; ".join(nxt)), highlight=False)
    c.print(f"continue with: {escape(resume or noise.get('resume') or '')}", highlight=False)


def cleared_deltas(outcome: Outcome, plan: Plan) -> list[Delta]:
    """The searched differences no culprit needs. An ordered search's steps between builds
    are not differences of their own (each build is judged by its runs, in the answer's
    evidence), and the build is not cleared when a culprit names one of its steps."""
    suspects = {i for cul in outcome.culprits for i in cul.indices}
    build_named = any(plan.deltas[i].kind == "build" for i in suspects)
    # a flag that alone shows another failure (a wrong answer, say) is cleared of the
    # target only: it is named with that failure, never listed as harmless
    suspects |= {f.variant[0] for f in outcome.findings if len(f.variant) == 1}
    return [
        d
        for i, d in enumerate(plan.deltas[: plan.n])
        if i not in suspects and not (build_named and d.kind == "build")
    ]


def print_outcome(
    outcome: Outcome,
    plan: Plan,
    report_paths: list[str],
    resume: str | None = None,
    deployment: CampaignDeployment | None = None,
) -> None:
    c = console()
    c.print()
    if outcome.target:
        c.print(f"target failure: [red]{escape(str(outcome.target))}[/]", highlight=False)
    if deployment is not None:
        c.print(
            "roles: " + escape(", ".join(f"{r.role} on {r.host or '?'}" for r in deployment.roles)),
            highlight=False,
        )
        if deployment.answer_line():
            c.print(escape(str(deployment.answer_line())), highlight=False)
    if outcome.effects is not None:  # a probe metric measured: its effect table
        for line in effect_table.lines(outcome.effects, outcome.message):
            c.print(escape(line), highlight=False)
    elif outcome.status is Status.UNSURE:
        _unsure(outcome, resume)
    elif outcome.found:
        for cul in outcome.culprits:
            kind = cul.kind
            needs = f" (needs {', '.join(cul.needs)})" if cul.needs else ""
            c.print(
                f"[bold red]culprit ({kind}):[/] [bold]{escape(' + '.join(cul.flags))}[/]"
                + escape(needs),
                highlight=False,
            )
            for line in _evidence(cul):
                c.print(f"  {escape(line)}", highlight=False)
        cleared = cleared_deltas(outcome, plan)
        if cleared:
            c.print(
                "cleared (not needed for the target failure): "
                + escape(", ".join(d.short() for d in cleared)),
                highlight=False,
            )
    else:
        c.print(f"[yellow]no answer[/]: {escape(outcome.message)}", highlight=False)
        for cul in outcome.culprits:  # the best answer so far (noise-aware search)
            c.print(f"  best so far: {escape(' + '.join(cul.flags))}", highlight=False)
        if outcome.narrowed:
            c.print(
                "  narrowed so far: the failure needs some of: "
                + escape(", ".join(outcome.narrowed.failure_needs_some_of)),
                highlight=False,
            )
    for f in outcome.findings:
        c.print(
            f"[magenta]other failure[/]: {escape(str(f.signature))}  (smallest variant: "
            f"{escape(f.label)}, run {f.run_id}; {escape(f.seen())})",
            highlight=False,
        )
    if outcome.answers:
        c.print(f"[cyan]answers[/]: {escape(outcome.answers)}", highlight=False)
    if outcome.resource and outcome.resource != outcome.message:
        c.print(f"[cyan]resource[/]: {escape(outcome.resource)}", highlight=False)
    for note in outcome.repairs:
        c.print(f"[cyan]repair[/]: {escape(note.sentence())}", highlight=False)
    for inv in outcome.invalid:
        c.print(
            f"{verdict_text(Verdict.INVALID)} {escape(inv.variant)}: {escape(inv.reason)}",
            highlight=False,
        )
    for fl in outcome.flaky:
        c.print(f"[yellow]flaky[/]: {escape(fl)}", highlight=False)
    for line in sureness_lines(outcome.noise):
        c.print(escape(line), highlight=False)
    if outcome.weights and (
        outcome.weights.get("rehearsal") or outcome.weights.get("dummy_starts")
    ):
        for line in weights_lines(outcome.weights):
            c.print(escape(line), highlight=False)
    c.print(
        f"runs: {outcome.runs_executed} executed, {outcome.runs_reused} reused from the cache;"
        f" campaign {outcome.campaign_id}",
        highlight=False,
    )
    for p in report_paths:
        c.print(f"report: {p}", highlight=False)


def _counts(text: str | None) -> str:
    return f" ({text})" if text else ""


def sureness_lines(noise: dict | None) -> list[str]:
    """How sure the answer is: confidence, measured reproduction rate, and the switch."""
    if not noise:
        return []
    out = []
    if noise.get("switched"):
        out.append(noise["switched"])
    conf, rate = noise.get("confidence"), noise.get("reproduction_rate")
    parts = []
    if conf is not None:
        parts.append(f"confidence {conf:.3f}")
    if rate is not None:
        parts.append(
            f"reproduction rate {rate:.2f} ({noise.get('reproduction_counts')} runs "
            "with the culprit set)"
        )
    if parts:
        out.append("; ".join(parts))
    return out


__all__ = ["print_outcome", "register", "sureness_lines"]


def refuse_split_endpoints(good: Experiment, bad: Experiment) -> None:
    """A pair whose good or bad config splits a flag its roles must agree on, and that
    does not say to start it anyway, is refused before anything starts (exit 2): that
    endpoint would be `invalid` without a start, after good's start was spent for
    nothing, and no search can follow."""
    from orchestrator.config.deployment import refusal, starts_anyway

    start = starts_anyway(good, bad)
    for side, exp in (("good", good), ("bad", bad)):
        refused = refusal(exp, start=start)
        if refused is not None:
            raise ConfigError(
                f"the {side} config would never start: {refused.reason}",
                file=exp.source,
                key="mismatched_roles",
                hint="make the roles agree, or say `mismatched_roles: start` in either "
                "config to start such variants anyway and see what the split does",
            )
