"""Seeded random incidents: 4-30 deltas (flags, environment variables, keys of a JSON
flag), a cause that is one delta, 2-3 interacting ones or two independent sets, failing as
a crash in a startup phase, a hang, a crash under load or wrong answers, sometimes on a
share of the starts only, with decoy failures beside it that are not the target.

`incident(seed)` is a pure function of the seed. The features it drew are listed on the
incident (`features`), which is how the fuzzer's table groups its incidents.
"""

from __future__ import annotations

import random
from typing import Any

from tests.support.fuzz.incident import AFTER_REQUESTS, JSON_FLAG, Cond, Delta, Fault, Incident

#: flags a delta may change: name -> (good, bad); None is absent
FLAGS: dict[str, tuple[Any, Any]] = {
    "max-running-requests": (128, 256),
    "chunked-prefill-size": (8192, 16384),
    "cuda-graph-max-bs": (160, 256),
    "max-prefill-tokens": (16384, 32768),
    "stream-interval": (1, 8),
    "dp-size": (1, 2),
    "ep-size": (None, 8),
    "page-size": (1, 16),
    "num-continuous-decode-steps": (1, 4),
    "max-total-tokens": (None, 200000),
    "watchdog-timeout": (300, 600),
    "random-seed": (None, 42),
    "decode-log-interval": (40, 10),
    "torch-compile-max-bs": (32, 64),
    "schedule-conservativeness": (1.0, 0.8),
    "enable-nccl-nvls": (None, True),
    "enable-dp-attention": (None, True),
    "enable-metrics": (None, True),
    "enable-torch-compile": (None, True),
    "enable-mixed-chunk": (None, True),
    "enable-two-batch-overlap": (None, True),
    "disable-radix-cache": (None, True),
    "enable-deterministic-inference": (None, True),
    "log-requests": (None, True),
    "enable-cache-report": (None, True),
    "disable-custom-all-reduce": (True, None),
    "disable-cuda-graph-padding": (True, None),
    "enable-p2p-check": (True, None),
    "schedule-policy": ("lpm", "fcfs"),
    "attention-backend": ("flashinfer", "fa3"),
    "moe-runner-backend": ("auto", "flashinfer_cutlass"),
    "moe-a2a-backend": ("none", "deepep"),
    "kv-cache-dtype": ("auto", "fp8_e5m2"),
    "sampling-backend": ("flashinfer", "pytorch"),
    "grammar-backend": ("xgrammar", "outlines"),
    "load-balance-method": ("round_robin", "shortest_queue"),
    "speculative-algorithm": (None, "NEXTN"),
}
#: environment variables a delta may change
ENV: dict[str, tuple[Any, Any]] = {
    "NCCL_DEBUG": ("WARN", "INFO"),
    "NCCL_NVLS_ENABLE": (None, "1"),
    "NCCL_ALGO": (None, "Tree"),
    "SGLANG_ENABLE_JIT_DEEPGEMM": ("1", "0"),
    "CUDA_LAUNCH_BLOCKING": (None, "1"),
    "NCCL_IB_DISABLE": (None, "1"),
    "NCCL_P2P_LEVEL": (None, "NVL"),
    "SGLANG_TORCH_PROFILER_DIR": ("/tmp/prof", None),
}
#: keys of the JSON flag (both sides set them, so each is a changed key path)
JSON_KEYS: dict[str, tuple[Any, Any]] = {
    "cudagraph_mode": ("PIECEWISE", "FULL"),
    "level": (2, 3),
    "pass_config.enable_fusion": (False, True),
    "pass_config.enable_attn_fusion": (False, True),
    "max_capture_size": (256, 512),
}
#: crashes: (error, phases it may happen in); each incident uses an error once
ERRORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling"
        " `cublasGemmStridedBatchedEx(...)`",
        ("cuda_graph", "warmup"),
    ),
    ("RuntimeError: CUDA error: misaligned address", ("cuda_graph", "warmup")),
    ("AttributeError: 'NoneType' object has no attribute 'dtype'", ("init", "load_weights")),
    (
        "RuntimeError: CUDA error: operation not permitted when stream is capturing",
        ("cuda_graph",),
    ),
    (
        "ValueError: Duplicated timeseries in CollectorRegistry: {'sglang:num_requests_total'}",
        ("init", "warmup"),
    ),
    ("KeyError: 'model.layers.3.mlp.experts.w13_weight_scale_inv'", ("load_weights",)),
    (
        "TypeError: forward() got an unexpected keyword argument 'forward_batch'",
        ("init", "warmup", "cuda_graph"),
    ),
    (
        "NotImplementedError: FP8 block quantization is not supported on this device",
        ("init", "load_weights"),
    ),
    ("IndexError: index 8 is out of bounds for dimension 0 with size 8", ("warmup", "kv_cache")),
    ("ZeroDivisionError: division by zero", ("kv_cache", "init")),
)
LOAD_ERROR = "RuntimeError: CUDA error: an illegal memory access was encountered"
HANG_PHASES = ("load_weights", "cuda_graph", "warmup")


