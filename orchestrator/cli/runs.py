"""`orchestrator runs` (a table of runs or campaigns) and `orchestrator show RUN_ID`."""

from __future__ import annotations

import argparse
import difflib
import json
import shlex
import time

from rich.markup import escape
from rich.table import Table

from orchestrator.cli import common
from orchestrator.cli.detached import status_of
from orchestrator.cli.live import verdict_text
from orchestrator.cli.output import console
from orchestrator.config.experiment import Experiment, option_word
from orchestrator.diagnosis.logtail import keep_what_matters
from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.reports import answers_view, deployment_view
from orchestrator.reports.notify import culprits_of
from orchestrator.store.store import RunRow, Store


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runs", help="list recorded runs (or campaigns)")
    p.add_argument("--campaign", metavar="ID", help="only this campaign's runs")
    p.add_argument("--campaigns", action="store_true", help="list campaigns instead of runs")
    p.add_argument(
        "--follow",
        metavar="ID",
        help="show a campaign's progress until it ends, and exit with its exit "
        "code (Ctrl-C stops following; the campaign keeps running)",
    )
    p.add_argument(
        "--max-wait",
        metavar="DURATION",
        default="24h",
        help="with --follow: stop following after this long (default 24h)",
    )
    p.add_argument("--limit", type=common.positive_int, default=50)
    p.add_argument("--json", action="store_true")
    common.add_results_option(p)
    p.set_defaults(handler=run_list)

    s = sub.add_parser("show", help="one run: config diff against good, verdict, signature, log")
    s.add_argument("run_id")
    s.add_argument(
        "--lines",
        type=common.positive_int,
        default=40,
        help="log tail lines to show (1 or more; default 40)",
    )
    s.add_argument(
        "--role",
        action="append",
        metavar="ROLE",
        help="of a deployment's run: also show this role's own log tail (repeatable; "
        "`all`: every role's)",
    )
    s.add_argument("--json", action="store_true")
    common.add_results_option(s)
    s.set_defaults(handler=show)


def _when(ts: float) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(ts))


def run_list(args: argparse.Namespace) -> int:
    if args.follow:
        from orchestrator.cli import detached
        from orchestrator.config.schema import parse_duration

        detached.check_follow_args(args)
        try:
            max_wait = parse_duration(args.max_wait)
        except ValueError as exc:
            raise UsageError(f"--max-wait: {exc}") from None
        return detached.follow(args, max_wait)
    store = common.store(args, readonly=True)
    c = console()
    if args.campaigns:
        camps = store.campaigns(args.limit)
        if args.json:
            c.print_json(
                json.dumps(
                    [
                        {
                            "id": x.id,
                            "kind": x.kind,
                            "status": status_of(x),
                            "created": x.created,
                            "target": str(x.target or ""),
                        }
                        for x in camps
                    ]
                )
            )
            return 0
        t = Table(title="campaigns", title_justify="left")
        for col in ("id", "kind", "started", "status", "runs", "target / answer"):
            t.add_column(col)
        for x in camps:
            culprits = "; ".join(culprits_of(x.answer))
            t.add_row(
                x.id,
                x.kind,
                _when(x.created),
                status_of(x),
                str(len(store.runs(x.id))),
                escape(culprits or str(x.target or "")),
            )
        c.print(t)
        return 0
    cid = store.campaign(args.campaign).id if args.campaign is not None else None
    runs = store.runs(cid, limit=args.limit)
    deps = deployment_view.of_runs(runs, store.host_record)
    if args.json:
        c.print_json(
            json.dumps(
                [
                    {
                        "id": r.id,
                        "campaign": r.campaign,
                        "label": r.label,
                        "host": r.host,
                        "verdict": r.verdict.value,
                        "signature": str(r.signature or ""),
                        "duration": r.duration,
                        "started": r.started,
                        "cached_from": r.cached_from,
                        "weights": r.weights,
                        "deployment": deps[r.id].to_json() if r.id in deps else None,
                    }
                    for r in runs
                ]
            )
        )
        return 0
    t = Table(title=f"runs of campaign {cid}" if cid else "recent runs", title_justify="left")
    for col in ("run", "when", "host", "variant", "verdict", "signature", "time"):
        t.add_column(col)
    for r in runs:
        dep = deps.get(r.id)
        t.add_row(
            r.id,
            _when(r.started),
            escape(dep.first_failure or dep.hosts()) if dep else r.host,
            escape(r.label),
            verdict_text(r.verdict) + (" (cached)" if r.cached_from else ""),
            escape(str(r.signature or "")),
            f"{r.duration:.0f}s",
        )
    c.print(t)
    return 0


