"""A notification URL (`--notify`, the hosts file's `notify:`): checked when it is read,
before anything runs, and shown in messages without its path (a webhook's secret).
"""

from __future__ import annotations

import urllib.parse

from orchestrator.errors import UsageError


def check_url(url: str, *, where: str = "--notify") -> str:
    """Refuse anything but an http(s) URL with a host and a valid port, before anything
    runs (a URL that cannot be sent to is a usage error, not a note after the campaign)."""
    hint = "e.g. --notify https://hooks.slack.com/services/..."
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises on a port that is not a number in range
        host = parts.hostname
    except ValueError as exc:
        raise UsageError(f"{where}: not a valid URL ({exc})", hint=hint) from None
    if parts.scheme not in ("http", "https") or not host:
        raise UsageError(
            f"{where}: expected an http:// or https:// URL, got {shown(url)!r}", hint=hint
        )
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise UsageError(f"{where}: the URL holds a space or a control character", hint=hint)
    if port == 0:
        raise UsageError(f"{where}: port 0 is not a port", hint=hint)
    return url


def shown(url: str) -> str:
    """The URL for messages: scheme and host only (a webhook's path is its secret)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "the notification URL"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")