def incident(seed: int) -> Incident:
    """The incident of `seed`: the same on every call and machine."""
    rng = random.Random(f"fuzz-{seed}")
    features: list[str] = []
    deltas = _deltas(rng, rng.randint(4, 30), features)
    keys = [d.key for d in deltas]
    errors = list(ERRORS)
    rng.shuffle(errors)

    kind = rng.choices(["crash", "hang", "load", "answers"], [0.55, 0.15, 0.18, 0.12])[0]
    cause = rng.choices(["single", "interacting", "independent"], [0.4, 0.35, 0.25])[0]
    features += [kind, cause]
    flaky = rng.random() < 0.2
    if flaky:
        features.append("flaky")
    probability = rng.choice([0.5, 0.7]) if flaky else None

    # the target's rules: one per cause set, all with one failure
    sets = _cause_sets(rng, keys, cause)
    phase, error, effect, after = _failure(rng, kind, errors)
    targets = [
        Fault(
            conds=tuple(_cond(rng, k, deltas) for k in s),
            phase=phase,
            error=error,
            effect=effect,
            probability=probability,
            after_requests=after,
            shared=rng.random() < 0.3,
        )
        for s in sets
    ]

    # decoys: other failures met on the way, never what bad shows
    decoys = []
    culprits = {k for s in sets for k in s}
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        decoy = _decoy(rng, keys, sets, culprits, errors, deltas, kind, flaky)
        if decoy is not None:
            decoys.append(decoy)
    if decoys:
        features.append("decoy")
    if any(d.kind == "env" for d in deltas if d.key in culprits):
        features.append("env-cause")
    if any(d.kind == "json" for d in deltas if d.key in culprits):
        features.append("json-cause")
    if any(isinstance(v, str) and v.startswith("/") for d in deltas for v in (d.good, d.bad)):
        features.append("path")  # a launch that names a file on one side only
    hang = kind == "hang" or any(d.effect == "hang" for d in decoys)
    return Incident(
        seed=seed,
        features=tuple(features),
        deltas=tuple(deltas),
        faults=(*targets, *decoys),
        probe=kind == "load",
        answers=kind == "answers" or any(d.answers for d in decoys),
        health_timeout=8.0 if hang else 30.0,
    )


def _deltas(rng: random.Random, n: int, features: list[str]) -> list[Delta]:
    n_json = rng.choice([0, 0, 0, rng.randint(1, len(JSON_KEYS))]) if n >= 4 else 0
    n_env = min(len(ENV), rng.randint(0, max(1, n // 4)))
    n_json = min(n_json, n - 2)
    n_env = min(n_env, n - n_json - 1)
    n_flags = n - n_json - n_env
    out = [Delta(k, *FLAGS[k]) for k in rng.sample(sorted(FLAGS), n_flags)]
    out += [Delta(f"env:{k}", *ENV[k]) for k in rng.sample(sorted(ENV), n_env)]
    out += [Delta(f"{JSON_FLAG}.{k}", *JSON_KEYS[k]) for k in rng.sample(sorted(JSON_KEYS), n_json)]
    if n_json:
        features.append("json")
    if n_env:
        features.append("env")
    rng.shuffle(out)
    return out


def _cause_sets(rng: random.Random, keys: list[str], cause: str) -> list[list[str]]:
    if cause == "single":
        return [rng.sample(keys, 1)]
    if cause == "interacting":
        return [rng.sample(keys, min(len(keys), rng.choice([2, 2, 3])))]
    picked = rng.sample(keys, 4)
    first = picked[: rng.choice([1, 2])]
    return [first, picked[len(first) : len(first) + rng.choice([1, 1, 2])]]


def _failure(
    rng: random.Random, kind: str, errors: list[tuple[str, tuple[str, ...]]]
) -> tuple[str, str, str, int | None]:
    """(phase, error, effect, after_requests) of the target."""
    if kind == "hang":
        return rng.choice(HANG_PHASES), "", "hang", None
    if kind == "load":
        return "serving", LOAD_ERROR, "crash", AFTER_REQUESTS
    if kind == "answers":
        return "serving", "", rng.choice(["garbled", "wrong"]), None
    error, phases = errors.pop()
    return rng.choice(phases), error, "crash", None


def _cond(rng: random.Random, key: str, deltas: list[Delta], applied: bool = True) -> Cond:
    d = next(x for x in deltas if x.key == key)
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (d.good, d.bad))
    return Cond(key, applied, cmp=numeric and d.kind == "flag" and rng.random() < 0.5)


def _decoy(
    rng: random.Random,
    keys: list[str],
    sets: list[list[str]],
    culprits: set[str],
    errors: list[tuple[str, tuple[str, ...]]],
    deltas: list[Delta],
    kind: str,
    flaky: bool,
) -> Fault | None:
    """A failure that is not the target: part of a cause set (b300's `ep-size` alone), or
    other deltas. A decoy that bad could show is masked by the target rules before it."""
    if rng.random() < 0.4 and any(len(s) > 1 for s in sets):
        s = rng.choice([s for s in sets if len(s) > 1])
        applied = rng.sample(s, rng.randint(1, len(s) - 1))
    else:
        applied = rng.sample(keys, rng.choice([1, 1, 2]))
    if any(set(s) <= set(applied) for s in sets):
        return None  # the target's rule comes first: it would never show
    conds = [_cond(rng, k, deltas) for k in applied]
    if flaky or kind == "answers":
        # nothing masks it in bad (a flaky target may not fire; an answers rule comes after
        # every crash): a member of each cause set must be absent
        for s in sets:
            absent = rng.choice(sorted(set(s) - set(applied)))
            if all(c.key != absent for c in conds):
                conds.append(Cond(absent, applied=False))
    if rng.random() < 0.25 and kind != "hang":
        phase, error, effect = rng.choice(HANG_PHASES), "", "hang"
    elif rng.random() < 0.15 and kind not in ("answers", "load"):
        phase, error, effect = "serving", "", rng.choice(["garbled", "wrong"])
    else:
        if not errors:
            return None
        error, phases = errors.pop()
        phase, effect = rng.choice(phases), "crash"
    return Fault(
        conds=tuple(conds),
        phase=phase,
        error=error,
        effect=effect,
        probability=rng.choice([None, None, 0.5]),
        role="decoy",
    )
