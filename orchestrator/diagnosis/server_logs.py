"""What each inference server's log looks like: the data the classifier reads logs with.

One `ServerProfile` per server. Adding a server is adding one profile to `PROFILES`:

- `detect`: strings only this server prints (a log is read with the markers of the
  servers it matches, or of all of them when it matches none);
- `markers`: startup milestones in the order the server prints them, each with the phase
  the server is in once the line appears (the log's own progress);
- `startup_frames`: functions that, on a traceback's stack, say which startup phase raised
  it (innermost wins: vLLM captures CUDA graphs inside `_initialize_kv_caches`);
- `loop_frames`: functions of the serving loop. The loop also runs the server's own warmup
  request, so these say "warmup or serving" and the log's progress decides which;
- `packages`: path segments of the server's own code (frames there name the place a
  generic error came from; frames in torch, triton or the standard library do not).

Functions that only pass a call through (checkers, decorators, dispatchers) are listed in
`PASS_THROUGH`: they never name a place.

Errors whose own line says little (`GENERIC_HEADERS`) are named by the line that does:
pydantic's `N validation error for X` by its `Value error, ...` line, NCCL's `internal
error` by its `Last error:` line (named as the `NCCL WARN` line it repeats: that line,
printed before the summary, is an error of its own, the first of the failure, so it names
a log that kept it), a client's `Error code: 400 - {...}` by the answer's `message`. A
message is named by its words: not the parts that hold values (`VALUE_PARTS`), not a
clause that says when it happened (`CIRCUMSTANCES`), not a wrapper's words in front of
the error it quotes (`WRAPPED_CAUSES`). Lines that say the server was asked to stop
(`STOP_MARKERS`) end the part of a log where errors count: vLLM prints an
`EngineDeadError` traceback on every SIGTERM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.diagnosis.verdicts import NAMING_WORDS, Phase


@dataclass(frozen=True)
class Marker:
    phase: Phase
    needle: str  # a literal every matching line contains (a cheap test before the regex)
    pattern: re.Pattern[str]


def _m(phase: Phase, needle: str, regex: str | None = None) -> Marker:
    return Marker(phase, needle, re.compile(regex if regex is not None else re.escape(needle)))


@dataclass(frozen=True)
class ServerProfile:
    name: str
    detect: tuple[str, ...]
    markers: tuple[Marker, ...]
    startup_frames: tuple[tuple[Phase, re.Pattern[str]], ...]
    loop_frames: re.Pattern[str]
    packages: tuple[str, ...]


def _frames(*pairs: tuple[Phase, str]) -> tuple[tuple[Phase, re.Pattern[str]], ...]:
    return tuple((phase, re.compile(rf"^(?:{names})$")) for phase, names in pairs)


# argparse prints these before any server code runs, whatever the server.
ARGS_MARKERS: tuple[Marker, ...] = (
    _m(Phase.ARGS, "usage: ", r"^usage: \S+"),
    _m(Phase.ARGS, ": error: ", r"^[\w.-]+(?:\.py)?: error: "),
)
# A traceback through argparse's own parsing (a file named argparse*: the standard
# library's, vLLM's FlexibleArgumentParser) was raised while the command line was read: an
# option's type function refused its value with an exception argparse does not turn into
# `error:` (vLLM validates a JSON option such as --compilation-config there), whatever the
# server. Unless a startup function sits inside it on the stack, that is phase `args`.
ARGS_FRAMES = re.compile(
    r"^(?:parse_args|parse_known_args|_parse_known_args|_get_values?|"
    r"parse_known_intermixed_args)$"
)
ARGS_FILES = re.compile(r"(?:^|/)argparse\w*\.py$")

SGLANG = ServerProfile(
    name="sglang",
    detect=(
        "sglang",
        "ServerArgs(",
        "Scheduler hit an exception",
        " TP0]",
        "sgl_kernel",
        "The server is fired up",
    ),
    markers=(
        _m(Phase.INIT, "server_args=ServerArgs("),
        _m(Phase.INIT, "Init torch distributed begin"),
        _m(Phase.INIT, "Init nccl begin"),
        _m(Phase.LOAD_WEIGHTS, "Init torch distributed ends"),
        _m(Phase.LOAD_WEIGHTS, "Load weight begin"),
        _m(Phase.LOAD_WEIGHTS, "checkpoint shards", r"^Loading (?:safetensors|pt) checkpoint"),
        _m(Phase.KV_CACHE, "Load weight end"),
        _m(Phase.KV_CACHE, "Using KV cache dtype"),
        _m(Phase.KV_CACHE, "KV Cache is allocated"),
        _m(Phase.KV_CACHE, "Memory pool end"),
        _m(Phase.KV_CACHE, "is larger than the profiled value"),
        _m(Phase.CUDA_GRAPH, "Capture cuda graph begin"),
        _m(Phase.CUDA_GRAPH, "Capture piecewise CUDA graph begin"),
        _m(Phase.CUDA_GRAPH, "Capture cuda graph bs"),
        _m(Phase.CUDA_GRAPH, "Capturing batches"),
        _m(Phase.WARMUP, "Capture cuda graph end"),
        _m(Phase.WARMUP, "max_total_num_tokens="),
        # SGLang starts uvicorn, then sends its own warmup request before it is ready
        _m(Phase.WARMUP, "Started server process"),
        _m(Phase.WARMUP, "Waiting for application startup"),
        _m(Phase.WARMUP, "Application startup complete"),
        _m(Phase.WARMUP, "Uvicorn running on"),
        _m(Phase.SERVING, "The server is fired up and ready to roll"),
        _m(Phase.SERVING, "Decode batch"),  # the warmup request is too short to log one
        _m(Phase.SERVING, "POST /v1/"),  # the warmup request goes to /generate
    ),
    startup_frames=_frames(
        (
            Phase.INIT,
            "init_torch_distributed|initialize_model_parallel|init_distributed_"
            "environment|_set_envs_and_config|_launch_subprocesses",
        ),
        (
            Phase.LOAD_WEIGHTS,
            "load_model|load_weights|load_weights_and_postprocess|"
            "post_load_weights|get_model|process_weights_after_loading",
        ),
        (Phase.KV_CACHE, "init_memory_pool|profile_max_num_token"),
        (Phase.CUDA_GRAPH, "init_cuda_graphs|init_device_graphs|capture|capture_one_batch_size"),
        (Phase.WARMUP, "_wait_and_warmup|_execute_server_warmup"),
    ),
    loop_frames=re.compile(
        r"^(?:event_loop_\w+|run_batch|forward_batch_generation|"
        r"process_batch_result\w*|forward_step|exposed_step|"
        r"forward_thread_func_?|forward_batch_speculative_generation)$"
    ),
    packages=("sglang", "sgl_kernel"),
)

VLLM = ServerProfile(
    name="vllm",
    detect=("vllm", "vLLM", "EngineCore", "VllmWorker", "LLM engine"),
    markers=(
        _m(Phase.INIT, "vLLM API server version"),
        _m(Phase.INIT, "non-default args:"),
        # 0.32 prints its banner without "API server version"; headless mode no args line
        _m(Phase.INIT, "Resolved architecture"),
        _m(Phase.INIT, "LLM engine", r"Initializing an? (?:V\d )?LLM engine"),
        _m(Phase.INIT, "world_size=", r"world_size=\d+ rank=\d+"),
        _m(Phase.LOAD_WEIGHTS, "Starting to load model"),
        _m(Phase.LOAD_WEIGHTS, "checkpoint shards", r"^Loading (?:safetensors|pt) checkpoint"),
        # after the weights vLLM profiles a forward pass (and compiles) to size the KV cache
        _m(Phase.KV_CACHE, "Loading model weights took"),
        _m(Phase.KV_CACHE, "Model loading took"),
        _m(Phase.KV_CACHE, "Memory profiling"),
        _m(Phase.KV_CACHE, "torch.compile takes"),
        _m(Phase.KV_CACHE, "Loading weights took"),
        _m(Phase.KV_CACHE, "Compiling a graph for"),
        _m(Phase.KV_CACHE, "for vLLM's torch.compile"),
        _m(Phase.KV_CACHE, "Dynamo bytecode transform time"),
        _m(Phase.KV_CACHE, "Available KV cache memory"),
        _m(Phase.KV_CACHE, "# GPU blocks:"),
        _m(Phase.CUDA_GRAPH, "GPU KV cache size:"),
        _m(Phase.CUDA_GRAPH, "Capturing CUDA graph"),
        _m(Phase.CUDA_GRAPH, "Capturing the model for CUDA graphs"),
        _m(Phase.CUDA_GRAPH, "Capturing cudagraphs"),
        _m(Phase.WARMUP, "Graph capturing finished"),
        _m(Phase.WARMUP, "init engine (profile, create kv cache, warmup model) took"),
        # vLLM has no warmup request: once the API server is up, it serves
        _m(Phase.SERVING, "Starting vLLM API server"),
        _m(Phase.SERVING, "Available routes are"),
        _m(Phase.SERVING, "Uvicorn running on"),
        _m(Phase.SERVING, "Application startup complete"),
        _m(Phase.SERVING, "Received request"),
        _m(Phase.SERVING, "Avg prompt throughput"),
    ),
    startup_frames=_frames(
        (
            Phase.INIT,
            "init_device|init_model|init_worker_distributed_environment|"
            "_check_if_gpu_supports_dtype|_raise_for_unsupported|create_engine_config",
        ),
        (
            Phase.LOAD_WEIGHTS,
            "load_model|load_weights|_load_weights_\\w+|get_model|process_weights_after_loading",
        ),
        (
            Phase.KV_CACHE,
            "determine_available_memory|profile_run|determine_num_available_"
            "blocks|check_enough_kv_cache_memory|get_kv_cache_configs?|"
            "raise_if_cache_size_invalid|initialize_cache|_initialize_kv_caches|"
            "initialize_from_config|initialize_kv_cache|_allocate_kv_cache_"
            "tensors|_reshape_kv_cache_tensors",
        ),
        (Phase.CUDA_GRAPH, "capture_model|_capture_cudagraphs|_warmup_and_capture|capture"),
        # v1 warms up (compile sizes, then graphs, then the sampler) inside this one
        (Phase.WARMUP, "_dummy_sampler_run|compile_or_warm_up_model"),
    ),
    # the engine loop, and what it does for a client once up (an RPC such as add_lora; a
    # LoRA adapter is loaded when a request or the API server asks for it)
    loop_frames=re.compile(
        r"^(?:execute_model|step|step_async|run_busy_loop|"
        r"_process_engine_step|step_with_batch_queue|engine_step|"
        r"run_engine_loop|sample_tokens|execute_model_async|"
        r"_handle_client_request|add_lora|_load_adapter)$"
    ),
    packages=("vllm",),
)

PROFILES: tuple[ServerProfile, ...] = (SGLANG, VLLM)


@dataclass(frozen=True)
class GenericHeader:
    """An error line that only announces the real error, and where that one is printed.

    `header` is searched in the exception's text; `detail` is matched on the lines
    `after` it (or `before` it) up to `within` lines away, the first match wins; its
    group `msg` names the failure. The key becomes `template` over both matches' groups.
    """

    name: str
    header: re.Pattern[str]
    detail: re.Pattern[str]
    template: str
    direction: str = "after"  # or "before": the cause was printed first; "same": its line
    within: int = 8
    # the error class the detail names, by its `kind` group (pydantic's "Value error"
    # is the validator's ValueError); absent: the class stays the header's
    classes: dict[str, str] | None = None


GENERIC_HEADERS: tuple[GenericHeader, ...] = (
    # pydantic: "1 validation error for SchedulerConfig" then, indented, the validator's
    # own error: "  Value error, max_num_batched_tokens (64) is smaller than ... [type=...]"
    # (its text may go on over several lines before the `[type=...]`)
    GenericHeader(
        "pydantic-validator",
        re.compile(r"\b\d+ validation errors? for (?P<model>[\w.]+)"),
        re.compile(
            r"^\s*(?P<kind>Value error|Assertion failed|Assertion error),\s*"
            r"(?P<msg>.*?)\s*(?:\[type=\w+.*)?$"
        ),
        "{msg}",
        classes={
            "Value error": "ValueError",
            "Assertion failed": "AssertionError",
            "Assertion error": "AssertionError",
        },
    ),
    # or a field's name on one line, then "  Input should be ... [type=int_parsing, ...]"
    GenericHeader(
        "pydantic-field",
        re.compile(r"\b\d+ validation errors? for (?P<model>[\w.]+)"),
        re.compile(r"^\s+(?P<msg>\S.*?)\s*\[type=(?P<type>\w+)"),
        "{model}: {msg}",
    ),
    # a client's exception around the server's error answer (the OpenAI client's
    # `BadRequestError: Error code: 400 - {'object': 'error', 'message': "...", ...}`): the
    # answer's `message` is the server's own error, as a quoted answer is read
    GenericHeader(
        "client-error-answer",
        re.compile(r"\bError code: \d{3} - \{"),
        re.compile(r"""['"]message['"]:\s*(?P<q>["'])(?P<msg>.{20,}?)(?P=q)\s*[,}]"""),
        "{msg}",
        direction="same",
    ),
    # newer NCCL prints the cause after the summary: "Last error:" then the cause, the
    # text of the last `NCCL WARN` line; named as that line is, so a report that kept the
    # WARN line and one that kept only the summary name one failure
    GenericHeader(
        "nccl-last-error",
        re.compile(
            r"(?:NCCL error|nccl\w*Error)\b.*?(?P<what>internal error|unhandled system "
            r"error|unhandled cuda error|remote process exited|invalid usage)",
            re.IGNORECASE,
        ),
        re.compile(r"^Last error:\s*(?P<msg>.*)$"),
        "NCCL WARN {msg}",
        within=3,
    ),
)

