#!/usr/bin/env python3
"""DPO, ORPO and GRPO in scripts/bench_mac.sh: metal-candle's `train --method M` beside mlx-lm-lora's trainer
(`python -m mlx_lm_lora.train --train-mode M`, the MLX preference/RL trainer Mac users run) on the same model, the same
rows (our sample datasets, converted to mlx-lm-lora's fields) and the same LoRA shape.

Subcommands (each prints one JSON line with "bench", "impl" and the step time):

  ours   --bench M --warmup W < train.jsonl
         Summarise `metal-candle train --json` events: mean seconds per optimizer step after W warm-up steps, from
         the steps' cumulative `elapsed_secs`, tokens/s and the last loss. For DPO and ORPO run W + N + 1 steps (the
         last step's event comes before its time is known; see cmd_ours), for GRPO W + N.
  mlx    --mode dpo|orpo|grpo --model DIR --data DIR --steps N --warmup W --batch-size B --seq-len S --rank R
         --alpha A --targets LIST [--beta X] [--group-size G --max-completion-length L --temperature T]
         Converts our dataset (messages) into mlx-lm-lora's string fields in a temporary folder, writes its LoRA
         YAML (rank, scale = alpha / rank, dropout 0, the same projections of every layer), runs its trainer for
         W + N iterations reporting every step, and prints the mean of 1 / it/s over the iterations after W.
  report --raw F
         Markdown rows (ours vs mlx-lm-lora, ratio) for the method benchmarks in bench_mac.sh's raw JSON lines.

On Linux (`mlx[cpu]`) mlx-lm-lora's trainers ask `mx.device_info()` for the Metal-only
`max_recommended_working_set_size`; the runner supplies 0 there so the CPU wheel runs them (a functional check; MLX's
Linux CPU figures say nothing about a Mac).
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Started in a child python: mlx-lm-lora's CLI with the Metal-only device key filled in where MLX lacks it.
LAUNCHER = """
import runpy, sys
import mlx.core as mx
_info = mx.device_info
def _device_info():
    info = dict(_info())
    info.setdefault("max_recommended_working_set_size", 0)
    return info
