#!/usr/bin/env python3
"""Reference inference benchmark: SmolLM2 (GGUF) in HF transformers.

Loads the GGUF with transformers (dequantized to f32, optionally cast to bf16), --attn attention (sdpa, transformers' default, or eager),
then measures
  * prefill tokens/s: one forward over a prompt of --prompt-tokens tokens (KV cache populated),
  * decode tokens/s: greedy generate() with a fixed number of new tokens (eos ignored, KV cache on);
    decode time = t(generate new_tokens) - t(generate 1 token), i.e. prefill and the first token
    are excluded, over (new_tokens - 1) tokens.
Each measurement is preceded by a warm-up and is the median of --repeats runs.
Prints one JSON line.

    python scripts/bench_transformers_generate.py --gguf models/smollm2/SmolLM2-135M-Instruct-Q4_1.gguf

--hf-dir DIR loads a Hugging Face model folder instead (e.g. one from scripts/make_smollm2_hf.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", type=Path)
    src.add_argument("--hf-dir", type=Path, help="a Hugging Face model folder instead of a GGUF")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM
    from transformers import __version__ as tf_version

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    dev = args.device

    t0 = time.perf_counter()
    if args.gguf is not None:
        model = AutoModelForCausalLM.from_pretrained(
            args.gguf.parent, gguf_file=args.gguf.name, dtype=torch.float32, attn_implementation=args.attn
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32, attn_implementation=args.attn)
    model = model.to(device=dev, dtype=dtype).eval()
    load_s = time.perf_counter() - t0

    cfg = model.config
    # random prompt of ordinary (non-special) tokens, deterministic
    g = torch.Generator().manual_seed(args.seed)
    lo = 32  # skip the special/control tokens at the start of the vocab
    prompt = torch.randint(lo, cfg.vocab_size, (1, args.prompt_tokens), generator=g).to(dev)
    attn = torch.ones_like(prompt)

    gen_kwargs = dict(
        attention_mask=attn,
        do_sample=False,
        use_cache=True,
        min_new_tokens=None,
        eos_token_id=None,
        pad_token_id=cfg.pad_token_id if cfg.pad_token_id is not None else 0,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    # make sure nothing from the model's generation_config can stop early
    model.generation_config.eos_token_id = None

    def prefill():
        with torch.inference_mode():
            model(input_ids=prompt, attention_mask=attn, use_cache=True)

    def gen(n):
        with torch.inference_mode():
            out = model.generate(input_ids=prompt, max_new_tokens=n, **gen_kwargs)
        assert out.shape[1] == prompt.shape[1] + n, out.shape
        return out

    # warm-up
    prefill()
    gen(min(8, args.new_tokens))

    prefill_times = [timed(prefill, dev) for _ in range(args.repeats)]
    gen1_times = [timed(lambda: gen(1), dev) for _ in range(args.repeats)]
    genN_times = [timed(lambda: gen(args.new_tokens), dev) for _ in range(args.repeats)]

    t_prefill = statistics.median(prefill_times)
    t_gen1 = statistics.median(gen1_times)
    t_genN = statistics.median(genN_times)
    decode_tokens = args.new_tokens - 1
    t_decode = max(t_genN - t_gen1, 1e-9)

    res = {
        "impl": "transformers",
        "model": (args.gguf or args.hf_dir).name,
        "device": dev,
        "dtype": args.dtype,
        "threads": torch.get_num_threads() if dev == "cpu" else None,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "prefill_tokens_per_sec": args.prompt_tokens / t_prefill,
        "decode_tokens_per_sec": decode_tokens / t_decode,
        "prefill_s": t_prefill,
        "decode_s": t_decode,
        "decode_ms_per_token": 1000 * t_decode / decode_tokens,
        "generate_end_to_end_s": t_genN,
        "end_to_end_tokens_per_sec": args.new_tokens / t_genN,
        "repeats": args.repeats,
        "attn_implementation": args.attn,
        "kv_cache": True,
        "load_s": load_s,
        "torch": torch.__version__,
        "transformers": tf_version,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if dev == "cuda" else None,
    }
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
