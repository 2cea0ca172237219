#!/usr/bin/env python3
"""Check metal-candle's GGUF exports against llama.cpp (node-llama-cpp's prebuilt CPU binaries) and the
Python `gguf` reader.

For each case: export with our CLI, read the file back with gguf.GGUFReader (metadata, tensor names/types),
compare llama.cpp's tokenization of the prompt with ours, then llama.cpp's greedy continuation (prompt given as
our ids) with our own `generate` greedy on the source model (+ adapter). For quantized files, compare llama.cpp's
teacher-forced log-probs of a text on the quantized file against the f16 file. With --smollm2-checkpoint (an
adapter trained on assets/sample-chat), the merged q8_0 file is asked held-out questions through llama.cpp's chat
session with the file's own chat template: answers must take the trained format and end by EOG.

Usage:  python3 scripts/check_gguf_llamacpp.py --bin target/release/metal-candle --work /tmp/gguf-check
        (needs `npm ci` in scripts/llamacpp first)
A greedy mismatch counts as a near-tie (and passes) only if llama.cpp's logits of the two candidate tokens at
the first difference are within --tie-logits of each other.
"""
import argparse, json, math, os, re, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE = os.path.join(ROOT, "scripts", "llamacpp", "oracle.mjs")
PROMPT = "The capital of France is"
TEXT = ("Paris is the capital and most populous city of France. It is located on the Seine river, in the north "
        "of the country, and is known for its museums, architecture and food.")


def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stderr[-2000:]}")
    return res.stdout


def oracle(*args):
    return json.loads(run(["node", ORACLE, *args]).strip().splitlines()[-1])


def ours(bin_, model, adapter, *args):
    cmd = [bin_, *args, "--model", model] + (["--adapter", adapter] if adapter else [])
    return json.loads(run(cmd).strip().splitlines()[-1])


def export(bin_, model, ckpt, fmt, quant, out):
    cmd = [bin_, "export", "--format", fmt, "--model", model, "--out", out]
    if quant:
        cmd += ["--quant", quant]
    if ckpt:
        cmd += ["--checkpoint", ckpt]
    run(cmd)
    return os.path.getsize(out) if os.path.isfile(out) else None


def check_metadata(path):
    from gguf import GGUFReader
    r = GGUFReader(path)
    f = {k: v.contents() for k, v in r.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = f["general.architecture"]
    need = ["context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count"]
    missing = [k for k in need if f"{arch}.{k}" not in f]
    types = {}
    for t in r.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    n_tokens = len(r.fields["tokenizer.ggml.tokens"].data)
    return {"arch": arch, "missing_keys": missing, "tensors": len(r.tensors), "types": types, "tokens": n_tokens,
            "blocks": f[f"{arch}.block_count"], "first": r.tensors[0].name if r.tensors else None}


def greedy_case(a, name, model, ckpt, gguf_path, lora=None, n=24):
    mine = ours(a.bin, model, ckpt, "generate", "--prompt", PROMPT, "--temperature", "0", "--max-tokens", str(n),
                "--ignore-eos", "--json")
    prompt, want = mine["prompt_ids"], mine["generated_ids"]
    tok = oracle("tokenize", gguf_path, PROMPT)["ids"]
    extra = ["--lora", lora] if lora else []
    got = oracle("greedy", gguf_path, json.dumps(prompt), str(n), *extra)["generated_ids"]
    same = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), None)
    result = {"case": name, "tokenize_equal": tok == prompt, "greedy_equal": same is None, "n": n}
    if same is not None:
        gap = oracle("gap", gguf_path, json.dumps(prompt + want[:same]), json.dumps([got[same], want[same]]), *extra)
        result.update(first_diff=same, llamacpp_logit_gap=gap["logit_a"] - gap["logit_b"],
                      near_tie=abs(gap["logit_a"] - gap["logit_b"]) <= a.tie_logits)
    result["ok"] = result["tokenize_equal"] and (result["greedy_equal"] or result.get("near_tie", False))
    return result


def logprob_case(a, name, model, ref_gguf, quant_gguf):
    ids = ours(a.bin, model, None, "score", "--text", TEXT, "--json")["ids"]
    ref = oracle("logprobs", ref_gguf, json.dumps(ids))
    q = oracle("logprobs", quant_gguf, json.dumps(ids))
    diffs = [abs(x - y) for x, y in zip(ref["token_logprobs"], q["token_logprobs"])]
    ppl_ref, ppl_q = math.exp(ref["nll_mean"]), math.exp(q["nll_mean"])
    return {"case": name, "tokens": len(ids), "ppl_f16": round(ppl_ref, 4), "ppl_quant": round(ppl_q, 4),
            "ppl_rel_change": round(ppl_q / ppl_ref - 1, 4), "mean_abs_dlogprob": round(sum(diffs) / len(diffs), 4),
            "ok": abs(ppl_q / ppl_ref - 1) <= a.ppl_tol[name.split(":")[-1]]}


