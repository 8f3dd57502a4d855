"""Classification: from a server's log tail and a run's outcome to a verdict and a signature.

Pure and table-driven. Three tables drive everything:

- `PHASE_MARKERS`: the startup milestone lines SGLang and vLLM print, each tagged with the
  phase the server has reached once the line appears;
- `FRAME_PHASES`: function names in traceback frames that say where an exception was
  raised (used first, because a log *tail* may have lost its milestone lines);
- `ERROR_RULES`: regex rules naming an error class and its key message; the first rule (by
  priority) that matches an exception's text wins. Adding an error class is one line.

`analyze_log(text)` finds the root error of a log (the first real exception, not the
wrappers and the sigquit noise the other ranks print afterwards) and its `Signature`;
`judge(evidence, target)` turns a whole run's evidence into a `Verdict`.

Nothing here does I/O or prints; the CLI and the executor feed it text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.verdicts import Phase, Signature, Verdict

# ---------------------------------------------------------------------------------------
# Line prefixes: timestamps, ranks, worker tags. Stripped before anything else looks at a line.
# ---------------------------------------------------------------------------------------

# Each pattern removes one layer; they are applied repeatedly because layers nest, e.g.
# `(EngineCore_DP0 pid=223840) ERROR 10-25 13:08:43 [core.py:708] ...` or a journal line
# `Mar 12 10:00:00 host python3[1234]: [2025-03-29 18:18:34 TP0] ...`.
_PREFIXES: tuple[re.Pattern[str], ...] = (
    # journalctl -o short: "Mar 12 10:00:00 host unit[pid]: "
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.-]+ [\w@.:/-]+(?:\[\d+\])?: "),
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
    # "(WorkerDict pid=616, ip=192.168.149.159) "
    re.compile(r"^\((?:\w+) pid=\d+(?:, ip=[\d.]+)?\)\s"),
    # vLLM logger: "ERROR 05-07 02:14:18 [core.py:396] ",
    # "INFO 08-19 07:51:03 model_runner.py:732] "
    re.compile(
        r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? "
        r"\[?[\w.]+:\d+\]\s?"
    ),
    # torch.distributed: "[rank0]: "
    re.compile(r"^\[rank\d+\]:\s?"),
)

def strip_prefix(line: str) -> str:
    """The line without its timestamp / rank / worker prefixes."""
    body = line.rstrip("\r\n")
    for _ in range(6):  # prefixes nest a few layers deep at most
        before = body
        for pattern in _PREFIXES:
            body = pattern.sub("", body, count=1)
        if body == before:
            break
    return body


def _source_lines(text: str) -> list[str]:
    """Log lines, minus the `# source:` headers of recorded test logs."""
    return [line for line in text.splitlines() if not line.startswith("# source:")]


# ---------------------------------------------------------------------------------------
# Phases
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseMarker:
    """A startup milestone: once a line matches `pattern`, the server has reached `phase`."""

    phase: Phase
    pattern: re.Pattern[str]


def _m(phase: Phase, regex: str) -> PhaseMarker:
    return PhaseMarker(phase, re.compile(regex))


# Order inside the table does not matter: phase_of_line returns the latest phase a line
# proves. The strings are the ones SGLang (python/sglang/srt/...) and vLLM print.
PHASE_MARKERS: tuple[PhaseMarker, ...] = (
    # argparse prints the usage line and `prog: error: ...` before anything else runs
    _m(Phase.ARGS, r"^usage: \S+"),
    _m(Phase.ARGS, r"^[\w.-]+(?:\.py)?: error: "),
    # init: server args dump, distributed init
    _m(Phase.INIT, r"server_args=ServerArgs\("),
    _m(Phase.INIT, r"Init torch distributed begin"),
    _m(Phase.INIT, r"Init torch distributed ends"),
    _m(Phase.INIT, r"Initializing an? (?:V\d )?LLM engine"),
    _m(Phase.INIT, r"^non-default args: "),
    # weights
    _m(Phase.LOAD_WEIGHTS, r"Load weight begin\."),
    _m(Phase.LOAD_WEIGHTS, r"^Loading (?:safetensors|pt) checkpoint shards"),
    _m(Phase.LOAD_WEIGHTS, r"Starting to load model "),
    # after the weights, the next thing both servers do is size and allocate the KV cache
    _m(Phase.KV_CACHE, r"Load weight end\."),
    _m(Phase.KV_CACHE, r"Loading (?:model )?weights took "),
    _m(Phase.KV_CACHE, r"Model loading took "),
    _m(Phase.KV_CACHE, r"KV Cache is allocated\."),
    _m(Phase.KV_CACHE, r"Memory pool end\."),
    _m(Phase.KV_CACHE, r"is larger than the profiled value"),
    _m(Phase.KV_CACHE, r"# GPU blocks: "),
    _m(Phase.KV_CACHE, r"Available KV cache memory: "),
    _m(Phase.KV_CACHE, r"GPU KV cache size: "),
    _m(Phase.KV_CACHE, r"Memory profiling takes "),
    # CUDA graphs
    _m(Phase.CUDA_GRAPH, r"Capture cuda graph begin\."),
    _m(Phase.CUDA_GRAPH, r"Capture cuda graph bs "),
    _m(Phase.CUDA_GRAPH, r"Capturing batches "),
    _m(Phase.CUDA_GRAPH, r"Capturing the model for CUDA graphs"),
    _m(Phase.CUDA_GRAPH, r"Capturing cudagraphs for decoding"),
    _m(Phase.CUDA_GRAPH, r"Capturing CUDA graph"),
    # warmup: SGLang starts uvicorn, then sends its own warmup request before it declares
    # itself ready; so uvicorn's lines mean "warming up", not "serving", for SGLang.
    _m(Phase.WARMUP, r"Capture cuda graph end\."),
    _m(Phase.WARMUP, r"Graph capturing finished in "),
    _m(Phase.WARMUP, r"init engine \(profile, create kv cache, warmup model\) took"),
    _m(Phase.WARMUP, r"Started server process \["),
    _m(Phase.WARMUP, r"Waiting for application startup\."),
    _m(Phase.WARMUP, r"Application startup complete\."),
    _m(Phase.WARMUP, r"Uvicorn running on "),
    # serving
    _m(Phase.SERVING, r"The server is fired up and ready to roll!"),
    _m(Phase.SERVING, r"Starting vLLM API server"),
    _m(Phase.SERVING, r"^Available routes are:"),
)

_PHASE_ORDER = {phase: i for i, phase in enumerate(Phase.ordered())}


def phase_of_line(line: str) -> Phase | None:
    """The startup phase a log line proves the server has reached, or None."""
    body = strip_prefix(line)
    found: Phase | None = None
    for marker in PHASE_MARKERS:
        if marker.pattern.search(body) and (
            found is None or _PHASE_ORDER[marker.phase] > _PHASE_ORDER[found]
        ):
            found = marker.phase
    return found


def last_phase(lines: Iterable[str]) -> Phase | None:
    """The latest phase any of `lines` proves (phases only move forward)."""
    best: Phase | None = None
    for line in lines:
        if line.startswith("# source:"):
            continue
        phase = phase_of_line(line)
        if phase is not None and (best is None or _PHASE_ORDER[phase] > _PHASE_ORDER[best]):
            best = phase
    return best


@dataclass(frozen=True)
class FramePhase:
    """A function in a traceback frame that tells in which phase the exception was raised."""

    phase: Phase
    pattern: re.Pattern[str]


def _f(phase: Phase, regex: str) -> FramePhase:
    return FramePhase(phase, re.compile(regex))


# Matched against `File "...", line N, in FUNC` frames and the source line below them,
# innermost last; the innermost matching frame wins. Names are SGLang's and vLLM's.
FRAME_PHASES: tuple[FramePhase, ...] = (
    _f(Phase.INIT, r"\bin (?:init_torch_distributed|initialize_model_parallel|init_device)\b"),
    _f(Phase.LOAD_WEIGHTS, r"\bin (?:load_model|load_weights)\b"),
    _f(Phase.KV_CACHE, r"\bin (?:init_memory_pool|profile_max_num_token|_initialize_kv_caches)\b"),
    _f(Phase.KV_CACHE, r"\bin (?:determine_available_memory|check_enough_kv_cache_memory)\b"),
    _f(Phase.CUDA_GRAPH, r"cuda_graph_runner\.py\", line \d+, in "),
    _f(Phase.CUDA_GRAPH, r"\bin (?:init_cuda_graphs|init_device_graphs|capture_model)\b"),
    _f(Phase.WARMUP, r"\bin _wait_and_warmup\b"),
    _f(Phase.SERVING, r"\bin (?:event_loop_normal|event_loop_overlap|run_batch)\b"),
    _f(Phase.SERVING, r"\bin (?:forward_batch_generation|process_batch_result\w*)\b"),
)


# ---------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------

# Order matters: specific shapes before the generic number rule.
_NORMALIZERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:\.\d+)?\b"), "<time>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\(\d+(?:\.\d+)?/\d+(?:\.\d+)?\s?(?:[KMGTP]i?B)\)"), "(<size>)"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:[KMGTP]i?B|bytes|B)\b"), "<size>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<addr>"),
    (re.compile(r"(\.py\"?,? line |\.py:|\.cpp:|\.cu:|\.h:|line )\d+"), r"\1<n>"),
    (re.compile(r"\b(pid|PID|tid|rank|Rank|device|GPU|gpu|cuda:|TP|DP|EP|PP)[ =]?\d+\b"), r"\1<n>"),
    (re.compile(r"\[(?:[A-Z]{2,3}\d+ ?)+\]"), ""),
    (re.compile(r"-?\d+\.\d+"), "<num>"),
    (re.compile(r"-?\b\d{4,}\b"), "<n>"),
    (re.compile(r"\s+"), " "),
)


def normalize_message(text: str) -> str:
    """The message with everything that varies between ranks, days and hosts replaced."""
    out = strip_prefix(text)
    for pattern, repl in _NORMALIZERS:
        out = pattern.sub(repl, out)
    return out.strip()


# ---------------------------------------------------------------------------------------
# Error rules
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorRule:
    """One row of the error table.

    `message` is a `str.format` template over the match's named groups (plus `{0}` for
    the whole match); it names the bug and nothing that varies. `phase` forces the
    phase (argparse errors happen before any startup); `phase_hint` is used only when
    neither the traceback nor the milestones say where the error happened.
    """

    error_class: str
    pattern: re.Pattern[str]
    message: str = "{0}"
    priority: int = 50
    phase: Phase | None = None
    phase_hint: Phase | None = None
    options_only: bool = False  # keep only `--flag` words of the groups (drop flag values)

    def key_message(self, match: re.Match[str]) -> str:
        groups = {k: (v or "") for k, v in match.groupdict().items()}
        if self.options_only:
            groups = {k: " ".join(w for w in v.split() if w.startswith("-"))
                      for k, v in groups.items()}
        return self.message.format(match.group(0), **groups).strip()


def _r(error_class: str, regex: str, message: str = "{0}", **kw: object) -> ErrorRule:
    return ErrorRule(error_class, re.compile(regex), message, **kw)  # type: ignore[arg-type]


# Lower priority number = tried first. The table is the whole classifier's knowledge.
ERROR_RULES: tuple[ErrorRule, ...] = tuple(
    sorted(
        (
            _r("cublas", r"(?P<status>CUBLAS_STATUS_[A-Z_]+)(?: when calling `?(?P<fn>\w+))?",
               "{status} when calling {fn}", priority=10),
            _r("not_enough_memory",
               r"Not enough memory(?: to allocate KV cache)?\.(?: Please try to increase "
               r"--mem-fraction-static)?",
               "Not enough memory. Please try to increase --mem-fraction-static",
               priority=15, phase_hint=Phase.KV_CACHE),
            _r("cuda_oom", r"CUDA out of memory\.(?: Tried to allocate [\d.]+ ?[KMGT]i?B)?",
               priority=20),
            _r("cuda_oom", r"torch\.(?:cuda\.)?OutOfMemoryError", "CUDA out of memory.",
               priority=21),
            _r("illegal_address",
               r"an illegal memory access was encountered|cudaErrorIllegalAddress",
               "an illegal memory access was encountered", priority=25),
            _r("nccl", r"NCCL error:? (?:in: \S+ )?(?P<what>[^(\n]*?)\s*(?:\(run with |,|$)",
               "NCCL error: {what}", priority=30),
            _r("nccl", r"\b(?P<code>nccl(?:Internal|System|UnhandledCuda|InvalidUsage|Remote)"
               r"Error)\b", "{code}", priority=31),
            _r("nccl", r"Watchdog caught collective operation timeout",
               "Watchdog caught collective operation timeout", priority=32),
            _r("argparse", r"error: unrecognized arguments: (?P<args>.*)",
               "unrecognized arguments: {args}", priority=5, phase=Phase.ARGS,
               options_only=True),
            _r("argparse",
               r"error: ambiguous option: (?P<opt>--?[\w-]+)(?:=\S*)? could match (?P<m>.*)",
               "ambiguous option: {opt} could match {m}", priority=5, phase=Phase.ARGS),
            _r("argparse", r"error: argument (?P<arg>\S+?): invalid choice: '(?P<val>[^']*)'",
               "argument {arg}: invalid choice: '{val}'", priority=5, phase=Phase.ARGS),
            _r("argparse", r"error: argument (?P<arg>\S+?): expected one argument",
               "argument {arg}: expected one argument", priority=5, phase=Phase.ARGS),
            _r("argparse", r"error: the following arguments are required: (?P<args>.*)",
               "the following arguments are required: {args}", priority=5, phase=Phase.ARGS),
            _r("argparse", r"^[\w.-]+: error: (?P<msg>.*)", "{msg}", priority=6,
               phase=Phase.ARGS),
            _r("signal", r"Fatal Python error: (?P<what>Segmentation fault|Aborted|Bus error)",
               "Fatal Python error: {what}", priority=80),
            _r("signal", r"^Killed$", "Killed", priority=90),
        ),
        key=lambda rule: rule.priority,
    )
)

# Exceptions that wrap or report another failure: never the root of a crash.
WRAPPER_TYPES = frozenset(
    {"ChildProcessError", "SystemExit", "KeyboardInterrupt", "CancelledError", "EOFError"}
)
WRAPPER_MESSAGES: tuple[re.Pattern[str], ...] = (
    re.compile(r"Received sigquit from a child process"),
    re.compile(r"Engine core initialization failed"),
    re.compile(r"Engine process failed to start"),
    re.compile(r"EngineCore failed to start"),
    re.compile(r"^Exception in \w+:?$"),
    re.compile(r"Initialization failed\. warmup error"),
)

_TRACEBACK_RE = re.compile(r"Traceback \(most recent call last\):")
_FRAME_RE = re.compile(r'^\s*File "[^"]*", line \d+')
# "module.Type: message" or "Type" alone; types are CamelCase and end like exceptions do,
# or carry a dotted module path (torch.OutOfMemoryError, c10::Error via what() below).
_EXC_LINE_RE = re.compile(
    r"^(?P<type>(?:[A-Za-z_]\w*\.)*"
    r"(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)|Exception|Error))"
    r"(?::\s?(?P<msg>.*))?$"
)
_WHAT_RE = re.compile(r"^\s*what\(\):\s+(?P<msg>.*)$")
_SIGQUIT_RE = re.compile(r"Received sigquit from a child proces")


@dataclass(frozen=True)
class _Event:
    """An exception found in the log: where, what, and the traceback frames before it."""

    index: int  # line index of the exception line
    start: int  # first line of its traceback (or the line itself)
    exc_type: str | None
    text: str  # the exception line's body, prefix-free
    frames: tuple[str, ...]


def _find_events(bodies: Sequence[str]) -> list[_Event]:
    events: list[_Event] = []
    i = 0
    n = len(bodies)
    used: set[int] = set()
    while i < n:
        body = bodies[i]
        if _TRACEBACK_RE.search(body):
            start = i
            frames: list[str] = []
            j = i + 1
            # Frames are indented; carets and blank lines may sit between them. Logs
            # interleaved from several ranks may put another rank's line in between: skip
            # lines that cannot end a traceback (not an exception shape) for a short while.
            while j < n:
                b = bodies[j]
                if b.startswith((" ", "\t")) or not b.strip():
                    if _FRAME_RE.match(b):
                        frames.append(b.strip())
                    elif frames and b.strip():
                        frames[-1] = frames[-1] + " | " + b.strip()
                    j += 1
                    continue
                break
            if j < n and (m := _EXC_LINE_RE.match(bodies[j].strip())):
                events.append(_Event(j, start, m.group("type"), bodies[j].strip(), tuple(frames)))
                used.add(j)
                i = j + 1
                continue
            i = j
            continue
        i += 1
    # Exception-shaped lines and rule hits outside any traceback (a tail that lost its
    # traceback head, C++ `what():` lines, argparse errors, "Killed").
    for idx, body in enumerate(bodies):
        if idx in used:
            continue
        stripped = body.strip()
        # The line after a frame is the frame's source code (`raise RuntimeError(f"NCCL
        # error: ...")`), even when a copy of the log lost the indentation.
        if idx > 0 and _FRAME_RE.match(bodies[idx - 1]) or stripped.startswith("raise "):
            continue
        if (w := _WHAT_RE.match(body)) is not None:
            events.append(_Event(idx, idx, None, w.group("msg"), ()))
        elif (m := _EXC_LINE_RE.match(stripped)) is not None and m.group("msg") is not None:
            events.append(_Event(idx, idx, m.group("type"), stripped, ()))
        elif not body.startswith((" ", "\t")) and any(
            rule.pattern.search(stripped) for rule in ERROR_RULES
        ):
            events.append(_Event(idx, idx, None, stripped, ()))
    events.sort(key=lambda e: e.index)
    return events


def _short_type(exc_type: str) -> str:
    return exc_type.rsplit(".", 1)[-1]


def _is_wrapper(event: _Event) -> bool:
    if event.exc_type and _short_type(event.exc_type) in WRAPPER_TYPES:
        return True
    if event.exc_type and _short_type(event.exc_type).endswith("Warning"):
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


@dataclass(frozen=True)
class LogAnalysis:
    """What a log says about a failure.

    `phase` is the phase the server had reached when the root error happened (or the last
    phase reached at all, when there is no error). `error_class`, `message`, `raw_message`
    and `signature` are None when the log shows no failure. `excerpt` holds the root
    error's traceback and error lines, prefixes kept, for people to read.
    """

    phase: Phase | None
    error_class: str | None = None
    raw_message: str | None = None
    message: str | None = None
    excerpt: tuple[str, ...] = ()
    signature: Signature | None = None
    reached: Phase | None = None  # the last phase reached anywhere in the log
    errors_seen: int = 0  # exceptions found (all ranks, wrappers included)

    @property
    def failed(self) -> bool:
        return self.signature is not None


def classify_error(text: str) -> tuple[str, str, ErrorRule | None] | None:
    """(error class, key message, rule) for one exception text, by the rule table."""
    for rule in ERROR_RULES:
        m = rule.pattern.search(text)
        if m:
            return rule.error_class, rule.key_message(m), rule
    return None


def _classify_event(event: _Event, extra: Sequence[str]) -> tuple[str, str, ErrorRule | None]:
    # The rule table sees the exception line plus its continuation lines: CUDA's messages
    # often put the interesting part on the next line.
    hit = classify_error(event.text)
    if hit is None:
        for line in extra:
            hit = classify_error(line.strip())
            if hit is not None:
                break
    if hit is not None:
        return hit
    if event.exc_type:
        m = _EXC_LINE_RE.match(event.text)
        msg = (m.group("msg") if m else None) or ""
        return _short_type(event.exc_type), msg, None
    return "error", event.text, None


def _frame_phase(frames: Sequence[str]) -> Phase | None:
    for frame in reversed(frames):
        for hint in FRAME_PHASES:
            if hint.pattern.search(frame):
                return hint.phase
    return None


def _nearby_frames(bodies: Sequence[str], index: int, window: int = 80) -> list[str]:
    """Frames printed near an exception that has no traceback of its own.

    A tail often holds one rank's bare error line and another rank's traceback of the
    same failure (or a traceback whose head was cut). Frames above the error come first
    (innermost last, as in a traceback), then the ones below it.
    """
    before = [b.strip() for b in bodies[max(0, index - window) : index] if _FRAME_RE.match(b)]
    after = [b.strip() for b in bodies[index + 1 : index + 1 + window] if _FRAME_RE.match(b)]
    return after + before  # _frame_phase reads from the end: `before` wins when present


def analyze_log(text: str) -> LogAnalysis:
    """Find the root failure in a server log (any number of ranks) and its signature."""
    lines = _source_lines(text)
    bodies = [strip_prefix(line) for line in lines]
    reached = last_phase(lines)
    events = _find_events(bodies)
    roots = [e for e in events if not _is_wrapper(e)]
    if not roots:
        return LogAnalysis(phase=reached, reached=reached, errors_seen=len(events))

    # The first real exception is the root: ranks that fail because a peer died print
    # later, and chained tracebacks print the cause first.
    root = roots[0]
    extra = _continuation(bodies, root.index)
    error_class, key, rule = _classify_event(root, extra)

    phase: Phase | None
    if rule is not None and rule.phase is not None:
        phase = rule.phase
    else:
        frames = root.frames or tuple(_nearby_frames(bodies, root.index))
        phase = _frame_phase(frames) or last_phase(lines[: root.index + 1])
        if phase is None and rule is not None:
            phase = rule.phase_hint
        if phase is None:
            phase = Phase.INIT  # the process ran but printed no milestone yet
    message = normalize_message(key) if key else ""
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
    )


# ---------------------------------------------------------------------------------------
# Judging a run
# ---------------------------------------------------------------------------------------

HANG_MESSAGE = "no readiness before the deadline"

_SIGNAL_NAMES = {
    1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS",
    8: "SIGFPE", 9: "SIGKILL", 11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM",
}  # fmt: skip


def signal_name(value: str | int) -> str:
    """'KILL', 'SIGKILL', 9, '9/KILL' -> 'SIGKILL' (unknown values are kept as given)."""
    text = str(value).strip()
    if "/" in text:  # systemd's "status=9/KILL"
        text = text.split("/", 1)[1]
    if text.isdigit():
        return _SIGNAL_NAMES.get(int(text), f"signal {text}")
    text = text.upper()
    return text if text.startswith("SIG") else f"SIG{text}"


@dataclass(frozen=True)
class ProbeOutcome:
    """The optional load/benchmark probe run after the server became ready."""

    exit_code: int | None = None
    metric: float | None = None
    passed: bool | None = None  # None: no pass condition was evaluated
    condition: str | None = None  # the config's pass_if, e.g. ">= 3000"
    server_alive: bool = True  # checked after the probe


@dataclass(frozen=True)
class RunEvidence:
    """Everything the executor observed about one run, for `judge`."""

    log_tail: str = ""
    became_ready: bool = False
    died_after_ready: bool = False  # ready, then the unit/process went away
    exit_code: int | None = None
    exit_signal: str | int | None = None  # "KILL", "SIGKILL", 9
    unit_result: str | None = None  # systemd Result=: exit-code, signal, oom-kill, ...
    timed_out: bool = False
    last_phase: Phase | None = None  # tracked live from the log; the log is used otherwise
    invalid_reason: str | None = None  # preflight or read-back mismatch
    infra_error: str | None = None
    probe: ProbeOutcome | None = None


def _process_signature(evidence: RunEvidence, phase: Phase) -> Signature:
    """A signature from how the process ended, for crashes the log does not explain."""
    result = (evidence.unit_result or "").lower()
    if result == "oom-kill":
        return Signature(phase, "signal", "SIGKILL (oom-kill)")
    if evidence.exit_signal is not None:
        return Signature(phase, "signal", signal_name(evidence.exit_signal))
    if evidence.exit_code is not None and evidence.exit_code > 128:
        # shells and runtimes report death by signal N as 128+N
        return Signature(phase, "signal", signal_name(evidence.exit_code - 128))
    if evidence.exit_code is not None:
        return Signature(phase, "exit", f"exit status {evidence.exit_code}")
    return Signature(phase, "exit", result or "exited")


def _crash_signature(evidence: RunEvidence, analysis: LogAnalysis, phase: Phase) -> Signature:
    if analysis.signature is not None:
        return analysis.signature
    return _process_signature(evidence, phase)


def _verdict_for(sig: Signature, target: Signature | None) -> Verdict:
    if target is None or sig == target:
        return Verdict.FAIL
    return Verdict.OTHER


# Signals a server does not send itself when it crashes: SGLang's kill_process_tree sends
# SIGKILL to its own tree too, but only after a child's traceback is in the log.
OUTSIDE_SIGNALS = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP"})
_KILL_NOTICES = frozenset({"Killed", "Terminated"})
_PORT_CLASH_RE = re.compile(
    r"address already in use|EADDRINUSE|errno:? ?98\b|\[Errno 98\]", re.IGNORECASE
)


def _died_by_signal(evidence: RunEvidence) -> str | None:
    if evidence.exit_signal is not None:
        return signal_name(evidence.exit_signal)
    if evidence.exit_code is not None and evidence.exit_code > 128:
        return signal_name(evidence.exit_code - 128)
    return None


def port_clash(log: str) -> str | None:
    """'port clash: ...' with the log's own line, when the server could not bind an
    address because another process holds it."""
    m = _PORT_CLASH_RE.search(log)
    if m is None:
        return None
    start = log.rfind("\n", 0, m.start()) + 1
    end = log.find("\n", m.end())
    line = strip_prefix(log[start : end if end >= 0 else len(log)]).strip()[:200]
    return f"port clash: another process holds an address the server binds ({line})"


def outside_cause(evidence: RunEvidence) -> str | None:
    """Why a failed run says nothing about its config, or None.

    Two things end a run from outside the campaign: a port the server binds taken by
    another process (it binds late, after the port check), and a kill nobody in the
    campaign sent (a person, another tool, a host watchdog): the server died by SIGKILL,
    SIGTERM, SIGINT or SIGHUP and its log shows no failure of its own. Such runs are
    `infra`: retried, never cached, never a finding. The kernel's OOM killer, which
    systemd reports as `oom-kill`, stays a failure of the config.
    """
    if evidence.infra_error or evidence.invalid_reason:
        return None
    died = not evidence.became_ready and not evidence.timed_out
    died = died or evidence.died_after_ready or (
        evidence.probe is not None and not evidence.probe.server_alive)
    if not died:
        return None
    tail = evidence.log_tail[-200_000:]
    clash = port_clash(tail)
    if clash is not None:
        return f"{clash}; not a verdict about the config"
    sig = _died_by_signal(evidence)
    if sig in OUTSIDE_SIGNALS and (evidence.unit_result or "").lower() != "oom-kill":
        own = analyze_log(tail).signature
        # A shell's "Killed" line is the kill itself, not a failure of the server.
        if own is None or (own.error_class == "signal" and own.message in _KILL_NOTICES):
            return (f"the server was killed by {sig} from outside the campaign (its log shows "
                    "no failure of its own: a person, a watchdog, the kernel's OOM killer?); "
                    "not a verdict about the config")
    return None


def judge(evidence: RunEvidence, target: Signature | None) -> tuple[Verdict, Signature | None]:
    """The verdict of one run, and its failure signature (None for pass/invalid/infra).

    `target` is the campaign's target failure; None while judging the bad endpoint
    itself, in which case any failure (crash, hang, missed probe) is FAIL and its
    signature becomes the target.
    """
    if evidence.infra_error:
        return Verdict.INFRA, None
    if evidence.invalid_reason:
        return Verdict.INVALID, None
    if outside_cause(evidence) is not None:
        return Verdict.INFRA, None

    analysis = analyze_log(evidence.log_tail)
    reached = evidence.last_phase or analysis.reached or Phase.INIT

    if evidence.timed_out and not evidence.became_ready:
        # A log error during the wait is a crash that left the unit hanging; report it.
        if analysis.signature is not None:
            sig = analysis.signature
            return _verdict_for(sig, target), sig
        sig = Signature(reached, "hang", HANG_MESSAGE)
        if target is None or sig == target:
            return Verdict.FAIL, sig
        return Verdict.TIMEOUT, sig

    if not evidence.became_ready:
        sig = _crash_signature(evidence, analysis, reached)
        return _verdict_for(sig, target), sig

    probe = evidence.probe
    died = evidence.died_after_ready or (probe is not None and not probe.server_alive)
    if died:
        # The server crashed under load: a serving crash, named by the log's error.
        base = _crash_signature(evidence, analysis, Phase.SERVING)
        sig = Signature(Phase.SERVING, base.error_class, base.message)
        return _verdict_for(sig, target), sig

    if probe is None:
        return Verdict.PASS, None
    if probe.exit_code not in (None, 0):
        sig = Signature(Phase.PROBE, "probe_error", f"probe exit status {probe.exit_code}")
        return _verdict_for(sig, target), sig
    if probe.passed is False:
        bar = probe.condition or "its bar"
        sig = Signature(Phase.PROBE, "probe_threshold", f"metric missed {bar}")
        return _verdict_for(sig, target), sig
    return Verdict.PASS, None


__all__ = [
    "ERROR_RULES",
    "FRAME_PHASES",
    "HANG_MESSAGE",
    "OUTSIDE_SIGNALS",
    "PHASE_MARKERS",
    "ErrorRule",
    "FramePhase",
    "LogAnalysis",
    "PhaseMarker",
    "ProbeOutcome",
    "RunEvidence",
    "analyze_log",
    "classify_error",
    "judge",
    "last_phase",
    "normalize_message",
    "outside_cause",
    "phase_of_line",
    "port_clash",
    "signal_name",
    "strip_prefix",
]
