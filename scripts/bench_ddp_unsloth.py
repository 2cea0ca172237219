#!/usr/bin/env python3
"""Unsloth twin of scripts/bench_ddp_peft.py: the same torchrun job, DDP wrapper, random batches, AdamW, timing and
JSON line (bench_ddp_peft.bench), with the model loaded by Unsloth's FastLanguageModel (its Triton RMSNorm / RoPE /
SwiGLU / LoRA kernels and loss) on cuda:LOCAL_RANK, LoRA added by FastLanguageModel.get_peft_model (r=--rank,
alpha=2*rank, dropout 0, --targets; Unsloth's fused LoRA path needs all seven linears). --checkpointing is Unsloth's
own (offloaded) gradient checkpointing. bf16 only.

Needs the offline Unsloth kit (shared/anchors/README.md: untar unsloth-site.tar.xz to /tmp/site, PYTHONPATH=/tmp/site)
and a model folder with a tokenizer, e.g. the one gpu_unsloth.py makes (/tmp/llama-1b-bf16). Each rank compiles into
its own UNSLOTH_COMPILE_LOCATION (/tmp/unsloth_compiled_cache_rankN), so ranks do not race on one cache; Unsloth
compiles during warm-up (about a minute), so keep --warmup >= 3. Not yet run on a lent machine when written (the kit
could not be carried then); bench_ddp_peft.py's shared loop was.

    NCCL_NVLS_ENABLE=0 PYTHONPATH=/tmp/site torchrun --standalone --nproc-per-node 2 scripts/bench_ddp_unsloth.py \\
        --model /tmp/llama-1b-bf16 --global-batch-size 8 --seq-len 1024 --rank 8 \\
        --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj --steps 20 --warmup 3
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ddp_peft import Dist, alpha_of, bench, build_parser, targets_of  # noqa: E402  (stdlib only at import)


def main() -> None:
    args = build_parser(__doc__).parse_args()
    if args.dtype != "bf16":
        sys.exit("bench_ddp_unsloth.py: --dtype bf16 only")
    local_rank = os.environ.get("LOCAL_RANK", "0")
    for k, v in dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                     UNSLOTH_DISABLE_STATISTICS="1",
                     UNSLOTH_COMPILE_LOCATION=f"/tmp/unsloth_compiled_cache_rank{local_rank}").items():
        os.environ.setdefault(k, v)
    from importlib.metadata import version

    import torch

    torch.cuda.set_device(int(local_rank))  # before Unsloth touches CUDA, or every rank opens a context on GPU 0
    from unsloth import FastLanguageModel  # first, so that its patches land before transformers and peft are used

    d = Dist(args)
    t0 = time.perf_counter()
    ckpt = "unsloth" if args.checkpointing else False
    model, _ = FastLanguageModel.from_pretrained(str(args.model), max_seq_length=args.seq_len, dtype=d.dtype,
                                                 load_in_4bit=False, device_map={"": d.local_rank},
                                                 use_gradient_checkpointing=ckpt)
    model = FastLanguageModel.get_peft_model(model, r=args.rank, lora_alpha=alpha_of(args), lora_dropout=0,
                                             target_modules=targets_of(args), bias="none",
                                             use_gradient_checkpointing=ckpt, random_state=args.seed)
    FastLanguageModel.for_training(model)
    bench(d, args, model, "unsloth", t0, unsloth=version("unsloth"))


if __name__ == "__main__":
    main()
