"""Short options (`-tp 8`, `-O3`) as the known servers' parsers read them.

vLLM's `serve` parser gives many options a short alias (`--tensor-parallel-size, -tp`) and
its FlexibleArgumentParser reads `-O3`, `-O=3` and `-O 3` as `--optimization-level 3`;
SGLang's parser has none (it refuses `-tp`). A config names an option by its long name,
so `-tp 8` and `--tensor-parallel-size 8` are one option to the planner, not a removed
flag and an added one. The table is vLLM 0.33's, as its real parser registered it
(`tests/data/help/vllm-0.33.0-serve.accepts.json`; a test checks the table against it).
A short option of a server not known here is kept as written (`-x`), with its own values:
never read as the value of the flag before it. Where the server's own help is at hand,
the preflight's `respell` names it by its long name
(orchestrator.execution.preflight.option_of).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePosixPath

#: vLLM's short aliases -> (long option, takes no value)
VLLM: dict[str, tuple[str, bool]] = {
    "-asc": ("api-server-count", False),
    "-q": ("quantization", False),
    "-pp": ("pipeline-parallel-size", False),
    "-n": ("nnodes", False),
    "-r": ("node-rank", False),
    "-tp": ("tensor-parallel-size", False),
    "-dcp": ("decode-context-parallel-size", False),
    "-pcp": ("prefill-context-parallel-size", False),
    "-dp": ("data-parallel-size", False),
    "-dpn": ("data-parallel-rank", False),
    "-dpr": ("data-parallel-start-rank", False),
    "-dpl": ("data-parallel-size-local", False),
    "-dpa": ("data-parallel-address", False),
    "-dpp": ("data-parallel-rpc-port", False),
    "-dpb": ("data-parallel-backend", False),
    "-dph": ("data-parallel-hybrid-lb", True),
    "-dpe": ("data-parallel-external-lb", True),
    "-dpm": ("data-parallel-multi-port-external-lb", True),
    "-ep": ("enable-expert-parallel", True),
    "-sc": ("speculative-config", False),
    "-dc": ("diffusion-config", False),
    "-cc": ("compilation-config", False),
    "-ac": ("attention-config", False),
}
#: vLLM's FlexibleArgumentParser: `-O3`, `-O=3` (and `-O 3`) are `--optimization-level 3`
VLLM_O = "optimization-level"

#: argparse's negative-number test: such a word is a value, not an option
NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def server_of(exec_words: Sequence[str]) -> str | None:
    """`vllm` or `sglang` when the command is one of their servers' entry points (an
    image whose entry point is the server's counts: `docker run vllm/vllm-openai`)."""
    from orchestrator.config.containers import IMAGE_ENTRYPOINTS, image_repository

    words = list(exec_words)
    words += [e for w in exec_words for e in IMAGE_ENTRYPOINTS.get(image_repository(w), ())]
    for w in words:
        base = PurePosixPath(w).name
        if base == "vllm" or w.startswith("vllm.entrypoints"):
            return "vllm"
        if base == "sglang" or w.startswith("sglang.launch_server") or w == "sglang.srt":
            return "sglang"
    return None


def is_option(word: str) -> bool:
    """A word argparse reads as an option (not a value): `-x`, `--x`, `--x=1`; not `-`,
    not a negative number, not a word with a space before any `=` (argparse's rules)."""
    if word.startswith("--"):
        return True
    if len(word) < 2 or not word.startswith("-") or NEGATIVE.match(word):
        return False
    return " " not in word.split("=", 1)[0]


def read_short(word: str, server: str | None) -> tuple[str, str | None, bool]:
    """A single-dash option word -> (flag key, attached value or None, is a switch).

    The key is the long option's name where the server's table knows the alias (`-tp` ->
    `tensor-parallel-size`), else the word as written (`-x`, kept with its dash)."""
    if server == "vllm":
        if word.startswith("-O") and word != "-O" and word[2] != ".":
            return VLLM_O, word[3:] if word[2] == "=" else word[2:], False
        if word == "-O":
            return VLLM_O, None, False
        name, eq, inline = word.partition("=")
        if name in VLLM:
            long, switch = VLLM[name]
            return long, inline if eq else None, switch
        if word[:2] in VLLM and not VLLM[word[:2]][1]:  # `-qawq`: a one-letter option's value
            return VLLM[word[:2]][0], word[2:], False
    name, eq, inline = word.partition("=")
    return name, inline if eq else None, False


def canonical(exec_words: Sequence[str], key: str) -> str:
    """A config's short flag key by its long name where the server is known (`-tp` ->
    `tensor-parallel-size` for vLLM); any other key as it is. `-O3` is not a key this
    renames (its level is its value): `read_short` reads it."""
    if not key.startswith("-") or key.startswith("--"):
        return key
    if server_of(exec_words) == "vllm" and key in VLLM:
        return VLLM[key][0]
    return key


__all__ = ["NEGATIVE", "VLLM", "VLLM_O", "canonical", "is_option", "read_short", "server_of"]
