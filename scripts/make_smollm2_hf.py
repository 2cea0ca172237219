#!/usr/bin/env python3
"""Write a random-weight SmolLM2-135M-shaped Hugging Face model folder (f32 safetensors) for benchmarks.

Random weights (transformers' default init, seed --seed) of SmolLM2-135M's exact config: hidden 576,
30 layers, 9 heads, 3 KV heads, intermediate 1536, vocab 49152, tied embeddings, rope_theta 100000,
rms_norm_eps 1e-5, SiLU. Same shapes as the real model, so the same speed (checked on an H100: our
decode and transformers' decode ran at the same speed on this folder and on the real GGUF); useless
for quality. (A GGUF loaded by transformers 5.17 cannot be save_pretrained: it stays flagged quantized.)
--tokenizer copies a tokenizer.json into the folder (our loader needs one; the benchmarks only use it
to encode a synthetic prompt). Used where the 98 MB GGUF can't travel, e.g. to a lent GPU machine:

    python scripts/make_smollm2_hf.py --out /tmp/smollm2-random --tokenizer models/smollm2/transformers_tokenizer.json

--shape llama-3.2-1b writes Llama-3.2-1B's shape instead (hidden 2048, 16 layers, 32 heads, 8 KV heads,
head_dim 64, intermediate 8192, vocab 128256, tied embeddings, rope_theta 5e5 without the llama3 rope
scaling, which changes no shape); --shape llama-3.2-3b Llama-3.2-3B's (hidden 3072, 28 layers, 24 heads, 8 KV
heads, head_dim 128, the rest as 1B); --dtype bf16 halves the file (2.5 GB for the 1B shape, 6.4 GB for 3B).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.json to copy into the folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shape", choices=["smollm2-135m", "llama-3.2-1b", "llama-3.2-3b"], default="smollm2-135m")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    args = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    shape = {
        "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                             num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0),
        "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                             num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0),
        "llama-3.2-3b": dict(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                             num_attention_heads=24, num_key_value_heads=8, rope_theta=500000.0, head_dim=128),
    }[args.shape]
    cfg = LlamaConfig(
        **{"head_dim": 64, **shape},
        hidden_act="silu",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    if getattr(cfg, "rope_parameters", None) is not None:  # transformers >= 5
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": shape["rope_theta"]}
    model = LlamaForCausalLM(cfg).to({"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype])
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    if args.tokenizer is not None:
        shutil.copy(args.tokenizer, args.out / "tokenizer.json")
        (args.out / "tokenizer_config.json").write_text(
            json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})
        )
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"out": str(args.out), "source": "random", "parameters": n}))


if __name__ == "__main__":
    main()