mx.device_info = _device_info
sys.argv = ["mlx_lm_lora.train"] + sys.argv[1:]
runpy.run_module("mlx_lm_lora.train", run_name="__main__")
"""


def last_user_text(messages) -> str:
    if isinstance(messages, str):
        return messages
    users = [m["content"] for m in messages if m.get("role") == "user"]
    return users[-1] if users else messages[-1]["content"]


def last_text(messages) -> str:
    return messages if isinstance(messages, str) else messages[-1]["content"]


def convert(mode: str, src: Path, dst: Path) -> None:
    """Our sample rows as mlx-lm-lora reads them: prompt/chosen/rejected strings, or prompt/answer for GRPO."""
    for split in ("train", "valid"):
        rows = [json.loads(line) for line in (src / f"{split}.jsonl").read_text().splitlines() if line.strip()]
        with open(dst / f"{split}.jsonl", "w") as out:
            for r in rows:
                if mode == "grpo":
                    prompt = last_user_text(r.get("messages") or r.get("prompt"))
                    rec = {"prompt": prompt, "answer": str(r["answer"])}
                else:
                    rec = {"prompt": last_user_text(r["prompt"]), "chosen": last_text(r["chosen"]),
                           "rejected": last_text(r["rejected"])}
                out.write(json.dumps(rec) + "\n")


def cmd_ours(args) -> None:
    events = [json.loads(line) for line in sys.stdin if line.startswith("{")]
    steps = [e for e in events if e.get("event") == "step"]
    # SFT, DPO and ORPO begin step k + 1 before step k's event is sent (its loss is read after the next step's
    # passes), so the event of step k marks the end of step k + 1's passes and the last step's event comes early:
    # it is left out and the span between the events of steps W and n - 1 holds steps W + 2 .. n whole. GRPO begins
    # nothing ahead (it samples with the last step's weights): its events are plain step ends.
    ends = steps if args.bench == "grpo" else steps[:-1]
    measured = len(ends) - args.warmup
    rec = {"bench": args.bench, "impl": "metal-candle", "steps": max(measured, 0)}
    if measured >= 1 and args.warmup >= 1:
        first, last = ends[args.warmup - 1], ends[-1]
        span = last["elapsed_secs"] - first["elapsed_secs"]
        rec["mean_step_secs"] = span / measured
        rec["tokens_per_sec"] = (last["trained_tokens"] - first["trained_tokens"]) / span if span > 0 else None
        rec["last_loss"] = steps[-1]["loss"]
    print(json.dumps(rec), flush=True)


def cmd_mlx(args) -> None:
    import mlx.core as mx

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "data"
        data.mkdir()
        convert(args.mode, Path(args.data), data)
        keys = [f"self_attn.{t}" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else f"mlp.{t}"
                for t in args.targets.split(",") if t.strip()]
        alpha = args.alpha if args.alpha is not None else 2.0 * args.rank
        (tmp / "lora.yaml").write_text(
            "lora_parameters:\n"
            f"  rank: {args.rank}\n  scale: {alpha / args.rank}\n  dropout: 0.0\n  keys: {json.dumps(keys)}\n")
        cmd = [sys.executable, "-c", LAUNCHER, "-c", str(tmp / "lora.yaml"), "--model", str(args.model), "--train",
               "--train-mode", args.mode, "--data", str(data), "--iters", str(args.steps + args.warmup),
               "--batch-size", str(args.batch_size), "--max-seq-length", str(args.seq_len), "--num-layers", "-1",
               "--steps-per-report", "1", "--steps-per-eval", "1000000", "--val-batches", "1",
               "--learning-rate", str(args.lr), "--adapter-path", str(tmp / "adapters"), "--seed", "0"]
        if args.mode in ("dpo", "orpo"):
            cmd += ["--beta", str(args.beta)]
        if args.mode == "grpo":
            cmd += ["--group-size", str(args.group_size), "--max-completion-length", str(args.max_completion_length),
                    "--temperature", str(args.temperature)]
        print("bench_mlx_methods: " + " ".join(cmd[:2] + ["<launcher>"] + cmd[3:]), file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(proc.stderr[-4000:])
        speeds = parse_speeds(proc.stdout, args.mode)
    rec = {"bench": args.mode, "impl": "mlx-lm-lora", "device": str(mx.default_device()),
           "mlx": getattr(mx, "__version__", None), "mlx_lm_lora": mlx_lm_lora_version(),
           "exit_status": proc.returncode, "batch_size": args.batch_size, "seq_len": args.seq_len, "rank": args.rank}
    measured = speeds[args.warmup:]
    if proc.returncode == 0 and measured:
        rec["steps"] = len(measured)
        rec["mean_step_secs"] = statistics.mean(1.0 / s for s in measured if s > 0)
    print(json.dumps(rec), flush=True)
    if proc.returncode != 0:
        sys.exit(proc.returncode)


def parse_speeds(stdout: str, mode: str) -> list[float]:
    """it/s of each reported iteration: "Iter N: ... it/s X" (DPO, ORPO) or "Speed: X it/s" (GRPO)."""
    pattern = r"Speed: ([0-9.]+) it/s" if mode == "grpo" else r"^Iter \d+: loss .*?it/s ([0-9.]+)"
    return [float(m) for m in re.findall(pattern, stdout, flags=re.M)]


def mlx_lm_lora_version():
    try:
        from importlib.metadata import version

        return version("mlx-lm-lora")
    except Exception:
        return None


def cmd_report(args) -> None:
    recs = [json.loads(line) for line in Path(args.raw).read_text().splitlines() if line.startswith("{")]
    rows, shape = [], None
    for mode in ("dpo", "orpo", "grpo"):
        ours = next((r for r in recs if r.get("bench") == mode and r.get("impl") == "metal-candle"), None)
        theirs = next((r for r in recs if r.get("bench") == mode and r.get("impl") == "mlx-lm-lora"), None)
        if not ours and not theirs:
            continue
        shape = shape or theirs
        o = (ours or {}).get("mean_step_secs")
        t = (theirs or {}).get("mean_step_secs")
        cell = lambda v: "not measured" if v is None else f"{v:.3f}"
        ratio = f"{t / o:.2f}x (mlx-lm-lora time / ours)" if o and t else "n/a"
        rows.append(f"| {mode.upper()} step: mean s/step | {cell(o)} | {cell(t)} | {ratio} |")
    if rows:
        print("| method | metal-candle | mlx-lm-lora | ratio |")
        print("|---|---|---|---|")
        print("\n".join(rows))
        print()
        if shape:
            print(f"Each step: {shape.get('batch_size')} rows (prompts) of at most {shape.get('seq_len')} tokens, LoRA "
                  f"r{shape.get('rank')}; mlx-lm-lora {shape.get('mlx_lm_lora')} on MLX {shape.get('mlx')} "
                  f"({shape.get('device')}).")
        print("Same rows (assets/sample-preference, assets/sample-grpo), LoRA shape and batch; GRPO's completions stop "
              "at each side's end-of-sequence, so their lengths (and the work) can differ; each side's rewards are its "
              "own (ours: exact answer; mlx-lm-lora: its default reward functions).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ours")
    p.add_argument("--bench", required=True)
    p.add_argument("--warmup", type=int, default=1)
    p.set_defaults(fn=cmd_ours)
    p = sub.add_parser("mlx")
    p.add_argument("--mode", choices=["dpo", "orpo", "grpo"], required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=None)
    p.add_argument("--targets", default="q_proj,v_proj")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-completion-length", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.set_defaults(fn=cmd_mlx)
    p = sub.add_parser("report")
    p.add_argument("--raw", required=True)
    p.set_defaults(fn=cmd_report)
    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
