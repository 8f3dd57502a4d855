"""Reading launch scripts and unit lines as the shell and systemd would.

`scan` splits shell text into commands of words the way a POSIX shell does (quotes,
backslashes, continuations, comments, `;`, `&&`, `|`, redirections), keeping each `$`
expansion as a part to expand later: a line the import does not use may hold what it
cannot read (`$(date)`), and only the launch line's must be read. `expand` expands a
command's words with the variables the script (or unit) set: `$X`, `${X}`,
`${X:-default}`, `"$@"` (the script's arguments), with field splitting of unquoted values.
What it cannot know (a variable the script does not set, `$(...)`, `$1` without
arguments) raises `Unreadable` naming it.

`systemd_words` splits an `ExecStart=`/`Environment=` value as systemd does (its quotes
and C escapes), `specifiers` resolves `%n`, `%%`, ... and `systemd_expand` does the
`$VAR` / `${VAR}` / `$$` substitution systemd applies to `ExecStart=`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.config.systemd_quoting import Unreadable, c_unescape


@dataclass(frozen=True)
class Part:
    """A piece of a word: literal text, a variable, the script's arguments, or something
    the import cannot read (`bad`, its text says what)."""

    kind: str  # "lit" | "var" | "args" | "pos" | "bad"
    text: str = ""  # the literal text, the variable's name, or what is unreadable
    quoted: bool = False
    op: str = ""  # ${X:-w}: ":-", "-", ":=", "=", ":+", "+", ":?", "?"
    word: str = ""  # the operator's word, as written


Word = tuple[Part, ...]
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-=+?])(.*))?$", re.S)
_SEPARATORS = ("&&", "||", ";;", ";", "&", "|", "(", ")", "\n")
_LITERAL = re.compile(r"[^\s\\'\"$`#<>;&|()]+")


@dataclass
class Command:
    words: list[Word]
    text: str  # as written, for messages
    redirected: bool = False  # had a redirection (`> log 2>&1`), dropped


def literal(word: Word) -> str | None:
    """The word's text when it is all literal (no expansion), else None."""
    if all(p.kind == "lit" for p in word):
        return "".join(p.text for p in word)
    return None


def _matching(text: str, i: int, open_: str, close: str) -> int:
    """Index after the `close` that matches the `open_` at text[i-1] (nesting counted)."""
    depth = 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and open_ == "(":
            j = text.find("'", i + 1)
            i = len(text) if j < 0 else j + 1
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise Unreadable(f"unclosed {open_!r}")


def _dollar(text: str, i: int, quoted: bool) -> tuple[Part, int]:
    """The expansion starting at text[i] == '$' -> (part, index after it)."""
    nxt = text[i + 1] if i + 1 < len(text) else ""
    if text.startswith("$((", i):
        end = _matching(text, i + 2, "(", ")")
        return Part("bad", f"the arithmetic {text[i : end + 1]}", quoted), end + 1
    if nxt == "(":
        end = _matching(text, i + 2, "(", ")")
        return Part("bad", f"the command substitution {text[i:end]}", quoted), end
    if nxt == "{":
        end = _matching(text, i + 2, "{", "}")
        inner = text[i + 2 : end - 1]
        m = _BRACED.match(inner)
        if m:
            return Part("var", m[1], quoted, m[2] or "", m[3] or ""), end
        if inner in ("@", "*"):
            return Part("args", inner, quoted), end
        if inner.isdigit():
            return Part("pos", inner, quoted), end
        return Part("bad", f"the expansion ${{{inner}}}", quoted), end
    m = _NAME.match(text, i + 1)
    if m:
        return Part("var", m[0], quoted), m.end()
    if nxt in ("@", "*"):
        return Part("args", nxt, quoted), i + 2
    if nxt.isdigit():
        return Part("pos", nxt, quoted), i + 2
    if nxt and nxt in "#?$!-":
        return Part("bad", f"the shell's ${nxt}", quoted), i + 2
    if nxt == "'" and not quoted:  # $'...': ANSI-C quoting
        j = i + 2
        out = []
        while j < len(text) and text[j] != "'":
            if text[j] == "\\" and j + 1 < len(text):
                out.append(text[j : j + 2])
                j += 2
                continue
            out.append(text[j])
            j += 1
        if j >= len(text):
            raise Unreadable("unclosed $'")
        return Part("lit", c_unescape("".join(out)), True), j + 1
    return Part("lit", "$", quoted), i + 1


