"""`orchestrator run CONFIG --host H` (one recorded run) and `orchestrator rerun RUN_ID`."""

from __future__ import annotations

import argparse
import json

from rich.markup import escape

from orchestrator.campaign import answers_check
from orchestrator.campaign.records import BisectSpec
from orchestrator.campaign.rerun import recorded_good, recorded_reference
from orchestrator.campaign.single import single_run, single_runs
from orchestrator.cli import common, detached
from orchestrator.cli.live import verdict_text
from orchestrator.cli.output import console
from orchestrator.config.experiment import Experiment
from orchestrator.config.hosts import Host
from orchestrator.config.loading import load_experiment
from orchestrator.diagnosis.verdicts import Signature, Verdict, relative
from orchestrator.errors import UsageError
from orchestrator.reports import deployment_view
from orchestrator.store.store import CampaignRow, RunRow, Store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run one experiment config on a host and judge it")
    p.add_argument("config", help="experiment YAML")
    p.add_argument("--host", required=True)
    _shared(p)
    detached.add_option(p)
    p.set_defaults(handler=run_one)

    r = sub.add_parser("rerun", help="run a recorded variant again, exactly as recorded")
    r.add_argument("run_id")
    r.add_argument("--host", help="another host (default: the recorded run's host)")
    r.add_argument(
        "--repeat",
        type=common.positive_int,
        default=1,
        metavar="N",
        help="start it N times and report how often it fails, with each start's signature",
    )
    _shared(r)
    r.set_defaults(handler=rerun)


