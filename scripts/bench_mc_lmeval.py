#!/usr/bin/env python3
"""lm-evaluation-harness's side of the multiple-choice benchmark (BENCHMARKS.md, "Multiple choice").

Scores the same items as `metal-candle bench multiple-choice` with lm-eval's own `hf` model: a Hugging Face
folder, float32, on the CPU, through lm-eval's real `arc_easy` task config with the dataset swapped for the local
file. The clock runs around `simple_evaluate` with the model already loaded (reading the rows, building the
requests, tokenizing, the forward passes and the metrics), as the Rust side times `run_eval`. Prints one JSON line.

    /work/venv-tf/bin/python scripts/bench_mc_lmeval.py --model /tmp/smollm2-hf --data assets/sample-mc/test.jsonl \
        --batch-size 8 --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import lm_eval
import torch
from lm_eval import simple_evaluate
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager

TASKS = Path(lm_eval.__file__).parent / "tasks"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path, help="a Hugging Face model folder")
    ap.add_argument("--data", required=True, type=Path, help="ARC-shaped rows (.jsonl or .parquet)")
    ap.add_argument("--task", default="arc_easy", choices=["arc_easy", "hellaswag"])
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16 (the HF model's dtype)")
    ap.add_argument("--attn", default=None, help="transformers attention implementation (e.g. sdpa)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    extra = {"attn_implementation": args.attn} if args.attn else {}
    lm = HFLM(pretrained=str(args.model), dtype=args.dtype, device=args.device, batch_size=args.batch_size, **extra)
    include = {"arc_easy": TASKS / "arc" / "arc_easy.yaml", "hellaswag": TASKS / "hellaswag" / "hellaswag.yaml"}
    kind = "parquet" if args.data.suffix == ".parquet" else "json"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "mc_bench.yaml").write_text(
            f"task: mc_bench\ntag: []\ninclude: {include[args.task]}\ndataset_path: {kind}\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    test: {args.data.resolve()}\ntest_split: test\n"
            "validation_split: null\ntraining_split: null\nfewshot_split: null\n")
        manager = TaskManager(include_path=tmp, include_defaults=False)
        started = time.perf_counter()
        out = simple_evaluate(model=lm, tasks=["mc_bench"], limit=args.limit, task_manager=manager, log_samples=True)
        secs = time.perf_counter() - started
    samples = out["samples"]["mc_bench"]
    metrics = out["results"]["mc_bench"]
    print(json.dumps({
        "impl": "lm-eval " + getattr(lm_eval, "__version__", "0.4"), "device": args.device,
        "dtype": {"float32": "f32", "bfloat16": "bf16"}.get(args.dtype, args.dtype),
        "threads": torch.get_num_threads(), "items": len(samples),
        "choices": sum(len(s["arguments"]) for s in samples), "secs": secs, "items_per_sec": len(samples) / secs,
        "acc": metrics["acc,none"], "acc_norm": metrics["acc_norm,none"], "batch_size": args.batch_size,
    }))


if __name__ == "__main__":
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
