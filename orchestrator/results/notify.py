"""Notifications: a JSON message POSTed to a URL when a campaign ends.

The message is Slack-compatible (`text`, which Slack, Mattermost, Discord's /slack
endpoint and most chat webhooks show) plus structured fields for other receivers:
`campaign`, `kind`, `status`, `culprits`, `target`, `report`, `detail`, `confidence`.
It is sent when a campaign concludes, stops on infrastructure or is interrupted, with a
short timeout and a few retries (tenacity) on connection errors, 5xx and 429. A notification
that cannot be delivered is reported and never fails the campaign. Every text field
goes through the campaign's redactor: secrets never leave in a message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

from orchestrator.config.secrets import Redactor
from orchestrator.errors import UsageError

TIMEOUT_S = 5.0
ATTEMPTS = 3

#: status -> how the text says it
_SAID = {
    "found": "found the culprit",
    "unsure": "is not sure yet (best answer below the confidence asked)",
    "done": "finished",
    "incomplete": "stopped without an answer",
    "endpoints": "stopped at the endpoint checks",
    "infra": "stopped on infrastructure trouble",
    "changed": "stopped: the host's environment changed",
    "interrupted": "was interrupted",
    "error": "stopped on an error",
}


def check_url(url: str, *, where: str = "--notify") -> str:
    """Refuse anything but an http(s) URL with a host (urllib would open file:// too)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{where}: expected an http:// or https:// URL, got {shown(url)!r}",
                         hint="e.g. --notify https://hooks.slack.com/services/...")  # fmt: skip
    return url


def shown(url: str) -> str:
    """The URL for messages: scheme and host only (a webhook's path is its secret)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")


@dataclass(frozen=True)
class Message:
    campaign: str
    kind: str  # bisect | sweep
    status: str
    culprits: tuple[str, ...] = ()
    target: str | None = None
    report: str | None = None
    detail: str = ""
    #: an answer's confidence (posterior), when the search computed one
    confidence: float | None = None

    def payload(self, redact: Redactor | None = None) -> dict[str, Any]:
        r = redact or Redactor()
        said = _SAID.get(self.status, self.status)
        text = f"orchestrator {self.kind} {self.campaign} {said}"
        if self.culprits:
            text += (": best so far " if self.status == "unsure" else ": ") \
                + "; ".join(self.culprits)
        if self.target and self.status != "found":
            text += f" (target failure: {self.target})"
        if self.detail:
            text += f". {self.detail}"
        if self.report:
            text += f"\nreport: {self.report}"
        return {
            "text": r.text(text),
            "campaign": self.campaign,
            "kind": self.kind,
            "status": self.status,
            "culprits": [r.text(c) for c in self.culprits],
            "target": r.text(self.target),
            "report": r.text(self.report),
            "detail": r.text(self.detail),
            "confidence": self.confidence,
        }


class _Retry(Exception):  # noqa: N818 (an internal signal)
    pass


def send(url: str, payload: dict[str, Any], *, timeout: float = TIMEOUT_S,
         attempts: int = ATTEMPTS,
         sleep: Callable[[float], None] | None = None) -> str | None:  # fmt: skip
    """POST `payload` as JSON. None when delivered, else why not (one line; the URL's
    path is never in it)."""
    body = json.dumps(payload).encode()

    def once() -> None:
        req = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "orchestrator"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (checked)
                resp.read(65536)
        except urllib.error.HTTPError as exc:
            if exc.code >= 500 or exc.code == 429:
                raise _Retry(f"HTTP {exc.code}") from exc
            raise RuntimeError(f"HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise _Retry(str(reason)) from exc

    kwargs: dict[str, Any] = {"sleep": sleep} if sleep is not None else {}
    retrying = Retrying(stop=stop_after_attempt(max(attempts, 1)),
                        wait=wait_exponential(multiplier=0.5, max=4),
                        retry=retry_if_exception(lambda e: isinstance(e, _Retry)),
                        **kwargs)  # fmt: skip
    try:
        retrying(once)
    except RetryError as exc:
        last = exc.last_attempt.exception()
        return f"{shown(url)}: {last} (after {attempts} attempts)"
    except RuntimeError as exc:
        return f"{shown(url)}: {exc}"
    return None


def culprits_of(answer: dict[str, Any] | None) -> tuple[str, ...]:
    """`--a + --b` per culprit set of a campaign's recorded answer (none for a sweep's)."""
    from orchestrator.campaign.records import Culprit

    return tuple(" + ".join(Culprit.from_dict(c).flags)
                 for c in (answer or {}).get("culprits") or [])  # fmt: skip