# Errors whose message does not say what went wrong, only what broke (a device, a library,
# a memory pool, a bare Python error naming a value): the same text comes from many bugs,
# so their signature keeps the place in the server's own code that raised them. Any other
# error says what went wrong in its own words, and those words are its name: the place
# is left out, so the same message from another version, rank or wrapper (code moved, a
# traceback cut or re-printed shorter) stays one failure.
GENERIC_CLASSES = frozenset(
    {
        "illegal_address",
        "device_assert",
        "cublas",
        "cuda_error",
        "cuda_oom",
        "not_enough_memory",
        "kv_cache_memory",
        "nccl",
        "nvshmem",
        "triton_out_of_resources",
        "cuda_graph_capture",
        "signal",
        "error",
        "KeyError",
        "IndexError",
        "AttributeError",
        "ZeroDivisionError",
        "StopIteration",
        "UnboundLocalError",
        "NameError",
        "OutOfResources",
    }
)
# (A host-side assertion of a JIT compiler, `Assertion error (compiler.hpp:38): cond`,
# names its file and condition: one check, wherever the compile was started or re-raised.)
# Device errors that name their cause, wherever they are raised: a build for another GPU,
# a device that is not there or is taken.
SELF_NAMING = re.compile(
    r"no kernel image is available|invalid device ordinal|busy or unavailable|unsupported "
    r"toolchain|driver version is insufficient|no CUDA-capable device|not compiled with"
)

