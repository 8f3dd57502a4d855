"""`orchestrator restore --host H`: undo what a killed orchestrator left on a host."""

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
    p.add_argument("--break-lock", action="store_true",
                   help="also remove locks left by a campaign that is dead")  # fmt: skip
    p.add_argument("--accept-new-host-key", action="store_true")
    common.add_hosts_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    for host in common.hosts_for(args, args.host):
        t = connect(host) if host.is_local else connect(
            host, accept_new_host_key=args.accept_new_host_key)  # fmt: skip
        with t:
            for line in restore_host(host, t, break_lock=args.break_lock):
                console().print(f"{host.name}: {escape(line)}", highlight=False)
    return 0