def scan(text: str) -> list[Command]:
    """Shell text -> its simple commands, in order (words keep their expansions)."""
    text = text.replace("\r\n", "\n")  # a script saved with CRLF line ends
    commands: list[Command] = []
    words: list[Word] = []
    parts: list[Part] = []
    started = False  # a quoted empty string starts a word
    cmd_start = 0
    redirected = False
    i, n = 0, len(text)

    def end_word() -> None:
        nonlocal parts, started
        if parts or started:
            words.append(tuple(parts))
        parts, started = [], False

    def end_command(at: int) -> None:
        nonlocal words, cmd_start, redirected
        end_word()
        if words:
            commands.append(Command(words, text[cmd_start:at].strip(), redirected))
        words, cmd_start, redirected = [], at, False

    while i < n:
        c = text[i]
        if c == "\\":
            if text.startswith("\\\n", i):
                i += 2  # a continuation
                continue
            if i + 1 < n:
                parts.append(Part("lit", text[i + 1], True))
            i += 2
            continue
        if c in " \t\r":
            end_word()
            i += 1
            continue
        if c == "#" and not parts and not started:
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        sep = next((s for s in _SEPARATORS if text.startswith(s, i)), None)
        if sep is not None:
            end_command(i)
            i += len(sep)
            cmd_start = i
            continue
        if c in "<>":
            # a redirection: its fd digits, operator and target are not the command's words
            fd = literal(tuple(parts)) if parts else None
            if fd is not None and fd.isdigit():
                parts = []
            op = re.match(r"<<-?|<>|>>|>\||<&|>&|<|>", text[i:])
            assert op is not None
            i += op.end()
            if op[0].startswith("<<"):
                raise Unreadable("a here-document (<<)")
            m = (
                re.match(r"[ \t]*(-|\d+)(?=[\s;&|)]|$)", text[i:])
                if op[0] in ("<&", ">&")
                else None
            )
            if m:
                i += m.end()
            else:
                while i < n and text[i] in " \t":
                    i += 1
                target = scan_word(text, i)
                i = target
            redirected = True
            continue
        if c == "'":
            j = text.find("'", i + 1)
            if j < 0:
                raise Unreadable("unclosed single quote")
            parts.append(Part("lit", text[i + 1 : j], True))
            started = True
            i = j + 1
            continue
        if c == '"':
            i = _double(text, i + 1, parts)
            started = True
            continue
        if c == "$":
            part, i = _dollar(text, i, quoted=False)
            parts.append(part)
            continue
        if c == "`":
            j = text.find("`", i + 1)
            if j < 0:
                raise Unreadable("unclosed backquote")
            parts.append(Part("bad", f"the command substitution {text[i : j + 1]}"))
            i = j + 1
            continue
        m = _LITERAL.match(text, i)
        if m is None:  # a `#` inside a word is no comment
            parts.append(Part("lit", c))
            i += 1
            continue
        parts.append(Part("lit", m[0]))
        i = m.end()
    end_command(n)
    return commands


def scan_word(text: str, i: int) -> int:
    """Index after the shell word starting at text[i] (a redirection's target)."""
    n = len(text)
    while i < n and text[i] not in " \t\n;&|()<>":
        c = text[i]
        if c == "\\":
            i += 2
        elif c == "'":
            j = text.find("'", i + 1)
            i = n if j < 0 else j + 1
        elif c == '"':
            i = _double(text, i + 1, [])
        else:
            i += 1
    return i


def _double(text: str, i: int, parts: list[Part]) -> int:
    """Read a double-quoted string from text[i] (after its `"`) into parts."""
    buf: list[str] = []

    def flush() -> None:
        if buf:
            parts.append(Part("lit", "".join(buf), True))
            buf.clear()

    n = len(text)
    before = len(parts)
    while i < n:
        c = text[i]
        if c == '"':
            flush()
            if len(parts) == before:  # `""`: an empty word of its own
                parts.append(Part("lit", "", True))
            return i + 1
        if c == "\\" and i + 1 < n and text[i + 1] in '$`"\\\n':
            if text[i + 1] != "\n":
                buf.append(text[i + 1])
            i += 2
            continue
        if c == "$":
            flush()
            part, i = _dollar(text, i, quoted=True)
            parts.append(part)
            continue
        if c == "`":
            j = text.find("`", i + 1)
            if j < 0:
                raise Unreadable("unclosed backquote")
            flush()
            parts.append(Part("bad", f"the command substitution {text[i : j + 1]}", True))
            i = j + 1
            continue
        buf.append(c)
        i += 1
    raise Unreadable("unclosed double quote")