# Messages that say which startup phase raised them, for logs that show neither the
# milestones nor the frames (a report that quotes only the error line).
PHASE_HINTS: tuple[tuple[Phase, re.Pattern[str]], ...] = (
    # SGLang's wrapper of any error raised while capturing says so
    (Phase.CUDA_GRAPH, re.compile(r"Capture cuda graph failed")),
    # a request the server rejects: only ever raised while serving
    (
        Phase.SERVING,
        re.compile(
            r"The decoder prompt \(length \d+\) is longer than the "
            r"maximum model length|prompt \(length \d+\) is longer than|"
            r"maximum context length is \d+ tokens\. However, you requested"
        ),
    ),
    (Phase.KV_CACHE, re.compile(r"Error in memory profiling|KV cache|cache blocks")),
    (Phase.LOAD_WEIGHTS, re.compile(r"\bmodel weights\b|\bload(?:ing)? (?:the )?weights\b")),
    # an NCCL watchdog's work item counts the collectives its group ran: a server that
    # ran a hundred thousand of them was serving (startup runs hundreds, not more)
    (Phase.SERVING, re.compile(r"WorkNCCL\(SeqNum=\d{6,}")),
)
SPECIFIC_WORDS = NAMING_WORDS  # a message of fewer words than this names no failure by itself
# Words of a message (its first sentence) kept in a signature. The head of a message says
# what failed; the tail carries values, a hint that versions reword, or nothing at all when
# a report cut the line short ("...but there are other ranks th").
KEY_WORDS = 12

