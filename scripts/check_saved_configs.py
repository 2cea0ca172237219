#!/usr/bin/env python3
"""Do config.json files written by the installed transformers still load in ours with the same numbers?

transformers re-words configs between major versions (5.x moves rope_theta / rope_scaling into `rope_parameters`,
per layer type for Gemma 3). For each tiny fixture this re-saves its config with the installed transformers
(`AutoConfig.from_pretrained(...).save_pretrained`), links the fixture's weights and tokenizer beside it, and
scores one text with ours on the original and on the re-saved folder: the log-probs must agree.

    python3 scripts/check_saved_configs.py BIN [OUT_DIR]    # BIN: our binary (or a wrapper command, quoted)
Prints one line per fixture and exits 1 when any differs or fails to load.
"""
import json
import shlex
import subprocess
import sys
from pathlib import Path

import transformers
from transformers import AutoConfig

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
TEXT = "The quick brown fox jumps over the lazy dog, again and again."
FAMILIES = ["tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-mistral", "tiny-gemma3", "tiny-olmo2", "tiny-phi3",
            "tiny-smollm3", "tiny-granite"]


def score(binary, folder):
    cmd = shlex.split(binary) + ["score", "--model", str(folder), "--device", "cpu", "--text", TEXT, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return None, (out.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(lines[-1]), None


def main():
    binary = sys.argv[1]
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/resaved-configs")
    failed = False
    print(f"transformers {transformers.__version__}")
    for name in FAMILIES:
        src, dst = FIX / name, out / name
        dst.mkdir(parents=True, exist_ok=True)
        AutoConfig.from_pretrained(src).save_pretrained(dst)
        for f in src.iterdir():
            if f.name != "config.json" and not (dst / f.name).exists():
                (dst / f.name).symlink_to(f.resolve())
        saved = json.loads((dst / "config.json").read_text())
        rope = {k: saved[k] for k in ("rope_parameters", "rope_scaling", "rope_theta") if k in saved}
        a, err_a = score(binary, src)
        b, err_b = score(binary, dst)
        if a is None or b is None:
            failed = True
            print(f"{name}: FAILED original={err_a} resaved={err_b}; saved rope keys {json.dumps(rope)[:300]}")
            continue
        la, lb = a.get("logprobs") or a.get("token_logprobs"), b.get("logprobs") or b.get("token_logprobs")
        diff = max(abs(x - y) for x, y in zip(la, lb)) if la and lb and len(la) == len(lb) else None
        ok = diff is not None and diff < 1e-5
        failed |= not ok
        print(f"{name}: {'ok' if ok else 'DIFFERS'} max |log-prob diff| {diff}; saved rope keys {json.dumps(rope)[:300]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
