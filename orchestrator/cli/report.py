"""`orchestrator report CAMPAIGN`: write the Markdown and HTML report of a campaign."""

from __future__ import annotations

import argparse

from orchestrator.cli import common
from orchestrator.cli.output import console
from orchestrator.report import write_reports


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a campaign's Markdown and HTML report")
    p.add_argument("campaign", help="campaign id (a unique prefix is enough)")
    common.add_results_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    store = common.store(args)
    camp = store.campaign(args.campaign)
    if camp.kind == "sweep":
        from orchestrator.sweep_report import write_sweep_reports

        paths = write_sweep_reports(store, camp.id)
    else:
        paths = write_reports(store, camp.id)
    for path in paths:
        console().print(str(path), highlight=False)
    return 0