# Parts of a normalized message that hold values, not words: a message's name is read
# without them (`classify.normalize.message_words`). Versions add or drop them ("Free memory on
# device (...)" became "Free memory on device cuda:0 (...)"), and they change with the
# input ("derived max_model_len (None=2048 in model's config.json)" and "(max_position_
# embeddings=512 or model_max_length=None in ...)"). A short quoted name ('flash_attn')
# is a word: it stays.
VALUE_PARTS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\s*\((?:[^()]|\([^()]*\))*\)"),  # a parenthesized value or dump
    re.compile(r"\s*\{(?:[^{}]|\{[^{}]*\})*\}"),  # a printed dict
    # a device: "cuda:<n>", "cuda:<n>,<n>", "device <n>" was already "device<n>"
    re.compile(r"\b(?:cuda|xpu|npu|hpu|mps|cpu|rocm|gpu):<n>(?:,<n>)*"),
    re.compile(r"(?<=\bdevice)<n>|(?<=\bGPU)<n>"),
    # "..., got X" / "but got X": the value the check saw
    re.compile(r",?\s*\b(?:but )?got\b.*$"),
    # a quoted value (a repo id, a path: classify masks them to '<v>')
    re.compile(r"\s*'<v>'"),
    # a path to a directory or a model (no file extension): where the user keeps it
    re.compile(
        r"\s*<path>/(?![^\s'\",:;()]*\.[A-Za-z]\w{0,4}(?:\.(?:\d+|<n>))*(?![^\s'\",:;()]))"
        r"[^\s'\",:;()]*[^\s'\",:;().]"
    ),
    re.compile(r"<path>/"),  # where a file lives: the file names it
    # an unquoted dotted name of four parts or more: a parameter of the model's checkpoint
    # ("base_model.model.lm_head.weight is unsupported ..."), which adapters and models
    # name each their own way (a quoted one is a word: a KeyError names the key it missed)
    re.compile(r"(?<![\w.<>'\"`])\s*(?:[A-Za-z_][\w<>]*\.){3,}[A-Za-z_][\w<>]*(?![\w.<>'\"`])"),
)

