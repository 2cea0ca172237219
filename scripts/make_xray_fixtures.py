"""Reference values for the adapter X-ray (`metal-candle inspect`, `engine::xray`), from numpy's SVD of the dense
scaled update scale * B @ A of every adapted module (float64 from the stored float32 weights).

Writes:
- tests/fixtures/xray-rank3-adapter/: a synthetic LoRA adapter for tiny-llama (r = 16, alpha = 16, q_proj and
  down_proj of both layers) whose every update B @ A has rank 3 (singular values 3, 2.5, 2 before scaling),
  with A and B dense (mixed by a random invertible 16 x 16 matrix), so only the product reveals the rank;
- tests/fixtures/xray_expected.json: per adapter folder and per module `singular_values` (the first r), `update_norm`,
  `relative_norm` (over the frozen weight's Frobenius norm from the base named below), `energy_rank_50/90/99`,
  and for DoRA `magnitude_change` (||m - ||W||_row|| / ||W||_F).

Run: /work/venv-tf/bin/python scripts/make_xray_fixtures.py   (deterministic: identical bytes on a re-run)
"""

import json
import os

import numpy as np
from safetensors.numpy import load_file, save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIX = os.path.join(ROOT, "tests", "fixtures")

# (adapter folder, its base model folder), both under tests/fixtures.
ADAPTERS = [
    ("ours-tiny-llama-adapter", "tiny-llama"),
    ("tiny-qwen2-peft-rslora", "tiny-qwen2"),
    ("tiny-llama-dora-peft", "tiny-llama"),
    ("xray-rank3-adapter", "tiny-llama"),
]


def write_rank3_adapter():
    rng = np.random.default_rng(39)
    cfg = json.load(open(os.path.join(FIX, "tiny-llama", "config.json")))
    hidden, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    r, alpha = 16, 16.0
    scale = alpha / r
    shapes = {"self_attn.q_proj": (hidden, hidden), "mlp.down_proj": (hidden, inter)}  # (out, in)
    tensors = {}
    for layer in range(layers):
        for module, (d_out, d_in) in shapes.items():
            u, _ = np.linalg.qr(rng.standard_normal((d_out, 3)))
            v, _ = np.linalg.qr(rng.standard_normal((d_in, 3)))
            s = np.array([3.0, 2.5, 2.0])
            b = np.zeros((d_out, r))
            b[:, :3] = u * (s / scale)
            a = rng.standard_normal((r, d_in)) * 0.1
            a[:3, :] = v.T
            g = rng.standard_normal((r, r)) + 4.0 * np.eye(r)
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (np.linalg.inv(g) @ a).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (b @ g).astype(np.float32)
    out = os.path.join(FIX, "xray-rank3-adapter")
    os.makedirs(out, exist_ok=True)
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"))
    config = {
        "base_model_name_or_path": "../tiny-llama",
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "peft_type": "LORA",
        "r": r,
        "target_modules": ["q_proj", "down_proj"],
        "task_type": "CAUSAL_LM",
        "use_rslora": False,
    }
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def energy_rank(sv, share):
    energy = sv**2
    total = energy.sum()
    if total <= 0:
        return 0
    cumulative = np.cumsum(energy)
    return int(np.argmax(cumulative >= share * total - 1e-12 * total) + 1)


def base_weights(base):
    folder = os.path.join(FIX, base)
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, name)))
    return out


def xray(adapter, base):
    folder = os.path.join(FIX, adapter)
    cfg = json.load(open(os.path.join(folder, "adapter_config.json")))
    r, alpha = cfg["r"], float(cfg["lora_alpha"])
    scale = alpha / np.sqrt(r) if cfg.get("use_rslora") else alpha / r
    tensors = load_file(os.path.join(folder, "adapter_model.safetensors"))
    weights = base_weights(base)
    modules = {}
    for key in sorted(tensors):
        if not key.endswith(".lora_A.weight"):
            continue
        prefix = key[: -len(".lora_A.weight")]
        name = prefix[len("base_model.model."):]
        a = tensors[key].astype(np.float64)
        b = tensors[prefix + ".lora_B.weight"].astype(np.float64)
        delta = scale * (b @ a)
        sv = np.linalg.svd(delta, compute_uv=False)[:r]
        w = weights[name + ".weight"].astype(np.float64)
        norm = float(np.sqrt((sv**2).sum()))
        entry = {
            "singular_values": [float(x) for x in sv],
            "update_norm": norm,
            "dense_frobenius": float(np.linalg.norm(delta)),
            "relative_norm": norm / float(np.linalg.norm(w)),
            "energy_rank_50": energy_rank(sv, 0.5),
            "energy_rank_90": energy_rank(sv, 0.9),
            "energy_rank_99": energy_rank(sv, 0.99),
        }
        magnitude = tensors.get(prefix + ".lora_magnitude_vector")
        if magnitude is not None:
            rows = np.linalg.norm(w, axis=1)
            entry["magnitude_change"] = float(np.linalg.norm(magnitude.astype(np.float64) - rows) / np.linalg.norm(w))
        modules[name] = entry
    return {"base": base, "rank": r, "scale": float(scale), "modules": modules}


def main():
    write_rank3_adapter()
    expected = {adapter: xray(adapter, base) for adapter, base in ADAPTERS}
    with open(os.path.join(FIX, "xray_expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    for adapter, data in expected.items():
        ranks = sorted({m["energy_rank_90"] for m in data["modules"].values()})
        print(f"{adapter}: {len(data['modules'])} modules, energy ranks 90 {ranks}")


if __name__ == "__main__":
    main()
