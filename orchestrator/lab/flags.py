"""A catalogue of SGLang server flags, for scenarios that parse like the real server.

A scenario's `known_flags` may name a preset (`sglang`, `sglang-0.5.23`) or list flags;
a listed flag found here takes its kind (value, switch, list) and aliases from this
catalogue, so scenario files can stay a plain list of names. The two presets differ the
way the real releases do: 0.5.23 split `--cuda-graph-max-bs` into `-decode`/`-prefill`,
which makes the old spelling an ambiguous prefix under argparse's `allow_abbrev`.
"""

from __future__ import annotations

from dataclasses import dataclass

VALUE = "value"
SWITCH = "switch"
LIST = "list"
KINDS = (VALUE, SWITCH, LIST)


@dataclass(frozen=True)
class FlagSpec:
    """One server flag: canonical name (no dashes), kind, other long names, help text."""

    name: str
    kind: str = VALUE
    aliases: tuple[str, ...] = ()
    help: str | None = None


def _specs(kind: str, names: str) -> list[FlagSpec]:
    return [FlagSpec(n, kind) for n in names.split()]


# Flags every SGLang release of interest accepts. Aliases follow the real parser
# (`--tp-size` is also `--tensor-parallel-size`); they are folded onto the canonical name.
_COMMON: list[FlagSpec] = [
    FlagSpec("model-path", help="The path of the model weights."),
    FlagSpec("tp-size", aliases=("tensor-parallel-size",), help="The tensor parallelism size."),
    FlagSpec("dp-size", aliases=("data-parallel-size",), help="The data parallelism size."),
    FlagSpec("ep-size", aliases=("expert-parallel-size",), help="The expert parallelism size."),
    FlagSpec("pp-size", aliases=("pipeline-parallel-size",)),
    FlagSpec("host", help="The host of the HTTP server."),
    FlagSpec("port", help="The port of the HTTP server."),
    FlagSpec("mem-fraction-static", help="The fraction of the memory used for static allocation."),
    FlagSpec("max-running-requests", help="The maximum number of running requests."),
    FlagSpec("cuda-graph-bs", LIST, help="Set the list of batch sizes for cuda graph."),
    *_specs(
        VALUE,
        "tokenizer-path tokenizer-mode load-format dtype kv-cache-dtype quantization "
        "context-length served-model-name chat-template revision max-total-tokens "
        "chunked-prefill-size max-prefill-tokens schedule-policy schedule-conservativeness "
        "page-size random-seed watchdog-timeout dist-timeout download-dir base-gpu-id "
        "log-level decode-log-interval api-key attention-backend prefill-attention-backend "
        "decode-attention-backend sampling-backend grammar-backend moe-a2a-backend "
        "moe-runner-backend deepep-mode ep-num-redundant-experts ep-dispatch-algorithm "
        "init-expert-location expert-distribution-recorder-mode speculative-algorithm "
        "speculative-draft-model-path speculative-num-steps speculative-eagle-topk "
        "speculative-num-draft-tokens reasoning-parser tool-call-parser dist-init-addr "
        "nnodes node-rank nccl-port torch-compile-max-bs stream-interval "
        "hicache-ratio hicache-size hicache-storage-backend enable-hierarchical-cache-mode "
        "json-model-override-args",
    ),
    *_specs(
        SWITCH,
        "trust-remote-code skip-server-warmup skip-tokenizer-init enable-nccl-nvls "
        "enable-symm-mem enable-dp-attention enable-dp-lm-head enable-two-batch-overlap "
        "enable-eplb enable-torch-compile enable-mixed-chunk enable-metrics enable-cache-report "
        "disable-cuda-graph disable-cuda-graph-padding disable-radix-cache "
        "disable-overlap-schedule disable-custom-all-reduce disable-shared-experts-fusion "
        "enable-flashinfer-allreduce-fusion enable-hierarchical-cache log-requests "
        "enable-deterministic-inference enable-piecewise-cuda-graph",
    ),
]

_PRESETS: dict[str, list[FlagSpec]] = {
    "sglang": [
        *_COMMON,
        FlagSpec("cuda-graph-max-bs", help="Set the maximum batch size for cuda graph."),
    ],
    "sglang-0.5.23": [
        *_COMMON,
        FlagSpec("cuda-graph-max-bs-decode", help="Maximum batch size for decode cuda graphs."),
        FlagSpec("cuda-graph-max-bs-prefill", help="Maximum batch size for prefill cuda graphs."),
    ],
}

#: Every flag any preset knows, by canonical name and by alias: used for the kind of a
#: flag a scenario lists by name, and to fold aliases in the permissive parser.
CATALOGUE: dict[str, FlagSpec] = {}
for _specs_of_preset in _PRESETS.values():
    for _spec in _specs_of_preset:
        CATALOGUE.setdefault(_spec.name, _spec)
ALIASES: dict[str, str] = {a: s.name for s in CATALOGUE.values() for a in s.aliases}


def preset_names() -> list[str]:
    return sorted(_PRESETS)


def preset(name: str) -> list[FlagSpec]:
    """The flags of a named preset; KeyError for an unknown name."""
    return list(_PRESETS[name])


def canonical(name: str) -> str:
    """A flag name with aliases folded onto the catalogue's canonical name."""
    return ALIASES.get(name, name)