# A clause that says when an error happened, not what it is: a title or another version
# adds it after the message ("operator torchvision::nms does not exist when importing
# vLLM", "Torch not compiled with CUDA enabled when specified --device tpu"). A message is
# named by the words before it, when those are enough to name anything (SPECIFIC_WORDS).
CIRCUMSTANCES: tuple[re.Pattern[str], ...] = (re.compile(r",?\s+\b(?:when|while)\s+\S.*$"),)

# Words that make a line an error message when a report quotes the message without its
# exception type (an issue title, a sentence, a console that dropped it). Read only when
# a text shows no error line, no traceback and no startup milestone at all: a quote, not a
# server's log (a server that went silent keeps its milestones and is a hang).
UNTYPED_ERROR = re.compile(
    r"\b(?:error|failed|failure|unknown|not supported|unsupported|does not|do not|cannot|"
    r"can't|could not|unable to|invalid|undefined|missing|mismatch|exceeds?|must be|"
    r"not found|no such|out of)\b",
    re.IGNORECASE,
)
# Where such a text quotes the message itself, first match wins: the `message` of the
# servers' OpenAI-style error answer as a client printed it (`{'object': 'error',
# 'message': "This model's maximum context length is ..."}`), or a message quoted in a
# sentence ("I hit the error "The checkpoint ... architecture."").
QUOTED_MESSAGES: tuple[re.Pattern[str], ...] = (
    re.compile(r"""['"]message['"]:\s*(?:"(?P<dq>[^"]{20,})"|'(?P<sq>[^']{20,})')"""),
    # in double quotes (backticks may be inside: "... model type `x` but ..."), then in
    # backticks
    re.compile(r"[\"\u201c](?P<msg>[^\"\u201c\u201d]{20,})[\"\u201d]"),
    re.compile(r"`(?P<msg>[^`]{20,})`"),
)

