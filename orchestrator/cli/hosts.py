"""`orchestrator hosts check [H]`: can a campaign run on these hosts? With `--experiment`,
on every host of that config's deployment, and what of ours each role's unit shows."""

from __future__ import annotations

import argparse
import json

from rich.markup import escape
from rich.table import Table

from orchestrator.cli import common, deployment_hosts
from orchestrator.cli.deployment_hosts import RoleHost
from orchestrator.cli.output import console
from orchestrator.config.hosts import Host
from orchestrator.errors import OrchestratorError
from orchestrator.execution.checks import Check
from orchestrator.execution.hostops import check_host, service_check, survey, unit_check
from orchestrator.execution.slurm.check import deployment_checks
from orchestrator.execution.transport import Transport, connect


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hosts", help="check hosts")
    hs = p.add_subparsers(dest="hosts_command", metavar="SUBCOMMAND")
    c = hs.add_parser(
        "check",
        help="reachable, host key, sudo, service manager, unit, GPUs, "
        "and what `restore` would undo (leftovers of campaigns that are gone)",
    )
    c.add_argument(
        "host",
        nargs="?",
        help="a host or pool (default: all hosts); with --experiment, the host of the "
        "roles that name none",
    )
    c.add_argument("--unit", help="also check that this systemd unit is installed")
    c.add_argument(
        "--experiment",
        metavar="CONFIG",
        help="check every host of this experiment's deployment: each role's host, its "
        "unit, and our drop-ins and locks on that unit",
    )
    c.add_argument("--accept-new-host-key", action="store_true")
    c.add_argument("--json", action="store_true")
    common.add_hosts_option(c)
    c.set_defaults(handler=run)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def run(args: argparse.Namespace) -> int:
    inv = common.inventory(args)
    roles: dict[str, list[RoleHost]] = {}
    if args.experiment:
        roles, hosts = deployment_hosts.hosts_of(args)
    else:
        hosts = inv.resolve(args.host) if args.host else list(inv.hosts.values())
    results: dict[str, list[Check]] = {}
    for host in hosts:
        how = (
            deployment_hosts.restore_command(args, args.experiment, args.host)
            if args.experiment
            else common.restore_command(args, host.name)
        )
        try:
            with (
                connect(host, accept_new_host_key=args.accept_new_host_key)
                if not host.is_local
                else connect(host) as t
            ):
                results[host.name] = check_host(host, t, unit=args.unit, restore_command=how)
                results[host.name] += _role_checks(host, t, roles.get(host.name, []), how)
                if args.experiment and host.service_manager == "slurm" and roles.get(host.name):
                    exp = deployment_hosts.load(args.experiment)
                    results[host.name] += deployment_checks(host, t, exp)
        except OrchestratorError as exc:
            results[host.name] = [
                Check("reachable", False, common.with_hosts_file(args, exc), exc.hint)
            ]
    bad = any(c.ok is False for cs in results.values() for c in cs)
    if args.json:
        console().print_json(json.dumps({h: [c.__dict__ for c in cs] for h, cs in results.items()}))
        return 3 if bad else 0
    t = Table(title=f"hosts check ({escape(args.hosts_file)})", title_justify="left")
    for col in ("host", "check", "", "detail"):
        t.add_column(col)
    for h, cs in results.items():
        for c in cs:
            mark = "[green]ok[/]" if c.ok else "[red]FAIL[/]" if c.ok is False else "[dim]-[/]"
            detail = escape(c.detail) + (f"\n[yellow]{escape(c.hint)}[/]" if c.hint else "")
            t.add_row(h, c.name, mark, detail)
    console().print(t)
    return 3 if bad else 0


def _role_checks(host: Host, t: Transport, roles: list[RoleHost], how: str) -> list[Check]:
    """Per role on this host: its unit is installed, and what of ours that unit shows."""
    if not roles:
        return []
    if host.service_manager == "slurm":
        return [Check(r.label, None, "a Slurm job: the scheduler picks its node") for r in roles]
    s = survey(host, t)
    out: list[Check] = []
    for r in roles:
        if host.service_manager == "systemd" and r.unit:
            out.append(unit_check(t, r.unit, f"{r.label} unit"))
        out.append(service_check(s, r.service, r.label, how))
    return out