def _shared(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true")
    p.add_argument("--accept-new-host-key", action="store_true")
    common.add_hosts_option(p)
    common.add_results_option(p)


def _print(
    row: RunRow, args: argparse.Namespace, extra: dict | None = None, store: Store | None = None
) -> None:
    """The run's verdict; of a deployment's run (`store` given), every role's host and
    which one failed first too."""
    dep = None
    if store is not None:
        dep = deployment_view.of_record(store.host_record(row.cached_from or row.id))
    if dep is not None:
        extra = (extra or {}) | {"deployment": dep.to_json()}
    if args.json:
        data = {
            "run": row.id,
            "host": row.host,
            "verdict": row.verdict.value,
            "signature": str(row.signature) if row.signature else None,
            "detail": row.detail,
            "duration": row.duration,
            "probe_metric": row.probe_metric,
            "log": row.log_path,
        }
        console().print_json(json.dumps(data | (extra or {})))
        return
    console().print(
        f"verdict: {verdict_text(row.verdict)}"
        + (f"  {escape(str(row.signature))}" if row.signature else "")
        + f"  (run {row.id}, {row.duration:.0f}s)",
        highlight=False,
    )
    if row.detail:
        console().print(f"detail: {escape(row.detail)}", highlight=False)
    if dep is not None:
        for line in deployment_view.role_lines(dep):
            console().print(f"  {escape(line)}", highlight=False)


def run_one(args: argparse.Namespace) -> int:
    if args.detach:
        return detached.detach(args)
    exp = load_experiment(args.config)
    hosts = common.hosts_for(args, args.host)
    if len(hosts) != 1:
        raise UsageError(f"'{args.host}' is a pool; `run` takes one host")
    common.deployment_setup(args, hosts, exp)
    store = common.store(args)
    view = common.live_view(args)
    row = common.run_single(
        lambda: single_run(
            store,
            exp,
            hosts[0],
            kind="run",
            command=common.command_line(),
            label=exp.name,
            listener=view,
            executor_factory=common.executor_factory(args),
        ),
        view,
        as_json=args.json,
        args=args,
    )
    if row is None:
        return 130
    _print(row, args, store=store)
    return _exit_code(row.verdict)


def _exit_code(verdict: Verdict) -> int:
    """3 when the host failed the run (nothing learnt); 2 when the server refused the
    config (`invalid`: a config error, as a usage error is); 0 when the run was judged."""
    if verdict is Verdict.INFRA:
        return 3
    if verdict is Verdict.INVALID:
        return 2
    return 0


def _judged_by(bar: str | None, good: tuple[float, str] | None, exp: Experiment) -> str:
    """Which bar and which good metric the rerun is judged by, in words ('' without a bar)."""
    if not bar:
        return ""
    cond = exp.probe.condition if exp.probe else None
    if cond is None or not cond.relative_to_good:
        return f"judged by the recorded bar {bar}"
    if good is None:
        return (
            f"the recorded bar {bar} has no recorded good metric to compare with: "
            "the probe's metric is not judged"
        )
    return (
        f"judged by the recorded bar {bar}, good = {good[0]:g} (run {good[1]}), "
        f"bar = {cond.number * good[0]:g}"
    )


def reproduction(rows: list[RunRow], target: Signature | None) -> dict:
    """How often the starts failed: judged starts (host trouble left out), failures, those
    with the target signature, and each signature's count."""
    judged = [r for r in rows if r.verdict is not Verdict.INFRA]
    failed = [r for r in judged if r.verdict not in (Verdict.PASS, Verdict.INVALID)]
    sigs: dict[str, int] = {}
    shown: dict[Signature, str] = {}  # one failure is counted once, as first met
    for r in failed:
        key = shown.setdefault(r.signature, str(r.signature)) if r.signature else r.verdict.value
        sigs[key] = sigs.get(key, 0) + 1
    return {
        "starts": len(rows),
        "judged": len(judged),
        "failed": len(failed),
        "target_failures": sum(1 for r in failed if target is not None and r.signature == target),
        "passed": sum(1 for r in judged if r.verdict is Verdict.PASS),
        "infra": len(rows) - len(judged),
        "rate": round(len(failed) / len(judged), 3) if judged else None,
        "signatures": dict(sorted(sigs.items(), key=lambda kv: -kv[1])),
    }


def _rerun_repeated(
    args: argparse.Namespace,
    store: Store,
    old: RunRow,
    camp: CampaignRow,
    exp: Experiment,
    host: Host,
    env_keys: frozenset[str],
    good: tuple[float, str] | None,
    judged: str,
    view: object,
    reference: RunRow | None = None,
) -> int:
    """`rerun ID --repeat N`: the recorded variant started N times, its reproduction rate."""
    rows = common.run_single(
        lambda: single_runs(
            store,
            exp,
            host,
            kind="rerun",
            command=common.command_line(),
            label=f"rerun of {old.id}: {old.label}",
            starts=args.repeat,
            target=camp.target,
            env_keys=env_keys,
            listener=view,
            executor_factory=common.executor_factory(args),
            spec_extra={
                "rerun_of": old.id,
                "good_metric": good[0] if good else None,
                "good_run": good[1] if good else None,
                "answers_reference": reference.id if reference else None,
            },
            good_metric=good[0] if good else None,
            reference=reference,
        ),
        view,
        as_json=args.json,
        args=args,
    )  # type: ignore[arg-type]
    if rows is None:
        return 130
    rep = reproduction(rows, camp.target)
    if args.json:
        console().print_json(
            json.dumps(
                {
                    "rerun_of": old.id,
                    "host": host.name,
                    **rep,
                    "target": str(camp.target) if camp.target else None,
                    "runs": [
                        {
                            "run": r.id,
                            "verdict": r.verdict.value,
                            "signature": str(r.signature) if r.signature else None,
                            "duration": r.duration,
                            "weights": r.weights,
                        }
                        for r in rows
                    ],
                    "judged_by": judged,
                }
            )
        )
    else:
        c = console()
        if judged:
            c.print(judged, highlight=False)
        for i, r in enumerate(rows, 1):
            c.print(
                f"start {i}: {verdict_text(r.verdict)}"
                + (f"  {escape(str(r.signature))}" if r.signature else "")
                + f"  (run {r.id}, {r.duration:.0f}s)",
                highlight=False,
            )
        line = f"failed {rep['failed']} of {rep['judged']} starts"
        if camp.target is not None:
            line += f" ({rep['target_failures']} with the target failure)"
        if rep["infra"]:
            line += f"; {rep['infra']} lost to host trouble, not counted"
        c.print(line, highlight=False)
        for sig, n in rep["signatures"].items():
            c.print(f"  {n} x {escape(sig)}", highlight=False)
    if not rep["judged"]:
        return 3
    return 2 if all(r.verdict is Verdict.INVALID for r in rows) else 0


def rerun(args: argparse.Namespace) -> int:
    store = common.store(args, create=False)  # a recorded run: its results are there
    old = store.run(args.run_id)
    camp = store.campaign(old.campaign)
    # exactly as recorded (YAML files may have changed since); secrets from the environment
    exp = old.experiment(resolve_secrets=True)
    if exp.answers is not None and exp.answers.judged():
        exp.answers.load()  # the prompts its reference answered, or refused before a start
    if not args.host:  # the recorded host: as its campaign's hosts file names it
        common.recorded_hosts(args, camp)
    recorded = old.host
    if exp.roles:  # a deployment's run is named by its failing role's host: its campaign's
        recorded = ((camp.spec or {}).get("hosts") or [old.host])[0]
    host = common.inventory(args).host(args.host or recorded)
    common.deployment_setup(args, [host], exp)
    env_keys: frozenset[str] = frozenset()
    spec = BisectSpec.from_dict(camp.spec)  # a bisection's two configs (none for other kinds)
    for side in (spec.good, spec.bad):
        env_keys |= frozenset((side.get("service") or {}).get("env") or {})
    # judged as the recorded run was: its recorded bar, against its campaign's good metric
    good = recorded_good(store, old, camp)
    # and its answers against the answers they were judged against
    reference = recorded_reference(store, old, camp)
    bar = exp.probe.pass_if if exp.probe else None
    judged = _judged_by(bar, good, exp)
    said = answers_check.judged_against(exp, reference, old.id)
    judged = "; ".join(t for t in (judged, said) if t)
    view = common.live_view(args)
    if args.repeat > 1:
        return _rerun_repeated(
            args, store, old, camp, exp, host, env_keys, good, judged, view, reference
        )
    row = common.run_single(
        lambda: single_run(
            store,
            exp,
            host,
            kind="rerun",
            command=common.command_line(),
            label=f"rerun of {old.id}: {old.label}",
            target=camp.target,
            env_keys=env_keys,
            listener=view,
            executor_factory=common.executor_factory(args),
            spec_extra={
                "rerun_of": old.id,
                "good_metric": good[0] if good else None,
                "good_run": good[1] if good else None,
                "answers_reference": reference.id if reference else None,
            },
            good_metric=good[0] if good else None,
            reference=reference,
        ),
        view,
        as_json=args.json,
        args=args,
    )
    if row is None:
        return 130
    old_v = relative(old.verdict, old.signature, camp.target)
    # of a deployment, where it failed first is part of the failure (one signature from
    # another rank is another story: a crash there, or a hang it caused)
    old_dep = deployment_view.of_record(store.host_record(old.cached_from or old.id))
    new_dep = deployment_view.of_record(store.host_record(row.cached_from or row.id))
    old_first = old_dep.first_failure if old_dep else None
    new_first = new_dep.first_failure if new_dep else None
    same = (
        row.verdict is old_v
        and row.signature == old.signature
        and (old_dep is None or new_dep is None or old_dep.first_role == new_dep.first_role)
    )
    if args.json:
        _print(
            row,
            args,
            {
                "rerun_of": old.id,
                "old_verdict": old_v.value,
                "old_signature": str(old.signature) if old.signature else None,
                "same": same,
                "old_first_failure": old_first,
                "bar": bar,
                "good_metric": good[0] if good else None,
                "good_run": good[1] if good else None,
                "judged_by": judged,
            },
            store,
        )
        return _exit_code(row.verdict)
    c = console()
    if judged:
        c.print(judged, highlight=False)
    c.print(
        f"recorded run {old.id} on {old.host}: {verdict_text(old_v)}"
        + (f"  {escape(str(old.signature))}" if old.signature else "")
        + (f"  metric {old.probe_metric:g}" if old.probe_metric is not None else "")
        + (f"  failed first: {escape(old_first)}" if old_first else ""),
        highlight=False,
    )
    c.print(
        f"rerun    {row.id} on {row.host}: {verdict_text(row.verdict)}"
        + (f"  {escape(str(row.signature))}" if row.signature else "")
        + (f"  metric {row.probe_metric:g}" if row.probe_metric is not None else "")
        + (f"  failed first: {escape(new_first)}" if new_first else ""),
        highlight=False,
    )
    if new_dep is not None:
        if row.detail:
            c.print(f"detail: {escape(row.detail)}", highlight=False)
        for line in deployment_view.role_lines(new_dep):
            c.print(f"  {escape(line)}", highlight=False)
    c.print(
        "same verdict and signature" if same else "[yellow]differs from the recorded run[/]",
        highlight=False,
    )
    return _exit_code(row.verdict)
