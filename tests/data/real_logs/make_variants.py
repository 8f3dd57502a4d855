"""Make the rerun variants of the real-log corpus and its labels.tsv.

Each `base/KEY.log` is one failure reconstructed from a public SGLang or vLLM issue (the
address is in CASES below). A rerun of the same bug on another day or host prints the same
lines with other timestamps, pids, ranks, addresses, hostnames, sizes and layer numbers,
interleaved with other ranks' copies of the error and with unrelated warnings. This script
produces such reruns deterministically (seeded by the key), so the corpus can be rebuilt:

    python tests/data/real_logs/make_variants.py

It writes `KEY.a.log` (the base as reported), `KEY.b.log` (another day and host: every
number that varies between runs changed, another rank's copy interleaved, unrelated
warnings and health polls around it) and, for every second case, `KEY.c.log` (the same run
as read from the journal of a systemd unit, from another build whose line numbers moved).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

HERE = Path(__file__).parent
SG = "https://github.com/sgl-project/sglang"
VL = "https://github.com/vllm-project/vllm"

# key, class, phase, source. The key is the root cause: one bug, one key.
CASES: tuple[tuple[str, str, str, str], ...] = (
    ("sgl_capture_ima_flashinfer_mla", "crash", "cuda_graph", f"{SG}/issues/5029"),
    ("sgl_capture_ima_triton_mla", "crash", "cuda_graph", f"{SG}/issues/1467"),
    ("sgl_ima_decode_sync", "crash", "serving", f"{SG}/issues/3713"),
    ("sgl_ima_eagle_flashinfer_prefill", "crash", "serving", f"{SG}/issues/5491"),
    ("sgl_ima_moe_router_nvfp4", "crash", "serving", f"{SG}/issues/18989"),
    ("sgl_ima_custom_allreduce", "crash", "serving", f"{SG}/issues/13016"),
    ("sgl_ima_flashinfer_ragged_tp2", "crash", "serving", f"{SG}/issues/16920"),
    ("sgl_watchdog_ima_piecewise_car", "crash", "serving", f"{SG}/pull/14193"),
    ("sgl_cublas_gemm_serving", "crash", "serving", f"{SG}/issues/19081"),
    ("sgl_deepgemm_library_root", "crash", "load_weights", f"{SG}/pull/9340"),
    ("sgl_watchdog_hang_min_new_tokens", "hang", "serving", f"{SG}/issues/12076"),
    ("sgl_watchdog_hang_no_pyspy", "hang", "serving", f"{SG}/issues/7783"),
    ("sgl_watchdog_hang_overlap_resolve", "hang", "serving", f"{SG}/issues/5022"),
    ("sgl_nvshmem_ibrc_connect", "crash", "kv_cache", f"{SG}/issues/9813"),
    ("sgl_triton_smem_fp8_moe", "crash", "serving", f"{SG}/issues/5995"),
    ("sgl_not_enough_memory_kv", "crash", "kv_cache", f"{SG}/issues/4330"),
    ("sgl_oom_capture_bs", "crash", "cuda_graph", f"{SG}/issues/5285"),
    ("sgl_keyerror_ep_moe_scale_inv", "crash", "load_weights", f"{SG}/issues/3075"),
    ("sgl_keyerror_w2_weight_scale", "crash", "load_weights", f"{SG}/issues/4598"),
    ("sgl_nccl_init_system_error", "crash", "init", f"{SG}/issues/4289"),
    ("sgl_warmup_502_proxy", "crash", "warmup", f"{SG}/issues/2468"),
    ("sgl_device_assert_logits", "crash", "serving", f"{SG}/issues/1274"),
    ("sgl_multinomial_nan_flashinfer003", "crash", "serving", f"{SG}/issues/283"),
    ("sgl_import_sgl_kernel_setdevice", "crash", "init", f"{SG}/issues/9173"),
    ("sgl_import_sgl_kernel_greenctx", "crash", "init", f"{SG}/issues/8432"),
    ("sgl_nccl_watchdog_allgather_timeout", "timeout", "serving", f"{SG}/issues/1693"),
    ("vllm_keyerror_gate_g_idx", "crash", "load_weights", f"{VL}/issues/25029"),
    (
        "vllm_keyerror_down_proj_weight_scale",
        "crash",
        "load_weights",
        "https://github.com/vllm-project/llm-compressor/issues/959",
    ),
    ("vllm_keyerror_w13_bias_gptoss", "crash", "load_weights", f"{VL}/issues/40358"),
    ("vllm_no_cache_blocks_v1_check", "crash", "kv_cache", f"{VL}/issues/27508"),
    ("vllm_no_cache_blocks_v0_raise_if", "crash", "kv_cache", f"{VL}/issues/10439"),
    ("vllm_max_seq_len_vs_kv", "crash", "kv_cache", f"{VL}/issues/5976"),
    ("vllm_sampler_warmup_oom", "crash", "warmup", f"{VL}/issues/17939"),
    ("vllm_free_memory_startup", "crash", "init", f"{VL}/issues/25837"),
    (
        "vllm_nccl_system_error_mp",
        "crash",
        "init",
        "https://github.com/gpustack/gpustack/issues/835",
    ),
    ("vllm_nccl_unhandled_cuda_ray", "crash", "init", f"{VL}/issues/7896"),
    ("vllm_rpc_sample_tokens_timeout", "timeout", "serving", f"{VL}/issues/46611"),
    ("vllm_rpc_execute_model_timeout", "timeout", "serving", f"{VL}/issues/17965"),
    ("vllm_engines_ready_timeout", "timeout", "load_weights", f"{VL}/issues/32116"),
    ("vllm_triton_smem_t4", "crash", "serving", f"{VL}/issues/36802"),
    (
        "vllm_capture_stream_unsupported",
        "crash",
        "cuda_graph",
        "https://github.com/noonghunna/club-3090/issues/106",
    ),
    ("vllm_capture_nccl_uncaptured_stream", "crash", "cuda_graph", f"{VL}/issues/4432"),
    ("vllm_ima_capture_gh200_pp", "crash", "cuda_graph", f"{VL}/issues/30044"),
    ("vllm_ima_fused_moe_triton", "crash", "serving", f"{VL}/issues/21520"),
    ("vllm_index_oob_assert", "crash", "serving", f"{VL}/issues/21731"),
    ("vllm_ima_profile_llama4", "crash", "kv_cache", f"{VL}/issues/19631"),
    ("vllm_topk_sort_oom_serving", "crash", "serving", f"{VL}/issues/24436"),
    ("vllm_engine_iteration_timeout_v0", "timeout", "serving", f"{VL}/issues/4293"),
    ("vllm_bf16_compute_capability", "crash", "init", f"{VL}/issues/1157"),
    ("vllm_arch_not_supported", "crash", "init", f"{VL}/issues/9624"),
    # added after the classifier was tuned, first scored blind (see README)
    ("vllm_ima_flash_attn_varlen_v0", "crash", "serving", f"{VL}/issues/6976"),
    ("sgl_typeerror_executor_submit", "crash", "load_weights", f"{SG}/issues/13048"),
    ("sgl_fp8_block_n_divisible", "crash", "load_weights", f"{SG}/issues/4791"),
    ("vllm_heads_not_divisible_tp", "crash", "init", f"{VL}/issues/414"),
)


class Rerun:
    """One rerun's consistent changes: the same old value always maps to the same new one."""

    def __init__(self, seed: str) -> None:
        self.rng = random.Random(seed)
        self.delta = timedelta(days=self.rng.randint(3, 400), seconds=self.rng.randint(0, 86399))
        self.maps: dict[str, dict[str, str]] = {}
        self.size_factor = self.rng.uniform(0.6, 1.4)
        self.line_shift = self.rng.randint(3, 40)  # another build: every line number moved

    def same(self, kind: str, old: str, make: Callable[[], str]) -> str:
        table = self.maps.setdefault(kind, {})
        if old not in table:
            table[old] = make()
        return table[old]

    def num(self, kind: str, old: str, lo: int, hi: int) -> str:
        return self.same(kind, old, lambda: str(self.rng.randint(lo, hi)))


