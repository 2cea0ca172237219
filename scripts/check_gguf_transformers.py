#!/usr/bin/env python3
"""Check that Hugging Face transformers loads metal-candle's f16 GGUF exports and computes the same log-probs.

For each case: export `--format gguf --quant f16` with our CLI (adapter merged when a checkpoint is given), load the
file with `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` (transformers' GGUF loader: needs the `gguf`
package; it dequantizes to float32 and undoes llama.cpp's q/k permutation), and compare its teacher-forced
log-probs of a text (as our token ids, so tokenization plays no part) with `metal-candle score` on the source model
(+ adapter, un-merged, f32). Passes when max |d logprob| <= --max-tol and mean <= --mean-tol (f16 rounding of the
weights is the only expected difference).

Usage:  python3 scripts/check_gguf_transformers.py --bin target/release/metal-candle --work /tmp/gguf-tf \
            [--smollm2-checkpoint RUN/checkpoint-N]
"""
import argparse, json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_gguf_llamacpp import ROOT, TEXT, export, ours  # one home for running our binary and exporting


def transformers_logprobs(gguf_path, ids):
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path),
                                                 torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)], type(model).__name__


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "metal-candle"))
    p.add_argument("--work", default="/tmp/gguf-tf")
    p.add_argument("--smollm2", default=os.path.join(ROOT, "models", "smollm2", "SmolLM2-135M-Instruct-Q4_1.gguf"))
    p.add_argument("--smollm2-checkpoint", help="a checkpoint trained on --smollm2 (the merged case)")
    p.add_argument("--max-tol", type=float, default=0.02)
    p.add_argument("--mean-tol", type=float, default=0.005)
    a = p.parse_args()
    fx = lambda f: os.path.join(ROOT, "tests", "fixtures", f)
    cases = [(f"tiny-{f}", fx(f"tiny-{f}"), None) for f in ["llama", "mistral", "qwen2", "qwen3"]]
    cases += [("tiny-llama+adapter", fx("tiny-llama"), fx("ours-tiny-llama-adapter")),
              ("tiny-qwen3+adapter", fx("tiny-qwen3"), fx("ours-tiny-qwen3-adapter"))]
    if os.path.exists(a.smollm2):
        cases.append(("smollm2", a.smollm2, None))
        if a.smollm2_checkpoint:
            cases.append(("smollm2+adapter", a.smollm2, a.smollm2_checkpoint))
    results = []
    for name, model, ckpt in cases:
        folder = os.path.join(a.work, name)
        os.makedirs(folder, exist_ok=True)
        out = os.path.join(folder, "model-f16.gguf")
        export(a.bin, model, ckpt, "gguf", "f16", out)
        mine = ours(a.bin, model, ckpt, "score", "--text", TEXT, "--json")
        try:
            theirs, cls = transformers_logprobs(out, mine["ids"])
        except Exception as e:  # a transformers limitation is reported as the case's result, not a crash
            r = {"case": f"{name}:f16", "error": f"{type(e).__name__}: {str(e).splitlines()[-1][:200]}", "ok": False}
            results.append(r)
            print(json.dumps(r), flush=True)
            continue
        diffs = [abs(x - y) for x, y in zip(mine["token_logprobs"], theirs)]
        r = {"case": f"{name}:f16", "transformers_class": cls, "tokens": len(mine["ids"]),
             "max_abs_dlogprob": round(max(diffs), 5), "mean_abs_dlogprob": round(sum(diffs) / len(diffs), 5)}
        r["ok"] = len(theirs) == len(mine["token_logprobs"]) and max(diffs) <= a.max_tol and \
            sum(diffs) / len(diffs) <= a.mean_tol
        results.append(r)
        print(json.dumps(r), flush=True)
    failed = [r["case"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)}/{len(results)} cases ok" + (f"; failed: {failed}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
