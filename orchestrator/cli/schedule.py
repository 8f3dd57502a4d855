"""`orchestrator schedule add|list|remove`: run sweeps (or any command) on a calendar."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from orchestrator import schedule as sched
from orchestrator.cli import common
from orchestrator.cli.output import console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schedule", help="run a command (e.g. a sweep) on a calendar")
    ss = p.add_subparsers(dest="schedule_command", metavar="SUBCOMMAND")
    a = ss.add_parser("add", help="install a systemd timer (or print the crontab line)",
                      usage="orchestrator schedule add NAME --at CALENDAR -- COMMAND [ARGS...]")
    a.add_argument("name")
    a.add_argument("--at", required=True, metavar="CALENDAR",
                   help="systemd calendar, e.g. 'Mon..Fri 01:30'")  # fmt: skip
    common.add_results_option(a)
    a.set_defaults(handler=add, command_words=[])
    li = ss.add_parser("list", help="installed schedules")
    li.add_argument("--json", action="store_true")
    li.set_defaults(handler=list_)
    r = ss.add_parser("remove", help="disable and delete a schedule")
    r.add_argument("name")
    r.set_defaults(handler=remove)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def add(args: argparse.Namespace) -> int:
    words = list(args.command_words)
    info = sched.add(args.name, args.at, words, workdir=Path.cwd(), results=Path(args.results))
    c = console()
    if info["installed"]:
        c.print(f"installed {info['timer']} in {info['unit_dir']} ({info['calendar']}); "
                f"output goes to {info['log']}", highlight=False)  # fmt: skip
    else:
        c.print("systemd is not running here; add this line to your crontab (crontab -e):",
                highlight=False)  # fmt: skip
        c.out(info["cron"] or "(this calendar has no simple crontab form; use systemd)")
    return 0


def list_(args: argparse.Namespace) -> int:
    rows = sched.listing()
    if args.json:
        console().print_json(json.dumps(rows))
        return 0
    t = Table(title="schedules", title_justify="left")
    for col in ("name", "at", "next", "command"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], escape(r["at"]), escape(r["next"]), escape(r["command"]))
    console().print(t)
    return 0


def remove(args: argparse.Namespace) -> int:
    for line in sched.remove(args.name):
        console().print(line, highlight=False)
    return 0