def _shift(r: Rerun, text: str, fmt: str) -> str:
    try:
        when = datetime.strptime(text, fmt)
    except ValueError:
        return text
    if "%Y" not in fmt:
        when = when.replace(year=2025)
    return (when + r.delta).strftime(fmt)


def _times(r: Rerun, line: str) -> str:
    line = re.sub(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d",
        lambda m: _shift(r, m.group(0), "%Y-%m-%dT%H:%M:%S"),
        line,
    )
    line = re.sub(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d",
        lambda m: _shift(r, m.group(0), "%Y-%m-%d %H:%M:%S"),
        line,
    )
    line = re.sub(
        r"(?<=[A-Z] )\d\d-\d\d \d\d:\d\d:\d\d",
        lambda m: _shift(r, m.group(0), "%m-%d %H:%M:%S"),
        line,
    )
    line = re.sub(
        r"(?<=\[E)\d{4} \d\d:\d\d:\d\d", lambda m: _shift(r, m.group(0), "%m%d %H:%M:%S"), line
    )
    line = re.sub(r"^\[\d\d:\d\d:\d\d", lambda m: "[" + _shift(r, m.group(0)[1:], "%H:%M:%S"), line)
    return line


def _ranks(r: Rerun, line: str, top: int) -> str:
    def swap(m: re.Match[str]) -> str:
        return m.group(1) + r.num("rank", m.group(2), 0, top)

    return re.sub(
        r"(\b(?:TP|DP|EP|Rank |rank=|\[rank|GPU |Worker_TP|scheduler_TP))(\d+)\b", swap, line
    )