# The sample chat task's answer format (assets/sample-chat): "<Country> -> capital: <City>; continent: <Name>."
TRAINED_FORMAT = re.compile(r"^[A-Z][\w .'-]* -> capital: [^;]+; continent: [^.]+\.$")


def chat_case(a, name, gguf_path, n=64):
    """The trained adapter merged into a GGUF, asked held-out questions through llama.cpp with the file's own chat
    template: every answer must take the trained format and end by an end-of-generation token, not the limit."""
    rows = [json.loads(line) for line in open(os.path.join(ROOT, "assets", "sample-chat", "valid.jsonl"))][:4]
    answers = []
    for row in rows:
        question = row["messages"][0]["content"]
        got = oracle("chat", gguf_path, question, str(n))
        answers.append({"question": question, "answer": got["text"], "stop_reason": got["stop_reason"],
                        "format": bool(TRAINED_FORMAT.match(got["text"].strip()))})
    ok = all(x["format"] and x["stop_reason"] == "eogToken" for x in answers)
    return {"case": name, "answers": answers, "ok": ok}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "metal-candle"))
    p.add_argument("--work", default="/tmp/gguf-check")
    p.add_argument("--smollm2", default=os.path.join(ROOT, "models", "smollm2", "SmolLM2-135M-Instruct-Q4_1.gguf"))
    p.add_argument("--smollm2-checkpoint", help="a checkpoint trained on --smollm2 (merged and gguf-lora cases)")
    p.add_argument("--tie-logits", type=float, default=0.05)
    a = p.parse_args()
    # |ppl change| allowed on the 38-token text; the SmolLM2 base is itself Q4_1, whose 32-wide blocks
    # survive q8_0/q5 re-quantization better than 256-wide K-quant blocks.
    a.ppl_tol = {"q8_0": 0.01, "q4_k_m": 0.10, "q5_k_m": 0.05, "q6_k": 0.05}
    os.makedirs(a.work, exist_ok=True)
    results = []
    fx = lambda f: os.path.join(ROOT, "tests", "fixtures", f)
    cases = [(f"tiny-{f}", fx(f"tiny-{f}"), None) for f in ["llama", "mistral", "qwen2", "qwen3"]]
    cases += [("tiny-llama+adapter", fx("tiny-llama"), fx("ours-tiny-llama-adapter")),
              ("tiny-qwen3+adapter", fx("tiny-qwen3"), fx("ours-tiny-qwen3-adapter"))]
    if os.path.exists(a.smollm2):
        cases.append(("smollm2", a.smollm2, None))
        if a.smollm2_checkpoint:
            cases.append(("smollm2+adapter", a.smollm2, a.smollm2_checkpoint))
    for name, model, ckpt in cases:
        for quant in ["f16", "bf16"]:
            out = os.path.join(a.work, f"{name}-{quant}.gguf")
            size = export(a.bin, model, ckpt, "gguf", quant, out)
            r = greedy_case(a, f"{name}:{quant}", model, ckpt, out)
            r.update(size_bytes=size, metadata=check_metadata(out))
            results.append(r)
            print(json.dumps(r), flush=True)
        if ckpt:
            base = os.path.join(a.work, f"{name}-base-f16.gguf")
            export(a.bin, model, None, "gguf", "f16", base)
            lora = os.path.join(a.work, f"{name}-lora.gguf")
            export(a.bin, model, ckpt, "gguf-lora", None, lora)
            r = greedy_case(a, f"{name}:base-f16+gguf-lora", model, ckpt, base, lora=lora)
            results.append(r)
            print(json.dumps(r), flush=True)
    for name, model, ckpt in [c for c in cases if c[0] == "smollm2"]:
        ref = os.path.join(a.work, f"{name}-f16.gguf")
        for quant in ["q8_0", "q6_k", "q5_k_m", "q4_k_m"]:
            out = os.path.join(a.work, f"{name}-{quant}.gguf")
            size = export(a.bin, model, ckpt, "gguf", quant, out)
            r = logprob_case(a, f"{name}:{quant}", model, ref, out)
            r.update(size_bytes=size, metadata=check_metadata(out))
            results.append(r)
            print(json.dumps(r), flush=True)
    if a.smollm2_checkpoint and os.path.exists(a.smollm2):
        out = os.path.join(a.work, "smollm2+adapter-chat-q8_0.gguf")
        export(a.bin, a.smollm2, a.smollm2_checkpoint, "gguf", "q8_0", out)
        r = chat_case(a, "smollm2+adapter:q8_0 chat", out)
        results.append(r)
        print(json.dumps(r), flush=True)
    failed = [r["case"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)}/{len(results)} cases ok" + (f"; failed: {failed}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
