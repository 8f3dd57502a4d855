"""Classification: from a server's log tail and a run's outcome to a verdict and a signature.

Pure and table-driven. The knowledge lives in tables:

- `orchestrator.diagnosis.server_logs`: per server (SGLang, vLLM), the startup milestones (the log's
  own progress), the functions that say which startup phase a traceback was raised in,
  and which paths are the server's own code;
- `ERROR_RULES`: regex rules naming an error class and its key message; the first rule (by
  priority) that matches an exception's text wins. Adding an error class is one line;
- `WRAPPER_TYPES` / `WRAPPER_MESSAGES`: exceptions that only report another one
  (vLLM's `EngineDeadError`, "Worker failed with error ...", "Engine core initialization
  failed"): never the root of a failure.

`analyze_log(text)` finds the root failure of a log: the first real error (in a chained
traceback the cause prints first; ranks that die because a peer died print later), with
hangs and timeouts (scheduler and NCCL watchdogs, RPC and engine-startup timeouts) as
failures too. Its signature is phase + error class + normalized key message + the place:
the innermost frame in the server's own code (file and function, never a line number), or
for a hang the innermost own frame of the stuck thread when a stack dump shows it. Generic
messages ("an illegal memory access was encountered") from different kernels thus stay
apart, and every number, address, id and path is normalized so reruns stay together.

A text that is not a server log at all (empty, binary, a shell error, megabytes of
warnings) gets a plain answer (`LogAnalysis.note`) in bounded time: huge logs are read
whole only near their end; earlier parts only where an error or milestone shows.

`judge(evidence, target)` turns a whole run's evidence into a `Verdict`.
Nothing here does I/O or prints; the CLI and the executor feed it text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.diagnosis.server_logs import (
    ARGS_FILES,
    ARGS_FRAMES,
    ARGS_MARKERS,
    CIRCUMSTANCES,
    GENERIC_CLASSES,
    GENERIC_HEADERS,
    KEY_WORDS,
    PASS_THROUGH,
    PHASE_HINTS,
    PROFILES,
    QUOTED_MESSAGES,
    RECORD_STARTS,
    RUN_TOGETHER_MIN,
    SELF_NAMING,
    SPECIFIC_WORDS,
    STOP_MARKERS,
    UNTYPED_ERROR,
    VALUE_PARTS,
    WRAPPED_CAUSES,
    ServerProfile,
    own_file,
    profiles_for,
)
from orchestrator.diagnosis.verdicts import PHASE_ORDER, Phase, Signature, Verdict

#: Bumped whenever signatures of the same log change; stored runs are re-signed then.
SIGNATURE_VERSION = 8
KEY_LENGTH = 200  # characters of a normalized message kept in a signature

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
    re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s*\|\s*[A-Z]+\s*\|\s*"
               r"[\w.:<>-]+\s*(?:\||-)\s?"),
    # (the stamp in ISO form too: "2025-04-17T08:59:26+00:00 - gpustack.worker - ERROR - ")
    re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? - "
               r"[\w.<>-]+ - [A-Z]+ - "),
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
                if strip_prefix(line[begin:m.end()]).strip():
                    out.append(line[begin:m.start()])
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
# Normalization: what varies between ranks, days, hosts and installs goes
# ---------------------------------------------------------------------------------------

_PATH = re.compile(r"""(?:(?<=^)|(?<=[\s'"(\[=`]))(?:\.{1,2}/|~/|/)(?:[^\s'"():,\[\]]+/)+"""
                   r"""(?=[^\s/'"():,\[\]]+)""")

# Order matters: specific shapes before the generic number rules.
_NORMALIZERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?"), "<time>"),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:\.\d+)?\b"), "<time>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{12,}\b"), "<id>"),
    (re.compile(r"\b(?:https?|file)://\S+"), "<url>"),
    (_PATH, "<path>/"),
    (re.compile(r"\(\d+(?:\.\d+)?/\d+(?:\.\d+)?\s?(?:[KMGTP]i?B)\)"), "(<size>)"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:[KMGTP]i?B|bytes|B)\b"), "<size>"),
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+\b|<\d+>|\b)"), "<addr>"),  # NCCL: ip<port>
    (re.compile(r"\[(?:[A-Z]{2,3}\d+ ?)+\]"), ""),
    (re.compile(r"\b(pid|PID|tid|rank|Rank|device|GPU|gpu|cuda:|TP|DP|EP|PP)[ =]?\d+\b"), r"\1<n>"),
    (re.compile(r"(?<![\w.])-?\d+\.\d+(?![\w.])"), "<num>"),
    (re.compile(r"(?<![\w<])-?\d+(?![\w>])"), "<n>"),
    (re.compile(r"\s+"), " "),
)


