#!/usr/bin/env python3
"""PyTorch micro-benchmarks used as the reference for the Rust/Candle kernels.

Measurements (one JSON line each):
  * lora_linear forward / forward_backward: x (batch 4 x seq 128 x hidden), frozen base W (out=in=hidden),
    A (r x in), B (out x r), y = x W^T + scale * (x A^T) B^T with scale = alpha/r (alpha = 2r).
    forward_backward = forward + y.sum().backward() (grads for A, B and x; W frozen).
    - hidden 512/1024/2048 at rank 8
    - rank 4/8/16/32/64 at hidden 1024
    - plus the frozen base linear alone (forward) for each hidden as a baseline
  * softmax (last dim), layer_norm (with weight+bias), rms_norm (F.rms_norm and a manual
    x * rsqrt(mean(x^2) + eps) * w) over a (4*128, 1024) tensor, forward only.
Timing: warm-up, then repeat until --min-time seconds (at least --min-iters), report median/mean ms.

    python scripts/bench_torch_lora_micro.py [--device cpu|cuda] [--dtype f32|bf16] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

BATCH, SEQ = 4, 128


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bench(fn, device: str, warmup: int, min_iters: int, min_time: float, max_iters: int = 10_000):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    t_start = time.perf_counter()
    while len(times) < min_iters or (time.perf_counter() - t_start < min_time and len(times) < max_iters):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def emit(base: dict, times: list[float], flops: float | None = None) -> None:
    med = statistics.median(times)
    rec = dict(base)
    rec.update(
        median_ms=med * 1e3,
        mean_ms=statistics.mean(times) * 1e3,
        min_ms=min(times) * 1e3,
        iters=len(times),
    )
    if flops is not None:
        rec["gflops_per_sec"] = flops / med / 1e9
    print(json.dumps(rec), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--min-iters", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per measurement")
    ap.add_argument("--no-input-grad", action="store_true", help="x does not require grad in forward_backward")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = args.device
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    common = {
        "impl": "torch",
        "torch": torch.__version__,
        "device": dev,
        "dtype": args.dtype,
        "threads": torch.get_num_threads() if dev == "cpu" else None,
    }
    bk = dict(device=dev, warmup=args.warmup, min_iters=args.min_iters, min_time=args.min_time)

    def lora_case(hidden: int, rank: int, with_base_only: bool) -> None:
        alpha = 2 * rank
        scale = alpha / rank
        m = BATCH * SEQ
        W = (torch.randn(hidden, hidden, device=dev, dtype=dtype) * hidden**-0.5).requires_grad_(False)
        A = (torch.randn(rank, hidden, device=dev, dtype=dtype) * hidden**-0.5).requires_grad_(True)
        B = (torch.randn(hidden, rank, device=dev, dtype=dtype) * 0.01).requires_grad_(True)
        x0 = torch.randn(BATCH, SEQ, hidden, device=dev, dtype=dtype)
        shape = {"batch": BATCH, "seq": SEQ, "hidden": hidden, "rank": rank, "alpha": alpha, "scale": scale}

        def fwd(x):
            return F.linear(x, W) + scale * F.linear(F.linear(x, A), B)

        fl_fwd = 2.0 * m * (hidden * hidden + 2 * rank * hidden)
        with torch.no_grad():
            emit({**common, "op": "lora_linear", "mode": "forward", **shape},
                 bench(lambda: fwd(x0), **bk), fl_fwd)
            if with_base_only:
                emit({**common, "op": "base_linear", "mode": "forward", "batch": BATCH, "seq": SEQ,
                      "hidden": hidden}, bench(lambda: F.linear(x0, W), **bk), 2.0 * m * hidden * hidden)

        xg = x0.clone().requires_grad_(not args.no_input_grad)

        def fwd_bwd():
            y = fwd(xg)
            y.sum().backward()
            A.grad = None
            B.grad = None
            xg.grad = None

        # backward: dA, dB (low-rank) and, if x requires grad, dx (= dy W + scale dy B A) ~ 2x forward matmul
        fl_bwd = 2.0 * m * (2 * rank * hidden * 2) + (0 if args.no_input_grad else 2.0 * m * hidden * hidden)
        emit({**common, "op": "lora_linear", "mode": "forward_backward", "input_requires_grad":
              not args.no_input_grad, **shape}, bench(fwd_bwd, **bk), fl_fwd + fl_bwd)

    for h in (512, 1024, 2048):
        lora_case(h, 8, with_base_only=True)
    for r in (4, 16, 32, 64):  # rank 8 at hidden 1024 is already covered above
        lora_case(1024, r, with_base_only=False)

    # --- elementwise / reduction ops over (4*128, 1024) ---
    n, d = BATCH * SEQ, 1024
    x = torch.randn(n, d, device=dev, dtype=dtype)
    w = torch.rand(d, device=dev, dtype=dtype) + 0.5
    b = torch.randn(d, device=dev, dtype=dtype) * 0.1
    eps = 1e-5
    shape = {"rows": n, "cols": d}
    with torch.no_grad():
        emit({**common, "op": "softmax", "mode": "forward", "dim": -1, **shape},
             bench(lambda: torch.softmax(x, dim=-1), **bk))
        emit({**common, "op": "layer_norm", "mode": "forward", "eps": eps, **shape},
             bench(lambda: F.layer_norm(x, (d,), w, b, eps), **bk))
        if hasattr(F, "rms_norm"):
            emit({**common, "op": "rms_norm", "variant": "F.rms_norm", "mode": "forward", "eps": eps, **shape},
                 bench(lambda: F.rms_norm(x, (d,), w, eps), **bk))
        emit({**common, "op": "rms_norm", "variant": "manual", "mode": "forward", "eps": eps, **shape},
             bench(lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w, **bk))


if __name__ == "__main__":
    main()
