"""`--notify URL` for bisect and sweep: one message when the campaign ends, however it ends.

The URL comes from `--notify`, else the sweep file's `notify:`, else the hosts file's
`notify:`, else $ORCH_NOTIFY_URL, else the private file $ORCH_NOTIFY_FILE names (what a
schedule uses: its command line is stored in the clear, so it never holds the URL). It is
registered as a secret with the store, so the recorded command line and the reports never
hold it (a webhook's URL is its password). Delivery failures are one note on stderr; the
exit code is the campaign's.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from rich.markup import escape

from orchestrator.cli.output import err_console
from orchestrator.config.webhook import check_url, shown
from orchestrator.errors import CampaignRef, OrchestratorError, UsageError
from orchestrator.reports.deployment_view import of_campaign
from orchestrator.reports.notify import Message, culprits_of, repairs_of, send
from orchestrator.store.store import Store

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Campaign(Protocol[T_co]):
    """A bisection or a sweep, as the command line runs it."""

    cid: str

    def run(self) -> T_co: ...


def add_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--notify",
        metavar="URL",
        help="POST a JSON message (Slack-compatible) here when the campaign ends "
        "(default: notify: in the sweep or hosts file)",
    )


#: where a schedule (or any run) finds the URL without a command line: the URL itself, or
#: a private file holding it (`schedule add --notify-file` sets this one)
URL_ENV, FILE_ENV = "ORCH_NOTIFY_URL", "ORCH_NOTIFY_FILE"


def url_for(args: argparse.Namespace, *fallbacks: str | None) -> str | None:
    """--notify, else the files' `notify:` (sweep, then hosts), else $ORCH_NOTIFY_URL, else
    the file $ORCH_NOTIFY_FILE names; checked before anything runs (exit 2 when bad)."""
    url = getattr(args, "notify", None)
    if url:
        return check_url(url)
    url = next((f for f in fallbacks if f), None) or os.environ.get(URL_ENV)
    if url:
        return check_url(url, where="notify:" if url != os.environ.get(URL_ENV) else URL_ENV)
    path = os.environ.get(FILE_ENV)
    return url_from_file(path, where=FILE_ENV) if path else None


def url_from_file(path: str, *, where: str) -> str:
    """The URL a private file holds (its first non-empty line)."""
    try:
        text = Path(path).expanduser().read_text()
        mode = Path(path).expanduser().stat().st_mode
    except OSError as exc:
        raise UsageError(
            f"{where}: cannot read {path}: {exc.strerror or exc}",
            hint="write the webhook URL alone in that file (chmod 600)",
        ) from None
    if mode & 0o077:
        raise UsageError(
            f"{where}: {path} is readable by other users, and a webhook's URL is its password",
            hint=f"chmod 600 {path}",
        )
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    return check_url(line, where=f"{where} ({path})")


def register_secret(store: Store, url: str | None) -> None:
    if url:
        store.add_secrets({"NOTIFY_URL": url})


def deliver(store: Store, url: str | None, message: Message) -> str | None:
    """Send; a failure is a note, never an error. Returns the failure (None: sent)."""
    if not url:
        return None
    problem = send(url, message.payload(store.redact))
    if problem:
        err_console().print(
            f"[yellow]note:[/] the notification was not delivered: {escape(problem)}",
            highlight=False,
        )
    else:
        err_console().print(f"notified {escape(shown(url))}", highlight=False)
    return problem


def guarded(
    store: Store, url: str | None, kind: str, campaign: Callable[[], str], run: Callable[[], T]
) -> T:
    """Run `run`; when it raises (infrastructure, another error), notify and re-raise."""
    try:
        return run()
    except OrchestratorError as exc:
        # the status the campaign was recorded with (`runs --campaigns` shows the same);
        # before it was recorded, the one it would have been
        status = getattr(exc, "campaign_status", None) or "error"
        try:
            cid = campaign()
        except Exception:  # noqa: BLE001 (no campaign recorded yet)
            cid = "?"
        answer = None
        if cid != "?":
            try:
                camp = store.campaign(cid)
                answer, status = camp.answer, camp.status
            except OrchestratorError:
                pass
        deliver(
            store, url, Message(cid, kind, status, culprits=culprits_of(answer), detail=str(exc))
        )
        raise


def conduct(
    args: argparse.Namespace,
    store: Store,
    url: str | None,
    kind: str,
    campaign: Campaign[T],
    view: Callable[..., None],
    noun: str,
) -> T | None:
    """Run a bisection or a sweep from the command line: notify however it ends; None when
    it was interrupted (the resume command is printed and sent)."""
    from orchestrator.cli import common

    outcome = guarded(
        store,
        url,
        kind,
        lambda: campaign.cid,
        lambda: common.run_campaign(campaign.run, view, noun, args),
    )
    if outcome is None:
        resume = common.resume_command(args, CampaignRef(kind, campaign.cid))
        concluded(
            store, url, kind, campaign.cid, "interrupted", None, detail=f"resume with: {resume}"
        )
    return outcome


def concluded(
    store: Store,
    url: str | None,
    kind: str,
    campaign_id: str,
    status: str,
    report: str | None,
    detail: str = "",
    regressions: tuple[str, ...] = (),
) -> None:
    camp = store.campaign(campaign_id)
    answer = camp.answer or {}
    if not detail and camp.target is not None and camp.target.error_class == "wrong_output":
        # a wrong answer has no log line to quote: how it was wrong, against good's
        detail = next(
            (
                str(r.answers["judged"].get("detail"))
                for r in store.runs(campaign_id)
                if r.signature == camp.target and r.answers and r.answers.get("judged")
            ),
            "",
        )
    deployment = of_campaign(store.runs(campaign_id), store.host_record, camp.target)
    first = deployment.target[1] if deployment is not None and deployment.target else None
    deliver(
        store,
        url,
        Message(
            campaign_id,
            kind,
            status,
            first_failure=(first.describe or first.first_failure) if first else None,
            culprits=culprits_of(camp.answer),
            target=str(camp.target) if camp.target else None,
            report=report,
            detail=detail,
            regressions=regressions,
            confidence=answer.get("confidence"),
            repairs=repairs_of(camp.answer),
        ),
    )
