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
    args = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    if getattr(cfg, "rope_parameters", None) is not None:  # transformers >= 5
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": 100000.0}
    model = LlamaForCausalLM(cfg).to(torch.float32)
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
