"""`orchestrator report CAMPAIGN`: write the Markdown and HTML report of a campaign, or
(`--issue`) print a bug report ready to paste into an SGLang or vLLM GitHub issue."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from orchestrator.cli import common
from orchestrator.cli.output import console
from orchestrator.errors import OrchestratorError
from orchestrator.reports.report import write_reports


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write a campaign's Markdown and HTML report")
    p.add_argument("campaign", help="campaign id (a unique prefix is enough)")
    p.add_argument(
        "--issue",
        action="store_true",
        help="print a bug report for an upstream GitHub issue (Markdown) instead",
    )
    common.add_results_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # --issue only reads; the reports are written beside a campaign that is recorded
    store = common.store(args, readonly=args.issue, create=False)
    if args.issue:
        from orchestrator.reports.issue_report import issue_markdown, nothing_to_report

        camp = store.campaign(args.campaign)
        why = nothing_to_report(camp, store.runs(camp.id))
        if why is not None:
            raise OrchestratorError(
                f"nothing to report upstream: {why}",
                hint=f"`orchestrator runs --campaign {camp.id}` shows what "
                "ran; `orchestrator report ID` writes its reports",
            )
        sources = [str(camp.spec.get(k) or "") for k in ("good_source", "bad_source", "sweep")]
        local = [
            str(store.root.resolve()),
            str(store.root),
            os.getcwd(),
            str(Path.home()),
            *(str(Path(s).resolve().parent) for s in sources if s),
            *sources,
        ]
        text = issue_markdown(
            camp,
            store.runs(camp.id),
            log_of=lambda r: r.log_tail(),
            env_of=lambda r: store.environment(r.env_digest),
            local_paths=local,
            record_of=store.host_record,
        )
        console().out(text, highlight=False, end="")
        return 0
    camp = store.campaign(args.campaign)
    if camp.kind == "sweep":
        from orchestrator.reports.sweep_report import write_sweep_reports

        paths = write_sweep_reports(store, camp.id)
    else:
        paths = write_reports(store, camp.id)
    for path in paths:
        console().print(str(path), highlight=False)
    return 0