# Wrappers that quote the error they report: when the log kept only the wrapper (the
# worker's own traceback went elsewhere), the quoted error is the failure. ('' quotes
# nothing: the cause is the traceback above, if the log has it.)
WRAPPED_CAUSES: tuple[re.Pattern[str], ...] = (
    re.compile(
        r"Worker failed with error '(?P<inner>.+)'(?:, please check the stack trace "
        r"above for the root cause)?$"
    ),
    re.compile(r"Error in model execution(?: \(input dumped to [^)]*\))?: (?P<inner>.+)$"),
    # what failed, then after a colon why: "Failed to derive max model length: Unrecognized
    # model in ..." (a wrapper's own logger quoting the error it caught); the why is named
    # when it has words enough to name something (SPECIFIC_WORDS)
    re.compile(r"^(?:[\w.]+: )?Failed to [\w ]{3,60}: (?P<inner>\S+(?: \S+){3,}.*)$"),
)

# The start of a log record, where a pasted log lost its line breaks and runs several
# records together on one line (a web page or a chat copied as one paragraph): the line is
# cut before each. Only record starts that carry a timestamp or a process/rank id, so a
# message that merely mentions a level word is never cut.
RECORD_STARTS: tuple[re.Pattern[str], ...] = (
    # vLLM's logger: "ERROR 11-04 18:02:56 [v1/executor/multiproc_executor.py:597] "
    re.compile(
        r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d(?:-\d{4})? "
        r"\d\d:\d\d:\d\d(?:\.\d+)? \[?[\w./-]+:\d+\]"
    ),
    # NCCL's debug lines: "02fdc141b80d:213:213 [1] NCCL INFO cudaDriverVersion 12080"
    re.compile(r"[\w.-]+:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN)"),
)
RUN_TOGETHER_MIN = 160  # characters: a shorter line is one record

# Lines a server prints once it has been told to stop (SIGTERM from systemd or the tool):
# errors after them are the shutdown, never the failure of a run.
STOP_MARKERS: tuple[re.Pattern[str], ...] = (
    re.compile(r"Shutting down FastAPI HTTP server"),  # vLLM's API server
    re.compile(r"^(?:INFO:\s+)?Shutting down$"),  # uvicorn
    re.compile(r"^(?:INFO:\s+)?Waiting for application shutdown"),  # uvicorn
    re.compile(r"Received (?:SIGTERM|signal 15|SIGINT)\b"),
    re.compile(r"Terminated by signal|Stopping .*\.service\.\.\.$"),  # systemd journal
)

# Functions that only pass a call on: decorators, dispatchers, re-raise sites. (A checker
# such as NCCL_CHECK is not one of them: it raised the error, and it is the frame every
# report of the failure keeps, however much of the stack above it was cut.)
PASS_THROUGH = re.compile(
    r"^(?:decorate_context|_call_impl|_wrapped_call_impl|"
    r"__call__|wrapper|inner|_fn|run_method|_op|sync_wrapper|patched_\w+|forward_call|"
    r"execute_method|worker_busy_loop|collective_rpc|get_response|_run_workers\w*|"
    r"__exit__|__enter__|run|_bootstrap\w*|<lambda>|<module>|main)$"
)

