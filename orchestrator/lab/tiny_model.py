#!/usr/bin/env python3
"""Write a tiny Llama model directory for the real vLLM lab, all generated locally.

Usage: <vllm venv>/bin/python orchestrator/lab/tiny_model.py OUT_DIR

Run by the vLLM venv's interpreter (it needs torch, safetensors and tokenizers, which that
venv has; the project's own venv does not). Nothing is downloaded:

- config.json: a 2-layer LlamaForCausalLM, hidden 128, 4 heads of head_dim 32 (the CPU
  attention backend supports head sizes 32..512 only), 2048 positions;
- a byte-level BPE tokenizer (the 256 byte symbols, no merges, <s> </s> <unk>), written with
  the `tokenizers` library as tokenizer.json plus tokenizer_config.json;
- model.safetensors: real random weights (seeded, so every build is the same), so the
  server can load them; the lab's experiments still pass `--load-format dummy` to start faster.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 4
HEAD_DIM = 32
INTERMEDIATE = 256
POSITIONS = 2048
SPECIALS = ["<unk>", "<s>", "</s>"]


def config(vocab: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": POSITIONS,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "attention_bias": False,
        "mlp_bias": False,
    }


def write_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in sorted(ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<unk>",
                "model_max_length": POSITIONS,
                "add_bos_token": True,
                "add_eos_token": False,
            },
            indent=1,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<unk>",
            }
        )
        + "\n"
    )
    return len(vocab)


def write_weights(out: Path, vocab: int) -> None:
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    t: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": rand(vocab, HIDDEN),
        "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "lm_head.weight": rand(vocab, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = rand(HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.k_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.v_proj.weight"] = rand(KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.o_proj.weight"] = rand(HIDDEN, HEADS * HEAD_DIM)
        t[p + "mlp.gate_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        t[p + "mlp.up_proj.weight"] = rand(INTERMEDIATE, HIDDEN)
        t[p + "mlp.down_proj.weight"] = rand(HIDDEN, INTERMEDIATE)
        t[p + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: tiny_model.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out)
    (out / "config.json").write_text(json.dumps(config(vocab), indent=1) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}) + "\n"
    )
    write_weights(out, vocab)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
