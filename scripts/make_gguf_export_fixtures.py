#!/usr/bin/env python3
"""llama.cpp's greedy continuations of our GGUF exports of the gemma3, phi3, olmo2, smollm3 and granite tiny
fixtures with our trained adapters, recorded for tests/gguf_export_families.rs (CI has no node).

    cargo build --release && (cd scripts/llamacpp && npm ci) && python3 scripts/make_gguf_export_fixtures.py

For each family, with `metal-candle` (--bin) and llama.cpp (node-llama-cpp, scripts/llamacpp/oracle.mjs):
  - `export --format gguf --quant f16` of the fixture with ours-tiny-<family>-adapter merged,
  - `export --format gguf --quant f16` of the base alone and `export --format gguf-lora` of the adapter,
  - `export --format gguf --quant q8_0` (merged),
then our `generate --json` (Hugging Face folder + adapter, greedy, 24 tokens, eos ignored) and llama.cpp's greedy
run of the same prompt ids on the merged f16 file, on base f16 + the LoRA GGUF, and on the q8_0 file. Recorded in
tests/fixtures/gguf-export/expected.json per family: prompt text and ids, llama.cpp's tokenization of the prompt,
our ids and llama.cpp's ids of each case; the first difference with llama.cpp's logits of the two candidates
there when there is one; and llama.cpp's log-probs of the score text's ids (our tokenization) on the merged f16
file and on base f16 + LoRA. Nothing is asserted here: the Rust test asserts.

tiny-gemma3 and tiny-smollm3 set on purpose what a GGUF file cannot say (llama.cpp fixes it per architecture):
gemma3's query_pre_attn_scalar (24; llama.cpp scales by 1/sqrt(head_dim 16)) and layer_types (llama.cpp makes
every 6th layer global), smollm3's no_rope_layers (llama.cpp: every 4th layer). Our exporter refuses those
models. The cases here use copies of those two fixtures with the smallest config change that llama.cpp can
express (FILE_CONFIG_PATCHES; the Rust test applies the same patch); the adapters fit unchanged.
"""
import argparse, json, os, shutil, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIX, "gguf-export", "expected.json")
ORACLE = os.path.join(ROOT, "scripts", "llamacpp", "oracle.mjs")
FAMILIES = ["gemma3", "phi3", "olmo2", "smollm3", "granite"]
# Longer than tiny-phi3's original context (16), so both sides run on LongRoPE's long factors from the start.
PROMPT = "Once upon a time, a small robot lived in a quiet town by the sea and wrote poems."
# Scored by both sides (our `score` with the adapter, llama.cpp's log-probs of the same ids).
TEXT = ("The little robot visited the cafe by the sea and wrote three short poems about it. Then it went home "
        "and slept.")
N = 24
# The config keys (over the fixture's config.json) that make the model one llama.cpp's file can describe.
FILE_CONFIG_PATCHES = {
    "gemma3": {"query_pre_attn_scalar": 16, "layer_types": ["sliding_attention", "sliding_attention"]},
    "smollm3": {"no_rope_layers": [1, 1]},
}


def run(cmd):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return res.stdout


def oracle(*args):
    return json.loads(run(["node", ORACLE, *map(str, args)]).strip().splitlines()[-1])


def model_folder(family, work):
    src = os.path.join(FIX, f"tiny-{family}")
    if family not in FILE_CONFIG_PATCHES:
        return src
    dst = os.path.join(work, f"tiny-{family}-as-gguf")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("expected.json"))
    cfg = json.load(open(os.path.join(dst, "config.json")))
    cfg.update(FILE_CONFIG_PATCHES[family])
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    return dst


def export(bin_, model, ckpt, fmt, quant, out):
    cmd = [bin_, "export", "--format", fmt, "--model", model, "--out", out, "--overwrite"]
    cmd += ["--quant", quant] if quant else []
    cmd += ["--checkpoint", ckpt] if ckpt else []
    run(cmd)


def compare(name, gguf, prompt, want, lora=None):
    extra = ["--lora", lora] if lora else []
    got = oracle("greedy", gguf, json.dumps(prompt), N, *extra)["generated_ids"]
    # llama.cpp's evaluation ends at an end-of-generation token; ours ran on (--ignore-eos).
    case = {"case": name, "llamacpp_ids": got, "equal": got == want, "llamacpp_stopped_early": len(got) < N}
    same = next((i for i, (x, y) in enumerate(zip(want, got)) if x != y), None)
    if same is not None:
        gap = oracle("gap", gguf, json.dumps(prompt + want[:same]), json.dumps([got[same], want[same]]), *extra)
        case.update(first_diff=same, llamacpp_logit_gap=gap["logit_a"] - gap["logit_b"])
    print(f"  {name}: equal={case['equal']}" + (f" first_diff={same} gap={case['llamacpp_logit_gap']:.4f}"
                                               if same is not None else ""), flush=True)
    return case


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "metal-candle"))
    p.add_argument("--work", default="/tmp/gguf-export-families")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    out = {"prompt": PROMPT, "n": N, "score_text": TEXT, "config_patches": FILE_CONFIG_PATCHES, "families": {}}
    for family in FAMILIES:
        print(family, flush=True)
        model = model_folder(family, a.work)
        ckpt = os.path.join(FIX, f"ours-tiny-{family}-adapter")
        files = {k: os.path.join(a.work, f"{family}-{k}.gguf") for k in ["merged-f16", "base-f16", "lora", "merged-q8_0"]}
        export(a.bin, model, ckpt, "gguf", "f16", files["merged-f16"])
        export(a.bin, model, None, "gguf", "f16", files["base-f16"])
        export(a.bin, model, ckpt, "gguf-lora", None, files["lora"])
        export(a.bin, model, ckpt, "gguf", "q8_0", files["merged-q8_0"])
        gen = lambda m, c: json.loads(run([a.bin, "generate", "--model", m, *(["--adapter", c] if c else []),
                                           "--prompt", PROMPT, "--temperature", "0", "--max-tokens", str(N),
                                           "--ignore-eos", "--json"]).strip().splitlines()[-1])
        ours = gen(model, ckpt)
        prompt, want = ours["prompt_ids"], ours["generated_ids"]
        ours_q8 = gen(files["merged-q8_0"], None)
        entry = {
            "prompt_ids": prompt,
            "llamacpp_prompt_ids": oracle("tokenize", files["merged-f16"], PROMPT)["ids"],
            "ours_generated_ids": want,
            "ours_q8_0_gguf_generated_ids": ours_q8["generated_ids"],
            "cases": [
                compare("merged-f16", files["merged-f16"], prompt, want),
                compare("base-f16+lora", files["base-f16"], prompt, want, lora=files["lora"]),
                compare("merged-q8_0", files["merged-q8_0"], prompt, ours_q8["generated_ids"]),
            ],
        }
        score_ids = json.loads(run([a.bin, "score", "--model", model, "--adapter", ckpt, "--text", TEXT,
                                    "--json"]).strip().splitlines()[-1])["ids"]
        entry["score"] = {
            "ids": score_ids,
            "merged_f16_logprobs": oracle("logprobs", files["merged-f16"], json.dumps(score_ids))["token_logprobs"],
            "base_f16_lora_logprobs": oracle("logprobs", files["base-f16"], json.dumps(score_ids), "--lora",
                                             files["lora"])["token_logprobs"],
        }
        out["families"][family] = entry
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