def show(args: argparse.Namespace) -> int:
    store = common.store(args, readonly=True)
    r = store.run(args.run_id)
    camp = store.campaign(r.campaign)
    good = camp.spec.get("good")
    exp = r.experiment()
    env = store.environment(r.env_digest)
    # the start that repaired this one, when it died of a resource and ran again
    again = next(
        (x for x in store.runs(r.campaign) if x.repair and x.repair.get("after") == r.id), None
    )
    dep = deployment_view.of_record(store.host_record(r.cached_from or r.id))
    asked = _asked_roles(args, dep, r.id)
    c = console()
    if args.json:
        c.print_json(
            json.dumps(
                {
                    "id": r.id,
                    "campaign": r.campaign,
                    "label": r.label,
                    "host": r.host,
                    "verdict": r.verdict.value,
                    "signature": str(r.signature or ""),
                    "argv": r.argv,
                    "env": r.env,
                    "detail": r.detail,
                    "phase_times": r.phase_times,
                    "probe_metric": r.probe_metric,
                    "rendered": r.rendered,
                    "log_path": r.log_path,
                    "cached_from": r.cached_from,
                    "weights": r.weights,
                    "on_host": store.host_record(r.id),
                    "environment": env.to_dict() if env else None,
                    "repair": r.repair,
                    "repaired_by": again.id if again else None,
                    "answers": r.answers,
                    "deployment": _deployment_json(dep, asked),
                }
            )
        )
        return 0
    where = escape(dep.hosts()) if dep is not None else r.host
    c.print(
        f"run [bold]{r.id}[/] of campaign {r.campaign} on {where}, "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.started))}, "
        f"{r.duration:.1f}s",
        highlight=False,
    )
    weights = ", dummy weights" if r.weights == "dummy" else ""
    c.print(f"variant: {escape(r.label)}  ({r.purpose}{weights})", highlight=False)
    c.print(
        f"verdict: {verdict_text(r.verdict)}"
        + (f"  signature: {escape(str(r.signature))}" if r.signature else ""),
        highlight=False,
    )
    if r.detail:
        c.print(f"detail: {escape(r.detail)}", highlight=False)
    if r.cached_from:
        c.print(f"verdict reused from run {r.cached_from}", highlight=False)
    if r.repair:
        from orchestrator.planner.repair import Applied

        a = Applied.from_dict(r.repair)
        c.print(
            f"repair: {escape(a.describe())} (step {a.step}), after run {a.after} "
            f"failed on a resource: {escape(a.failure)}",
            highlight=False,
        )
    if again is not None and again.repair:
        from orchestrator.planner.repair import Applied

        c.print(
            f"started again with {escape(Applied.from_dict(again.repair).describe())}: "
            f"run {again.id} ({again.verdict.value})",
            highlight=False,
        )
    if r.phase_times:
        c.print(
            "phases: " + ", ".join(f"{k} at {v:.1f}s" for k, v in r.phase_times.items()),
            highlight=False,
        )
    if r.probe_metric is not None:
        c.print(f"probe metric: {r.probe_metric:g}", highlight=False)
    if env is not None:
        facts = "; ".join(f"{k}: {v}" for k, v in env.rows())
        c.print(f"environment on {r.host}: {escape(facts)}", highlight=False)
    else:
        c.print("environment: not recorded", highlight=False)
    if good:
        base = _lines(Experiment.from_dict(good))
        diff = list(difflib.unified_diff(base, _lines(exp), "good", r.id, lineterm="", n=0))
        c.print("config against good:" if diff else "config: identical to good", highlight=False)
        for line in diff[2:]:
            color = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
            c.print(f"  [{color}]{escape(line)}[/]", highlight=False)
    if dep is None:
        c.print(f"command: {escape(exp.command_line())}", highlight=False)
    else:
        _roles(dep, exp)
    _on_host(store.host_record(r.id), r.rendered)
    # the last lines, and the error above them (a failed server's shutdown noise can
    # bury it: vLLM's shutdown, triton's leak warnings)
    text = r.log_tail()
    if r.verdict.value != "pass":
        text = keep_what_matters(text, args.lines, budget=max(2 * args.lines, 60))
    tail = text.splitlines()[-args.lines :] if r.verdict.value == "pass" else text.splitlines()
    _probe_record(store.host_record(r.id))
    _answers(store, r)
    if tail:
        whose = f" of {dep.first_role}, which failed first" if dep and dep.first_role else ""
        c.print(f"log tail{whose} ({r.log_path}):", highlight=False)
        c.out("\n".join(tail), highlight=False)
    for role in asked:
        lines = role.log_tail.splitlines()[-args.lines :]
        c.print(f"log tail of {escape(role.where())}:", highlight=False)
        if lines:
            c.out("\n".join(lines), highlight=False)
        else:
            c.print("  (nothing recorded)", highlight=False)
    return 0