# A wrapper's tag in front of a message: "[address=0.0.0.0:37591, pid=324770] The ..."
_TAG = re.compile(r"^\[\w+=[^\]]*\]\s*")
# The end of a message's first sentence: what follows is advice or a dump that versions
# reword ("Make sure that ...", "Please verify ...").
_SENTENCE_END = re.compile(r"(?<=[a-z0-9)\]'`\">])\.\s+(?=[A-Z(])")


_QUOTED = re.compile(r"'[^'\s][^']*'|\"[^\"\s][^\"]*\"")
# A quoted value that changes with the host, the day or the reporter: a path, a repo id
# or URL, a long dump. Short names (a module, an attribute, a method, a dtype) name the
# failure and stay: "No module named 'flash_attn'" is not "No module named 'vllm._C'".
_VARIABLE_QUOTE = re.compile(r"[/\\]|^.{41,}$|\s")


# A printed list of quoted values (`['Glm4ForCausalLM']`) is what the input held (the
# model's architectures, the devices), not the name of what broke.
_QUOTED_LIST = re.compile(r"\[\s*(?:'[^']*'|\"[^\"]*\")(?:\s*,\s*(?:'[^']*'|\"[^\"]*\"))*\s*\]")
# So is a printed set of them (`{'model.layers.2.input_layernorm.weight', ...}`), whose
# order changes from one process to the next (Python randomizes string hashes): the same
# failure would otherwise get another signature on every start.
_QUOTED_SET = re.compile(r"\{\s*(?:'[^']*'|\"[^\"]*\")(?:\s*,\s*(?:'[^']*'|\"[^\"]*\"))*\s*\}")


def _mask_variable_quotes(message: str) -> str:
    def one(m: re.Match[str]) -> str:
        inner = m.group(0)[1:-1]
        # one quoting style: Python's repr and a formatted message quote alike names apart
        return "'<v>'" if _VARIABLE_QUOTE.search(inner) else f"'{inner}'"

    message = _QUOTED_SET.sub("{'<v>'}", _QUOTED_LIST.sub("['<v>']", message))
    return _QUOTED.sub(one, message)


def first_sentence(message: str) -> str:
    """The first sentence of a message that has several (when it is long enough to name
    something on its own)."""
    m = _SENTENCE_END.search(message)
    if m is not None and len(message[: m.start()].split()) >= SPECIFIC_WORDS:
        message = message[: m.start()]
    return message.rstrip(" .")


