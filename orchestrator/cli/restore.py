"""`orchestrator restore --host H`: undo what a dead orchestrator left on a host, never what
a live one holds, and read the host back."""

from __future__ import annotations

import argparse

from rich.markup import escape

from orchestrator.cli import common
from orchestrator.cli.output import console
from orchestrator.execution.hostops import restore_host
from orchestrator.execution.transport import connect


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "restore",
        help="remove our drop-ins, stop our servers and leave services as they were found",
    )
    p.add_argument("--host", required=True, help="host or pool")
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
    code = 0
    for host in common.hosts_for(args, args.host):
        t = (
            connect(host)
            if host.is_local
            else connect(host, accept_new_host_key=args.accept_new_host_key)
        )
        with t:
            for line in restore_host(host, t, break_lock=args.break_lock):
                console().print(f"{host.name}: {escape(line)}", highlight=False)
                if (
                    line.startswith("refused:")
                    or " kept: " in line
                    or ": NOT as found" in line
                    or line.endswith("could not be read back")
                ):
                    code = 1
    return code