def _asked_roles(
    args: argparse.Namespace, dep: deployment_view.DeploymentRun | None, run_id: str
) -> list[deployment_view.RoleRun]:
    """The roles whose own log tail `--role` asks for (`all`: every role)."""
    names = list(getattr(args, "role", None) or [])
    if not names:
        return []
    if dep is None:
        raise UsageError(
            f"--role: run {run_id} is no deployment's run: it ran one unit, whose log "
            "tail `show` prints without --role"
        )
    if "all" in names:
        return list(dep.roles)
    out = []
    for name in names:
        role = dep.role(name)
        if role is None:
            raise UsageError(
                f"--role {name}: run {run_id} has no such role",
                hint="its roles: " + ", ".join(r.role for r in dep.roles),
            )
        out.append(role)
    return out


def _deployment_json(
    dep: deployment_view.DeploymentRun | None, asked: list[deployment_view.RoleRun]
) -> dict[str, object] | None:
    if dep is None:
        return None
    out = dep.to_json()
    wanted = {r.role for r in asked}
    for role in out["roles"]:
        if role["role"] in wanted:
            role["log_tail"] = dep.role(role["role"]).log_tail  # type: ignore[union-attr]
    return out


def _roles(dep: deployment_view.DeploymentRun, exp: Experiment) -> None:
    """A deployment's roles in start order: where each ran, its verdict and signature and
    its command; then which role failed first, and what the others did."""
    c = console()
    c.print("roles, in start order:", highlight=False)
    for role, line in zip(dep.roles, deployment_view.role_lines(dep), strict=True):
        c.print(f"  {escape(line)}", highlight=False)
        try:
            command = (
                shlex.join(role.argv) if role.argv else exp.role_launch(role.role).command_line()
            )
        except KeyError:  # a role the config no longer names
            continue
        c.print(f"    command: {escape(command)}", highlight=False, soft_wrap=True)
    if dep.first_failure:
        c.print(f"failed first: {escape(dep.describe or dep.first_failure)}", highlight=False)


def _answers(store: Store, r: RunRow) -> None:
    """What the server answered, beside good's answers where they differ."""
    if not r.answers:
        return
    ref_id = (r.answers.get("judged") or {}).get("reference_run")
    reference = None
    if ref_id:
        try:
            reference = store.run(str(ref_id)).answers
        except OrchestratorError:
            reference = None
    c = console()
    for line in answers_view.lines(r.answers, reference):
        c.print(escape(line), highlight=False, soft_wrap=True)


