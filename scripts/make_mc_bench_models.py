"""Random-weight Hugging Face Llama folders of SmolLM2's real shapes (135M, and 1.7B's shape with the same
tokenizer), bf16 safetensors: speed does not depend on the values. Also the benchmark items: the 32 ARC-shaped
sample questions made distinct and repeated to 512.

    python3 scripts/make_mc_bench_models.py OUT assets/sample-mc/test.jsonl SMOLLM2_HF_FILES
"""
import json, shutil, sys
from pathlib import Path
import torch
from transformers import AutoConfig, AutoModelForCausalLM

# config.json, tokenizer.json, tokenizer_config.json and generation_config.json of SmolLM2-135M-Instruct (from
# `metal-candle export --format merged` of the GGUF, as scripts/bench_mc_lmeval.sh makes them) lie in argv[3].
here = Path(sys.argv[3])
out = Path(sys.argv[1])
shapes = {
    "smollm2-135m": {},
    "smollm2-1.7b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                     "num_attention_heads": 32, "num_key_value_heads": 32, "rope_theta": 130000.0},
}
for name, change in shapes.items():
    cfg = json.loads((here / "config.json").read_text())
    cfg.update(change)
    cfg["torch_dtype"] = "bfloat16"
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copy(here / f, folder / f)
    print(name, sum(p.numel() for p in model.parameters()))
rows = [json.loads(l) for l in open(sys.argv[2])]
with open(out / "items.jsonl", "w") as f:
    for i in range(16):
        for j, r in enumerate(rows):
            r = dict(r, id=f"{r.get('id', j)}-{i}", question=f"{r['question']} (item {i * len(rows) + j})")
            f.write(json.dumps(r) + "\n")
