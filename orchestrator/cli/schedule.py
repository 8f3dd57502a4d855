"""`orchestrator schedule add|list|remove`: run sweeps (or any command) on a calendar.

`add` checks the scheduled command first, as the job will run it (same working directory):
a command orchestrator does not accept, or a sweep/experiment file that does not load, or a
host that is not in the hosts file, is refused now rather than failing at 01:30.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from orchestrator.campaign import schedule as sched
from orchestrator.cli import common
from orchestrator.cli.notifying import FILE_ENV, url_from_file
from orchestrator.cli.output import console, err_console
from orchestrator.errors import OrchestratorError, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schedule", help="run a command (e.g. a sweep) on a calendar")
    ss = p.add_subparsers(dest="schedule_command", metavar="SUBCOMMAND")
    a = ss.add_parser(
        "add",
        help="install a systemd timer (or, without systemd, a crontab line)",
        usage="orchestrator schedule add NAME --at CALENDAR -- COMMAND [ARGS...]",
        description="Run an orchestrator command on a calendar: a systemd timer "
        "on this machine, or a line in your crontab where systemd is not running. "
        "The command is checked now; the job runs it in the current directory "
        "with the same --results, ORCH_HOSTS and PYTHONPATH.",
    )
    a.add_argument("name")
    a.add_argument(
        "--at",
        required=True,
        metavar="CALENDAR",
        help="systemd calendar, e.g. 'Mon..Fri 01:30' (crontab: a time of day with "
        "optional weekdays, or 'daily')",
    )
    a.add_argument(
        "--notify-file",
        metavar="FILE",
        help="a private file (chmod 600) holding the URL the job notifies; the "
        "command itself never carries --notify (a schedule's command is stored "
        "in the clear)",
    )
    common.add_results_option(a)
    a.set_defaults(handler=add, command_words=[])
    li = ss.add_parser("list", help="installed schedules")
    li.add_argument("--json", action="store_true")
    li.set_defaults(handler=list_)
    r = ss.add_parser("remove", help="disable and delete a schedule")
    r.add_argument("name")
    r.set_defaults(handler=remove)
    p.set_defaults(handler=lambda args: (p.print_help(), 2)[1])


def check_command(words: list[str]) -> None:
    """Parse the scheduled command with this program's own parser and load what it names,
    from the current directory (the job's working directory)."""
    from orchestrator.cli import build_parser

    if not words:
        sched.job_command(words)  # the error with the example
    argv = list(words)
    if "--" in argv:
        argv = argv[: argv.index("--")]
    said = io.StringIO()
    shown = f"orchestrator {shlex.join(words)}"
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            ns = build_parser().parse_args(argv)
    except SystemExit:
        errors = [ln for ln in said.getvalue().splitlines() if "error:" in ln]
        why = errors[-1].split("error:", 1)[1].strip() if errors else "it only prints help"
        raise UsageError(
            f"the scheduled command `{_masked(shown)}` would not run: {why}",
            hint="`orchestrator --help` lists the commands",
        ) from None
    if not getattr(ns, "handler", None) or getattr(ns, "command", None) == "schedule":
        raise UsageError(
            f"the scheduled command `{shown}` does nothing on its own",
            hint="schedule e.g. `sweep nightly.yaml`",
        )
    if getattr(ns, "notify", None):
        raise UsageError(
            "a scheduled command cannot carry --notify: the timer unit, the "
            "crontab line and `schedule list` hold it in the clear, and a "
            "webhook's URL is its password",
            hint="put the URL in a file (chmod 600) and pass --notify-file FILE "
            "to `schedule add`, or use notify: in the sweep or hosts file",
        )
    try:
        _load_what_it_names(ns)
    except OrchestratorError as exc:
        raise UsageError(
            f"the scheduled command `{shown}` would fail: {exc}", hint=exc.hint
        ) from None


def _load_what_it_names(ns: argparse.Namespace) -> None:
    from orchestrator.config.loading import load_experiment

    if getattr(ns, "resume", None):
        return  # a campaign id: the results directory may not exist yet
    if ns.command == "sweep":
        from orchestrator.cli.sweep import sweep_and_hosts

        sweep_and_hosts(ns, common.inventory(ns))
    elif ns.command == "bisect":
        for path in (ns.good, ns.bad):
            if path:
                load_experiment(path)
        if ns.host:
            common.inventory(ns).resolve(ns.host)
    elif ns.command == "run":
        load_experiment(ns.config)
        common.inventory(ns).resolve(ns.host)


def add(args: argparse.Namespace) -> int:
    words = list(args.command_words)
    sched.check_name(args.name)
    sched.validate_calendar(args.at)
    check_command(words)
    env = {}
    if args.notify_file:
        notify_file = Path(args.notify_file).expanduser().resolve()
        url_from_file(str(notify_file), where="--notify-file")  # refused now, not at 01:30
        env[FILE_ENV] = str(notify_file)  # a path: the URL stays in the file
    info = sched.add(
        args.name, args.at, words, workdir=Path.cwd(), results=Path(args.results), env=env
    )
    c = console()
    if "timer" in info:
        c.print(
            f"installed {info['timer']} in {info['unit_dir']} ({info['calendar']}); "
            f"output goes to {info['log']}",
            highlight=False,
        )
    else:
        c.print(
            f"systemd is not running here: added to {info['where']} "
            f"({info['calendar']}); output goes to {info['log']}:",
            highlight=False,
        )
        c.out(info["cron"], highlight=False)
        if not info.get("cron_running", True):
            err_console().print(
                "[yellow]warning:[/] no cron daemon is running here: the line will not run "
                "until one is started (Debian: `service cron start`, or run `cron` as root); "
                "on a machine where systemd runs, `schedule add` installs a systemd timer "
                "instead",
                highlight=False,
            )
    return 0


#: `--notify URL` / `--notify=URL` in a command a schedule stored (before it was refused)
_NOTIFY_WORD = re.compile(r"(--notify(?:=|\s+))('[^']*'|\S+)")


def _masked(command: str) -> str:
    return _NOTIFY_WORD.sub(lambda m: m[1] + "[hidden]", command)


def list_(args: argparse.Namespace) -> int:
    raw = sched.listing()
    rows = [{k: _masked(v) if isinstance(v, str) else v for k, v in r.items()} for r in raw]
    if rows != raw:
        err_console().print(
            "[yellow]note:[/] a schedule carries --notify on its command line "
            "(stored in the clear): remove it and add it again with "
            "--notify-file",
            highlight=False,
        )
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