def _numbers(r: Rerun, line: str) -> str:
    line = re.sub(
        r"(pid=|PID |Process |Thread |process \[|python3?\[)(\d{3,7})(?=[\]):, ]|$)",
        lambda m: m.group(1) + r.num("pid", m.group(2), 1000, 3999999),
        line,
    )
    line = re.sub(
        r"0x[0-9a-f]{6,}",
        lambda m: r.same("hex", m.group(0), lambda: hex(r.rng.getrandbits(47))),
        line,
    )
    line = re.sub(
        r"\b(?:10|172|192)\.\d+\.\d+\.\d+\b",
        lambda m: r.same(
            "ip",
            m.group(0),
            lambda: f"10.{r.rng.randint(0, 255)}.{r.rng.randint(0, 255)}.{r.rng.randint(2, 254)}",
        ),
        line,
    )
    line = re.sub(
        r"(127\.0\.0\.1:)(\d{4,5})",
        lambda m: m.group(1) + r.num("port", m.group(2), 30000, 65000),
        line,
    )
    line = re.sub(
        r"(\d+\.\d\d) ?(GiB|GB|MiB|MB)\b",
        lambda m: f"{float(m.group(1)) * r.size_factor:.2f} {m.group(2)}",
        line,
    )
    line = re.sub(
        r"\blayers\.(\d+)\.", lambda m: f"layers.{r.num('layer', m.group(1), 0, 60)}.", line
    )
    line = re.sub(
        r"(#tokens: |#token: |#new-token: |#running-req: |SeqNum=|NumelIn=|NumelOut="
        r"|ran for |block: \[|thread: \[|with |Required: |max seq len \(|KV cache \(|"
        r"work: |batch_size\(\)=|size\(\)=)(\d+)",
        lambda m: m.group(1) + str(max(1, int(int(m.group(2)) * r.size_factor))),
        line,
    )
    line = re.sub(r"\brid=[0-9a-f]{32}", lambda m: f"rid={r.rng.getrandbits(128):032x}", line)
    line = re.sub(
        r"(chatcmpl-|cmpl-)[0-9a-f]{32}",
        lambda m: f"{m.group(1)}{r.rng.getrandbits(128):032x}",
        line,
    )
    line = re.sub(
        r"(ts-[0-9a-f]+-worker-\d+|sglang-head-r\d|gpt-oss-20b-[0-9a-z]+-[0-9a-z]+)",
        lambda m: r.same("host", m.group(0), lambda: f"gpu-node-{r.rng.randint(1, 99):02d}"),
        line,
    )
    return line


def _line_numbers(r: Rerun, line: str) -> str:
    return re.sub(
        r'(", line |\.py:|\.cpp:|\.cu:|\.hpp:)(\d+)',
        lambda m: m.group(1) + str(int(m.group(2)) + r.line_shift),
        line,
    )


_SGL_NOISE = (
    '[{ts}] INFO:     127.0.0.1:{port} - "GET /health HTTP/1.1" 200 OK',
    "/usr/local/lib/python3.10/dist-packages/torch/cuda/__init__.py:61: FutureWarning: The "
    "pynvml package is deprecated. Please install nvidia-ml-py instead. If you did not install "
    "pynvml directly, please report this to the maintainers of the package that installed "
    "pynvml for you.",
    "[{ts}] Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
    "Please use '/model_info' instead.",
)
_VLLM_NOISE = (
    'INFO:     127.0.0.1:{port} - "GET /health HTTP/1.1" 200 OK',
    "WARNING {vts} [config.py:1239] Default sampling parameters have been overridden by the "
    "model's Hugging Face generation config recommended from the model creator. If this is not "
    "intended, please relaunch vLLM instance with `--generation-config vllm`.",
    "WARNING {vts} [__init__.py:1711] The following intended overrides are not keyword-only "
    "args and will be dropped: {{'truncate_prompt_tokens'}}",
)
_AFTER = (
    "/usr/lib/python3.10/multiprocessing/resource_tracker.py:254: UserWarning: "
    "resource_tracker: There appear to be 1 leaked shared_memory objects to clean up at shutdown",
    "  warnings.warn('resource_tracker: There appear to be %d '",
)

_TRACE_LINE = re.compile(r"^\s|Traceback|Error|Exception|Watchdog|Pyspy|^Thread |what\(\)")
_WRAPPED = re.compile(r"^[\w.-]+\s+\|\s|^\S+Z\s")  # docker compose / docker --timestamps


