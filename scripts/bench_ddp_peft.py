#!/usr/bin/env python3
"""Multi-GPU reference LoRA training-step benchmark: HF transformers + PEFT LoRA + torch DistributedDataParallel.

The data-parallel twin of scripts/bench_peft_train.py (same model loading from a local HF folder, same LoRA settings:
r=--rank, alpha=2*rank, dropout 0, --targets; same random-token batches with labels = ids and next-token
cross-entropy; same SDPA attention; same --liger; same AdamW lr 1e-4 over the adapter parameters; same warmup/steps
timing), run as one process per GPU under torchrun with the NCCL backend:

  * each rank loads the model in --dtype on cuda:LOCAL_RANK, wraps it with PEFT LoRA, then with torch DDP
    (find_unused_parameters=False, gradient_as_bucket_view=True, broadcast_buffers=False: the only buffers are the
    fixed rotary tables); DDP broadcasts rank 0's weights and adapters at construction, so all replicas start equal;
  * every step each rank draws its own --global-batch-size/N rows of --seq-len random ids (seed --seed + rank), does
    forward + backward (DDP all-reduces, i.e. averages, the adapter gradients) + optimizer step;
  * a timed step is  cuda.synchronize; dist.barrier; t0; step; cuda.synchronize; dist.barrier; t1  on every rank,
    and rank 0's times are reported (the barriers make them the slowest rank's).

Rank 0 prints one JSON line: world_size, global_batch_size, per_rank_batch_size, seq_len, median_step_secs,
mean_step_secs, tokens_per_sec (global: B*T / median step; tokens_per_sec_mean is B*T / mean, the figure
bench_peft_train.py calls tokens_per_sec), peak_memory_gib (rank 0's torch.cuda.max_memory_allocated since after
loading) and the largest over ranks, first_loss/last_loss (averaged over ranks), torch/peft/transformers/NCCL versions.

NCCL_NVLS_ENABLE=0 must be set by the caller (with TORCH_SYMM_MEM_DISABLE_MULTICAST=1): NVLink multicast stays off on
the lent multi-GPU machines, whose GPUs a multicast user can put out of service for others. The script also does
os.environ.setdefault("NCCL_NVLS_ENABLE", "0") (and the same for the torch one) before init; that only covers a
caller who forgot, not one who set them to something else.

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 2 scripts/bench_ddp_peft.py --model DIR \\
        --global-batch-size 8 --seq-len 1024 --rank 8 \\
        --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --steps 20 --warmup 3 --dtype bf16

--nproc-per-node 1 is the one-GPU baseline through the same code (DDP over one rank: its gradient hooks and a one-rank
all-reduce stay in); add --no-ddp there to time the bare model without the DDP wrapper. Run with plain python3 (no
torchrun) it behaves as a one-rank torchrun. --global-batch-size must be divisible by the number of ranks.
Seen working with one rank on a lent H200 (torch 2.11, transformers 5.17, peft 0.21, random-weight Llama-3.2-1B shape,
4 x 1024, all seven linears, r 8): 0.121 s/step through DDP, 0.119 s with --no-ddp, 19.0 GiB allocated.
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


def build_parser(doc: str | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="a local Hugging Face model folder")
    ap.add_argument("--global-batch-size", type=int, default=4, help="rows per step, all ranks (B); each rank gets B/N")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--rank", type=int, default=8, help="LoRA rank (not the process rank)")
    ap.add_argument("--alpha", type=float, default=None, help="default 2*rank")
    ap.add_argument("--targets", default="q_proj,v_proj", help="comma list of module names, or all-linear (PEFT's)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="bf16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    ap.add_argument("--no-ddp", action="store_true", help="one rank only: train the PEFT model without the DDP wrapper")
    return ap


class Dist:
    """This process's place in the job: rank, local_rank, world, per-rank rows b, its cuda device. Sets up NCCL."""

    def __init__(self, args: argparse.Namespace):
        # torchrun sets these; plain `python3 scripts/bench_ddp_peft.py` runs as a one-rank job.
        one_rank = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511")
        for k, v in one_rank.items():
            os.environ.setdefault(k, v)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        self.rank, self.local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        B = args.global_batch_size
        if B % self.world != 0 or B < self.world:
            sys.exit(f"--global-batch-size {B} is not divisible by the {self.world} ranks" if self.rank == 0 else 2)
        if args.no_ddp and self.world != 1:
            sys.exit("--no-ddp needs exactly one rank (--nproc-per-node 1)" if self.rank == 0 else 2)
        if args.steps < 1 or args.warmup < 0:
            sys.exit("--steps must be at least 1 and --warmup at least 0" if self.rank == 0 else 2)
        self.b = B // self.world

        import torch
        import torch.distributed as dist

        torch.cuda.set_device(self.local_rank)
        self.dev = torch.device("cuda", self.local_rank)
        dist.init_process_group(backend="nccl")
        self.dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
        torch.manual_seed(args.seed)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(device_ids=[self.local_rank])


