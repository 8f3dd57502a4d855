"""Consoles for the CLI. Plain line-by-line output when not a terminal (logs, CI).

rich resolves `sys.stdout`/`sys.stderr` at each write when no file is given, so these
module-level consoles follow redirections (pytest's capture included).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.errors import MarkupError

# Control characters from untrusted text (a config's name, a server's log line, a flag
# value) would drive the terminal: ANSI escapes recolour or rewrite the screen, a CR hides
# what came before. They are shown as visible escapes instead; rich draws its own styles.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text)


#: called when the output a console writes to is closed (a pipe's reader is gone: `| head`
#: has its lines, `less` was quit); a campaign in progress sets it (cli.signals), to stop
#: as it does on SIGHUP
_on_closed: list[Callable[[], None]] = []


class SafeConsole(Console):
    """A rich console that never passes a control character of a string to the terminal.
    Its output closing is no error: it goes quiet (see `on_broken_pipe`)."""

    closed = False

    def on_broken_pipe(self) -> None:
        """The reader of our output is gone (rich's default exits at once: a campaign's
        hosts would not be restored nor its record closed). Whatever would still be
        written goes nowhere; a campaign in progress is told (`_on_closed`)."""
        self.quiet = True
        self.closed = True
        try:
            fd = self.file.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, fd)  # what is buffered is flushed there, not to the pipe
            finally:
                os.close(null)
        except (OSError, ValueError, AttributeError):
            pass  # not a file of its own (a capture): quiet is enough
        if _on_closed:
            _on_closed[-1]()

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


def on_closed(hook: Callable[[], None] | None) -> None:
    """Call `hook` when an output closes (None: stop calling the last one set)."""
    if hook is None:
        if _on_closed:
            _on_closed.pop()
    else:
        _on_closed.append(hook)


def stdout_closed() -> bool:
    """True once the standard output was found closed: say what must be said on stderr."""
    return _out.closed
