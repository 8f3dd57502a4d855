"""`orchestrator lab up|down|status`: the local lab host for the demo and for trying the tool."""

from __future__ import annotations

import argparse

import yaml

from orchestrator.cli.output import console
from orchestrator.lab import hostctl


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "lab",
        help="start/stop the local lab host (a private sshd on 127.0.0.1:2222)",
        description=(
            "The lab host is this machine, reached through a private OpenSSH sshd on "
            "127.0.0.1:2222 with throwaway keys under .lab/ (the `lab` entry of "
            "hosts.example.yaml). Environment: ORCH_LAB_PORT, ORCH_LAB_DIR."
        ),
    )
    sub = parser.add_subparsers(dest="lab_command", metavar="ACTION")
    sub.required = True
    sub.add_parser("up", help="start the lab host (idempotent)").set_defaults(handler=_up)
    sub.add_parser("down", help="stop what `lab up` started").set_defaults(handler=_down)
    sub.add_parser("status", help="show what runs").set_defaults(handler=_status)


def _print_reach(st: hostctl.LabStatus) -> None:
    out = console()
    if st.transport == "ssh":
        out.print(f"  ssh {st.user or ''}{'@' if st.user else ''}{st.settings.address} "
                  f"-p {st.port} -i {st.identity_file} "
                  f"-o UserKnownHostsFile={st.known_hosts}", highlight=False)
    out.print("  hosts.yaml entry:", highlight=False)
    text = yaml.safe_dump({"lab": st.hosts_entry()}, sort_keys=False)
    for line in text.splitlines():
        out.print(f"    {line}", highlight=False, markup=False)


def _up(args: argparse.Namespace) -> int:
    settings = hostctl.LabSettings.from_env()
    res = hostctl.up(settings)
    st = res.status
    out = console()
    if not st.sshd_installed:
        out.print(
            "lab: OpenSSH's sshd is not installed, so the lab host uses the local transport "
            "(no SSH); install openssh-server to demo through real SSH.",
            highlight=False,
        )
        _print_reach(st)
        return 0
    where = f"{settings.address}:{st.port}"
    if res.started:
        out.print(f"lab: up: sshd pid {st.pid} on {where}", highlight=False)
    else:
        out.print(f"lab: already up: sshd pid {st.pid} on {where}", highlight=False)
    if res.python:
        out.print(f"  python3 over ssh: {res.python}", highlight=False)
    _print_reach(st)
    return 0


def _down(args: argparse.Namespace) -> int:
    settings = hostctl.LabSettings.from_env()
    res = hostctl.down(settings)
    out = console()
    for note in res.notes:
        out.print(f"lab: {note}", highlight=False)
    if res.stopped_pid is not None:
        out.print(f"lab: down: stopped sshd pid {res.stopped_pid}", highlight=False)
    else:
        out.print("lab: already down: nothing to stop", highlight=False)
    return 0


def _status(args: argparse.Namespace) -> int:
    settings = hostctl.LabSettings.from_env()
    st = hostctl.status(settings)
    out = console()
    if not st.sshd_installed:
        out.print("lab: sshd not installed; the lab host uses the local transport",
                  highlight=False)
    elif st.running:
        out.print(f"lab: up: sshd pid {st.pid} on {settings.address}:{st.port} "
                  f"(log {st.log_path})", highlight=False)
    else:
        stale = " (stale pid file)" if st.stale_pid_file else ""
        out.print(f"lab: down{stale}; start it with `orchestrator lab up`", highlight=False)
        return 0
    _print_reach(st)
    return 0
