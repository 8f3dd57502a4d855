"""The rule table contributors edit: each error class with the regex that names it and
its key message, tried by priority, and the exceptions that only report another one.

Adding an error class is one line in `ERROR_RULES`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.diagnosis.verdicts import Phase

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
            groups = {
                k: " ".join(w for w in v.split() if w.startswith("-")) for k, v in groups.items()
            }
        if "src" in groups:  # who reports it: "CUDA error", "Triton Error [CUDA]", a kernel
            src = groups["src"]
            groups["src"] = (
                "triton"
                if "triton" in src.lower()
                else src
                if src.endswith("failed with error")
                else "cuda"
            )
        if "file" in groups:
            groups["file"] = groups["file"].rsplit("/", 1)[-1]
        return self.message.format(match.group(0), **groups).strip()


def _r(error_class: str, regex: str, message: str = "{0}", **kw: object) -> ErrorRule:
    return ErrorRule(error_class, re.compile(regex), message, **kw)  # type: ignore[arg-type]


# Lower priority number = tried first. The table is the whole classifier's knowledge.
ERROR_RULES: tuple[ErrorRule, ...] = tuple(
    sorted(
        (
            _r(
                "argparse",
                r"error: unrecognized arguments: (?P<args>.*)",
                "unrecognized arguments: {args}",
                priority=5,
                phase=Phase.ARGS,
                options_only=True,
            ),
            _r(
                "argparse",
                r"error: ambiguous option: (?P<opt>--?[\w-]+)(?:=\S*)? could match (?P<m>.*)",
                "ambiguous option: {opt} could match {m}",
                priority=5,
                phase=Phase.ARGS,
            ),
            _r(
                "argparse",
                r"error: argument (?P<arg>\S+?): invalid choice: '(?P<val>[^']*)'",
                "argument {arg}: invalid choice: '{val}'",
                priority=5,
                phase=Phase.ARGS,
            ),
            _r(
                "argparse",
                r"error: argument (?P<arg>\S+?): expected one argument",
                "argument {arg}: expected one argument",
                priority=5,
                phase=Phase.ARGS,
            ),
            _r(
                "argparse",
                r"error: the following arguments are required: (?P<args>.*)",
                "the following arguments are required: {args}",
                priority=5,
                phase=Phase.ARGS,
            ),
            _r("argparse", r"^[\w.-]+: error: (?P<msg>.*)", "{msg}", priority=6, phase=Phase.ARGS),
            # hangs and timeouts: the place comes from a stack dump when the log has one
            _r(
                "nccl_timeout",
                r"Watchdog caught collective operation timeout: WorkNCCL\(.*?OpType=(?P<op>\w+)",
                "collective operation timeout: {op}",
                priority=7,
                kind="timeout",
            ),
            # torch's NCCL heartbeat monitor: the watchdog thread itself is stuck
            _r(
                "hang",
                r"watchdog got stuck for \d+ seconds without making progress|Heartbeat "
                r"monitor timed out|due to ProcessGroupNCCL watchdog hang",
                "ProcessGroupNCCL watchdog stuck",
                priority=7,
                kind="hang",
            ),
            _r(
                "hang",
                r"Watchdog timeout \(self\.watchdog_timeout=",
                "scheduler watchdog timeout",
                priority=7,
                kind="hang",
            ),
            _r(
                "hang",
                r"Engine iteration timed out",
                "engine iteration timed out",
                priority=7,
                kind="hang",
            ),
            _r(
                "timeout",
                r"RPC call to (?P<m>\w+) timed out",
                "RPC call to {m} timed out",
                priority=7,
                kind="timeout",
            ),
            _r(
                "timeout",
                r"Timed out waiting for engine(?:s to send ?initial message| core "
                r"processes to start)",
                "timed out waiting for the engine to start",
                priority=7,
                kind="timeout",
            ),
            # torch's store client never reached the rendezvous (rank 0 of a multi-node
            # server): a consequence of the node that did not come up, like a watchdog's
            _r(
                "timeout",
                r"The client socket has timed out after \S+ while trying to connect to",
                "the client socket timed out connecting to the distributed store",
                priority=7,
                phase_hint=Phase.INIT,
                kind="timeout",
            ),
            _r(
                "cublas",
                r"(?P<status>CUBLAS_STATUS_[A-Z_]+)(?: when calling `?(?P<fn>\w+))?",
                "{status} when calling {fn}",
                priority=10,
            ),
            _r(
                "not_enough_memory",
                r"Not enough memory(?: to allocate KV cache)?\.(?: Please try to increase "
                r"--mem-fraction-static)?",
                "Not enough memory. Please try to increase --mem-fraction-static",
                priority=15,
                phase_hint=Phase.KV_CACHE,
            ),
            # vLLM's KV cache sizing: a memory pool too small for the blocks, or for one
            # request of the model's length (v0 and v1 word the second differently)
            _r(
                "kv_cache_memory",
                r"No available memory for the cache blocks",
                "No available memory for the cache blocks",
                priority=16,
                phase_hint=Phase.KV_CACHE,
            ),
            _r(
                "kv_cache_too_small",
                r"max seq len \(\d+\) is larger than the maximum number of tokens that can be "
                r"stored in KV cache|To serve at least one request with the models?'s max seq "
                r"len \(\d+\)",
                "the model's max seq len is larger than the KV cache",
                priority=17,
                phase_hint=Phase.KV_CACHE,
            ),
            _r(
                "cuda_oom",
                r"CUDA out of memory occurred when (?P<when>[a-z ]+)",
                "CUDA out of memory when {when}",
                priority=19,
            ),
            _r(
                "cuda_oom",
                r"CUDA out of memory\.(?: Tried to allocate [\d.]+ ?[KMGT]i?B)?",
                priority=20,
            ),
            _r(
                "cuda_oom",
                r"torch\.(?:cuda\.)?OutOfMemoryError",
                "CUDA out of memory.",
                priority=21,
            ),
            _r(
                "illegal_address",
                r"(?:(?P<src>Triton Error \[CUDA\]|CUDA [Ee]rror|\w+ failed with error):? "
                r"(?:\d+)?)?an illegal memory access was encountered|cudaErrorIllegalAddress",
                "{src} an illegal memory access was encountered",
                priority=25,
            ),
            _r(
                "device_assert",
                r"(?P<file>[\w/.-]+\.cu):\d+: .*?Assertion `(?P<cond>.+)` failed",
                "{file}: Assertion `{cond}` failed",
                priority=24,
            ),
            _r(
                "device_assert",
                r"device-side assert triggered",
                "device-side assert triggered",
                priority=26,
            ),
            _r(
                "cuda_graph_capture",
                r"operation not permitted when stream is capturing|operation failed due to a "
                r"previous error during capture|cudaErrorStreamCapture\w+",
                priority=27,
            ),
            _r(
                "nvshmem",
                r"nvshmem/src/\S*?(?P<file>\w+\.(?:cpp|cu)):\d+: non-zero status: "
                r"\d+ (?P<what>[\w ]*?failed)",
                "nvshmem {file}: {what}",
                priority=28,
            ),
            _r(
                "nvshmem",
                r"nvshmem (?:initialization|setup connections) failed|NVSHMEM API "
                r"called before NVSHMEM initialization",
                "nvshmem initialization failed",
                priority=29,
            ),
            _r(
                "nccl",
                r"NCCL error:? (?:in: \S+ )?(?P<what>[^(\n]*?)\s*(?:\(run with |,|$)",
                "NCCL error: {what}",
                priority=30,
            ),
            _r(
                "nccl",
                r"\b(?P<code>nccl(?:Internal|System|UnhandledCuda|InvalidUsage|Remote)"
                r"Error)\b",
                "{code}",
                priority=31,
            ),
            _r("nccl", r"NCCL WARN (?P<what>.*)", "NCCL WARN {what}", priority=32),
            _r(
                "triton_out_of_resources",
                r"out of resource: (?P<res>[\w ]+)",
                "out of resource: {res}",
                priority=33,
            ),
            _r(
                "assertion",
                r"Assertion error \((?P<file>[^)]*)\): (?P<cond>.*)",
                "Assertion error ({file}): {cond}",
                priority=34,
            ),
            _r(
                "cuda_error",
                r"CUDA [Ee]rror: (?P<what>[a-z][\w ]+)",
                "CUDA error: {what}",
                priority=40,
            ),
            _r(
                "shell",
                r"^(?:-?(?:ba|da|z|k)?sh|/bin/\w*sh|/usr/bin/\w*sh)(?:: line \d+)?(?:: "
                r"\d+)?: (?P<cmd>[^:]+): (?P<what>command not found|[Nn]o such file or "
                r"directory|[Pp]ermission denied|not found)",
                "{cmd}: {what}",
                priority=45,
                phase=Phase.INIT,
            ),
            _r(
                "shell",
                r"^(?P<cmd>\S*python[\d.]*): (?P<what>No module named \S+|can't open "
                r"file .*)",
                "{cmd}: {what}",
                priority=45,
                phase=Phase.INIT,
            ),
            _r(
                "signal",
                r"Fatal Python error: (?P<what>Segmentation fault|Aborted|Bus error)",
                "Fatal Python error: {what}",
                priority=80,
            ),
            _r("signal", r"^Killed$", "Killed", priority=90),
            # only ever the root when nothing else was printed (the child died silently)
            _r(
                "child_died",
                r"Received sigquit from a child process|SIGQUIT received",
                "a child process died without a report",
                priority=95,
            ),
        ),
        key=lambda rule: rule.priority,
    )
)

# A cheap test before the rules: a line with none of these cannot match any rule.
_RULE_NEEDLES = (
    "rror",
    "ERROR",
    "max seq len",
    "CUBLAS",
    "memory",
    "ssert",
    "captur",
    "nvshmem",
    "NVSHMEM",
    "NCCL",
    "nccl",
    "resource",
    "imed out",
    "atchdog",
    "Fatal",
    "Killed",
    "not found",
    "No such file",
    "denied",
    "No module",
    "can't open",
    "SIGQUIT",
    "sigquit",
)


def _needles(text: str) -> bool:
    return any(n in text for n in _RULE_NEEDLES)


# Exceptions that wrap or report another failure: never the root of a crash.
WRAPPER_TYPES = frozenset(
    {
        "ChildProcessError",
        "SystemExit",
        "KeyboardInterrupt",
        "CancelledError",
        "EOFError",
        "EngineDeadError",
        "AsyncEngineDeadError",
        "CalledProcessError",
        "BrokenPipeError",
    }
)
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


def classify_error(text: str) -> tuple[str, str, ErrorRule | None] | None:
    """(error class, key message, rule) for one exception text, by the rule table."""
    if not _needles(text):
        return None
    for rule in ERROR_RULES:
        m = rule.pattern.search(text)
        if m:
            return rule.error_class, rule.key_message(m), rule
    return None


__all__ = [
    "ERROR_RULES",
    "ErrorRule",
    "classify_error",
]
