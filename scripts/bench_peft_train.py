#!/usr/bin/env python3
"""Reference LoRA training-step benchmark: SmolLM2 (GGUF) + PEFT LoRA in HF transformers.

Loads the GGUF with transformers (dequantized to f32; --dtype bf16 casts the base model), wraps it
with peft LoRA (r=--rank, alpha=2*rank, dropout 0, --targets), freezes everything else, and runs
AdamW (lr 1e-4) over the adapter parameters on random token batches of shape
(--batch-size, --seq-len) with next-token cross-entropy loss. --attn picks transformers' attention:
sdpa (its default, PyTorch's fused flash / memory-efficient kernels) or eager; --liger applies
Liger kernels (the model type's entry in Liger's MODEL_TYPE_TO_APPLY_LIGER_FN: fused RMS norm, rotary,
SwiGLU/GeGLU and the fused linear cross-entropy that never materialises the logits; a model type Liger does not
cover is refused) before the model is created. No KV cache. --checkpointing turns on transformers' gradient
checkpointing. --qlora is the QLoRA recipe: the base loaded in 4-bit NF4 by bitsandbytes (double quantization,
bf16 compute), then PEFT's `prepare_model_for_kbit_training` (which casts the remaining weights to f32 and, with
--checkpointing, enables gradient checkpointing; `model.train()` follows, or checkpointing does nothing). Reports mean step time (forward + backward + optimizer step) over
--steps steps after --warmup steps, tokens/s, and peak memory (process max RSS on CPU via
resource.getrusage; torch.cuda.max_memory_allocated and max_memory_reserved on GPU; the driver's
view, nvidia-smi, is polled from outside by the caller). Prints one JSON line.

    python scripts/bench_peft_train.py --gguf models/smollm2/SmolLM2-135M-Instruct-Q4_1.gguf \
        --batch-size 4 --seq-len 128 --rank 8 --targets q_proj,v_proj --steps 5

--hf-dir DIR loads a Hugging Face model folder instead (e.g. one from scripts/make_smollm2_hf.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def max_rss_bytes() -> int:
    # Linux: ru_maxrss is in KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_hwm() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) so training peak can be told apart from loading."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def vm_hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None



def apply_liger(model_type: str) -> str:
    """Patch transformers with Liger's kernels for `model_type` (before the model loads); returns liger-kernel's
    version. Exits when Liger has no kernels for that type."""
    from importlib.metadata import version

    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        sys.exit(f"liger-kernel {version('liger-kernel')} has no kernels for model_type {model_type!r}")
    apply()
    return version("liger-kernel")

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", type=Path)
    src.add_argument("--hf-dir", type=Path, help="a Hugging Face model folder instead of a GGUF")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=None, help="default 2*rank")
    ap.add_argument("--targets", default="q_proj,v_proj")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--liger", action="store_true", help="apply Liger kernels for the model type before loading")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    ap.add_argument("--qlora", action="store_true", help="4-bit NF4 base (bitsandbytes) + prepare_model_for_kbit_training")
    args = ap.parse_args()

    from peft import LoraConfig, get_peft_model
    from peft import __version__ as peft_version
    from transformers import AutoModelForCausalLM
    from transformers import __version__ as tf_version

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dev = args.device
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]

    liger_version = None
    if args.liger:
        model_type = json.loads(((args.hf_dir or args.gguf.parent) / "config.json").read_text())["model_type"] \
            if args.hf_dir is not None else "llama"
        liger_version = apply_liger(model_type)

    t0 = time.perf_counter()
    if args.gguf is not None:
        model = AutoModelForCausalLM.from_pretrained(
            args.gguf.parent, gguf_file=args.gguf.name, dtype=torch.float32, attn_implementation=args.attn
        )
    elif args.qlora:
        from peft import prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig

        nf4 = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(args.hf_dir, quantization_config=nf4, dtype=torch.bfloat16,
                                                     device_map={"": 0}, attn_implementation=args.attn)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.checkpointing)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32, attn_implementation=args.attn)
    if not args.qlora:
        model = model.to(device=dev, dtype=dtype)
        if args.checkpointing:
            model.gradient_checkpointing_enable()
    model.config.use_cache = False
    # "all-linear" is PEFT's own word for every linear layer but the output head; any other value is a list.
    targets = "all-linear" if args.targets == "all-linear" else [t.strip() for t in args.targets.split(",") if t.strip()]
    lcfg = LoraConfig(
        task_type="CAUSAL_LM",
        r=args.rank,
        lora_alpha=args.alpha if args.alpha is not None else 2 * args.rank,
        lora_dropout=0.0,
        target_modules=targets,
        bias="none",
    )
    model = get_peft_model(model, lcfg)
    # adapters in the model dtype (peft keeps them in the base layer's dtype)
    model.train()
    load_s = time.perf_counter() - t0

    params = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in params)
    n_total = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(args.seed)

    def batch():
        x = torch.randint(32, vocab, (args.batch_size, args.seq_len), generator=g)
        return x.to(dev)

    import gc

    gc.collect()
    rss_after_load = vm_hwm_bytes()
    hwm_reset = reset_hwm()
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()

    losses = []

    def step():
        x = batch()
        out = model(input_ids=x, labels=x, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    for _ in range(args.warmup):
        losses.append(step())
    times = []
    for _ in range(args.steps):
        sync(dev)
        t = time.perf_counter()
        losses.append(step())
        sync(dev)
        times.append(time.perf_counter() - t)

    mean_s = statistics.mean(times)
    tokens = args.batch_size * args.seq_len
    res = {
        "impl": "transformers+peft" + ("+bnb-nf4" if args.qlora else "") + ("+liger" if args.liger else ""),
        "checkpointing": args.checkpointing,
        "attn": args.attn,
        "liger": liger_version,
        "model": (args.gguf or args.hf_dir).name,
        "device": dev,
        "dtype": args.dtype,
        "threads": torch.get_num_threads() if dev == "cpu" else None,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "rank": args.rank,
        "alpha": lcfg.lora_alpha,
        "targets": targets,
        "trainable_params": n_trainable,
        "total_params": n_total,
        "warmup_steps": args.warmup,
        "steps": args.steps,
        "mean_step_s": mean_s,
        "median_step_s": statistics.median(times),
        "min_step_s": min(times),
        "tokens_per_sec": tokens / mean_s,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if dev == "cuda" else max_rss_bytes(),
        "peak_memory_kind": "cuda_max_memory_allocated" if dev == "cuda" else "process_max_rss",
        "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved() if dev == "cuda" else None,
        "peak_rss_during_training_bytes": vm_hwm_bytes() if hwm_reset else None,
        "peak_rss_load_bytes": rss_after_load,
        "load_s": load_s,
        "torch": torch.__version__,
        "transformers": tf_version,
        "peft": peft_version,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(0) if dev == "cuda" else None,
    }
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
