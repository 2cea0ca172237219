#!/usr/bin/env python3
"""A random-weight model folder for memory and speed measurements: values do not change memory or speed.

Usage:
  python3 scripts/make_random_llama.py OUT_DIR [hidden] [intermediate] [layers]
      a Llama of that size, f32, vocab 512
  python3 scripts/make_random_llama.py OUT_DIR --preset llama-3.2-1b|qwen3-1.7b|llama-3.1-8b
      the real shapes of that model from its published config.json values (vocabulary, heads, tied
      embeddings, rope scaling, qwen3's q/k norms), bf16 as the hub ships them
Writes config.json, model.safetensors (written one tensor at a time) and the tiny-llama fixture's tokenizer
files (its 512 tokens are a subset of every vocabulary here), using only numpy.
"""
import json, shutil, struct, sys
from pathlib import Path
import numpy as np

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
               "original_max_position_embeddings": 8192}
# Published config.json values (meta-llama/Llama-3.2-1B, Qwen/Qwen3-1.7B, meta-llama/Llama-3.1-8B).
PRESETS = {
    "llama-3.2-1b": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=2048,
                         intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                         rope_theta=500000.0, rope_scaling=LLAMA3_ROPE, max_position_embeddings=131072,
                         rms_norm_eps=1e-5),
    "qwen3-1.7b": dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], hidden_size=2048,
                       intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                       rope_theta=1000000.0, rope_scaling=None, max_position_embeddings=40960, rms_norm_eps=1e-6,
                       attention_bias=False),
    "llama-3.1-8b": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False,
                         rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE, factor=8.0),
                         max_position_embeddings=131072, rms_norm_eps=1e-5),
}

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
fixture = Path(__file__).resolve().parent.parent / "tests/fixtures/tiny-llama"
cfg = json.loads((fixture / "config.json").read_text())
if len(sys.argv) > 3 and sys.argv[2] == "--preset":
    cfg.update(PRESETS[sys.argv[3]])
    if cfg["rope_scaling"] is None:
        cfg.pop("rope_scaling")
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    dtype = "BF16"
else:
    h = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    cfg.update(hidden_size=h, intermediate_size=int(sys.argv[3]) if len(sys.argv) > 3 else 2816,
               num_hidden_layers=int(sys.argv[4]) if len(sys.argv) > 4 else 16, num_attention_heads=h // 64,
               num_key_value_heads=h // 128, head_dim=64, vocab_size=512, max_position_embeddings=2048)
    cfg.pop("rope_scaling", None)
    dtype = "F32"
(out / "config.json").write_text(json.dumps(cfg, indent=2))
for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]:
    shutil.copy(fixture / f, out / f)

h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
heads, kv, d, vocab = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"]
shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
if not cfg.get("tie_word_embeddings", False):
    shapes["lm_head.weight"] = (vocab, h)
for l in range(layers):
    p = f"model.layers.{l}"
    shapes.update({f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
                   f"{p}.self_attn.q_proj.weight": (heads * d, h), f"{p}.self_attn.k_proj.weight": (kv * d, h),
                   f"{p}.self_attn.v_proj.weight": (kv * d, h), f"{p}.self_attn.o_proj.weight": (h, heads * d),
                   f"{p}.mlp.gate_proj.weight": (i, h), f"{p}.mlp.up_proj.weight": (i, h),
                   f"{p}.mlp.down_proj.weight": (h, i)})
    if cfg["model_type"] == "qwen3":
        shapes.update({f"{p}.self_attn.q_norm.weight": (d,), f"{p}.self_attn.k_norm.weight": (d,)})
size = 2 if dtype == "BF16" else 4
header, offset = {}, 0
for name, shape in shapes.items():
    n = int(np.prod(shape)) * size
    header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
    offset += n
blob = json.dumps(header).encode()
blob += b" " * (-len(blob) % 8)
rng = np.random.default_rng(0)
with open(out / "model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(blob))); f.write(blob)
    for name, shape in shapes.items():
        w = np.ones(shape, np.float32) if name.endswith("norm.weight") else rng.normal(0, 0.02, shape).astype(np.float32)
        if dtype == "BF16":
            w = (w.view(np.uint32) >> 16).astype(np.uint16)  # bf16: the top half of each f32
        f.write(w.tobytes())
        del w
print(out, sum(int(np.prod(s)) for s in shapes.values()), "parameters,", dtype)
