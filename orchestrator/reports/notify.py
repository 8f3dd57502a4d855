"""Notifications: a JSON message POSTed to a URL when a campaign ends.

The message is Slack-compatible (`text`, which Slack, Mattermost, Discord's /slack
endpoint and most chat webhooks show) plus structured fields for other receivers:
`campaign`, `kind`, `status`, `culprits`, `target`, `report`, `detail`, `regressions` (a
sweep's, against its previous run, with the reference's own move), `confidence` (a
bisection's, when its search computed one), `first_failure` (of a deployment over several
hosts: the role and host where the target failure happened first). It is sent
when a campaign concludes, stops on infrastructure or is interrupted, with a few retries
on connection errors, 5xx and 429, all within one overall deadline. Whatever the receiver
does (answers in another protocol, answers byte by byte or never, redirects), the
delivery ends by that deadline with one line saying why it failed; it never fails the
campaign nor changes its exit code. Every text field goes through the campaign's
redactor: secrets never leave in a message.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.config.secrets import Redactor
from orchestrator.config.webhook import shown

TIMEOUT_S = 5.0  # one attempt's socket operations
ATTEMPTS = 3
DEADLINE_S = 20.0  # the whole delivery, retries included

#: status -> how the text says it
_SAID = {
    "found": "found the culprit",
    "unsure": "is not sure yet (best answer below the confidence asked)",
    "done": "finished",
    "incomplete": "stopped without an answer",
    "endpoints": "stopped at the endpoint checks",
    "changed": "stopped: the host's environment changed",
    "interrupted": "was interrupted",
    "refused": "was refused: another campaign holds a host's lock",
    "error": "stopped on an error",
}


@dataclass(frozen=True)
class Message:
    campaign: str
    kind: str  # bisect | sweep
    status: str
    culprits: tuple[str, ...] = ()
    target: str | None = None
    report: str | None = None
    detail: str = ""
    #: a sweep's regressions against its previous run, one line each ("config: why"), and
    #: the reference's own move when it moved
    regressions: tuple[str, ...] = ()
    #: an answer's confidence (posterior), when the search computed one
    confidence: float | None = None
    #: the variants started again after a resource failure, one line each
    repairs: tuple[str, ...] = ()
    #: a deployment's: where the target failure happened first, and what the other
    #: roles did then ("node1 on b300-02: ...; node0 then timed out in a collective")
    first_failure: str | None = None

    def payload(self, redact: Redactor | None = None) -> dict[str, Any]:
        r = redact or Redactor()
        said = _SAID.get(self.status, self.status)
        if self.regressions:
            said += " with a REGRESSION"
        text = f"orchestrator {self.kind} {self.campaign} {said}"
        if self.culprits:
            text += (": best so far " if self.status == "unsure" else ": ") + "; ".join(
                self.culprits
            )
        if self.regressions:
            text += ": " + "; ".join(self.regressions)
        if self.target and self.status != "found":
            text += f" (target failure: {self.target})"
        if self.first_failure:
            text += f"; failed first: {self.first_failure}"
        if self.detail:
            text += f". {self.detail}"
        if self.repairs:
            text += "\nrepaired: " + "; ".join(self.repairs)
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
            "regressions": [r.text(x) for x in self.regressions],
            "confidence": self.confidence,
            "repairs": [r.text(x) for x in self.repairs],
            "first_failure": r.text(self.first_failure),
        }


class _Retry(Exception):  # noqa: N818 (an internal signal: try again)
    pass


class _Final(Exception):  # noqa: N818 (an internal signal: the delivery failed for good)
    pass


def send(
    url: str,
    payload: dict[str, Any],
    *,
    timeout: float = TIMEOUT_S,
    attempts: int = ATTEMPTS,
    deadline: float = DEADLINE_S,
    sleep: Callable[[float], None] | None = None,
) -> str | None:
    """POST `payload` as JSON. None when delivered (a 2xx answer), else why not: one line,
    never the URL's path, never an exception.

    One overall deadline covers the whole delivery, retries included: a receiver that
    answers byte by byte, or not at all, cannot hold the command past it (the attempt runs
    in a thread whose socket is shut at the deadline). A redirect is not followed: a POST
    that follows a 301/302 arrives as a GET without the message, so it is a failure that
    names where it pointed."""
    body = json.dumps(payload).encode()
    box: dict[str, Any] = {}
    done = threading.Event()
    end = time.monotonic() + deadline

    def work() -> None:
        try:
            box["problem"] = _deliver(
                url,
                body,
                timeout=timeout,
                attempts=attempts,
                end=end,
                sleep=sleep or time.sleep,
                box=box,
            )
        except Exception as exc:  # noqa: BLE001 (any failure of a receiver is one note)
            box["problem"] = f"{type(exc).__name__}: {_line(exc)}"
        finally:
            done.set()

    worker = threading.Thread(target=work, name="notify", daemon=True)
    worker.start()
    if not done.wait(max(deadline, 0.0)):
        box["abandoned"] = True
        _shut(box.get("conn"))
        return f"{shown(url)}: no complete answer within {deadline:g}s (given up)"
    problem = box.get("problem")
    return f"{shown(url)}: {problem}" if problem else None


def _deliver(
    url: str,
    body: bytes,
    *,
    timeout: float,
    attempts: int,
    end: float,
    sleep: Callable[[float], None],
    box: dict[str, Any],
) -> str | None:
    """The attempts of one delivery, until `end`: None when delivered, else why not."""
    last = "no attempt made"
    for attempt in range(1, max(attempts, 1) + 1):
        left = end - time.monotonic()
        if left <= 0 or box.get("abandoned"):
            break
        try:
            _post(url, body, timeout=min(timeout, left), box=box)
            return None
        except _Final as exc:
            return str(exc)
        except _Retry as exc:
            last = str(exc)
        if attempt < attempts:
            sleep(max(min(0.5 * 2 ** (attempt - 1), 4.0, end - time.monotonic()), 0.0))
    return f"{last} (after {attempt} attempt{'s' if attempt != 1 else ''})"


def _post(url: str, body: bytes, *, timeout: float, box: dict[str, Any]) -> None:
    """One POST; returns on a 2xx answer, else raises _Retry or _Final."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "", parts.port, timeout=timeout)
    box["conn"] = conn
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request(
            "POST",
            target,
            body=body,
            headers={"Content-Type": "application/json", "User-Agent": "orchestrator"},
        )
        # The status line and headers say whether it was taken; the answer's body says
        # nothing more, so it is not read (a receiver may send it slowly, or forever).
        resp = conn.getresponse()
        status, reason = resp.status, resp.reason
        location = resp.getheader("Location") or ""
    except (http.client.RemoteDisconnected, ConnectionError, TimeoutError) as exc:
        raise _Retry(_net(exc)) from exc
    except http.client.HTTPException as exc:
        raise _Final(
            f"the receiver does not answer in HTTP ({type(exc).__name__}: {_line(exc)})"
        ) from exc
    except OSError as exc:  # refused, unreachable, DNS, TLS
        raise _Retry(_net(exc)) from exc
    finally:
        _shut(conn)
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        where = f" to {shown(urllib.parse.urljoin(url, location))}" if location else ""
        raise _Final(
            f"HTTP {status} {reason}: a redirect{where}, not followed (the message "
            "would arrive as a GET without its body); give the final URL"
        )
    if status >= 500 or status == 429:
        raise _Retry(f"HTTP {status}")
    raise _Final(f"HTTP {status} {reason}")


def _shut(conn: http.client.HTTPConnection | None) -> None:
    """Close a connection, waking any thread blocked reading from it."""
    if conn is None:
        return
    sock = getattr(conn, "sock", None)
    try:
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        conn.close()
    except Exception:  # noqa: BLE001 (closing what is already broken)
        pass


def _net(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return _line(getattr(exc, "strerror", None) or exc)


def _line(exc: object) -> str:
    text = " ".join(str(exc).split())
    return text[:200] or "no detail"


def repairs_of(answer: dict[str, Any] | None) -> tuple[str, ...]:
    """Each repaired (or unrepairable) variant of a campaign's recorded answer, in words."""
    from orchestrator.campaign.records import RepairNote

    return tuple(RepairNote.from_dict(r).sentence() for r in (answer or {}).get("repairs") or [])


def culprits_of(answer: dict[str, Any] | None) -> tuple[str, ...]:
    """`--a + --b` per culprit set of a campaign's recorded answer (none for a sweep's)."""
    from orchestrator.campaign.records import Culprit

    return tuple(
        " + ".join(Culprit.from_dict(c).flags) for c in (answer or {}).get("culprits") or []
    )
