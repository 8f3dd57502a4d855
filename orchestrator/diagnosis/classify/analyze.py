"""`analyze_log`: the root failure of a server log and its signature."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.diagnosis.classify.lines import (
    _body,
    _later,
    _not_a_log,
    _phase_of_body,
    _select_lines,
)
from orchestrator.diagnosis.classify.normalize import (
    _mask_variable_quotes,
    first_sentence,
    message_words,
    names_itself,
    normalize_message,
)
from orchestrator.diagnosis.classify.rules import ErrorRule, classify_error
from orchestrator.diagnosis.classify.tracebacks import (
    _FRAME_RE,
    Frame,
    _classify_event,
    _common_site,
    _continuation,
    _Event,
    _events_by_process,
    _find_dumps,
    _frame_phase,
    _is_wrapper,
    _mid_line_errors,
    _site,
    _stuck_place,
    _untyped_error,
)
from orchestrator.diagnosis.server_logs import (
    KEY_WORDS,
    PHASE_HINTS,
    STOP_MARKERS,
    WRAPPED_CAUSES,
    ServerProfile,
    profiles_for,
)
from orchestrator.diagnosis.verdicts import Phase, Signature

#: Bumped whenever signatures of the same log change; stored runs are re-signed then.
SIGNATURE_VERSION = 9
KEY_LENGTH = 200  # characters of a normalized message kept in a signature


@dataclass(frozen=True)
class LogAnalysis:
    """What a log says about a failure.

    `phase` is the phase the server had reached when the root error happened (or the last
    phase reached at all, when there is no error). `error_class`, `message`, `raw_message`
    and `signature` are None when the log shows no failure. `excerpt` holds the root
    error's traceback and error lines, prefixes kept, for people to read. `site` is the
    place in the server's own code (file:function) that raised it or where it was stuck;
    `kind` is crash, hang or timeout; `note` explains an input that is not a server log.
    """

    phase: Phase | None
    error_class: str | None = None
    raw_message: str | None = None
    message: str | None = None
    excerpt: tuple[str, ...] = ()
    signature: Signature | None = None
    reached: Phase | None = None  # the last phase reached anywhere in the log
    errors_seen: int = 0  # exceptions found (all ranks, wrappers included)
    site: str | None = None
    kind: str | None = None
    server: str | None = None
    note: str | None = None

    @property
    def failed(self) -> bool:
        return self.signature is not None


FRESH_LINES = 3  # a milestone this close above a traceback was being printed when it failed


def _fresh_progress(
    bodies: Sequence[str],
    progress: Sequence[Phase | None],
    start: int,
    profiles: Sequence[ServerProfile],
) -> Phase | None:
    """The phase of a milestone printed right above line `start` (blank lines and other
    processes' lines aside), or None."""
    seen = 0
    for i in range(start - 1, -1, -1):
        body = bodies[i].strip()
        if not body:
            continue
        phase = _phase_of_body(bodies[i], profiles)
        if phase is not None:
            return progress[i] if i < len(progress) else phase
        seen += 1
        if seen >= FRESH_LINES:
            return None
    return None


def _stopped_at(bodies: Sequence[str]) -> int | None:
    """The line where the server says it was told to stop (server_logs.STOP_MARKERS)."""
    for i, body in enumerate(bodies):
        if any(p.search(body) for p in STOP_MARKERS):
            return i
    return None


def _hang_before_kill(roots: Sequence[_Event], bodies: Sequence[str]) -> _Event | None:
    """A hang or timeout report when the first error is only the kill that ended it (a
    watchdog's SIGKILL, `Killed`, `Aborted`): the server is named by what it waited on."""
    first = classify_error(roots[0].text)
    if first is None or first[0] not in ("signal", "child_died"):
        return None
    for e in roots[1:]:
        hit = classify_error(e.text)
        if hit is not None and hit[2] is not None and hit[2].kind in ("hang", "timeout"):
            return e
    return None


def _root_error(
    root: _Event, events: Sequence[_Event], bodies: Sequence[str]
) -> tuple[list[str], str, str, ErrorRule | None]:
    """The root error's continuation lines, then its error class, key message and rule:
    its own, else those of the error a wrapper quotes, else (a bare exception type) those
    of the exception it caused."""
    extra = _continuation(bodies, root.index)
    error_class, key, rule = _classify_event(root, extra, bodies)
    if _is_wrapper(root) or rule is None:
        # only the wrapper was printed, or the error was re-raised with the wrapper's words
        # in front of its own ("Error in model execution (input dumped to ...): ..."): the
        # error it quotes, if any, is the failure
        inner = next(
            (m.group("inner") for p in WRAPPED_CAUSES if (m := p.search(root.text)) is not None),
            None,
        )
        if inner and inner.strip("'\" "):
            hit = classify_error(inner)
            error_class, key, rule = hit if hit is not None else (error_class, inner, None)
    if not key and rule is None:
        # a bare `TimeoutError` / `AssertionError`: the exception it caused says what it was
        for later in events:
            if later.chain == root.chain and later.index > root.index:
                hit = classify_error(later.text)
                if hit is not None:
                    error_class, key, rule = hit
                    break
    return extra, error_class, key, rule


def _frames_of(
    root: _Event, events: Sequence[_Event], bodies: Sequence[str], kind: str
) -> tuple[tuple[Frame, ...], tuple[Frame, ...]]:
    """The frames that tell where the root error happened, and those of its whole chain."""
    # Frames that tell where: the root's own, else those of the traceback printed for the
    # same failure right after it (a bare CUDA or C++ error line, then Python's report).
    frames = root.frames
    if not frames:
        later = [
            e for e in events if e.index > root.index and e.frames and e.index - root.index <= 200
        ]
        if later and kind == "crash":
            frames = later[0].frames
        elif kind == "crash":
            # a traceback the tail cut before its exception line still says where
            frames = tuple(
                (fm.group("file"), fm.group("func"))
                for body in bodies[root.index + 1 : root.index + 200]
                if (fm := _FRAME_RE.match(body)) is not None
            )
    chain_frames = tuple(f for e in events if e.chain == root.chain for f in e.frames)
    return frames, chain_frames


def _message(
    key: str, rule: ErrorRule | None, kind: str, error_class: str, site: str | None
) -> str:
    """The signature's message: the key message normalized, cut to its name, with the
    place in the server's own code unless the words name the failure themselves."""
    message = normalize_message(key) if key else ""
    if rule is None:
        message = first_sentence(message_words(message))
        words = message.split(" ")
        if len(words) > KEY_WORDS:
            message = " ".join(words[:KEY_WORDS]).rstrip(",;:") + "..."
    if len(message) > KEY_LENGTH:
        # what follows is a dump (supported architectures, a request, a config) that
        # changes with versions and inputs; the bug is named by the start
        message = message[:KEY_LENGTH].rstrip() + "..."
    specific = kind == "crash" and names_itself(error_class, message)
    if specific:
        # a message in the server's own words quotes what the user gave it (a model
        # path or repo id, an architecture, a file): the words name the failure
        message = _mask_variable_quotes(message)
    if site and not specific:
        message = f"{message} @ {site}" if message else f"@ {site}"
    return message


def analyze_log(text: str) -> LogAnalysis:
    """Find the root failure in a server log (any number of ranks) and its signature."""
    why = _not_a_log(text)
    if why is not None:
        return LogAnalysis(phase=None, note=why)
    lines, skipped = _select_lines(text)
    bodies = [_body(line) for line in lines]
    profiles = profiles_for("\n".join(lines[:300] + lines[-300:]))
    progress: list[Phase | None] = []
    best: Phase | None = None
    for body in bodies:
        best = _later(best, _phase_of_body(body, profiles))
        progress.append(best)
    reached = best
    events = _events_by_process(lines, bodies) or _mid_line_errors(bodies)
    if not events and reached is None:
        events = _untyped_error(bodies)
    stop = _stopped_at(bodies)
    if stop is not None:
        # told to stop (SIGTERM): what it prints from then on is its shutdown
        events = [e for e in events if e.start < stop]
    # a wrapper is the root only when the cause was never printed (killed without a word)
    roots = [e for e in events if not _is_wrapper(e)] or events
    server = profiles[0].name if len(profiles) == 1 else None
    if not roots:
        note = None
        if reached is None and not events:
            size = f"{len(text) / 1e6:.1f} MB" if len(text) >= 100_000 else f"{len(lines)} lines"
            note = (
                f"no failure and no server startup line found in {size}"
                + (
                    f" ({skipped / 1e6:.0f} MB in the middle only searched for errors)"
                    if skipped
                    else ""
                )
                + ": is this a server log?"
            )
        return LogAnalysis(
            phase=reached, reached=reached, errors_seen=len(events), server=server, note=note
        )

    # The first real error is the root: ranks that fail because a peer died print later,
    # and chained tracebacks print the cause first.
    root = _hang_before_kill(roots, bodies) or roots[0]
    extra, error_class, key, rule = _root_error(root, events, bodies)
    kind = rule.kind if rule is not None else "crash"

    frames, chain_frames = _frames_of(root, events, bodies, kind)

    site: str | None
    dump_frames: tuple[Frame, ...] = ()
    peer_frames: list[Frame] = []
    if kind == "crash":
        site = _common_site(root, frames, (error_class, key), roots, bodies, peer_frames, events)
    else:
        site, dump_frames = _stuck_place(_find_dumps(bodies), root.index)
        if site is None:
            site = _site(frames)
    at_root = progress[root.index] if root.index < len(progress) else reached

    phase: Phase | None
    if rule is not None and rule.phase is not None:
        phase = rule.phase
    else:
        phase = (
            _frame_phase(frames or chain_frames, profiles, at_root)
            or _frame_phase(chain_frames + dump_frames + tuple(peer_frames), profiles, at_root)
            or at_root
        )
        fresh = _fresh_progress(bodies, progress, root.start, profiles)
        if fresh is not None and _later(fresh, phase) is fresh and fresh is not phase:
            # the server was printing its own progress of a later phase when it failed
            # (a capture progress bar, then the traceback): the stack's startup function
            # is the one that runs that phase too (vLLM captures inside its KV-cache init)
            phase = fresh
        if phase is None and rule is not None:
            phase = rule.phase_hint
        if phase is None:
            # the error's own words, or the wrapper printed right after it, may say
            said = [key or "", root.text] + [
                e.text for e in events if 0 < e.index - root.index <= 5
            ]
            phase = next((ph for ph, pat in PHASE_HINTS if any(pat.search(t) for t in said)), None)
        if phase is None:
            phase = Phase.INIT  # the process ran but printed no milestone yet
    message = _message(key, rule, kind, error_class, site)
    excerpt = tuple(line.rstrip() for line in lines[root.start : root.index + 1])
    excerpt += tuple(lines[root.index + 1 : root.index + 1 + len(extra)])
    return LogAnalysis(
        phase=phase,
        error_class=error_class,
        raw_message=key,
        message=message,
        excerpt=excerpt,
        signature=Signature(phase, error_class, message),
        reached=reached,
        errors_seen=len(events),
        site=site,
        kind=kind,
        server=server,
    )


__all__ = [
    "SIGNATURE_VERSION",
    "LogAnalysis",
    "analyze_log",
]
