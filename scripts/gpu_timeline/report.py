#!/usr/bin/env python3
"""Where a training step's GPU time goes, from a timeline written by timeline.c (CUDA_INJECTION64_PATH).

Steps are the stretches of GPU work between two reads back to the host (a device-to-host copy followed by an idle
GPU for more than --step-gap-us): both our bench and PyTorch's read the loss at the end of a step and synchronise.
With --every-read, each device-to-host copy ends a step, idle or not: since the seventeenth session our trainer and
bench begin the next step before they read the last, so the GPU no longer idles at the read.
For the last --steps steps it prints: the GPU span of a step, the time the GPU was busy, and its idle time split
into gaps where the host was late (the next operation was not yet submitted when the GPU ran dry) and gaps where
it was submitted in time (the GPU's own launch latency between dependent operations), with the largest gaps and
what surrounds them.

    python3 report.py timeline.tsv [--steps 10] [--step-gap-us 100 | --every-read] [--top 12]
    python3 report.py timeline.tsv --by-kernel N   GPU time by kernel name over the whole run, divided by N (the
                                                  number of steps run), for a process that reads back mid-step
                                                  (PyTorch + Liger does), where the step split above does not hold
    python3 report.py timeline.tsv --by-grid N --top 60   kernel time by kernel and grid size, divided by N: tells
                                                  apart one kernel's launches over tensors of different sizes
"""
from __future__ import annotations

import argparse
import statistics
from collections import Counter


def load(path):
    gpu, api = [], {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 6:
                continue
            kind, start, end, corr, extra, name = parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[4], parts[5]
            if kind == "A":
                api[corr] = (start, end, name)
            else:
                gpu.append((start, end, kind, corr, name, extra))
    gpu.sort()
    return gpu, api


def short(name, width=60):
    return name if len(name) <= width else name[: width - 3] + "..."


def steps_of(gpu, gap_ns):
    """Index ranges [a, b] of GPU operations, each ending with a device-to-host copy followed by an idle gap of more
    than gap_ns (any gap when gap_ns < 0)."""
    bounds, first = [], 0
    for i, (s, e, kind, _, name, _) in enumerate(gpu):
        nxt = gpu[i + 1][0] if i + 1 < len(gpu) else None
        if kind == "M" and name == "memcpy-2" and (nxt is None or gap_ns < 0 or nxt - e > gap_ns):
            bounds.append((first, i))
            first = i + 1
    return bounds


def by_kernel(gpu, steps, top):
    """GPU time by operation name over the whole run, per step; host-to-device copies (model loading) apart."""
    total, count = Counter(), Counter()
    for s, e, _, _, name, _ in gpu:
        total[name] += e - s
        count[name] += 1
    loading = total.pop("memcpy-1", 0)
    print(f"GPU busy per step {sum(total.values()) / steps / 1e6:.2f} ms over {steps} steps "
          f"(host-to-device copies apart: {loading / 1e6:.1f} ms in all)")
    for name, t in total.most_common(top):
        print(f"  {t / steps / 1e6:7.3f} ms {count[name] / steps:6.1f}x  {short(name, 90)}")


def by_grid(gpu, steps, top):
    """Kernel time by (kernel name, grid size) over the whole run, per step: copies and memsets apart."""
    total, count = Counter(), Counter()
    for s, e, kind, _, name, extra in gpu:
        if kind == "K":
            key = (name[:40], int(extra))
            total[key] += e - s
            count[key] += 1
    print(f"total kernel ms over {steps} steps: {sum(total.values()) / 1e6:.1f}; kernels {sum(count.values())}")
    for (name, grid), t in total.most_common(top):
        print(f"{t / steps / 1e6:9.2f} ms/step {count[(name, grid)] / steps:7.1f}x  grid {grid:8d}  {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("timeline")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--step-gap-us", type=float, default=100.0)
    ap.add_argument("--every-read", action="store_true", help="each device-to-host copy ends a step")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--by-kernel", type=int, default=0, metavar="STEPS")
    ap.add_argument("--by-grid", type=int, default=0, metavar="STEPS")
    args = ap.parse_args()
    gpu, api = load(args.timeline)
    if args.by_grid:
        by_grid(gpu, args.by_grid, args.top)
        return
    if args.by_kernel:
        by_kernel(gpu, args.by_kernel, args.top)
        return
    steps = steps_of(gpu, -1 if args.every_read else int(args.step_gap_us * 1000))
    if len(steps) < 2:
        print(f"{args.timeline}: found {len(steps)} steps; nothing to report")
        return
    chosen = steps[-args.steps:]
    spans, busys, host_late, launch, between, counts = [], [], [], [], [], []
    gaps = []
    for a, b in chosen:
        ops = gpu[a : b + 1]
        span = ops[-1][1] - ops[0][0]
        busy, late, dev = 0, 0, 0
        end = ops[0][0]
        for i, (s, e, _, corr, name, _) in enumerate(ops):
            if s > end:
                gap = s - end
                submitted = api.get(corr, (None, None, None))[1]
                # The operation's API call returned after the GPU ran dry: the GPU waited for the host.
                host = submitted is not None and submitted > end
                if host:
                    late += gap
                else:
                    dev += gap
                gaps.append((gap, host, ops[i - 1][4], name))
            busy += max(0, e - max(s, end))
            end = max(end, e)
        spans.append(span)
        busys.append(busy)
        host_late.append(late)
        launch.append(dev)
        counts.append(len(ops))
        if b + 1 < len(gpu):
            between.append(gpu[b + 1][0] - gpu[b][1])
    ms = lambda v: f"{statistics.mean(v) / 1e6:.3f} ms"
    print(f"{args.timeline}: {len(steps)} steps found, the last {len(chosen)} reported (means per step)")
    print(f"  GPU span of a step      {ms(spans)}  ({statistics.mean(counts):.0f} operations)")
    print(f"  GPU busy                {ms(busys)}")
    print(f"  idle, host late         {ms(host_late)}")
    print(f"  idle, submitted in time {ms(launch)}  ({statistics.mean(launch) / max(1, statistics.mean(counts)) / 1e3:.2f} us per operation)")
    if between:
        print(f"  between steps (host)    {ms(between)}")
    sizes = Counter()
    for gap, host, _, _ in gaps:
        bucket = "<2us" if gap < 2000 else "2-5us" if gap < 5000 else "5-20us" if gap < 20000 else "20-100us" if gap < 100000 else ">100us"
        sizes[(bucket, "host" if host else "gpu")] += gap
    print("  idle by gap size (ms per step):")
    for bucket in ["<2us", "2-5us", "5-20us", "20-100us", ">100us"]:
        h, g = sizes[(bucket, "host")] / len(chosen) / 1e6, sizes[(bucket, "gpu")] / len(chosen) / 1e6
        print(f"    {bucket:>8}: host late {h:.3f}, in time {g:.3f}")
    print(f"  largest gaps over the {len(chosen)} steps:")
    for gap, host, prev, name in sorted(gaps, reverse=True)[: args.top]:
        print(f"    {gap / 1e3:8.1f} us {'host' if host else 'gpu '}  {short(prev, 50)}  ->  {short(name, 50)}")


if __name__ == "__main__":
    main()