# What a message's words keep when they are its name (server_logs.VALUE_PARTS): markdown's
# backticks and typographic quotes come and go between reports of one line.
_MARKUP = str.maketrans({"`": None, "\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_SPACE_PUNCT = re.compile(r"\s+(?=[,.;:)\]])|(?<=[(\[])\s+")


def message_words(message: str) -> str:
    """A normalized message without the parts that hold values rather than words (a
    parenthesized value, a device name, a trailing `got ...`), so reports of one error from
    other versions, devices and inputs read alike; the message itself when that would
    leave too few words to name anything."""
    out = _mask_variable_quotes(message).translate(_MARKUP)
    for pattern in VALUE_PARTS:
        out = pattern.sub("", out)
    out = _SPACE_PUNCT.sub("", re.sub(r"\s{2,}", " ", out)).strip(" ,;:")
    if len(out.split()) < SPECIFIC_WORDS:
        return message.translate(_MARKUP)
    for pattern in CIRCUMSTANCES:  # "... does not exist when importing vLLM"
        head = pattern.sub("", out).rstrip(" ,;:")
        if len(head.split()) >= SPECIFIC_WORDS:
            out = head
    return out


def names_itself(error_class: str, message: str) -> bool:
    """True when the message says what went wrong in its own words, so the place that
    raised it is not needed to tell it from other failures (server_logs.GENERIC_CLASSES)."""
    if SELF_NAMING.search(message):
        return True
    return error_class not in GENERIC_CLASSES and len(message.split()) >= SPECIFIC_WORDS


def normalize_message(text: str) -> str:
    """The message with everything that varies between ranks, days and hosts replaced."""
    out = _TAG.sub("", strip_prefix(text))
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
    neither the traceback nor the milestones say where the error happened. `kind` says
    whether the rule names a crash, a hang (the server stopped making progress) or a
    timeout (something gave up waiting).
    """

    error_class: str
    pattern: re.Pattern[str]
    message: str = "{0}"
    priority: int = 50
    phase: Phase | None = None
    phase_hint: Phase | None = None
    options_only: bool = False  # keep only `--flag` words of the groups (drop flag values)
    kind: str = "crash"

    def key_message(self, match: re.Match[str]) -> str:
        groups = {k: (v or "") for k, v in match.groupdict().items()}
        if self.options_only:
            groups = {k: " ".join(w for w in v.split() if w.startswith("-"))
                      for k, v in groups.items()}
        if "src" in groups:  # who reports it: "CUDA error", "Triton Error [CUDA]", a kernel
            src = groups["src"]
            groups["src"] = ("triton" if "triton" in src.lower() else
                             src if src.endswith("failed with error") else "cuda")
        if "file" in groups:
            groups["file"] = groups["file"].rsplit("/", 1)[-1]
        return self.message.format(match.group(0), **groups).strip()


def _r(error_class: str, regex: str, message: str = "{0}", **kw: object) -> ErrorRule:
    return ErrorRule(error_class, re.compile(regex), message, **kw)  # type: ignore[arg-type]


# Lower priority number = tried first. The table is the whole classifier's knowledge.
ERROR_RULES: tuple[ErrorRule, ...] = tuple(
    sorted(
        (
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
            # hangs and timeouts: the place comes from a stack dump when the log has one
            _r("nccl_timeout",
               r"Watchdog caught collective operation timeout: WorkNCCL\(.*?OpType=(?P<op>\w+)",
               "collective operation timeout: {op}", priority=7, kind="timeout"),
            # torch's NCCL heartbeat monitor: the watchdog thread itself is stuck
            _r("hang", r"watchdog got stuck for \d+ seconds without making progress|Heartbeat "
                       r"monitor timed out|due to ProcessGroupNCCL watchdog hang",
               "ProcessGroupNCCL watchdog stuck", priority=7, kind="hang"),
            _r("hang", r"Watchdog timeout \(self\.watchdog_timeout=",
               "scheduler watchdog timeout", priority=7, kind="hang"),
            _r("hang", r"Engine iteration timed out", "engine iteration timed out",
               priority=7, kind="hang"),
            _r("timeout", r"RPC call to (?P<m>\w+) timed out", "RPC call to {m} timed out",
               priority=7, kind="timeout"),
            _r("timeout", r"Timed out waiting for engine(?:s to send ?initial message| core "
                          r"processes to start)", "timed out waiting for the engine to start",
               priority=7, kind="timeout"),
            _r("cublas", r"(?P<status>CUBLAS_STATUS_[A-Z_]+)(?: when calling `?(?P<fn>\w+))?",
               "{status} when calling {fn}", priority=10),
            _r("not_enough_memory",
               r"Not enough memory(?: to allocate KV cache)?\.(?: Please try to increase "
               r"--mem-fraction-static)?",
               "Not enough memory. Please try to increase --mem-fraction-static",
               priority=15, phase_hint=Phase.KV_CACHE),
            # vLLM's KV cache sizing: a memory pool too small for the blocks, or for one
            # request of the model's length (v0 and v1 word the second differently)
            _r("kv_cache_memory", r"No available memory for the cache blocks",
               "No available memory for the cache blocks", priority=16,
               phase_hint=Phase.KV_CACHE),
            _r("kv_cache_too_small",
               r"max seq len \(\d+\) is larger than the maximum number of tokens that can be "
               r"stored in KV cache|To serve at least one request with the models?'s max seq "
               r"len \(\d+\)",
               "the model's max seq len is larger than the KV cache", priority=17,
               phase_hint=Phase.KV_CACHE),
            _r("cuda_oom", r"CUDA out of memory occurred when (?P<when>[a-z ]+)",
               "CUDA out of memory when {when}", priority=19),
            _r("cuda_oom", r"CUDA out of memory\.(?: Tried to allocate [\d.]+ ?[KMGT]i?B)?",
               priority=20),
            _r("cuda_oom", r"torch\.(?:cuda\.)?OutOfMemoryError", "CUDA out of memory.",
               priority=21),
            _r("illegal_address",
               r"(?:(?P<src>Triton Error \[CUDA\]|CUDA [Ee]rror|\w+ failed with error):? "
               r"(?:\d+)?)?an illegal memory access was encountered|cudaErrorIllegalAddress",
               "{src} an illegal memory access was encountered", priority=25),
            _r("device_assert", r"(?P<file>[\w/.-]+\.cu):\d+: .*?Assertion `(?P<cond>.+)` failed",
               "{file}: Assertion `{cond}` failed", priority=24),
            _r("device_assert", r"device-side assert triggered", "device-side assert triggered",
               priority=26),
            _r("cuda_graph_capture",
               r"operation not permitted when stream is capturing|operation failed due to a "
               r"previous error during capture|cudaErrorStreamCapture\w+", priority=27),
            _r("nvshmem", r"nvshmem/src/\S*?(?P<file>\w+\.(?:cpp|cu)):\d+: non-zero status: "
                          r"\d+ (?P<what>[\w ]*?failed)", "nvshmem {file}: {what}", priority=28),
            _r("nvshmem", r"nvshmem (?:initialization|setup connections) failed|NVSHMEM API "
                          r"called before NVSHMEM initialization", "nvshmem initialization failed",
               priority=29),
            _r("nccl", r"NCCL error:? (?:in: \S+ )?(?P<what>[^(\n]*?)\s*(?:\(run with |,|$)",
               "NCCL error: {what}", priority=30),
            _r("nccl", r"\b(?P<code>nccl(?:Internal|System|UnhandledCuda|InvalidUsage|Remote)"
               r"Error)\b", "{code}", priority=31),
            _r("nccl", r"NCCL WARN (?P<what>.*)", "NCCL WARN {what}", priority=32),
            _r("triton_out_of_resources", r"out of resource: (?P<res>[\w ]+)",
               "out of resource: {res}", priority=33),
            _r("assertion", r"Assertion error \((?P<file>[^)]*)\): (?P<cond>.*)",
               "Assertion error ({file}): {cond}", priority=34),
            _r("cuda_error", r"CUDA [Ee]rror: (?P<what>[a-z][\w ]+)", "CUDA error: {what}",
               priority=40),
            _r("shell", r"^(?:-?(?:ba|da|z|k)?sh|/bin/\w*sh|/usr/bin/\w*sh)(?:: line \d+)?(?:: "
                        r"\d+)?: (?P<cmd>[^:]+): (?P<what>command not found|[Nn]o such file or "
                        r"directory|[Pp]ermission denied|not found)",
               "{cmd}: {what}", priority=45, phase=Phase.INIT),
            _r("shell", r"^(?P<cmd>\S*python[\d.]*): (?P<what>No module named \S+|can't open "
                        r"file .*)", "{cmd}: {what}", priority=45, phase=Phase.INIT),
            _r("signal", r"Fatal Python error: (?P<what>Segmentation fault|Aborted|Bus error)",
               "Fatal Python error: {what}", priority=80),
            _r("signal", r"^Killed$", "Killed", priority=90),
            # only ever the root when nothing else was printed (the child died silently)
            _r("child_died", r"Received sigquit from a child process|SIGQUIT received",
               "a child process died without a report", priority=95),
        ),
        key=lambda rule: rule.priority,
    )
)

# A cheap test before the rules: a line with none of these cannot match any rule.
_RULE_NEEDLES = ("rror", "ERROR", "max seq len", "CUBLAS", "memory",
                 "ssert", "captur", "nvshmem", "NVSHMEM",
                 "NCCL", "nccl", "resource", "imed out", "atchdog", "Fatal", "Killed",
                 "not found", "No such file", "denied", "No module", "can't open", "SIGQUIT",
                 "sigquit")


def _needles(text: str) -> bool:
    return any(n in text for n in _RULE_NEEDLES)

# Exceptions that wrap or report another failure: never the root of a crash.
WRAPPER_TYPES = frozenset(
    {"ChildProcessError", "SystemExit", "KeyboardInterrupt", "CancelledError", "EOFError",
     "EngineDeadError", "AsyncEngineDeadError", "CalledProcessError", "BrokenPipeError"}
)  # fmt: skip
WRAPPER_MESSAGES: tuple[re.Pattern[str], ...] = (
    re.compile(r"Received sigquit from a child process"),
    re.compile(r"SIGQUIT received"),
    re.compile(r"Engine core initialization failed"),
    re.compile(r"Engine process failed to start"),
    re.compile(r"EngineCore failed to start"),
    re.compile(r"EngineCore encountered (?:an issue|a fatal error)"),
    re.compile(r"Worker failed with error"),
    re.compile(r"WorkerProc (?:initialization failed|hit an exception|failed to start)"),
    re.compile(r"Error raised in subprocess"),
    re.compile(r"^Exception in \w+:?$"),
    re.compile(r"Initialization failed\. warmup error"),
    re.compile(r"Task finished unexpectedly"),
    re.compile(r"^terminate called after throwing"),
)

_TRACEBACK_RE = re.compile(r"Traceback \(most recent call last\):")
_CHAIN_RE = re.compile(r"During handling of the above exception|The above exception was the "
                       r"direct cause of the following exception")
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
    r"(?<=[\s(])(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): \S.*)$")
# or its repr, as a wrapper prints the exception it caught ("Runner failed with exception:
# RuntimeError('Cannot find any model weights with ...')")
_EXC_REPR = re.compile(r"(?<![\w.])(?P<type>(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception))"
                       r"\((?P<q>['\"])(?P<msg>.+?)(?P=q)\)")


def _mid_line_errors(bodies: Sequence[str]) -> list[_Event]:
    found: list[tuple[int, str]] = []
    for i, body in enumerate(bodies):
        if isinstance(body, _Advice) or not ("rror" in body or "xception" in body):
            continue
        if (m := _MID_LINE_EXC.search(body)) is not None:
            text = m.group("exc").rstrip()
            if (body[m.start() - 1] == "(" and text.endswith(")")
                    and text.count(")") > text.count("(")):
                text = text[:-1]  # "(RuntimeError: ...)": the parenthesis is the sentence's
            found.append((i, text))
        elif (r := _EXC_REPR.search(body)) is not None:
            found.append((i, f"{r.group('type')}: {r.group('msg')}"))
    return [_Event(i, i, m.group("type") if (m := _EXC_LINE_RE.match(text)) else None, text,
                   (), n) for n, (i, text) in enumerate(found, start=1)]  # fmt: skip


def _untyped_error(bodies: Sequence[str]) -> list[_Event]:
    """The first line that reads as an error message quoted without its exception type
    (server_logs.UNTYPED_ERROR), or the message a sentence quotes; for a text that shows no
    error line and no milestone at all."""
    for i, body in enumerate(bodies):
        if isinstance(body, _Advice) or not body.strip():
            continue
        # (text, whether its place says it is an error): an error answer's `message` is one
        found = [(next(g for g in m.groups() if g).strip(), n == 0)
                 for n, pattern in enumerate(QUOTED_MESSAGES) for m in pattern.finditer(body)]
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
            events.append(_Event(idx, start if start is not None else idx, m.group("type"),
                                 stripped, tuple(frames), chain))  # fmt: skip
            frames, start, linked = [], None, False
            continue
        if not isinstance(body, _Advice) and (q := _QUOTED_EXC_LINE.search(stripped)) is not None:
            # a sentence that quotes the exception line ("I get “RuntimeError: ...”")
            text = (q.group("dq") or q.group("bq")).rstrip()
            m = _EXC_LINE_RE.match(text)
            events.append(_Event(idx, idx, m.group("type") if m else None, text, (),
                                 chain := chain + 1))  # fmt: skip
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
            events.append(_Event(indices[e.index], indices[e.start], e.exc_type, e.text,
                                 e.frames, e.chain + chain_base))  # fmt: skip
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


def classify_error(text: str) -> tuple[str, str, ErrorRule | None] | None:
    """(error class, key message, rule) for one exception text, by the rule table."""
    if not _needles(text):
        return None
    for rule in ERROR_RULES:
        m = rule.pattern.search(text)
        if m:
            return rule.error_class, rule.key_message(m), rule
    return None


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
                    groups.get("kind", ""))
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


def _classify_event(event: _Event, extra: Sequence[str],
                    bodies: Sequence[str] = ()) -> tuple[str, str, ErrorRule | None]:  # fmt: skip
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
        _QUOTED_EXC.search(event.text))


def _common_site(root: _Event, frames: Sequence[Frame], what: tuple[str, str],
                 roots: Sequence[_Event], bodies: Sequence[str],
                 peer_frames: list[Frame],
                 events: Sequence[_Event] = ()) -> str | None:  # fmt: skip
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
        error_class, key, _rule = _classify_event(peer, _continuation(bodies, peer.index),
                                                 bodies)
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


def _frame_phase(frames: Sequence[Frame], profiles: Sequence[ServerProfile],
                 progress: Phase | None) -> Phase | None:  # fmt: skip
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


FRESH_LINES = 3  # a milestone this close above a traceback was being printed when it failed


def _fresh_progress(bodies: Sequence[str], progress: Sequence[Phase | None], start: int,
                    profiles: Sequence[ServerProfile]) -> Phase | None:  # fmt: skip
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
            note = (f"no failure and no server startup line found in {size}"
                    + (f" ({skipped / 1e6:.0f} MB in the middle only searched for errors)"
                       if skipped else "") + ": is this a server log?")  # fmt: skip
        return LogAnalysis(phase=reached, reached=reached, errors_seen=len(events),
                           server=server, note=note)  # fmt: skip

    # The first real error is the root: ranks that fail because a peer died print later,
    # and chained tracebacks print the cause first.
    root = _hang_before_kill(roots, bodies) or roots[0]
    extra = _continuation(bodies, root.index)
    error_class, key, rule = _classify_event(root, extra, bodies)
    if _is_wrapper(root) or rule is None:
        # only the wrapper was printed, or the error was re-raised with the wrapper's words
        # in front of its own ("Error in model execution (input dumped to ...): ..."): the
        # error it quotes, if any, is the failure
        inner = next((m.group("inner") for p in WRAPPED_CAUSES
                      if (m := p.search(root.text)) is not None), None)  # fmt: skip
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
    kind = rule.kind if rule is not None else "crash"

    # Frames that tell where: the root's own, else those of the traceback printed for the
    # same failure right after it (a bare CUDA or C++ error line, then Python's report).
    frames = root.frames
    if not frames:
        later = [e for e in events if e.index > root.index and e.frames
                 and e.index - root.index <= 200]  # fmt: skip
        if later and kind == "crash":
            frames = later[0].frames
        elif kind == "crash":
            # a traceback the tail cut before its exception line still says where
            frames = tuple((fm.group("file"), fm.group("func")) for body in
                           bodies[root.index + 1 : root.index + 200]
                           if (fm := _FRAME_RE.match(body)) is not None)
    chain_frames = tuple(f for e in events if e.chain == root.chain for f in e.frames)

    site: str | None
    dump_frames: tuple[Frame, ...] = ()
    peer_frames: list[Frame] = []
    if kind == "crash":
        site = _common_site(root, frames, (error_class, key), roots, bodies, peer_frames,
                            events)
    else:
        site, dump_frames = _stuck_place(_find_dumps(bodies), root.index)
        if site is None:
            site = _site(frames)
    at_root = progress[root.index] if root.index < len(progress) else reached

    phase: Phase | None
    if rule is not None and rule.phase is not None:
        phase = rule.phase
    else:
        phase = (_frame_phase(frames or chain_frames, profiles, at_root)
                 or _frame_phase(chain_frames + dump_frames + tuple(peer_frames), profiles,
                                 at_root)
                 or at_root)  # fmt: skip
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
            said = [key or "", root.text] + [e.text for e in events
                                             if 0 < e.index - root.index <= 5]  # fmt: skip
            phase = next((ph for ph, pat in PHASE_HINTS if any(pat.search(t) for t in said)),
                         None)  # fmt: skip
        if phase is None:
            phase = Phase.INIT  # the process ran but printed no milestone yet
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


# ---------------------------------------------------------------------------------------
# Judging a run
# ---------------------------------------------------------------------------------------

HANG_MESSAGE = "no readiness before the deadline"


def hang_message(log_tail: str) -> str:
    """A silent hang named by what it waited on: the last milestone before the silence."""
    last = last_milestone(log_tail[-2_000_000:].splitlines()) if log_tail else None
    return f"{HANG_MESSAGE} after '{last}'" if last else HANG_MESSAGE

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
    time_limit: bool = False  # ended by the scheduler's time limit, not by our health deadline
    stopped_by: str | None = None  # the host's record that someone stopped the server
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
    silent = analysis.error_class == "child_died"  # the log only says a child went away
    known_exit = (evidence.exit_signal is not None or evidence.exit_code is not None
                  or bool(evidence.unit_result))  # fmt: skip
    if analysis.signature is not None and not (silent and known_exit):
        return analysis.signature
    return _process_signature(evidence, analysis.phase or phase if silent else phase)


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


#: the server's own words for a stop signal it received (and then, often, exit 0); never
#: SIGQUIT, which SGLang's parent gets from a child that failed
_STOP_NOTICE_RE = re.compile(
    r"\b(?:received|caught|got)\s+(?:signal\s+)?(?:SIGTERM|SIGINT|SIGHUP|15|2|1)\b"
    r"|\b(?:SIGTERM|SIGINT|SIGHUP) received\b"  # SGLang's TokenizerManager
    r"|Shutting down FastAPI HTTP server", re.IGNORECASE)  # vLLM's, on SIGTERM/SIGINT


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


#: failures of the host under the server, whatever its config: the GPU's memory or link
#: reports a hardware error (NVIDIA: "should be recovered by a new run"; repeated, the
#: hardware is broken), or the disk is full
_HOST_FAULT_RE = re.compile(
    r"uncorrectable ECC error|ECC_UNCORRECTABLE|uncorrectable NVLink error"
    r"|NVLINK_UNCORRECTABLE|No space left on device", re.IGNORECASE)


def host_fault(sig: Signature | None) -> str | None:
    """'the host failed under the server (...)' when the run's own failure is one no
    config causes (a GPU's uncorrectable ECC or NVLink error, a full disk), else None."""
    if sig is None or not _HOST_FAULT_RE.search(sig.message):
        return None
    return (f"the host failed under the server ({sig.error_class}: {sig.message}); not a "
            "verdict about the config")


def outside_cause(evidence: RunEvidence, analysis: LogAnalysis | None = None) -> str | None:
    """Why a failed run says nothing about its config, or None. `analysis`: the log's
    analysis when the caller has it already (judge does), else it is made when needed.

    Three things end a run from outside the campaign: a port the server binds taken by
    another process (it binds late, after the port check), the host failing under it (a
    GPU's uncorrectable ECC or NVLink error, a full disk: `host_fault`), and a kill nobody
    in the campaign sent (a person, another tool, a host watchdog): the server died by
    SIGKILL, SIGTERM, SIGINT or SIGHUP and its log shows no failure of its own. Such runs
    are `infra`: retried, never cached, never a finding. The kernel's OOM killer, which
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
    analysis = analysis or analyze_log(tail)
    fault = host_fault(analysis.signature)
    if fault is not None:
        return fault
    if (evidence.unit_result or "").lower() == "oom-kill":
        return None
    sig = _died_by_signal(evidence)
    # A server that handles the stop signal may exit 0: then who sent it is told by the host
    # (systemd logged a stop of the unit) or by the server's own notice of the signal.
    notice = _STOP_NOTICE_RE.search(tail)
    stopped = evidence.stopped_by or (f"its log: {notice[0]!r}" if notice else None)
    if sig in OUTSIDE_SIGNALS or stopped:
        own = analysis.signature
        # A shell's "Killed" line is the kill itself, not a failure of the server; a parent's
        # "a child process died" note is the kill seen from the parent. A failure of its own
        # (a crash, then an exit 0 on its own) stays the config's.
        if own is None or _kill_notice(own) or own.error_class == "child_died":
            if sig in OUTSIDE_SIGNALS:
                return (f"the server was killed by {sig} from outside the campaign (its log "
                        "shows no failure of its own: a person, a watchdog, the kernel's OOM "
                        "killer?); not a verdict about the config")
            return (f"the server was stopped from outside the campaign ({stopped}) and its "
                    "log shows no failure of its own; not a verdict about the config")
    return None


def _kill_notice(sig: Signature) -> bool:
    """The log's failure is only a shell's notice of a kill (`Killed`, `Terminated`)."""
    return sig.error_class == "signal" and sig.message in _KILL_NOTICES


def judge(evidence: RunEvidence, target: Signature | None) -> tuple[Verdict, Signature | None]:
    """The verdict of one run, and its failure signature (None for pass/infra, and for
    invalid unless the server itself refused its command line: then the `args` one).

    `target` is the campaign's target failure; None while judging the bad endpoint
    itself, in which case any failure (crash, hang, missed probe) is FAIL and its
    signature becomes the target.
    """
    if evidence.infra_error:
        return Verdict.INFRA, None
    if evidence.invalid_reason:
        return Verdict.INVALID, None
    analysis = analyze_log(evidence.log_tail)
    if outside_cause(evidence, analysis) is not None:
        return Verdict.INFRA, None
    reached = evidence.last_phase or analysis.reached or Phase.INIT

    if evidence.timed_out and not evidence.became_ready:
        # A log error during the wait is a crash that left the unit hanging; report it.
        # Not a shell's kill notice alone (`Killed`): that is how the hang ended (a
        # watchdog, the deadline's stop), so the hang is named by what it waited on.
        if analysis.signature is not None and not _kill_notice(analysis.signature):
            sig = analysis.signature
            return _verdict_for(sig, target), sig
        sig = Signature(reached, "hang", hang_message(evidence.log_tail))
        # The scheduler's time limit ended it before the health deadline could say anything
        # (a slow start, a short --time): no hang was shown, whatever the target.
        if evidence.time_limit:
            return Verdict.TIMEOUT, sig
        if target is None or sig == target:
            return Verdict.FAIL, sig
        return Verdict.TIMEOUT, sig

    if not evidence.became_ready:
        sig = _crash_signature(evidence, analysis, reached)
        if sig.phase is Phase.ARGS:
            # The server refused its command line (argparse: usage, `error:`, exit 2):
            # rejected before it could run, whether or not the preflight saw it coming.
            return Verdict.INVALID, sig
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
    missed = probe.exit_code not in (None, 0) or probe.passed is False
    if missed and analysis.signature is not None:
        # The probe failed and the server logged an error under its load: a crash under
        # load that had not ended the process yet when it was looked at (vLLM's engine dies
        # first; its API server exits, with status 0, seconds later). Named by the error.
        sig = Signature(Phase.SERVING, analysis.signature.error_class,
                        analysis.signature.message)  # fmt: skip
        return _verdict_for(sig, target), sig
    if probe.exit_code not in (None, 0):
        sig = Signature(Phase.PROBE, "probe_error", f"probe exit status {probe.exit_code}")
        return _verdict_for(sig, target), sig
    if probe.passed is False:
        bar = probe.condition or "its bar"
        sig = Signature(Phase.PROBE, "probe_threshold", f"metric missed {bar}")
        return _verdict_for(sig, target), sig
    return Verdict.PASS, None


def resign(old: Signature | None, log_tail: str) -> Signature | None:
    """The signature a run recorded as `old` gets from this version of the classifier.

    Only the stored log tail is left of the run, so `judge` is replayed from what the old
    signature says about it: a probe miss stays what it was; a hang with nothing in the log
    stays a hang unless the log now names one; a crash after readiness stays a serving crash;
    a crash named only by its exit status keeps that name unless the log now explains it.
    """
    if old is None or old.error_class in ("probe_error", "probe_threshold"):
        return old
    analysis = analyze_log(log_tail) if log_tail else None
    new = analysis.signature if analysis is not None else None
    if new is None:
        if old.error_class == "hang" and old.message == HANG_MESSAGE:
            return Signature(old.phase, "hang", hang_message(log_tail))
        return old
    if old.phase == Phase.SERVING and new.phase != Phase.SERVING:
        return Signature(Phase.SERVING, new.error_class, new.message)
    return new


__all__ = [
    "ERROR_RULES",
    "resign",
    "SIGNATURE_VERSION",
    "HANG_MESSAGE",
    "OUTSIDE_SIGNALS",
    "PHASE_MARKERS",
    "ErrorRule",
    "LogAnalysis",
    "PhaseMarker",
    "ProbeOutcome",
    "RunEvidence",
    "analyze_log",
    "classify_error",
    "hang_message",
    "judge",
    "last_milestone",
    "last_phase",
    "normalize_message",
    "host_fault",
    "outside_cause",
    "phase_of_line",
    "port_clash",
    "signal_name",
    "strip_prefix",
]
