"""The lines of a server log that matter: its tail, and every error above it.

A server that fails often goes on printing long after its error: vLLM's shutdown of every
process, triton's nanobind leak warnings (hundreds of lines), a resource tracker's notes.
A plain tail of such a log is all noise, and the error with its traceback is far above it.
`keep_what_matters` keeps the last lines AND each traceback above them (from its
`Traceback (most recent call last):` to the exception and the lines that explain it,
pydantic's `Value error, ...` included) and the line where the server printed its
arguments, in log order, with a marker where lines were cut.
The executor stores this form of a run's log; `show` prints it. Pure.
"""

from __future__ import annotations

import re

from orchestrator.diagnosis.classify.lines import strip_prefix

#: what stands where lines were cut (never read as a log line by the classifier: no error)
CUT = "[... {n} lines cut ...]"
_CUT_RE = re.compile(r"^\[\.\.\. \d+ lines cut")
#: at most this many lines of one traceback, and of all of them, are kept above the tail
MAX_BLOCK = 120
MAX_BLOCKS = 300
_START = "Traceback (most recent call last):"
#: how a server's line of its own arguments begins (see `server_logs.printed_args`)
_ARGS_LINES = ("server_args=ServerArgs(", "non-default args: {")
# After the exception line, its explanation: indented lines (pydantic's "  Value error, ..."
# and "For further information ..."), a few at most.
_EXPLAIN = 6


def _blocks(bodies: list[str]) -> list[tuple[int, int]]:
    """(start, end) line ranges of the tracebacks: the header, the frames, the exception
    line (the first unindented line after the frames) and its indented explanation."""
    out: list[tuple[int, int]] = []
    i, n = 0, len(bodies)
    while i < n:
        if bodies[i].strip() != _START:
            i += 1
            continue
        start = j = i
        j += 1
        # frames: indented lines ("  File ...", code, "^^^^"); chained tracebacks go on
        while j < n and (bodies[j][:1] in (" ", "\t") or not bodies[j].strip()):
            j += 1
        if j < n:
            j += 1  # the exception line itself
        k = 0
        while (
            j < n
            and k < _EXPLAIN
            and bodies[j][:1] in (" ", "\t")
            and bodies[j].strip()
            and not bodies[j].lstrip().startswith("File ")
        ):
            j += 1
            k += 1
        out.append((start, min(j, start + MAX_BLOCK)))
        i = max(j, i + 1)
    return out


def keep_what_matters(log: str, lines: int, budget: int = MAX_BLOCKS) -> str:
    """The last `lines` lines of `log`, preceded by the tracebacks above them (up to
    `budget` lines of them, the earliest first: the first error is the cause, the later ones
    are mostly the other processes dying of it), in log order; `CUT` lines mark the gaps."""
    all_lines = log.splitlines()
    if len(all_lines) <= lines:
        return log
    tail_start = len(all_lines) - lines
    bodies = [strip_prefix(line) for line in all_lines[:tail_start]]
    kept: list[tuple[int, int]] = []
    # the server's own arguments, printed once at start (SGLang: every one, the values it
    # chose included): a repair reads the value of a knob the config does not set there
    args = [i for i, b in enumerate(bodies) if b.startswith(_ARGS_LINES)]
    if args and budget > 0:
        budget -= 1
    else:
        args = []
    for start, end in _blocks(bodies):
        if budget <= 0:
            break
        end = min(end, start + budget)
        kept.append((start, end))
        budget -= end - start
    if args and not any(a <= args[-1] < b for a, b in kept):
        kept = sorted([*kept, (args[-1], args[-1] + 1)])
    out: list[str] = []
    at = 0
    for start, end in kept:
        if start > at:
            out.append(CUT.format(n=start - at))
        out.extend(all_lines[start:end])
        at = end
    if tail_start > at:
        out.append(CUT.format(n=tail_start - at))
    out.extend(all_lines[tail_start:])
    return "\n".join(out) + ("\n" if log.endswith("\n") else "")


_TELLING = re.compile(
    r"error|fail|exception|traceback|refused|denied|timed? ?out|status", re.IGNORECASE
)


def probe_excerpt(output: str, metric: str | None = None, *, last: int = 8, most: int = 30) -> str:
    """What a probe's output says, for the run's record: the lines that name its metric or
    an error or failure (a client's "Failed requests: 4", "Error 0: ..."), up to `most`,
    then its last `last` lines, in order, with `CUT` markers between."""
    lines = output.splitlines()
    rx = re.compile(metric) if metric else None
    tail_start = max(len(lines) - last, 0)
    picked = [
        i
        for i, line in enumerate(lines[:tail_start])
        if _TELLING.search(line) or (rx is not None and rx.search(line))
    ][:most]
    out: list[str] = []
    at = 0
    for i in [*picked, *range(tail_start, len(lines))]:
        if i > at:
            out.append(CUT.format(n=i - at))
        out.append(lines[i])
        at = i + 1
    return "\n".join(out)


def last_log_line(log: str, width: int = 200) -> str | None:
    """What a server that never became healthy was last doing: the last line its logger
    wrote (a line with a level/time/process prefix, shown without it), else the last line
    that says something; cut to `width`. A bare line printed by a library on import
    (vLLM's engine process prints "Triton is installed, but ..." as it starts) says less
    than the server's own last log line above it."""
    fallback = None
    for line in reversed(log.splitlines()):
        raw = line.strip()
        if not raw or is_cut_marker(raw):
            continue
        body = strip_prefix(line).strip()
        if body and body != raw:
            return body[:width]
        fallback = fallback or raw[:width]
    return fallback


def is_cut_marker(line: str) -> bool:
    return bool(_CUT_RE.match(line))


__all__ = ["CUT", "is_cut_marker", "keep_what_matters", "last_log_line", "probe_excerpt"]