class Vars:
    """What the import knows of a shell's variables while it reads a script."""

    def __init__(
        self,
        exported: Mapping[str, str] | None = None,
        *,
        args: Sequence[str] | None = None,
        arg0: str | None = None,
    ) -> None:
        self.values: dict[str, str] = dict(exported or {})
        self.exported: set[str] = set(exported or {})
        self.unknown: dict[str, str] = {}  # name -> why its value is not known
        self.args = list(args) if args is not None else None
        self.arg0 = arg0
        self.used: set[str] = set()
        self.used_args = False

    def set(self, name: str, value: str | None, why: str = "") -> None:
        if value is None:
            self.values.pop(name, None)
            self.unknown[name] = why
        else:
            self.values[name] = value
            self.unknown.pop(name, None)

    def get(self, name: str) -> str | None:
        self.used.add(name)
        if name in self.unknown:
            raise Unreadable(f"${name} (set from {self.unknown[name]})")
        return self.values.get(name)


def _value(part: Part, vs: Vars) -> str:
    name, op = part.text, part.op
    value = vs.get(name)
    unset = value is None
    empty = unset or value == ""
    if op in (":-", "-"):
        if empty if op == ":-" else unset:
            return expand_text(part.word, vs)
        return value or ""
    if op in (":=", "="):
        if empty if op == ":=" else unset:
            value = expand_text(part.word, vs)
            vs.set(name, value)
        return value or ""
    if op in (":+", "+"):
        return "" if (empty if op == ":+" else unset) else expand_text(part.word, vs)
    if op in (":?", "?") and (empty if op == ":?" else unset):
        raise Unreadable(f"${name}, which the script requires and does not set")
    if unset:
        raise Unreadable(
            f"${name}, which is not set in what the import reads (it would "
            "come from the environment the command starts in)"
        )
    return value or ""


def expand_text(text: str, vs: Vars) -> str:
    """A `${X:-word}` operator's word, expanded (as one string)."""
    cmds = scan(text.replace("\n", " ")) if text else []
    words = [w for c in cmds for w in c.words]
    return " ".join(expand(words, vs))


def expand(words: Sequence[Word], vs: Vars) -> list[str]:
    """Expand words as the shell does: variables, arguments, field splitting of unquoted
    expansions, quoted empty strings kept. Raises Unreadable naming what it cannot read."""
    out: list[str] = []
    for word in words:
        cur, has = "", False
        for p in word:
            if p.kind == "lit":
                cur += p.text
                has = has or p.quoted or bool(p.text)
                continue
            if p.kind == "bad":
                raise Unreadable(p.text)
            if p.kind == "args":
                vs.used_args = True
                args = vs.args or []
                if p.quoted and p.text == "@":
                    fields = list(args)
                elif p.quoted:
                    fields = [" ".join(args)] if args else []
                else:
                    fields = [f for a in args for f in a.split()]
                if not fields:
                    continue
                cur += fields[0]
                has = True
                for f in fields[1:]:
                    out.append(cur)
                    cur = f
                continue
            if p.kind == "pos":
                k = int(p.text)
                if k == 0 and vs.arg0 is not None:
                    value = vs.arg0
                elif k > 0 and vs.args is not None and k <= len(vs.args):
                    value = vs.args[k - 1]
                else:
                    raise Unreadable(f"the script's argument ${p.text}, which is not known")
            else:
                value = _value(p, vs)
            if p.quoted:
                cur += value
                has = True
                continue
            fields = value.split()
            if not fields:
                continue
            if value[:1].isspace() and has:
                out.append(cur)
                cur, has = "", False
            cur += fields[0]
            has = True
            for f in fields[1:]:
                out.append(cur)
                cur = f
            if value[-1:].isspace():
                out.append(cur)
                cur, has = "", False
        if has:
            out.append(cur)
    return out


