"""systemd's quoting and escaping, in one place: how `systemctl show` quotes an argv
(`shell_maybe_quote`, `quote_command_line`, from systemd's escape.h) and its inverse
(`split_command_line`), and the C escapes a unit file's words take (`c_unescape`, as
extract-word.c undoes them; the shell's `$'...'` takes the same).

Pure text functions: the config's unit import (`shellwords`) and the executor's parsers
of what systemd prints (`orchestrator.execution.facts`) both read systemd through them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class Unreadable(Exception):
    """What a launch line holds that the import cannot read (the message names it)."""


# systemd's escape.h: what makes shell_maybe_quote() quote an element, and what it
# backslash-escapes inside the quotes.
_SHELL_NEED_ESCAPE = '"\\`$'
_SHELL_NEED_QUOTES = _SHELL_NEED_ESCAPE + "*?[" + "'()<>|&;!"
_WHITESPACE = " \t\n\r"
_C_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}
_C_UNESCAPES = {v[1]: k for k, v in _C_ESCAPES.items()}


def shell_maybe_quote(s: str) -> str:
    """systemd's `shell_maybe_quote(s, 0)`: the element as `systemctl show` prints it.

    Left alone unless it holds whitespace, a shell special character or a control
    character; then wrapped in double quotes with `"`, `\\`, `` ` ``, `$` backslash-escaped
    and control characters C-escaped. Valid UTF-8 passes through.
    """
    cut = next(
        (
            i
            for i, ch in enumerate(s)
            if ch in _WHITESPACE + _SHELL_NEED_QUOTES or ord(ch) < 32 or ord(ch) == 127
        ),
        None,
    )
    if cut is None:
        return s
    out = [s[:cut]]
    for ch in s[cut:]:
        if ch in _C_ESCAPES:
            out.append(_C_ESCAPES[ch])
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        elif ch in _SHELL_NEED_ESCAPE:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def quote_command_line(argv: Sequence[str]) -> str:
    """systemd's `quote_command_line()`: elements quoted as needed, joined by spaces."""
    return " ".join(shell_maybe_quote(a) for a in argv)


def split_command_line(text: str) -> list[str]:
    """Inverse of `quote_command_line` (and of a plain space join when nothing is quoted).

    Double-quoted words are unescaped the way systemd escaped them; anything else splits
    on single spaces.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == " ":
            i += 1
            continue
        if text[i] == '"':
            j = i + 1
            buf: list[str] = []
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    ch, width = _escape_at(text, j, _C_UNESCAPES) or (text[j + 1], 2)
                    buf.append(ch)
                    j += width
                    continue
                buf.append(text[j])
                j += 1
            if j < n and (j + 1 == n or text[j + 1] == " "):
                out.append("".join(buf))
                i = j + 1
                continue
            # not a systemd-quoted word after all (a plain join of an element with `"`)
        j = text.find(" ", i)
        j = n if j < 0 else j
        out.append(text[i:j])
        i = j
    return out


#: the C escapes a unit file's words take (extract-word.c, EXTRACT_CUNESCAPE): the ones
#: `systemctl show` prints, and a backslash, the quotes and `\s` (a space)
_UNIT_UNESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
    "s": " ",
}


def c_unescape(text: str) -> str:
    """A word's C escapes undone as systemd does for a unit file (and the shell for
    `$'...'`); an escape systemd refuses raises `Unreadable`."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 >= len(text):
            out.append(c)
            i += 1
            continue
        found = _escape_at(text, i, _UNIT_UNESCAPES, unit=True)
        if found is None:
            raise Unreadable(f"the escape \\{text[i + 1]}, which systemd refuses")
        out.append(found[0])
        i += found[1]
    return "".join(out)


def _escape_at(
    text: str, i: int, table: dict[str, str], *, unit: bool = False
) -> tuple[str, int] | None:
    """The escape that starts with the backslash at `text[i]`: its character and how many
    characters it spans, or None when it is none of `table`'s, `\\xHH` (nor, with `unit`,
    a unit file's `\\uHHHH`, `\\UHHHHHHHH` or octal `\\NNN`)."""
    e = text[i + 1]
    if e in table:
        return table[e], 2
    if e == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", text[i + 2 : i + 4]):
        return chr(int(text[i + 2 : i + 4], 16)), 4
    if not unit:
        return None
    k = {"u": 6, "U": 10}.get(e)
    if k is not None and re.fullmatch(r"[0-9a-fA-F]+", text[i + 2 : i + k]):
        return chr(int(text[i + 2 : i + k], 16)), k
    if re.fullmatch(r"[0-7]{3}", text[i + 1 : i + 4]):
        return chr(int(text[i + 1 : i + 4], 8)), 4
    return None


__all__ = [
    "Unreadable",
    "c_unescape",
    "quote_command_line",
    "shell_maybe_quote",
    "split_command_line",
]
