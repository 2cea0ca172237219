#!/usr/bin/env python3
"""TRL's GRPOTrainer on the work `metal-candle bench grpo` times: step time, generation time, peak memory.

The same work as ours (engine/grpo_bench.rs): each optimizer step, PROMPTS prompts of PROMPT_LEN random token ids
(pre-tokenized: `_tokenize_prompts` hands TRL the ids, so no text round trip changes their length), each sampled
NUM_GENERATIONS times by TRL's own Hugging Face `generate` (no vLLM, no paged/continuous batching) at temperature 1,
top-p 1, with exactly MAX_NEW_TOKENS new tokens (`generation_kwargs={"min_new_tokens": N}`: the eos is suppressed
until N, and max_completion_length = N stops there); the synthetic reward sum((i + 1) * id) % 997 / 997 over each
completion's ids (ours computes the same); advantages scaled by the group's std; loss_type "dapo", beta 0 (no
reference pass), num_iterations 1, one generation batch per optimizer step (per_device_train_batch_size =
generation_batch_size = PROMPTS x NUM_GENERATIONS, gradient accumulation 1). LoRA r8 alpha 16 dropout 0 on all
seven linears (PEFT), torch's fused AdamW, lr 1e-4, no gradient checkpointing, SDPA attention. Variants:

  plain    transformers + PEFT + TRL
  unsloth  Unsloth's FastLanguageModel (its Triton kernels, fused LoRA, its patched GRPOTrainer), without
           fast_inference (vLLM), so generation is Unsloth's patched HF generate

Timing: wall time between consecutive optimizer steps' ends (device synchronised), after WARMUP steps, over STEPS
steps; generation is `_generate_single_turn` timed around (synchronised); training is the rest of the step (the
reward, TRL's bookkeeping, forward, backward and AdamW). Peak memory: CUDA: torch.cuda.max_memory_allocated over the
timed steps (the runner samples nvidia-smi beside it); CPU: peak RSS. Prints one JSON line. Usage:

    bench_trl_grpo.py --model DIR [--variant plain|unsloth] [--prompts 4] [--prompt-len 128]
                      [--num-generations 8] [--max-new-tokens 256] [--device cuda|cpu] [--dtype bf16|f32]
                      [--steps 5] [--warmup 1] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face model folder")
    ap.add_argument("--variant", choices=["plain", "unsloth"], default="plain")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--num-generations", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first (at least 1)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: its default)")
    return ap.parse_args()


def synthetic_reward(ids) -> float:
    """engine/grpo_bench.rs `synthetic_reward`: position-weighted id sum modulo 997, over 997."""
    return sum((i + 1) * int(t) for i, t in enumerate(ids)) % 997 / 997


def load(args, torch):
    """The model with a fresh LoRA adapter (PEFT's, or Unsloth's patched PEFT) and its tokenizer."""
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    if args.variant == "unsloth":
        from unsloth import FastLanguageModel

        model, tok = FastLanguageModel.from_pretrained(
            args.model, max_seq_length=args.prompt_len + args.max_new_tokens, dtype=dtype, load_in_4bit=False,
            fast_inference=False, use_gradient_checkpointing=False,
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


def main() -> None:
    args = parse()
    if args.warmup < 1 or args.steps < 1:
        sys.exit("--warmup and --steps must be at least 1")
    for k, v in dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                     UNSLOTH_DISABLE_STATISTICS="1", UNSLOTH_COMPILE_LOCATION="/tmp/unsloth_compiled_cache",
                     WANDB_DISABLED="true").items():
        os.environ.setdefault(k, v)
    if args.variant == "unsloth":
        import unsloth  # noqa: F401  first, so that its patches (GRPOTrainer included) land before trl is used
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    model, tok = load(args, torch)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    from importlib.metadata import version

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    total = args.warmup + args.steps
    rng = random.Random(7)
    vocab = model.config.vocab_size
    prompt_ids = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(total * args.prompts)]
    gen_secs: list[float] = []

    class PreTokenized(GRPOTrainer):
        """Prompts are keys into `prompt_ids` (exact lengths, no text round trip); generation is timed."""

        def _tokenize_prompts(self, prompts):
            return [prompt_ids[int(p)] for p in prompts], None, {}

        def _generate_single_turn(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = super()._generate_single_turn(*a, **k)
            if cuda:
                torch.cuda.synchronize()
            gen_secs.append(time.perf_counter() - t0)
            return out

    class Clock(TrainerCallback):
        """The end time of every optimizer step, the device synchronised; peak memory reset after the warm-up."""

        def __init__(self):
            self.ends, self.losses, self.lengths = [], [], []

        def on_step_end(self, _args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self.ends.append(time.perf_counter())
            if state.global_step == args.warmup and cuda:
                torch.cuda.reset_peak_memory_stats()

        def on_log(self, _args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                self.losses.append(logs["loss"])
            if logs and "completions/mean_length" in logs:
                self.lengths.append(logs["completions/mean_length"])

    def reward(prompts, completions, completion_ids, **kw):
        return [synthetic_reward(ids) for ids in completion_ids]

    batch = args.prompts * args.num_generations
    config = GRPOConfig(
        output_dir="/tmp/trl-grpo-bench", per_device_train_batch_size=batch, generation_batch_size=batch,
        num_generations=args.num_generations, max_completion_length=args.max_new_tokens,
        generation_kwargs={"min_new_tokens": args.max_new_tokens}, temperature=1.0, top_p=1.0,
        loss_type="dapo", beta=0.0, num_iterations=1, scale_rewards="group", max_steps=total,
        gradient_accumulation_steps=1, optim="adamw_torch_fused", weight_decay=0.0, learning_rate=1e-4,
        gradient_checkpointing=False, bf16=args.dtype == "bf16" and cuda, use_cpu=not cuda, logging_steps=1,
        save_strategy="no", report_to="none", dataloader_num_workers=0, disable_tqdm=True, seed=0,
        shuffle_dataset=False,
    )
    clock = Clock()
    trainer = PreTokenized(
        model=model, reward_funcs=[reward], args=config, processing_class=tok, callbacks=[clock],
        train_dataset=Dataset.from_dict({"prompt": [str(i) for i in range(len(prompt_ids))]}),
    )
    trainer.train()
    ends = clock.ends[args.warmup - 1:]  # from the end of the last warm-up step
    times = [b - a for a, b in zip(ends, ends[1:])]
    gens = gen_secs[args.warmup:args.warmup + len(times)]
    mean = sum(times) / len(times)
    mean_gen = sum(gens) / len(gens) if len(gens) == len(times) else None  # None: generation was not seen
    tokens = batch * args.max_new_tokens
    out = {
        "impl": {"plain": "trl+peft", "unsloth": "unsloth+trl"}[args.variant], "method": "grpo",
        "device": args.device, "dtype": args.dtype, "prompts": args.prompts, "prompt_len": args.prompt_len,
        "num_generations": args.num_generations, "max_new_tokens": args.max_new_tokens, "steps": len(times),
        "mean_generation_secs": mean_gen and round(mean_gen, 5),
        "mean_training_secs": mean_gen and round(mean - mean_gen, 5),
        "mean_step_secs": round(mean, 5), "median_step_secs": round(sorted(times)[len(times) // 2], 5),
        "steps_per_sec": round(1 / mean, 4), "completion_tokens_per_sec": round(tokens / mean, 1),
        "generation_tokens_per_sec": mean_gen and round(tokens / mean_gen, 1),
        "mean_completion_tokens": clock.lengths[-1] if clock.lengths else None,
        "last_loss": clock.losses[-1] if clock.losses else None,
        "threads": torch.get_num_threads() if not cuda else None,
        "versions": {p: version(p) for p in ["torch", "transformers", "peft", "trl"]
                     + {"unsloth": ["unsloth"]}.get(args.variant, [])},
    }
    if cuda:
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    else:
        out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
