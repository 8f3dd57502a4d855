"""Reading a log's lines: what each line says once its prefixes are gone, the startup
phase it marks, and which lines of a huge log are worth reading at all."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.diagnosis.server_logs import (
    ARGS_MARKERS,
    PROFILES,
    RECORD_STARTS,
    RUN_TOGETHER_MIN,
    ServerProfile,
    profiles_for,
)
from orchestrator.diagnosis.verdicts import PHASE_ORDER, Phase

# ---------------------------------------------------------------------------------------
# Line prefixes: timestamps, ranks, worker tags. Stripped before anything else looks at a line.
# ---------------------------------------------------------------------------------------

# Each pattern removes one layer; they are applied repeatedly because layers nest, e.g.
# `(EngineCore_DP0 pid=223840) ERROR 10-25 13:08:43 [core.py:708] ...` or a journal line
# `Mar 12 10:00:00 host python3[1234]: [2025-03-29 18:18:34 TP0] ...`.
_PREFIXES: tuple[re.Pattern[str], ...] = (
    # journalctl -o short: "Mar 12 10:00:00 host unit[pid]: "
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.-]+ [\w@.:/-]+(?:\[\d+\])?: "),
    # docker logs --timestamps: "2025-11-10T09:50:25.135391208Z "
    re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z?\s"),
    # Python logging in a wrapper: "2024-01-22 14:32:27 | ERROR | stderr | " (fastchat,
    # loguru: "... | ERROR | mod:fn:12 - "), "2025-03-07 23:50:27,531 - __main__ - INFO - "
    re.compile(
        r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s*\|\s*[A-Z]+\s*\|\s*"
        r"[\w.:<>-]+\s*(?:\||-)\s?"
    ),
    # (the stamp in ISO form too: "2025-04-17T08:59:26+00:00 - gpustack.worker - ERROR - ")
    re.compile(
        r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? - "
        r"[\w.<>-]+ - [A-Z]+ - "
    ),
    # docker compose: "service-1  | "
    re.compile(r"^[\w.-]+\s+\|\s"),
    # CI log viewers: "  | [2025-03-10T15:07:20Z] "
    re.compile(r"^\s*\|\s"),
    re.compile(r"^\[\d{4}-\d\d-\d\dT[\d:.]+Z?\]\s"),
    # SGLang: "[2025-03-29 18:18:34 TP0] ", "[23:17:08 TP4] ", "[2025-11-17 20:37:08 DP3 TP3 EP3] "
    re.compile(r"^\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d+)?(?: [A-Z]{2,3}\d+)*\]\s?"),
    # SGLang without timestamp: "[TP0] "
    re.compile(r"^\[(?:[A-Z]{2,3}\d+ ?)+\]\s?"),
    # vLLM / Ray worker tags: "(VllmWorkerProcess pid=13109) ", "(EngineCore_DP0 pid=1) ",
    # "(VllmWorker rank=1 pid=2) ", "(RayWorkerWrapper pid=616, ip=192.168.149.15) ",
    # "(MapWorker(MapBatches(vLLMEngineActor)) pid=1202, ip=10.53.120.11) "
    re.compile(r"^\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*?\bpid=\d+[^)]*\)\s?"),
    # vLLM logger: "ERROR 05-07 02:14:18 [core.py:396] ", "INFO 08-19 07:51:03 x.py:732] "
    re.compile(
        r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d(?:-\d{4})? \d\d:\d\d:\d\d(?:\.\d+)? "
        r"\[?[\w./-]+:\d+\]\s?"
    ),
    # torch.distributed: "[rank0]: ", "[rank1]:[E1209 02:28:15.281862353 ProcessGroupNCCL.cpp:20] "
    re.compile(r"^\[rank\d+\]:\s?"),
    re.compile(r"^\[[EWIF]\d{4} \d\d:\d\d:\d\d(?:\.\d+)? (?:\d+ )?[\w.]+:\d+\]\s?"),
    # line-number prefixes of pasted logs: "[80746] "
    re.compile(r"^\[\d+\]\s(?=\[rank)"),
)


# Terminal colours (vLLM colours its process tags) and their syslog-escaped form (`#033[`).
_ANSI = re.compile(r"(?:\x1b|#033)\[[0-9;]*[A-Za-z]")


def strip_prefix(line: str) -> str:
    """The line without its timestamp / rank / worker prefixes."""
    body = line.rstrip("\r\n")
    if "\x1b" in body or "#033[" in body:
        body = _ANSI.sub("", body)
    if len(body) > 2 and body[0] == "`" and body[-1] == "`" and body[1] != "`":
        body = body[1:-1]  # a line quoted whole in markdown's backticks
    if not body or body[0] in " \t":
        return body  # continuation lines keep their indentation
    for _ in range(6):  # prefixes nest a few layers deep at most
        before = body
        for pattern in _PREFIXES:
            body = pattern.sub("", body, count=1)
        if body == before:
            break
    return body


# A record the server's logger wrote below ERROR (vLLM's "WARNING 12-01 10:00:00 [x.py:1]",
# glog's "[W1209 ...]", Python's "WARNING:name:") is advice: an exception it quotes
# ("fd limit errors like `OSError: [Errno 24] Too many open files`") is not one it raised.
_ADVICE_HEAD = re.compile(
    r"(?:^|[\s)\]])(?:DEBUG|INFO|WARNING|WARN) \d\d-\d\d|\[[WI]\d{4} |^(?:DEBUG|INFO|WARNING):"
)


class _Advice(str):
    """A line body the server logged below ERROR (see _ADVICE_HEAD)."""


def _body(line: str) -> str:
    body = strip_prefix(line)
    cut = line.find(body) if body else -1
    head = line[:cut] if cut > 0 else (line if not body else "")
    if head and _ADVICE_HEAD.search(head) or _ADVICE_HEAD.match(body):
        return _Advice(body)
    return body


_RUN_TOGETHER = re.compile(r"\s+(?=" + "|".join(f"(?:{p.pattern})" for p in RECORD_STARTS) + ")")


def _source_lines(text: str) -> list[str]:
    """Log lines, minus the `# source:` headers of recorded test logs; a line that holds
    several log records run together (a paste that lost its line breaks) is cut into them."""
    out: list[str] = []
    for line in text.splitlines():
        if line.startswith("# source:"):
            continue
        if len(line) >= RUN_TOGETHER_MIN and _RUN_TOGETHER.search(line, 1) is not None:
            begin = 0
            for m in _RUN_TOGETHER.finditer(line, 1):
                # a record start behind a mere prefix (a worker tag, a journal stamp) is
                # still the same record
                if strip_prefix(line[begin : m.end()]).strip():
                    out.append(line[begin : m.start()])
                    begin = m.end()
            out.append(line[begin:])
        else:
            out.append(line)
    return out


# ---------------------------------------------------------------------------------------
# Phases: the log's own progress, read with the markers of the server(s) it comes from
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseMarker:
    """A startup milestone: once a line matches `pattern`, the server has reached `phase`."""

    phase: Phase
    pattern: re.Pattern[str]


PHASE_MARKERS: tuple[PhaseMarker, ...] = tuple(
    PhaseMarker(m.phase, m.pattern)
    for m in (*ARGS_MARKERS, *(mk for prof in PROFILES for mk in prof.markers))
)


def _later(a: Phase | None, b: Phase | None) -> Phase | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if PHASE_ORDER[a] >= PHASE_ORDER[b] else b


def _phase_of_body(body: str, profiles: Sequence[ServerProfile]) -> Phase | None:
    """The phase a prefix-free line proves. A line two servers read differently (uvicorn's
    "Application startup complete": SGLang still warms up, vLLM serves) proves only the
    earlier of the two when the log does not say which server it is."""
    found: Phase | None = None
    for marker in ARGS_MARKERS:
        if marker.needle in body and marker.pattern.search(body):
            found = marker.phase
    if found is not None:
        return found
    per_server: list[Phase] = []
    for prof in profiles:
        here: Phase | None = None
        for marker in prof.markers:
            if marker.needle in body and marker.pattern.search(body):
                here = _later(here, marker.phase)
        if here is not None:
            per_server.append(here)
    return min(per_server, key=PHASE_ORDER.__getitem__) if per_server else None


def phase_of_line(line: str, profiles: Sequence[ServerProfile] | None = None) -> Phase | None:
    """The startup phase a log line proves the server has reached, or None."""
    return _phase_of_body(strip_prefix(line), profiles or profiles_for(line))


def last_milestone(lines: Sequence[str]) -> str | None:
    """The last startup milestone the log printed, by the marker's literal (`Capturing
    batches`, not the progress bar's numbers): what a server that fell silent was doing."""
    lines = [ln for ln in lines if not ln.startswith("# source:")]
    profiles = profiles_for("\n".join(lines[:400] + lines[-400:]))
    for line in reversed(lines[-5000:]):
        body = strip_prefix(line)
        for prof in profiles:
            for marker in reversed(prof.markers):
                if marker.needle in body and marker.pattern.search(body):
                    return marker.needle
    return None


def last_phase(lines: Iterable[str]) -> Phase | None:
    """The latest phase any of `lines` proves (phases only move forward)."""
    lines = [ln for ln in lines if not ln.startswith("# source:")]
    profiles = profiles_for("\n".join(lines[:400] + lines[-400:]))
    best: Phase | None = None
    for line in lines:
        best = _later(best, _phase_of_body(strip_prefix(line), profiles))
    return best


# ---------------------------------------------------------------------------------------
# Reading a log: bounded work on huge inputs, plain answers for non-logs
# ---------------------------------------------------------------------------------------

FULL_READ = 2_000_000  # characters read line by line; a longer log only at both ends
HEAD_READ = 300_000  # the startup milestones are at the start
TAIL_READ = 600_000  # the failure is at the end
_ANCHORS = ("Traceback (most recent call last)", "Error: ", "what():", "Watchdog", "imed out")
_ANCHOR_CAP = 50  # per anchor: a log that repeats it more often is noise there
_BLOCK = 60  # lines kept after an anchor (a traceback)


def _select_lines(text: str) -> tuple[list[str], int]:
    """The lines worth reading, and how many characters were skipped.

    A huge log is read whole only in its first HEAD_READ and last TAIL_READ characters; in
    between only the blocks that start at an error anchor are kept, so 50 MB of warnings
    cost a few string searches, not a regex per line.
    """
    if len(text) <= FULL_READ:
        return _source_lines(text), 0
    head_end = text.find("\n", HEAD_READ) + 1 or HEAD_READ
    cut = text.find("\n", len(text) - TAIL_READ)
    cut = len(text) - TAIL_READ if cut < 0 else cut + 1
    middle = text[head_end:cut]
    spans: list[tuple[int, int]] = []
    for needle in _ANCHORS:
        pos, hits = middle.find(needle), 0
        while pos >= 0 and hits < _ANCHOR_CAP:
            begin = middle.rfind("\n", 0, pos) + 1
            end = pos
            for _ in range(_BLOCK):
                nxt = middle.find("\n", end)
                if nxt < 0:
                    end = len(middle)
                    break
                end = nxt + 1
            spans.append((begin, end))
            pos, hits = middle.find(needle, end), hits + 1
    kept: list[str] = []
    for begin, end in _merge(sorted(spans)):
        kept.extend(middle[begin:end].splitlines())
    skipped = len(middle) - sum(e - b for b, e in _merge(sorted(spans)))
    return (_source_lines(text[:head_end]) + kept + _source_lines(text[cut:])), skipped


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for b, e in spans:
        if out and b <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((b, e))
    return out


_NON_SPACE = re.compile(r"\S")


def _not_a_log(text: str) -> str | None:
    """Why `text` cannot be a server log at all, or None."""
    if _NON_SPACE.search(text) is None:
        return "empty log: nothing to classify"
    sample = text[:65536]
    odd = sum(1 for ch in sample if ch == "\ufffd" or (ch < " " and ch not in "\n\r\t"))
    if "\x00" in sample or odd > len(sample) // 20:
        return "binary data, not a text log: nothing to classify"
    return None


__all__ = [
    "PHASE_MARKERS",
    "PhaseMarker",
    "last_milestone",
    "last_phase",
    "phase_of_line",
    "strip_prefix",
]