def _probe_record(rec: dict[str, object] | None) -> None:
    """The probe of this run: its command, exit status and the end of its output."""
    probe = (rec or {}).get("probe")
    if not isinstance(probe, dict):
        return
    c = console()
    alive = "alive" if probe.get("server_alive") else "DEAD after it"
    c.print(f"probe: {escape(str(probe.get('command')))}", highlight=False, soft_wrap=True)
    c.print(
        f"  exit status {probe.get('exit_code')}; metric {probe.get('metric')}; bar "
        f"{escape(str(probe.get('bar') or '-'))}: {probe.get('passed')}; server {alive}",
        highlight=False,
    )
    values = probe.get("values")
    if isinstance(values, list) and values:
        warm = int(probe.get("warmup") or 0)
        each = ", ".join(
            f"{v:g}" + (" (warm-up)" if i < warm else "") for i, v in enumerate(values)
        )
        c.print(f"  each run of this start: {each}; metric = their median", highlight=False)
    out = str(probe.get("output") or "")
    if out.strip():
        c.print("  its output (the lines that matter):", highlight=False)
        for line in out.splitlines():
            c.print(f"    {escape(line)}", highlight=False)


def _on_host(rec: dict[str, object] | None, rendered: str | None) -> None:
    """What the tool did on the host for this run: the drop-in, what systemd read back,
    the invocation and the command that shows its whole journal there."""
    if rec and rec.get("manager") == "deployment" and isinstance(rec.get("slurm"), dict):
        rec = rec["slurm"]  # a deployment's node ranks as one job: where that job ran
    if rec and rec.get("manager") == "slurm":
        _on_cluster(rec)
        return
    if not rec or rec.get("manager") != "systemd":
        return
    c = console()
    c.print(
        f"on the host ({escape(str(rec.get('host') or '?'))}), unit "
        f"{escape(str(rec.get('unit')))}:",
        highlight=False,
    )
    c.print(
        f"  drop-in written: {escape(str(rec.get('dropin_path')))} "
        "(removed again when the campaign ended)",
        highlight=False,
    )
    for line in (rendered or "").splitlines():
        c.print(f"    {escape(line)}", highlight=False)
    argv = rec.get("exec_start")
    if isinstance(argv, list):
        path = rec.get("exec_path")
        binary = f" (runs {path})" if path and path != (argv[:1] or [None])[0] else ""
        c.print(
            f"  ExecStart read back from systemd{escape(binary)}: "
            f"{escape(shlex.join(map(str, argv)))}",
            highlight=False,
        )
    c.print(
        f"  InvocationID: {escape(str(rec.get('invocation') or '(not started)'))}", highlight=False
    )
    journal = str(rec.get("journal_command") or "")
    ssh = rec.get("ssh")
    full = f"{ssh} {shlex.quote(journal)}" if ssh else journal
    c.print(f"  full log on the host: {escape(full)}", highlight=False, soft_wrap=True)


def _on_cluster(rec: dict[str, object]) -> None:
    """A Slurm run: the job, where and how long it waited, and how it was submitted."""
    c = console()
    c.print(
        f"on the cluster ({escape(str(rec.get('host') or '?'))}): job "
        f"{escape(str(rec.get('job')))} on node{'s' if ',' in str(rec.get('node')) else ''} "
        f"{escape(str(rec.get('node') or '?'))}, "
        f"ended {escape(str(rec.get('state') or '?'))}"
        + (f" ({escape(str(rec['reason']))})" if rec.get("reason") else "")
        + f", {float(rec.get('pending_s') or 0):.1f}s pending",
        highlight=False,
    )  # type: ignore[arg-type]
    c.print(
        f"  submitted: {escape(str(rec.get('sbatch')))} job.sh", highlight=False, soft_wrap=True
    )
    c.print(f"  files: {escape(str(rec.get('dir')))} (the newest runs are kept)", highlight=False)


def _lines(exp: Experiment) -> list[str]:
    out = [f"exec: {' '.join(exp.exec)}"]
    out += [f"{option_word(k)} {v if v is not True else ''}".rstrip() for k, v in exp.flags]
    out += [f"env {k}={v}" for k, v in exp.env]
    out += [f"env -u {k}" for k in exp.unset]
    for role in exp.roles:  # a role's own flags and variables, named with the role
        for k, v in role.flags:
            value = "(removed)" if v is None else "" if v is True else v
            out.append(f"{role.name}: {option_word(k)} {value}".rstrip())
        out += [
            f"{role.name}: env {k}={v}" if v is not None else f"{role.name}: env -u {k}"
            for k, v in role.env
        ]
    return out
