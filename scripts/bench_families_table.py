#!/usr/bin/env python3
"""The markdown table of scripts/bench_families.sh's results.jsonl: per model, decode tokens/s and training step
time of ours and theirs with the ratio (theirs' time over ours: above 1 means we are faster), and peak memory
(process RSS on the CPU; on CUDA nvidia-smi's device peak for both sides, and PyTorch's own max allocated).

    python3 scripts/bench_families_table.py OUT/results.jsonl
"""
import json
import sys
from collections import defaultdict

rows = defaultdict(dict)
for line in open(sys.argv[1]):
    d = json.loads(line)
    rows[d["preset"]].setdefault(d["tag"], []).append(d)


def gib(n):
    return f"{n / 2**30:.2f}" if n else "-"


def first(runs, tag):
    return (runs.get(tag) or [{}])[0]


def train_s(d):
    return d.get("mean_step_secs") or d.get("mean_step_s")


def mem(d):
    if "nvidia_smi_peak_mib" in d:
        extra = f" ({gib(d['peak_memory_bytes'])} alloc)" if d.get("peak_memory_kind") == "cuda_max_memory_allocated" else ""
        return f"{d['nvidia_smi_peak_mib'] / 1024:.2f}{extra}"
    return gib(d.get("peak_rss_bytes") or d.get("peak_rss_during_training_bytes") or d.get("peak_memory_bytes"))


print("| model (published shape) | decode tok/s ours / transformers (x) | train step s ours / PEFT (x) | + Liger (x) "
      "| train peak GiB ours / PEFT / + Liger |")
print("|---|---|---|---|---|")
for preset, runs in rows.items():
    od, td = first(runs, "ours_decode"), first(runs, "transformers_decode")
    ours = [train_s(d) for d in runs.get("ours_train", []) + runs.get("ours_train_2", []) if train_s(d)]
    ot = min(ours) if ours else None
    pt, lt = first(runs, "peft_train"), first(runs, "peft_liger_train")
    dec = "-"
    if od.get("decode_tokens_per_sec") and td.get("decode_tokens_per_sec"):
        a, b = od["decode_tokens_per_sec"], td["decode_tokens_per_sec"]
        dec = f"{a:.1f} / {b:.1f} ({a / b:.2f}x)"
    tr = f"{ot:.3f} / {train_s(pt):.3f} ({train_s(pt) / ot:.2f}x)" if ot and train_s(pt) else "-"
    lg = f"{train_s(lt):.3f} ({train_s(lt) / ot:.2f}x)" if ot and train_s(lt) else "-"
    mems = " / ".join(mem(d) for d in (first(runs, "ours_train"), pt, lt) if d)
    print(f"| {preset} | {dec} | {tr} | {lg} | {mems} |")
errors = [d for runs in rows.values() for ds in runs.values() for d in ds if "error" in d]
for d in errors:
    print(f"\n{d['preset']} {d['tag']}: {d['error']}")
