#!/usr/bin/env python3
"""A random-weight Llama model folder for memory measurements: values do not change memory or speed.

Usage: python3 scripts/make_random_llama.py OUT_DIR [hidden] [intermediate] [layers]
Writes config.json, model.safetensors (f32, written one tensor at a time) and the tiny-llama fixture's
tokenizer files (vocab 512), using only numpy.
"""
import json, shutil, struct, sys
from pathlib import Path
import numpy as np

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
h = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
i = int(sys.argv[3]) if len(sys.argv) > 3 else 2816
layers = int(sys.argv[4]) if len(sys.argv) > 4 else 16
heads, kv, d, vocab = h // 64, h // 128, 64, 512
fixture = Path(__file__).resolve().parent.parent / "tests/fixtures/tiny-llama"
cfg = json.loads((fixture / "config.json").read_text())
cfg.update(hidden_size=h, intermediate_size=i, num_hidden_layers=layers, num_attention_heads=heads,
           num_key_value_heads=kv, head_dim=d, vocab_size=vocab, max_position_embeddings=2048)
cfg.pop("rope_scaling", None)
(out / "config.json").write_text(json.dumps(cfg, indent=2))
for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"]:
    shutil.copy(fixture / f, out / f)
shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
for l in range(layers):
    p = f"model.layers.{l}"
    shapes.update({f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
                   f"{p}.self_attn.q_proj.weight": (heads * d, h), f"{p}.self_attn.k_proj.weight": (kv * d, h),
                   f"{p}.self_attn.v_proj.weight": (kv * d, h), f"{p}.self_attn.o_proj.weight": (h, heads * d),
                   f"{p}.mlp.gate_proj.weight": (i, h), f"{p}.mlp.up_proj.weight": (i, h),
                   f"{p}.mlp.down_proj.weight": (h, i)})
header, offset = {}, 0
for name, shape in shapes.items():
    n = int(np.prod(shape)) * 4
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
    offset += n
blob = json.dumps(header).encode()
blob += b" " * (-len(blob) % 8)
rng = np.random.default_rng(0)
with open(out / "model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(blob))); f.write(blob)
    for name, shape in shapes.items():
        w = np.ones(shape, np.float32) if name.endswith("norm.weight") else rng.normal(0, 0.02, shape).astype(np.float32)
        f.write(w.tobytes())
print(out, sum(int(np.prod(s)) for s in shapes.values()), "parameters")
