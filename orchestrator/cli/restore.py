"""`orchestrator restore --host H`: undo what a dead orchestrator left on a host, never what
a live one holds, and read the host back. With `--experiment`, on every host of that
config's deployment, each role's unit read back by name."""

from __future__ import annotations

import argparse

from rich.markup import escape

from orchestrator.cli import common, deployment_hosts
from orchestrator.cli.deployment_hosts import RoleHost
from orchestrator.cli.output import console
from orchestrator.config.hosts import Host
from orchestrator.errors import UsageError
from orchestrator.execution.hostops import restore_host, service_left
from orchestrator.execution.transport import Transport, connect


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "restore",
        help="remove our drop-ins, stop our servers and leave services as they were found",
    )
    p.add_argument(
        "--host",
        help="host or pool; with --experiment, the host of the roles that name none",
    )
    p.add_argument(
        "--experiment",
        metavar="CONFIG",
        help="restore every host of this experiment's deployment and read each role's unit back",
    )
    p.add_argument(
        "--break-lock",
        action="store_true",
        help="also restore services whose lock holder cannot be told alive or "
        "dead, and remove their locks (a live holder is always refused)",
    )
    p.add_argument("--accept-new-host-key", action="store_true")
    common.add_hosts_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every host was read back as found, 1 when something was refused, kept
    or is still not as found."""
    if not args.host and not args.experiment:
        raise UsageError(
            "restore needs --host H or --experiment CONFIG",
            hint="--host names a host or pool; --experiment restores every host of a deployment",
        )
    roles: dict[str, list[RoleHost]] = {}
    if args.experiment:
        roles, hosts = deployment_hosts.hosts_of(args)
    else:
        hosts = common.hosts_for(args, args.host)
    code = 0
    for host in hosts:
        t = (
            connect(host)
            if host.is_local
            else connect(host, accept_new_host_key=args.accept_new_host_key)
        )
        with t:
            lines = restore_host(host, t, break_lock=args.break_lock)
            lines += _read_back_roles(host, t, roles.get(host.name, []))
            for line in lines:
                console().print(f"{host.name}: {escape(line)}", highlight=False)
                if (
                    line.startswith("refused:")
                    or " kept: " in line
                    or ": NOT as found" in line
                    or line.endswith("could not be read back")
                ):
                    code = 1
    return code


def _read_back_roles(host: Host, t: Transport, roles: list[RoleHost]) -> list[str]:
    """Each role's unit on this host read back by name, after the restore."""
    if host.service_manager == "slurm":
        return []
    out = []
    for r in roles:
        left = service_left(host, t, r.service)
        if left is None:
            out.append(f"{r.label} ({r.service}): could not be read back")
        elif left:
            out.append(f"{r.label} ({r.service}): NOT as found: " + "; ".join(left))
        else:
            out.append(f"{r.label} ({r.service}): read back: as found")
    return out
