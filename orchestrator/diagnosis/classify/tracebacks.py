"""Tracebacks and stack dumps: the errors a log shows (by process, chained or not), the
frames before each, and the place in the server's own code a failure or a hang is at."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.diagnosis.classify.lines import _Advice
from orchestrator.diagnosis.classify.normalize import normalize_message
from orchestrator.diagnosis.classify.rules import (
    ERROR_RULES,
    WRAPPER_MESSAGES,
    WRAPPER_TYPES,
    ErrorRule,
    _needles,
    classify_error,
)
from orchestrator.diagnosis.server_logs import (
    ARGS_FILES,
    ARGS_FRAMES,
    GENERIC_HEADERS,
    PASS_THROUGH,
    QUOTED_MESSAGES,
    SPECIFIC_WORDS,
    UNTYPED_ERROR,
    ServerProfile,
    own_file,
)
from orchestrator.diagnosis.verdicts import Phase

_TRACEBACK_RE = re.compile(r"Traceback \(most recent call last\):")
_CHAIN_RE = re.compile(
    r"During handling of the above exception|The above exception was the "
    r"direct cause of the following exception"
)
_FRAME_RE = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+, in (?P<func>\S+)')
# "module.Type: message" or "Type" alone; types are CamelCase and end like exceptions do,
# or live in an `errors` module (triton.runtime.errors.OutOfResources).
_EXC_LINE_RE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)|"
    r"Exception|Error)|(?:[a-z_]\w*\.)+errors?\.[A-Z]\w*)(?::\s?(?P<msg>.*))?$"
)
_WHAT_RE = re.compile(r"^\s*what\(\):\s+(?P<msg>.*)$")
# An exception line quoted whole inside a sentence, between quotes or backticks
# (in double quotes the line may hold backticks of its own: "... a `model_type` key ...")
_QUOTED_EXC_LINE = re.compile(
    r"(?:[\u201c\"]\s*(?P<dq>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): [^\u201c\u201d\"]+?)"
    r"\s*[\u201d\"]|`\s*(?P<bq>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): [^`]+?)\s*`)"
)
_SIGQUIT_RE = re.compile(r"Received sigquit from a child proces|SIGQUIT received")
_CARETS_RE = re.compile(r"^\s*[\^~]+\s*$")

# Stack dumps printed when a process hangs: faulthandler and py-spy (innermost first).
_FAULT_THREAD_RE = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\)")
_FAULT_FRAME_RE = re.compile(r'^\s+File "(?P<file>[^"]+)", line \d+ in (?P<func>\S+)')
_SPY_THREAD_RE = re.compile(r'^Thread (?:0x[0-9a-fA-F]+|\d+) \((?:\w+)\): "(?P<name>[^"]*)"')
_SPY_FRAME_RE = re.compile(r"^\s+(?P<func>[\w<>.]+) \((?P<file>[^():]+):\d+\)\s*$")

Frame = tuple[str, str]  # path, function


@dataclass
class _Event:
    """An error found in the log: where, what, and the traceback frames before it."""

    index: int  # line index of the exception line
    start: int  # first line of its traceback (or the line itself)
    exc_type: str | None
    text: str  # the exception line's body, prefix-free
    frames: tuple[Frame, ...]  # innermost last
    chain: int  # events of one chained traceback share this
    untyped: bool = False  # a message quoted without its exception type


@dataclass(frozen=True)
class _Dump:
    index: int
    thread: str
    frames: tuple[Frame, ...]  # innermost last, like a traceback


# Details that name their own error class (pydantic's "Value error, ..."): a report that
# quotes that line without its "N validation error for X" header still names the error.
_LONE_DETAILS = tuple(gh for gh in GENERIC_HEADERS if gh.classes)


def _lone_detail(bodies: Sequence[str], idx: int) -> tuple[str, str] | None:
    """(error class, exception text) of a self-naming detail line printed without its
    generic header above it, or None."""
    body = bodies[idx]
    if "," not in body:
        return None
    for gh in _LONE_DETAILS:
        d = gh.detail.match(body)
        if d is None or d.groupdict().get("kind") not in (gh.classes or {}):
            continue
        if any(gh.header.search(b) for b in bodies[max(0, idx - gh.within) : idx]):
            return None  # the header's own event reads it
        klass = (gh.classes or {})[d.group("kind")]
        return klass, f"{klass}: {d.group('msg')}"
    return None


# An exception line that a sentence runs into ("... deploying fails with ValueError: ..."),
# read only when the log shows no error line of its own.
_MID_LINE_EXC = re.compile(
    r"(?<=[\s(])(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): \S.*)$"
)
# or its repr, as a wrapper prints the exception it caught ("Runner failed with exception:
# RuntimeError('Cannot find any model weights with ...')")
_EXC_REPR = re.compile(
    r"(?<![\w.])(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception))"
    r"\((?P<q>['\"])(?P<msg>.+?)(?P=q)\)"
)


def _mid_line_errors(bodies: Sequence[str]) -> list[_Event]:
    found: list[tuple[int, str]] = []
    for i, body in enumerate(bodies):
        if isinstance(body, _Advice) or not ("rror" in body or "xception" in body):
            continue
        if (m := _MID_LINE_EXC.search(body)) is not None:
            text = m.group("exc").rstrip()
            if (
                body[m.start() - 1] == "("
                and text.endswith(")")
                and text.count(")") > text.count("(")
            ):
                text = text[:-1]  # "(RuntimeError: ...)": the parenthesis is the sentence's
            found.append((i, text))
        elif (r := _EXC_REPR.search(body)) is not None:
            found.append((i, f"{r.group('type')}: {r.group('msg')}"))
    return [
        _Event(i, i, m.group("type") if (m := _EXC_LINE_RE.match(text)) else None, text, (), n)
        for n, (i, text) in enumerate(found, start=1)
    ]


def _untyped_error(bodies: Sequence[str]) -> list[_Event]:
    """The first line that reads as an error message quoted without its exception type
    (server_logs.UNTYPED_ERROR), or the message a sentence quotes; for a text that shows no
    error line and no milestone at all."""
    for i, body in enumerate(bodies):
        if isinstance(body, _Advice) or not body.strip():
            continue
        # (text, whether its place says it is an error): an error answer's `message` is one
        found = [
            (next(g for g in m.groups() if g).strip(), n == 0)
            for n, pattern in enumerate(QUOTED_MESSAGES)
            for m in pattern.finditer(body)
        ]
        for text, known in [*found, (body.strip(), False)]:
            if len(text.split()) >= SPECIFIC_WORDS and (known or UNTYPED_ERROR.search(text)):
                return [_Event(i, i, None, text, (), 1, untyped=True)]
    return []


def _find_events(bodies: Sequence[str]) -> list[_Event]:
    events: list[_Event] = []
    frames: list[Frame] = []
    start: int | None = None
    last_frame = -2
    chain = 0
    linked = False
    for idx, body in enumerate(bodies):
        stripped = body.strip()
        if not stripped:
            continue
        if "Traceback (most recent call last):" in body:
            frames, start = [], idx
            continue
        if "above exception" in body and _CHAIN_RE.search(body):
            linked = True
            continue
        if (fm := _FRAME_RE.match(body)) is not None:
            if start is None:  # a traceback quoted without its header line
                start = idx
            frames.append((fm.group("file"), fm.group("func")))
            last_frame = idx
            continue
        if (w := _WHAT_RE.match(body)) is not None:
            events.append(_Event(idx, idx, None, w.group("msg"), (), chain := chain + 1))
            continue
        if (lone := _lone_detail(bodies, idx)) is not None:
            events.append(_Event(idx, idx, lone[0], lone[1], (), chain := chain + 1))
            frames, start, linked = [], None, False
            continue
        # The line after a frame is the frame's source code (`raise RuntimeError(f"NCCL
        # error: ...")`), even when a copy of the log lost the indentation; indented lines
        # inside a traceback are source continuation lines and carets.
        if _CARETS_RE.match(body) or stripped.startswith("raise "):
            continue
        if idx == last_frame + 1 and not (body[0] not in " \t" and _EXC_LINE_RE.match(stripped)):
            continue
        if body[0] in " \t":
            if frames:
                continue
            if (m := _EXC_LINE_RE.match(stripped)) is None:
                continue
        m = _EXC_LINE_RE.match(stripped)
        if m is not None and (m.group("msg") is not None or frames):
            if not linked:
                chain += 1
            events.append(
                _Event(
                    idx,
                    start if start is not None else idx,
                    m.group("type"),
                    stripped,
                    tuple(frames),
                    chain,
                )
            )
            frames, start, linked = [], None, False
            continue
        if not isinstance(body, _Advice) and (q := _QUOTED_EXC_LINE.search(stripped)) is not None:
            # a sentence that quotes the exception line ("I get “RuntimeError: ...”")
            text = (q.group("dq") or q.group("bq")).rstrip()
            m = _EXC_LINE_RE.match(text)
            events.append(
                _Event(idx, idx, m.group("type") if m else None, text, (), chain := chain + 1)
            )
            continue
        if _needles(stripped) and any(r.pattern.search(stripped) for r in ERROR_RULES):
            events.append(_Event(idx, idx, None, stripped, (), chain := chain + 1))
    return events


# vLLM tags every line with its process: "(VllmWorker rank=1 pid=2445156) ". Two processes
# failing at once interleave their tracebacks line by line; read each process on its own.
_PROCESS_TAG = re.compile(r"\(((?:[^()]|\([^()]*\))*?\bpid=\d+[^)]*)\)")


def _events_by_process(lines: Sequence[str], bodies: Sequence[str]) -> list[_Event]:
    tags: list[str] = []
    for line in lines:
        m = _PROCESS_TAG.search(line, 0, 160) if "pid=" in line[:160] else None
        tags.append(m.group(1) if m is not None else "")
    if len(set(tags)) <= 2:  # one process, or one plus untagged lines: read as printed
        return _find_events(bodies)
    streams: dict[str, list[int]] = {}
    for idx, tag in enumerate(tags):
        streams.setdefault(tag, []).append(idx)
    events: list[_Event] = []
    chain_base = 0
    for indices in streams.values():
        found = _find_events([bodies[i] for i in indices])
        for e in found:
            events.append(
                _Event(
                    indices[e.index],
                    indices[e.start],
                    e.exc_type,
                    e.text,
                    e.frames,
                    e.chain + chain_base,
                )
            )
        chain_base += 1 + max((e.chain for e in found), default=0)
    events.sort(key=lambda e: e.index)
    return events


def _find_dumps(bodies: Sequence[str]) -> list[_Dump]:
    dumps: list[_Dump] = []
    i, n = 0, len(bodies)
    while i < n:
        body = bodies[i]
        spy = _SPY_THREAD_RE.match(body)
        if spy is not None or _FAULT_THREAD_RE.match(body):
            frame_re = _SPY_FRAME_RE if spy is not None else _FAULT_FRAME_RE
            name = spy.group("name") if spy is not None else body.split(" (", 1)[0]
            j, stack = i + 1, []
            while j < n:
                fm = frame_re.match(bodies[j])
                if fm is None and j + 1 < n and not _SPY_THREAD_RE.match(bodies[j]):
                    fm = frame_re.match(bodies[j + 1])  # another process's line in between
                    j += fm is not None
                if fm is None:
                    break
                stack.append((fm.group("file"), fm.group("func")))
                j += 1
            if stack:
                dumps.append(_Dump(i, name, tuple(reversed(stack))))
            i = j
            continue
        i += 1
    return dumps


def _short_type(exc_type: str) -> str:
    return exc_type.rsplit(".", 1)[-1]


def _is_wrapper(event: _Event) -> bool:
    if event.exc_type:
        short = _short_type(event.exc_type)
        if short in WRAPPER_TYPES or short.endswith("Warning"):
            return True
    return any(p.search(event.text) for p in WRAPPER_MESSAGES)


def _continuation(bodies: Sequence[str], index: int, limit: int = 4) -> list[str]:
    """Lines that continue an exception message (CUDA's hints, SGLang's 'Possible solutions')."""
    out: list[str] = []
    for body in bodies[index + 1 : index + 1 + limit]:
        if not body.strip() or _TRACEBACK_RE.search(body) or _SIGQUIT_RE.search(body):
            break
        if _FRAME_RE.match(body):
            break
        out.append(body.rstrip())
    return out


def _detail(event: _Event, bodies: Sequence[str]) -> tuple[str, str | None] | None:
    """(key, error class or None) of an error whose own line is a generic header
    (server_logs.GENERIC_HEADERS), from the line that names the real error; or None."""
    for gh in GENERIC_HEADERS:
        head = gh.header.search(event.text)
        if head is None:
            continue
        if gh.direction == "same":
            m = gh.detail.search(event.text, head.end())
            if m is not None:
                groups = {k: (v or "") for k, v in (head.groupdict() | m.groupdict()).items()}
                return gh.template.format(**groups).strip(), (gh.classes or {}).get(
                    groups.get("kind", "")
                )
            continue
        if gh.direction == "after":
            span = range(event.index + 1, min(len(bodies), event.index + 1 + gh.within))
        else:  # the cause printed first: the earliest one in the window
            span = range(max(0, event.index - gh.within), event.index)
        for i in span:
            body = bodies[i]
            if gh.direction == "after" and (_TRACEBACK_RE.search(body) or _FRAME_RE.match(body)):
                break
            m = gh.detail.search(body)
            if m is None:
                continue
            groups = {k: (v or "") for k, v in (head.groupdict() | m.groupdict()).items()}
            if not groups.get("msg", "").strip():  # "Last error:" alone: the cause is next
                nxt = next((b.strip() for b in bodies[i + 1 : i + 3] if b.strip()), "")
                if not nxt:
                    continue
                groups["msg"] = nxt
            klass = (gh.classes or {}).get(groups.get("kind", ""))
            return gh.template.format(**groups).strip(), klass
    return None


def _classify_event(
    event: _Event, extra: Sequence[str], bodies: Sequence[str] = ()
) -> tuple[str, str, ErrorRule | None]:
    # The rule table sees the exception line plus its continuation lines: CUDA's messages
    # often put the interesting part on the next line.
    hit = classify_error(event.text)
    if hit is None:
        for line in extra:
            hit = classify_error(line.strip())
            if hit is not None:
                break
    found = _detail(event, bodies) if bodies else None
    if found is not None:
        key, klass = found
        named = classify_error(key)  # the real error may be one the rules know
        if named is not None and named[2] is not None and named[2].phase is None:
            return named
        if hit is not None:
            return klass or hit[0], key, hit[2]
        return klass or (_short_type(event.exc_type) if event.exc_type else "error"), key, None
    if hit is not None:
        return hit
    if event.exc_type:
        m = _EXC_LINE_RE.match(event.text)
        msg = ((m.group("msg") if m else None) or "").strip()
        if not msg and extra:
            # a message that starts with a newline ("ImportError: " then the text): its
            # first line names the error
            msg = extra[0].strip()
        return _short_type(event.exc_type), msg, None
    return ("untyped" if event.untyped else "error"), event.text, None


def _site(frames: Sequence[Frame], *, loose: bool = False, depth: int = 1) -> str | None:
    """The innermost frames (up to `depth`) in the server's own code that do more than pass
    a call on, innermost first (`sglang/flashinfer_backend.py:forward_extend`). One frame
    by default: the callers above it differ between ranks of one failure (a rank's
    traceback printed cut short, another path into the same kernel)."""
    found: list[str] = []
    for path, func in reversed(frames):
        name = own_file(path, loose=loose)
        if name is not None and not PASS_THROUGH.match(func):
            found.append(f"{name}:{func}")
            if len(found) == depth:
                break
    return " < ".join(found) or None


# An exception whose message quotes another one ("Capture cuda graph failed: RuntimeError:
# CUDA error: ...") re-raises it: its frames are where it was caught, not where it happened.
_QUOTED_EXC = re.compile(r":\s(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception):\s")


def _reraise(event: _Event, chain_head: dict[int, int]) -> bool:
    """True when `event` only reports an exception raised before it: a later link of a
    chained traceback, or a message quoting another exception."""
    return chain_head.get(event.chain, event.index) != event.index or bool(
        _QUOTED_EXC.search(event.text)
    )


def _common_site(
    root: _Event,
    frames: Sequence[Frame],
    what: tuple[str, str],
    roots: Sequence[_Event],
    bodies: Sequence[str],
    peer_frames: list[Frame],
    events: Sequence[_Event] = (),
) -> str | None:
    """The place most ranks report the root error from (ties: the first by name); the
    frames of those other ranks' reports go to `peer_frames`.

    With an asynchronous CUDA error every rank prints its own traceback, and which rank
    prints first changes from run to run; the place most of them name does not. Reports
    that raised the error count before reports that re-raise it (a wrapper's frames say
    where it was caught): so the place does not depend on which of them the log kept.
    """
    chain_head: dict[int, int] = {}
    for e in events or roots:
        chain_head.setdefault(e.chain, e.index)
    direct: dict[str, int] = {}
    caught: dict[str, int] = {}
    if (own := _site(frames)) is not None:
        tally = caught if _reraise(root, chain_head) and frames is root.frames else direct
        tally[own] = 1
    for peer in roots:
        if peer is root or not peer.frames or not 0 < abs(peer.index - root.index) <= 5000:
            continue
        error_class, key, _rule = _classify_event(peer, _continuation(bodies, peer.index), bodies)
        if (error_class, normalize_message(key)) != (what[0], normalize_message(what[1])):
            continue
        peer_frames.extend(peer.frames)
        if (site := _site(peer.frames)) is not None:
            tally = caught if _reraise(peer, chain_head) else direct
            tally[site] = tally.get(site, 0) + 1
    votes = direct or caught
    if not votes:
        return None
    return min(votes, key=lambda s: (-votes[s], s))


def _frame_phase(
    frames: Sequence[Frame], profiles: Sequence[ServerProfile], progress: Phase | None
) -> Phase | None:
    """The phase the stack says: a startup function on it (innermost wins), else the
    serving loop (warmup or serving: the log's progress tells which)."""
    for path, func in reversed(frames):
        if own_file(path) is None:
            continue  # the caller's own code ("load_model" in a demo script) says nothing
        for prof in profiles:
            for phase, pattern in prof.startup_frames:
                if pattern.match(func):
                    return phase
        if ARGS_FRAMES.match(func) and ARGS_FILES.search(path):
            return Phase.ARGS
    if any(prof.loop_frames.match(func) for _p, func in frames for prof in profiles):
        return progress if progress in (Phase.WARMUP, Phase.SERVING) else Phase.SERVING
    return None


def _stuck_place(dumps: Sequence[_Dump], after: int) -> tuple[str | None, tuple[Frame, ...]]:
    """Where a hung server sat, from the first stack dump near the hang report."""
    near = [d for d in dumps if d.index >= after - 200] or list(dumps)
    if not near:
        return None, ()

    def rank(d: _Dump) -> int:
        watchdog = any("watchdog" in f or "dump" in f for _p, f in d.frames)
        main = d.thread == "MainThread" or d.thread.startswith("Current thread")
        return (2 if watchdog else 0) + (0 if main else 1)

    best = min(near[:32], key=rank)
    return _site(best.frames, loose=True), best.frames