def _noise(r: Rerun, lines: list[str], vllm: bool) -> list[str]:
    """Unrelated warnings and health polls between startup lines (never inside a traceback)."""
    first_error = next(
        (i for i, ln in enumerate(lines) if _TRACE_LINE.search(_WRAPPED.sub("", ln))), len(lines)
    )
    out: list[str] = []
    pool = _VLLM_NOISE if vllm else _SGL_NOISE
    for i, line in enumerate(lines):
        out.append(line)
        if i < first_error and r.rng.random() < 0.5:
            sgl = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line)
            vts = re.search(r"(?<=[A-Z] )\d\d-\d\d \d\d:\d\d:\d\d", line)
            text = r.rng.choice(pool).format(
                ts=sgl.group(0) if sgl else "",
                vts=vts.group(0) if vts else "01-01 00:00:00",
                port=r.rng.randint(30000, 60000),
            )
            out.append(text.replace("[] ", ""))
    return out + list(_AFTER)


_SGL_EXC = re.compile(
    r"^\[(?P<ts>[^\]]*?) (?P<rank>TP\d+)\] (Scheduler hit an exception|"
    r"Exception in|TpModelWorkerClient hit)"
)
_VLLM_WORKER = re.compile(r"^\((?P<tag>VllmWorker rank=|Worker_TP)(?P<rank>\d+)(?P<rest>[^)]*)\)")


def _interleave(r: Rerun, lines: list[str], top: int) -> list[str]:
    """Another rank's copy of the failing traceback, printed right after the first one."""
    for i, line in enumerate(lines):
        m = _SGL_EXC.match(line)
        if m:
            end = i + 1
            while end < len(lines) and not lines[end].startswith("["):
                end += 1
            other = (int(m.group("rank")[2:]) + 1) % (top + 1)
            block = [lines[i].replace(m.group("rank"), f"TP{other}", 1)] + lines[i + 1 : end]
            return lines[:end] + block + lines[end:]
    for i, line in enumerate(lines):
        m = _VLLM_WORKER.match(line)
        if m and "Traceback" in line:
            tag = f"({m.group('tag')}{m.group('rank')}{m.group('rest')})"
            block = [ln for ln in lines[i:] if ln.startswith(tag)]
            other_rank = (int(m.group("rank")) + 1) % (top + 1)
            other_tag = f"({m.group('tag')}{other_rank} pid={r.rng.randint(1000, 99999)})"
            copy = [ln.replace(tag, other_tag, 1) for ln in block]
            last = max(j for j, ln in enumerate(lines) if ln.startswith(tag))
            return lines[: last + 1] + copy + lines[last + 1 :]
    return lines


def _journal(r: Rerun, lines: list[str]) -> list[str]:
    host = f"gpu-{r.rng.randint(100, 999)}"
    pid = r.rng.randint(2000, 90000)
    start = datetime(2026, r.rng.randint(1, 12), r.rng.randint(1, 28), r.rng.randint(0, 23))
    out = []
    for i, line in enumerate(lines):
        stamp = (start + timedelta(seconds=i // 7)).strftime("%b %d %H:%M:%S")
        out.append(f"{stamp} {host} python3[{pid}]: {line}")
    return out


def rerun(text: str, seed: str, *, journal: bool, shift_lines: bool) -> str:
    r = Rerun(seed)
    vllm = "vllm" in text
    lines = text.splitlines()
    ranks = [int(x) for x in re.findall(r"\b(?:TP|rank=|Rank |\[rank|Worker_TP)(\d+)\b", text)]
    top = max([*ranks, 0])
    top = 7 if top == 0 and ranks else top
    lines = _interleave(r, lines, top) if top else lines
    lines = [_numbers(r, _ranks(r, _times(r, ln), top) if top else _times(r, ln)) for ln in lines]
    if shift_lines:
        lines = [_line_numbers(r, ln) for ln in lines]
    lines = _noise(r, lines, vllm)
    if journal:
        lines = _journal(r, lines)
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = ["file\tclass\tphase\troot_cause_key\tsource"]
    for i, (key, klass, phase, source) in enumerate(CASES):
        base = (HERE / "base" / f"{key}.log").read_text(encoding="utf-8")
        variants = {
            "a": base if base.endswith("\n") else base + "\n",
            "b": rerun(base, key + "/b", journal=False, shift_lines=False),
        }
        if i % 2 == 0:
            variants["c"] = rerun(base, key + "/c", journal=True, shift_lines=True)
        for tag, text in variants.items():
            name = f"{key}.{tag}.log"
            (HERE / name).write_text(text, encoding="utf-8")
            rows.append(f"{name}\t{klass}\t{phase}\t{key}\t{source}")
    (HERE / "labels.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