def targets_of(args: argparse.Namespace) -> str | list[str]:
    # "all-linear" is PEFT's own word for every linear layer but the output head; any other value is a list.
    return "all-linear" if args.targets == "all-linear" else [t.strip() for t in args.targets.split(",") if t.strip()]


def alpha_of(args: argparse.Namespace) -> float:
    return args.alpha if args.alpha is not None else 2 * args.rank


def bench(d: Dist, args: argparse.Namespace, model, impl: str, t0: float, **extra) -> None:
    """Wrap the (PEFT) model in DDP unless --no-ddp, train --warmup + --steps steps, print rank 0's JSON line.

    t0: perf_counter before loading (load_s); extra: more JSON fields."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in params)
    n_total = sum(p.numel() for p in model.parameters())
    net = model if args.no_ddp else DDP(model, device_ids=[d.local_rank], output_device=d.local_rank,
                                        broadcast_buffers=False, find_unused_parameters=False,
                                        gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    d.barrier()
    load_s = time.perf_counter() - t0

    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(args.seed + d.rank)

    def step() -> float:
        x = torch.randint(32, vocab, (d.b, args.seq_len), generator=g).to(d.dev)
        out = net(input_ids=x, labels=x, use_cache=False)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(out.loss.detach())

    torch.cuda.reset_peak_memory_stats()
    losses = [step() for _ in range(args.warmup)]
    times = []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        d.barrier()
        t = time.perf_counter()
        losses.append(step())
        torch.cuda.synchronize()
        d.barrier()
        times.append(time.perf_counter() - t)

    # first/last loss averaged over ranks (each rank saw different rows); peak memory: rank 0's and the largest
    stats = torch.tensor([losses[0], losses[-1]], dtype=torch.float64, device=d.dev)
    dist.all_reduce(stats)
    stats /= d.world
    peak = torch.tensor([torch.cuda.max_memory_allocated(d.dev)], dtype=torch.int64, device=d.dev)
    peak_max = peak.clone()
    dist.all_reduce(peak_max, op=dist.ReduceOp.MAX)

    if d.rank == 0:
        from peft import __version__ as peft_version
        from transformers import __version__ as tf_version

        B, T = args.global_batch_size, args.seq_len
        median_s, mean_s = statistics.median(times), statistics.mean(times)
        res = {
            "impl": impl + ("+ddp" if not args.no_ddp else "+no-ddp"),
            "checkpointing": args.checkpointing,
            **extra,
            "model": args.model.name,
            "dtype": args.dtype,
            "world_size": d.world,
            "global_batch_size": B,
            "per_rank_batch_size": d.b,
            "seq_len": T,
            "rank": args.rank,
            "alpha": alpha_of(args),
            "targets": targets_of(args),
            "trainable_params": n_trainable,
            "total_params": n_total,
            "warmup_steps": args.warmup,
            "steps": args.steps,
            "median_step_secs": median_s,
            "mean_step_secs": mean_s,
            "min_step_secs": min(times),
            "tokens_per_sec": B * T / median_s,
            "tokens_per_sec_mean": B * T / mean_s,
            "first_loss": stats[0].item(),
            "last_loss": stats[1].item(),
            "peak_memory_gib": peak.item() / 2**30,
            "peak_memory_gib_max_rank": peak_max.item() / 2**30,
            "peak_memory_reserved_gib": torch.cuda.max_memory_reserved(d.dev) / 2**30,
            "load_s": load_s,
            "torch": torch.__version__,
            "transformers": tf_version,
            "peft": peft_version,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
            "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(d.dev),
        }
        print(json.dumps(res), flush=True)
    dist.destroy_process_group()


def main() -> None:
    ap = build_parser()
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--liger", action="store_true", help="apply Liger kernels for the model type before loading")
    args = ap.parse_args()
    d = Dist(args)

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    liger_version = None
    if args.liger:
        from bench_peft_train import apply_liger  # beside this script

        liger_version = apply_liger(json.loads((args.model / "config.json").read_text())["model_type"])

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=d.dtype, attn_implementation=args.attn)
    model = model.to(device=d.dev, dtype=d.dtype)
    if args.checkpointing:  # non-reentrant: the DDP-safe kind
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    lcfg = LoraConfig(task_type="CAUSAL_LM", r=args.rank, lora_alpha=alpha_of(args), lora_dropout=0.0,
                      target_modules=targets_of(args), bias="none")
    model = get_peft_model(model, lcfg)
    bench(d, args, model, "transformers+peft" + ("+liger" if args.liger else ""), t0,
          attn=args.attn, liger=liger_version)


if __name__ == "__main__":
    main()
