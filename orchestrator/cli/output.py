"""Consoles for the CLI. Plain line-by-line output when not a terminal (logs, CI).

rich resolves `sys.stdout`/`sys.stderr` at each write when no file is given, so these
module-level consoles follow redirections (pytest's capture included).
"""

from __future__ import annotations

from rich.console import Console

_out = Console(soft_wrap=True)
_err = Console(stderr=True, soft_wrap=True)


def console() -> Console:
    return _out


def err_console() -> Console:
    return _err