# ---------------------------------------------------------------------------------------
# systemd
# ---------------------------------------------------------------------------------------


def systemd_words(value: str) -> list[str]:
    """A unit setting's value split into words as systemd does (quotes, C escapes)."""
    words: list[str] = []
    cur: list[str] = []
    has = False
    i, n = 0, len(value)
    quote = ""
    while i < n:
        c = value[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and i + 1 < n:
                m = re.match(
                    r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)",
                    value[i:],
                    re.S,
                )
                assert m is not None
                cur.append(c_unescape(m[0]))
                i += m.end()
                continue
            else:
                cur.append(c)
            i += 1
            continue
        if c in " \t\n":
            if has:
                words.append("".join(cur))
            cur, has = [], False
        elif c in "'\"":
            quote, has = c, True
        elif c == "\\" and i + 1 < n:
            m = re.match(
                r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)", value[i:], re.S
            )
            assert m is not None
            cur.append(c_unescape(m[0]))
            has = True
            i += m.end()
            continue
        else:
            cur.append(c)
            has = True
        i += 1
    if quote:
        raise Unreadable(f"an unclosed {quote} quote")
    if has:
        words.append("".join(cur))
    return words


#: specifiers that are the same on every host for a system unit
_FIXED = {
    "%": "%",
    "t": "/run",
    "S": "/var/lib",
    "C": "/var/cache",
    "L": "/var/log",
    "E": "/etc",
    "T": "/tmp",
    "V": "/var/tmp",
}


def specifiers(word: str, unit: str | None) -> str:
    """Resolve a unit line's `%` specifiers as systemd does for a system unit; one that
    depends on the host (`%h`, `%H`, `%u`, ...) or on a unit name not known raises."""

    def one(m: re.Match[str]) -> str:
        s = m[1]
        if s in _FIXED:
            return _FIXED[s]
        template = bool(unit) and re.search(r"@\.[a-z]+$", unit or "") is not None
        if template and s in "iIf":
            raise Unreadable(
                f"the specifier %{s}: the instance of the template unit {unit} "
                "is not known (import the unit under its instance's name, "
                "NAME@INSTANCE.service)"
            )
        if unit and s in "nNpPiIjJf":
            full = unit
            stem = full.rsplit(".", 1)[0]
            prefix, _, instance = stem.partition("@")
            values = {
                "n": full,
                "N": stem,
                "p": prefix,
                "P": prefix.replace("-", "/"),
                "i": instance,
                "I": instance.replace("-", "/"),
                "j": prefix.rsplit("-", 1)[-1],
                "J": prefix.rsplit("-", 1)[-1],
                "f": "/" + (instance or prefix).replace("-", "/"),
            }
            return values[s]
        what = (
            "the unit's name is not known (import the unit file itself)"
            if s in "nNpPiIjJf"
            else "it depends on the host"
        )
        raise Unreadable(f"the specifier %{s}: {what}")

    if "%" not in word:
        return word
    return re.sub(r"%(.)", one, word, flags=re.S)


def systemd_expand(words: Sequence[str], env: Mapping[str, str], unknown: str) -> list[str]:
    """ExecStart='s variable substitution: a word that is `$NAME` alone becomes the value's
    whitespace-split words; `${NAME}` anywhere in a word becomes the value; `$$` is `$`;
    a `$NAME` inside a word stays as written. A variable the unit does not set raises
    (`unknown` says where else it could come from)."""

    def value(name: str) -> str:
        if name not in env:
            raise Unreadable(f"${{{name}}}, which the unit's Environment= does not set ({unknown})")
        return env[name]

    out: list[str] = []
    for w in words:
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
        if m:
            out.extend(value(m[1]).split())
            continue

        def sub(mm: re.Match[str]) -> str:
            if mm[0] == "$$":
                return "$"
            return value(mm[1])

        out.append(re.sub(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}", sub, w))
    return out


__all__ = [
    "Command",
    "Part",
    "Unreadable",
    "Vars",
    "expand",
    "literal",
    "scan",
    "specifiers",
    "systemd_expand",
    "systemd_words",
]
