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
    for path in write_reports(store, args.campaign):
        console().print(str(path), highlight=False)
    return 0
