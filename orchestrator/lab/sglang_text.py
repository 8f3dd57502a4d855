"""The words the simulated server prints: SGLang's startup lines and scheduler tracebacks.

The strings follow SGLang's own source and logs (`Load weight begin. avail mem=...`,
`Capture cuda graph begin. This can take up to several minutes. ...`, `The server is fired
up and ready to roll!`, `Scheduler hit an exception: Traceback ...`, `Received sigquit from
a child process. It usually means the child failed.`), so a log classifier written against
the lab also reads real logs. Each phase starts with a line that names it, which is how a
reader of a log tail tells where startup stopped:

    init         server_args=ServerArgs(...), Init torch distributed begin.
    load_weights Load weight begin.
    kv_cache     Using KV cache dtype: ...    (after Load weight end.)
    cuda_graph   Capture cuda graph begin.
    warmup       INFO:     Uvicorn running on ...
    serving      The server is fired up and ready to roll!

A line is a (rank, text) pair: rank None is the main process (`[time]` prefix), rank r a
scheduler (`[time TPr]`), and RAW a line printed without a prefix (progress bars, the
continuation lines of a traceback).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.lab.scenario_model import Frame, ModelInfo

RAW = -1
Line = tuple[int | None, str]

_SGL = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
_TORCH = "/usr/local/lib/python3.12/dist-packages/torch"
SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."
READY_LINE = "The server is fired up and ready to roll!"


@dataclass(frozen=True)
class Numbers:
    """Memory and size figures for the startup lines, derived from the model and flags."""

    tp: int
    gpu: float
    after_init: float
    weights: float
    after_weights: float
    kv_each: float
    kv_tokens: int
    after_pool: float
    graph_mem: float
    after_graph: float
    graph_bs: tuple[int, ...]
    max_running: int
    chunked_prefill: int
    #: what the server chose for the knobs it sizes itself when they are not set (SGLang
    #: works them out before it prints its arguments, and prints them with the others)
    chosen: tuple[tuple[str, object], ...] = ()


def numbers(
    model: ModelInfo, flags: Mapping[str, object], defaults: Mapping[str, object], tp: int
) -> Numbers:
    def num(name: str, fallback: float) -> float:
        v = flags.get(name, defaults.get(name, fallback))
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else fallback

    gpu = model.gpu_mem_gb
    after_init = gpu - 0.92
    weights = model.weights_gb / tp
    after_weights = max(after_init - weights, 0.5)
    mfs = num("mem-fraction-static", 0.85)
    kv_total = max(gpu * mfs - weights, 0.5)
    kv_each = kv_total / 2
    after_pool = max(after_weights - kv_total, 0.4)
    graph_mem = 0.6 + 0.002 * num("cuda-graph-max-bs", num("cuda-graph-max-bs-decode", 256))
    max_bs = int(num("cuda-graph-max-bs", num("cuda-graph-max-bs-decode", 256)))
    bs_list = flags.get("cuda-graph-bs")
    if isinstance(bs_list, list) and all(isinstance(b, int) for b in bs_list):
        graph_bs = tuple(sorted(int(b) for b in bs_list))
    else:
        candidates = [
            1,
            2,
            4,
            8,
            12,
            *range(16, 257, 8),
            *range(272, 513, 16),
            *range(544, 1025, 32),
        ]
        graph_bs = tuple(b for b in candidates if b <= max(max_bs, 1)) or (1,)
    return Numbers(
        tp=tp,
        gpu=gpu,
        after_init=after_init,
        weights=weights,
        after_weights=after_weights,
        kv_each=kv_each,
        kv_tokens=int(kv_total * 26_214),
        after_pool=after_pool,
        graph_mem=graph_mem,
        after_graph=max(after_pool - graph_mem, 0.3),
        graph_bs=graph_bs,
        max_running=int(num("max-running-requests", 2048)),
        chunked_prefill=int(num("chunked-prefill-size", 8192)),
        chosen=(
            ("mem-fraction-static", mfs),
            ("cuda-graph-max-bs", max_bs),
            ("chunked-prefill-size", int(num("chunked-prefill-size", 8192))),
        ),
    )


def _ranks(tp: int, text: str) -> list[Line]:
    return [(r, text) for r in range(tp)]


def server_args_line(
    flags: Mapping[str, object], host: str, port: int, chosen: Mapping[str, object] | None = None
) -> str:
    """SGLang's `server_args=ServerArgs(...)`: every argument, the ones the command line
    does not set with the value the server chose for them (`chosen`)."""
    flags = {**(chosen or {}), **flags}
    shown = {
        "model_path": flags.get("model-path", "/models/model"),
        "tokenizer_path": flags.get("model-path", "/models/model"),
        "host": host,
        "port": port,
    }
    for name, v in sorted(flags.items()):
        if name in ("model-path", "host", "port"):
            continue
        shown[name.replace("-", "_").replace(".", "_")] = v
    body = ", ".join(f"{k}={v!r}" for k, v in shown.items())
    return f"server_args=ServerArgs({body})"


def phase_begin(
    phase: str,
    n: Numbers,
    model: ModelInfo,
    flags: Mapping[str, object],
    host: str,
    port: int,
    pid: int,
) -> list[Line]:
    if phase == "init":
        return [
            (None, server_args_line(flags, host, port, dict(n.chosen))),
            (None, "Using default HuggingFace chat template with detected content format: string"),
            *_ranks(n.tp, "Init torch distributed begin."),
        ]
    if phase == "load_weights":
        begin = [
            *_ranks(n.tp, f"Init torch distributed ends. mem usage={n.gpu - n.after_init:.2f} GB"),
            *_ranks(n.tp, f"Load weight begin. avail mem={n.after_init:.2f} GB"),
        ]
        if str(flags.get("load-format", "")) == "dummy":
            return begin  # random weights: no checkpoint is read
        return [
            *begin,
            (0, "Using model weights format ['*.safetensors']"),
            (
                RAW,
                f"Loading safetensors checkpoint shards:   0% Completed | 0/{model.shards} "
                "[00:00<?, ?it/s]",
            ),
        ]
    if phase == "kv_cache":
        return [(0, f"Using KV cache dtype: {model.dtype}")]
    if phase == "cuda_graph":
        bs = n.graph_bs
        return [
            *_ranks(
                n.tp,
                "Capture cuda graph begin. This can take up to several minutes. "
                f"avail mem={n.after_pool:.2f} GB",
            ),
            (0, f"Capture cuda graph bs {list(bs)}"),
            (
                RAW,
                f"Capturing batches (bs={bs[-1]} avail_mem={n.after_pool:.2f} GB):   0%|"
                f"          | 0/{len(bs)} [00:00<?, ?it/s]",
            ),
        ]
    if phase == "warmup":
        return [
            (None, f"INFO:     Started server process [{pid}]"),
            (None, "INFO:     Waiting for application startup."),
            (None, "INFO:     Application startup complete."),
            (None, f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)"),
            (None, 'INFO:     127.0.0.1:39846 - "GET /get_model_info HTTP/1.1" 200 OK'),
            (
                0,
                "Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, "
                "#running-req: 0, #queue-req: 0, ",
            ),
        ]
    raise ValueError(phase)


def load_progress(done: int, total: int, elapsed: float) -> Line:
    pct = int(100 * done / total)
    rate = done / elapsed if elapsed > 0 else 0.0
    return (
        RAW,
        f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {done}/{total} "
        f"[00:{int(elapsed):02d}<00:00, {rate:5.2f}it/s]",
    )


def phase_end(phase: str, n: Numbers, model: ModelInfo, elapsed: float) -> list[Line]:
    if phase == "init":
        return []  # "Init torch distributed ends." opens load_weights (it is printed there)
    if phase == "load_weights":
        return _ranks(
            n.tp,
            f"Load weight end. type={model.arch}, dtype={model.dtype}, "
            f"avail mem={n.after_weights:.2f} GB, mem usage={n.weights:.2f} GB.",
        )
    if phase == "kv_cache":
        lines: list[Line] = []
        for r in range(n.tp):
            lines.append(
                (
                    r,
                    f"KV Cache is allocated. #tokens: {n.kv_tokens}, "
                    f"K size: {n.kv_each:.2f} GB, V size: {n.kv_each:.2f} GB",
                )
            )
            lines.append((r, f"Memory pool end. avail mem={n.after_pool:.2f} GB"))
        return lines
    if phase == "cuda_graph":
        count = len(n.graph_bs)
        rate = count / elapsed if elapsed > 0 else 0.0
        return [
            (
                RAW,
                f"Capturing batches (bs=1 avail_mem={n.after_graph:.2f} GB): 100%|██████████| "
                f"{count}/{count} [00:{int(elapsed):02d}<00:00, {rate:5.2f}it/s]",
            ),
            *_ranks(
                n.tp,
                f"Capture cuda graph end. Time elapsed: {elapsed:.2f} s. "
                f"mem usage={n.graph_mem:.2f} GB. avail mem={n.after_graph:.2f} GB.",
            ),
            (
                0,
                f"max_total_num_tokens={n.kv_tokens}, chunked_prefill_size={n.chunked_prefill}, "
                f"max_prefill_tokens=16384, max_running_requests={n.max_running}, "
                f"context_len={model.context_len}, available_gpu_mem={n.after_graph:.2f} GB",
            ),
        ]
    if phase == "warmup":
        return [
            (None, 'INFO:     127.0.0.1:39852 - "POST /generate HTTP/1.1" 200 OK'),
            (None, READY_LINE),
        ]
    raise ValueError(phase)


# ---------------------------------------------------------------------------- tracebacks

_F = tuple[str, int, str, str]  # file, line, function, code

_SCHEDULER_INIT: list[_F] = [
    (f"{_SGL}/managers/scheduler.py", 2964, "run_scheduler_process", "scheduler = Scheduler("),
    (f"{_SGL}/managers/scheduler.py", 348, "__init__", "self.tp_worker = TpModelWorker("),
    (f"{_SGL}/managers/tp_worker.py", 95, "__init__", "self.model_runner = ModelRunner("),
    (
        f"{_SGL}/model_executor/model_runner.py",
        281,
        "__init__",
        "self.initialize(min_per_gpu_memory)",
    ),
]
_EVENT_LOOP: list[_F] = [
    (
        f"{_SGL}/managers/scheduler.py",
        2973,
        "run_scheduler_process",
        "scheduler.event_loop_overlap()",
    ),
    (f"{_TORCH}/utils/_contextlib.py", 120, "decorate_context", "return func(*args, **kwargs)"),
]
_PHASE_FRAMES: dict[str, list[_F]] = {
    "init": [
        *_SCHEDULER_INIT,
        (
            f"{_SGL}/model_executor/model_runner.py",
            334,
            "initialize",
            "self.init_torch_distributed()",
        ),
        (
            f"{_SGL}/model_executor/model_runner.py",
            655,
            "init_torch_distributed",
            "initialize_model_parallel(",
        ),
    ],
    "load_weights": [
        *_SCHEDULER_INIT,
        (f"{_SGL}/model_executor/model_runner.py", 369, "initialize", "self.load_model()"),
        (f"{_SGL}/model_executor/model_runner.py", 742, "load_model", "self.model = get_model("),
        (f"{_SGL}/model_loader/__init__.py", 28, "get_model", "return loader.load_model("),
        (f"{_SGL}/model_loader/loader.py", 595, "load_model", "self.load_weights_and_postprocess("),
        (
            f"{_SGL}/model_loader/loader.py",
            610,
            "load_weights_and_postprocess",
            "model.load_weights(weights)",
        ),
    ],
    "kv_cache": [
        *_SCHEDULER_INIT,
        (f"{_SGL}/model_executor/model_runner.py", 401, "initialize", "self.init_memory_pool("),
        (
            f"{_SGL}/model_executor/model_runner.py",
            1573,
            "init_memory_pool",
            "self.token_to_kv_pool = MHATokenToKVPool(",
        ),
    ],
    "cuda_graph": [
        *_SCHEDULER_INIT,
        (f"{_SGL}/model_executor/model_runner.py", 412, "initialize", "self.init_device_graphs()"),
        (
            f"{_SGL}/model_executor/model_runner.py",
            1890,
            "init_device_graphs",
            "self.graph_runner = graph_runners[self.device](self)",
        ),
        (f"{_SGL}/model_executor/cuda_graph_runner.py", 380, "__init__", "self.capture()"),
        (
            f"{_SGL}/model_executor/cuda_graph_runner.py",
            486,
            "capture",
            ") = self.capture_one_batch_size(bs, forward)",
        ),
        (
            f"{_SGL}/model_executor/cuda_graph_runner.py",
            650,
            "capture_one_batch_size",
            "run_once()",
        ),
        (
            f"{_SGL}/model_executor/cuda_graph_runner.py",
            639,
            "run_once",
            "logits_output_or_pp_proxy_tensors = forward(",
        ),
    ],
    "warmup": [
        *_EVENT_LOOP,
        (
            f"{_SGL}/managers/scheduler.py",
            1002,
            "event_loop_overlap",
            "batch_result = self.run_batch(batch)",
        ),
        (
            f"{_SGL}/managers/scheduler.py",
            1890,
            "run_batch",
            ") = self.tp_worker.forward_batch_generation(model_worker_batch)",
        ),
        (
            f"{_SGL}/managers/tp_worker.py",
            236,
            "forward_batch_generation",
            "logits_output, can_run_cuda_graph = self.model_runner.forward(",
        ),
        (
            f"{_SGL}/model_executor/model_runner.py",
            2090,
            "_forward_raw",
            "ret = self.forward_extend(",
        ),
    ],
    "serving": [
        *_EVENT_LOOP,
        (
            f"{_SGL}/managers/scheduler.py",
            996,
            "event_loop_overlap",
            "self.process_batch_result(tmp_batch, tmp_result)",
        ),
        (
            f"{_SGL}/managers/scheduler.py",
            2090,
            "process_batch_result",
            "self.process_batch_result_decode(batch, result)",
        ),
        (
            f"{_SGL}/managers/scheduler_output_processor_mixin.py",
            288,
            "process_batch_result_decode",
            "result.copy_done.synchronize()",
        ),
        (f"{_TORCH}/cuda/streams.py", 231, "synchronize", "super().synchronize()"),
    ],
}


def traceback_lines(phase: str, error: str, extra: Sequence[Frame] = ()) -> list[Line]:
    """A scheduler's traceback as SGLang logs it, ending with the rule's error text.

    The first line carries the rank prefix (`Scheduler hit an exception: Traceback ...`),
    the frames and the error follow unprefixed, as in a real log. A rule's own frames go
    innermost, so the last source line can match the bug; when the first of them is in
    the same function as the innermost default frame, it replaces that frame.
    """
    frames = list(_PHASE_FRAMES[phase])
    for i, f in enumerate(extra):
        entry = (f.file, f.line, f.func, f.code)
        if i == 0 and f.func == frames[-1][2]:
            frames[-1] = entry
        else:
            frames.append(entry)
    lines: list[Line] = [(0, "Scheduler hit an exception: Traceback (most recent call last):")]
    for file, lineno, func, code in frames:
        lines.append((RAW, f'  File "{file}", line {lineno}, in {func}'))
        lines.append((RAW, f"    {code}"))
    lines.extend((RAW, text) for text in error.splitlines())
    lines.append((RAW, ""))
    lines.append((None, SIGQUIT_LINE))
    return lines
