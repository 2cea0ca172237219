#!/usr/bin/env python3
"""TRL's DPOTrainer on the batch `metal-candle bench train --method dpo` times: step time, tokens/s, peak memory.

The same work as ours (engine/bench.rs `random_pair_batch`): PAIRS pairs of two T-token sequences of random ids, the
first T/2 tokens (the prompt) shared by chosen and rejected, the last T - T/2 scored; the batch is exactly
PAIRS x 2 x T (pre-tokenized rows, TRL's own collator, no padding). LoRA r8 alpha 16 dropout 0 on all seven linears
of each block (PEFT), DPO sigmoid loss, beta 0.1, reference = the base with the adapter switched off, computed every
step (no precompute), one batch per optimizer step, torch's fused AdamW (transformers' default with torch >= 2.8;
named, because Unsloth's config defaults to 2 accumulated batches and 8-bit AdamW), no gradient checkpointing
(DPOConfig turns it on by default; ours runs without, so both do the same work), SDPA attention. Variants:

  plain    transformers + PEFT + TRL
  liger    the same with `use_liger_kernel=True`: TRL 1.x applies Liger's RMSNorm, RoPE and SwiGLU kernels and keeps
           its own chunked log-prob head (TRL 1.x no longer wires Liger's fused DPO loss into DPOTrainer)
  unsloth  Unsloth's FastLanguageModel (its Triton kernels, fused LoRA) + PatchDPOTrainer, on the same TRL

Timing: wall time between consecutive optimizer steps' ends (device synchronised), after WARMUP steps, over STEPS
steps: what a user of the trainer waits for, data loading and TRL's metric bookkeeping included. Peak memory: CUDA:
torch.cuda.max_memory_allocated over the timed steps (the runner samples nvidia-smi beside it); CPU: peak RSS.
Prints one JSON line. Usage:

    bench_trl_dpo.py --model DIR --variant plain|liger|unsloth --pairs 4 --seq-len 1024 [--device cuda|cpu]
                     [--dtype bf16|f32] [--steps 20] [--warmup 3] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face model folder")
    ap.add_argument("--variant", choices=["plain", "liger", "unsloth"], default="plain")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (at least 1)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: its default)")
    return ap.parse_args()


def load(args, torch):
    """The model with a fresh LoRA adapter (PEFT's, or Unsloth's patched PEFT) and its tokenizer."""
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.variant == "unsloth":
        from unsloth import FastLanguageModel

        model, tok = FastLanguageModel.from_pretrained(
            args.model, max_seq_length=args.seq_len, dtype=dtype, load_in_4bit=False, use_gradient_checkpointing=False
        )
        model = FastLanguageModel.get_peft_model(
            model, r=8, lora_alpha=16, lora_dropout=0, target_modules=ALL, use_gradient_checkpointing=False
        )
        return model, tok
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, attn_implementation="sdpa")
    model = get_peft_model(
        model.to(args.device),
        LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=ALL, task_type="CAUSAL_LM"),
    )
    return model, AutoTokenizer.from_pretrained(args.model)


def pairs_dataset(vocab: int, rows: int, seq_len: int):
    """Pre-tokenized random pairs: a shared T/2-token prompt, then T - T/2 chosen and T - T/2 rejected tokens."""
    import random

    from datasets import Dataset

    rng = random.Random(0)
    prompt = seq_len // 2
    ids = lambda n: [rng.randrange(vocab) for _ in range(n)]  # noqa: E731
    cols = {"prompt_ids": [], "chosen_ids": [], "rejected_ids": []}
    for _ in range(rows):
        cols["prompt_ids"].append(ids(prompt))
        cols["chosen_ids"].append(ids(seq_len - prompt))
        cols["rejected_ids"].append(ids(seq_len - prompt))
    return Dataset.from_dict(cols)


def main() -> None:
    args = parse()
    if args.warmup < 1 or args.steps < 1:
        sys.exit("--warmup and --steps must be at least 1")
    for k, v in dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                     UNSLOTH_DISABLE_STATISTICS="1", UNSLOTH_COMPILE_LOCATION="/tmp/unsloth_compiled_cache",
                     WANDB_DISABLED="true").items():
        os.environ.setdefault(k, v)
    if args.variant == "unsloth":
        import unsloth  # noqa: F401  first, so that its patches land before transformers, peft and trl are used
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    model, tok = load(args, torch)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if args.variant == "unsloth":
        from unsloth import PatchDPOTrainer

        PatchDPOTrainer()
    from importlib.metadata import version

    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    class PreTokenized(DPOTrainer):
        """Rows arrive as prompt_ids / chosen_ids / rejected_ids already (what `_prepare_dataset` makes of text)."""

        def _prepare_dataset(self, dataset, *a, **k):
            return dataset

    class Clock(TrainerCallback):
        """The end time of every optimizer step, the device synchronised; peak memory reset after the warm-up."""

        def __init__(self):
            self.ends, self.losses = [], []

        def on_step_end(self, _args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self.ends.append(time.perf_counter())
            if state.global_step == args.warmup and cuda:
                torch.cuda.reset_peak_memory_stats()

        def on_log(self, _args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                self.losses.append(logs["loss"])

    total = args.warmup + args.steps
    config = DPOConfig(
        output_dir="/tmp/trl-dpo-bench", per_device_train_batch_size=args.pairs, max_steps=total,
        gradient_accumulation_steps=1, optim="adamw_torch_fused", weight_decay=0.0, learning_rate=1e-4, beta=0.1,
        loss_type=["sigmoid"], precompute_ref_log_probs=False,
        max_length=args.seq_len, gradient_checkpointing=False, bf16=args.dtype == "bf16" and cuda,
        use_liger_kernel=args.variant == "liger", use_cpu=not cuda, logging_steps=total, save_strategy="no",
        report_to="none", dataloader_num_workers=0, disable_tqdm=True, seed=0,
    )
    clock = Clock()
    trainer = PreTokenized(
        model=model, ref_model=None, args=config, processing_class=tok, callbacks=[clock],
        train_dataset=pairs_dataset(model.config.vocab_size, total * args.pairs, args.seq_len),
    )
    trainer.train()
    ends = clock.ends[args.warmup - 1:]  # from the end of the last warm-up step
    times = sorted(b - a for a, b in zip(ends, ends[1:]))
    mean = sum(times) / len(times)
    tokens = 2 * args.pairs * args.seq_len
    out = {
        "impl": {"plain": "trl+peft", "liger": "trl+peft+liger", "unsloth": "unsloth+trl"}[args.variant],
        "method": "dpo", "device": args.device, "dtype": args.dtype, "pairs": args.pairs, "seq_len": args.seq_len,
        "steps": len(times), "mean_step_s": round(mean, 5), "median_step_s": round(times[len(times) // 2], 5),
        "tokens_per_sec": round(tokens / mean, 1), "last_loss": clock.losses[-1] if clock.losses else None,
        "threads": torch.get_num_threads() if not cuda else None,
        "versions": {p: version(p) for p in ["torch", "transformers", "peft", "trl"]
                     + {"liger": ["liger-kernel"], "unsloth": ["unsloth"]}.get(args.variant, [])},
    }
    if cuda:
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    else:
        out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
