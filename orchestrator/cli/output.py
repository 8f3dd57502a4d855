"""Consoles for the CLI. Plain line-by-line output when not a terminal (logs, CI).

rich resolves `sys.stdout`/`sys.stderr` at each write when no file is given, so these
module-level consoles follow redirections (pytest's capture included).
"""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.errors import MarkupError

# Control characters from untrusted text (a config's name, a server's log line, a flag
# value) would drive the terminal: ANSI escapes recolour or rewrite the screen, a CR hides
# what came before. They are shown as visible escapes instead; rich draws its own styles.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


class SafeConsole(Console):
    """A rich console that never passes a control character of a string to the terminal."""

    def print(self, *objects: Any, **kw: Any) -> None:  # noqa: A003
        safe = [visible(o) if isinstance(o, str) else o for o in objects]
        try:
            super().print(*safe, **kw)
        except MarkupError:
            # Untrusted text that slipped through unescaped broke the markup: show it all
            # literally rather than fail.
            super().print(*safe, **(kw | {"markup": False}))

    def out(self, *objects: Any, **kw: Any) -> None:
        super().out(*(visible(o) if isinstance(o, str) else o for o in objects), **kw)


_out = SafeConsole(soft_wrap=True)
_err = SafeConsole(stderr=True, soft_wrap=True)


#: Output that is not a terminal (a log, CI, a pipe to grep) is not wrapped at 80 columns:
#: a table row stays one line.
PLAIN_WIDTH = 200


def console() -> SafeConsole:
    if not _out.is_terminal and _out.width < PLAIN_WIDTH:
        _out.width = PLAIN_WIDTH
    return _out


def err_console() -> SafeConsole:
    return _err