# Files of the standard library and of third-party packages that appear in py-spy dumps
# without their directory (py-spy prints paths relative to site-packages).
FOREIGN_FILES = re.compile(
    r"^(?:threading|queue|selectors|subprocess|socket|ssl|contextlib|runpy|functools|"
    r"multiprocessing/\w+|asyncio/\w+|concurrent/futures/\w+|torch/.*|triton/.*|tqdm/.*|"
    r"uvloop/.*|zmq/.*|<string>|<frozen [\w.]+>)\.?(?:py)?$|^<"
)


def own_file(
    path: str, *, loose: bool = False, profiles: tuple[ServerProfile, ...] = PROFILES
) -> str | None:
    """`package/file` when `path` is the servers' own code (bare `file` from a stack
    dump), else None.

    The `/sglang/` (say) that counts is one not followed by site-packages: a venv named
    `sglang` holds torch too. `loose` is for stack dumps (py-spy prints paths relative to
    site-packages, `scheduler.py`): there a file counts unless it is a known foreign one.
    """
    clean = path.replace("\\", "/")
    name = clean.rsplit("/", 1)[-1]
    for prof in profiles:
        for pkg in prof.packages:
            at = clean.rfind(f"{pkg}/")
            while at >= 0:
                if (at == 0 or clean[at - 1] in "/ ") and not _SITE.search(clean, at):
                    return f"{pkg}/{name}"
                at = clean.rfind(f"{pkg}/", 0, at)
    if (
        loose
        and not clean.startswith("/")
        and not _SITE.search(clean)
        and not (FOREIGN_FILES.search(clean))
    ):
        return name
    return None


_SITE = re.compile(r"(?:site|dist)-packages/")


def profiles_for(text_sample: str) -> tuple[ServerProfile, ...]:
    """The servers a log looks like it comes from (all of them when it says nothing)."""
    found = tuple(p for p in PROFILES if any(d in text_sample for d in p.detect))
    return found or PROFILES


#: the line where a server prints its arguments at start: SGLang every one of them, those
#: it works out itself (`mem_fraction_static`, `cuda_graph_max_bs`) with the value chosen
#: (`server_args=ServerArgs(a=1, b='x')`); vLLM the ones not at their default
#: (`non-default args: {'a': 1}`)
_ARGS_LINES = re.compile(
    r"server_args=ServerArgs\((?P<sgl>.*)\)\s*$|non-default args: \{(?P<vllm>.*)\}"
)
_SCALAR = r"(?P<v>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|True|False|None|'[^']*')(?=\s*[,)}]|\s*$)"
_SGL_ARG = re.compile(r"(?:^|, )(?P<k>\w+)=" + _SCALAR)
_VLLM_ARG = re.compile(r"(?:^|, )'(?P<k>\w+)': " + _SCALAR)


def printed_args(log: str) -> dict[str, str]:
    """The scalar arguments a server printed at start, by flag name (`mem-fraction-static`
    -> `0.88`), the last start's line winning; empty when the log has no such line."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        if "server_args=ServerArgs(" not in line and "non-default args: {" not in line:
            continue
        m = _ARGS_LINES.search(line)
        if m is None:
            continue
        body, pat = (m["sgl"], _SGL_ARG) if m["sgl"] is not None else (m["vllm"], _VLLM_ARG)
        out = {a["k"].replace("_", "-"): a["v"].strip("'") for a in pat.finditer(body)}
    return out


__all__ = [
    "ARGS_FILES",
    "ARGS_FRAMES",
    "ARGS_MARKERS",
    "FOREIGN_FILES",
    "GENERIC_CLASSES",
    "GENERIC_HEADERS",
    "PHASE_HINTS",
    "KEY_WORDS",
    "RECORD_STARTS",
    "QUOTED_MESSAGES",
    "UNTYPED_ERROR",
    "VALUE_PARTS",
    "RUN_TOGETHER_MIN",
    "SELF_NAMING",
    "SPECIFIC_WORDS",
    "STOP_MARKERS",
    "WRAPPED_CAUSES",
    "CIRCUMSTANCES",
    "GenericHeader",
    "PASS_THROUGH",
    "PROFILES",
    "SGLANG",
    "VLLM",
    "Marker",
    "ServerProfile",
    "own_file",
    "printed_args",
    "profiles_for",
]
