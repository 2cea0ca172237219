#!/usr/bin/env python3
"""A random-weight model folder for memory and speed measurements: values do not change memory or speed.

Usage:
  python3 scripts/make_random_model.py OUT_DIR [hidden] [intermediate] [layers]
      a Llama of that size, f32, vocab 512 (numpy only)
  python3 scripts/make_random_model.py OUT_DIR --preset NAME
      the real shapes of a published model from its config.json values, bf16 as the hub ships them. NAME:
      llama-3.2-1b, qwen3-1.7b, llama-3.1-8b, and one model per family beyond Llama/Qwen: gemma-3-270m,
      phi-4-mini, smollm3-3b, granite-3.3-2b, olmo2-1b. The tensor names and shapes come from transformers
      itself (the model built on the meta device from that config), so every family's own layout (fused
      qkv_proj, sandwich norms, q/k norms) is right without a table here.
Writes config.json (the preset's published values), model.safetensors (written one tensor at a time: norm weights
1, the rest N(0, 0.02)) and the tiny-llama fixture's tokenizer files (its 512 tokens are a subset of every
vocabulary here). With MC_RANDOM_TILED=1 every weight repeats one block of 16M random values: much faster to
write at 8B, the same speed and memory to measure.
"""
import json, os, shutil, struct, sys
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
    # google/gemma-3-270m: sandwich (1 + w) norms, GeGLU, q/k norms, 5 sliding (512) : 1 global layers.
    "gemma-3-270m": dict(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"], hidden_size=640,
                         intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=256, vocab_size=262144, tie_word_embeddings=True,
                         rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
                         sliding_window=512, query_pre_attn_scalar=256, max_position_embeddings=32768,
                         rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
                         layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3),
    # microsoft/Phi-4-mini-instruct: fused qkv_proj and gate_up_proj, partial rotary 0.75, LongRoPE.
    "phi-4-mini": dict(model_type="phi3", architectures=["Phi3ForCausalLM"], hidden_size=3072,
                       intermediate_size=8192, num_hidden_layers=32, num_attention_heads=24,
                       num_key_value_heads=8, vocab_size=200064, tie_word_embeddings=True, rope_theta=10000.0,
                       partial_rotary_factor=0.75, max_position_embeddings=131072,
                       original_max_position_embeddings=4096, rms_norm_eps=1e-5, sliding_window=262144,
                       rope_scaling={"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [
                           1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817,
                           2.187582649, 2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687,
                           4.279200023, 4.785517845, 5.351743533, 5.984965424, 6.693110555, 7.485043894,
                           8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
                           16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03,
                           32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28,
                           33.49, 33.5, 44.16, 47.77]}),
    # HuggingFaceTB/SmolLM3-3B: a Llama with no rotary embedding on every fourth layer.
    "smollm3-3b": dict(model_type="smollm3", architectures=["SmolLM3ForCausalLM"], hidden_size=2048,
                       intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=4, vocab_size=128256, tie_word_embeddings=True, rope_theta=5000000.0,
                       rope_scaling=None, max_position_embeddings=65536, rms_norm_eps=1e-6,
                       no_rope_layer_interval=4, no_rope_layers=[int((i + 1) % 4 != 0) for i in range(36)]),
    # ibm-granite/granite-3.3-2b-instruct: embedding, residual and attention multipliers, logits scaling.
    "granite-3.3-2b": dict(model_type="granite", architectures=["GraniteForCausalLM"], hidden_size=2048,
                           intermediate_size=8192, num_hidden_layers=40, num_attention_heads=32,
                           num_key_value_heads=8, vocab_size=49159, tie_word_embeddings=True,
                           rope_theta=10000000.0, rope_scaling=None, max_position_embeddings=131072,
                           rms_norm_eps=1e-5, embedding_multiplier=12.0, residual_multiplier=0.22,
                           attention_multiplier=0.015625, logits_scaling=8.0),
    # allenai/OLMo-2-0425-1B: norms after attention and MLP, q/k norms over the whole projection.
    "olmo2-1b": dict(model_type="olmo2", architectures=["Olmo2ForCausalLM"], hidden_size=2048,
                     intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                     vocab_size=100352, tie_word_embeddings=False, rope_theta=500000.0, rope_scaling=None,
                     max_position_embeddings=4096, rms_norm_eps=1e-6),
}


def transformers_shapes(cfg: dict) -> dict:
    """Every stored tensor of the model transformers builds from `cfg`, built on the meta device (no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "torch_dtype", "dtype")}
    config = AutoConfig.for_model(cfg["model_type"], **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if cfg.get("tie_word_embeddings", False):
        shapes.pop("lm_head.weight", None)
    return shapes

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
fixture = Path(__file__).resolve().parent.parent / "tests/fixtures/tiny-llama"
cfg = json.loads((fixture / "config.json").read_text())
preset = len(sys.argv) > 3 and sys.argv[2] == "--preset"
if preset:
    # Only the published values, plus the tokenizer's special ids: no Llama field may leak into another family.
    cfg = {k: cfg[k] for k in ("bos_token_id", "eos_token_id") if k in cfg} | PRESETS[sys.argv[3]]
    if cfg.get("rope_scaling", 0) is None:
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

if preset:
    shapes = transformers_shapes(cfg)
else:
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
size = 2 if dtype == "BF16" else 4
header, offset = {}, 0
for name, shape in shapes.items():
    n = int(np.prod(shape)) * size
    header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
    offset += n
blob = json.dumps(header).encode()
blob += b" " * (-len(blob) % 8)
rng = np.random.default_rng(0)
# MC_RANDOM_TILED=1: every weight repeats one block of 16M random values (an 8B folder in a fraction of the time;
# speed and memory measurements do not depend on the values).
TILED = os.environ.get("MC_RANDOM_TILED") == "1"
pool = rng.standard_normal(1 << 24, np.float32) * np.float32(0.02) if TILED else None
with open(out / "model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(blob))); f.write(blob)
    for name, shape in shapes.items():
        rows = shape[0] if len(shape) > 1 else 1
        step = max(1, (1 << 24) // max(1, int(np.prod(shape)) // rows))  # ~16M values at a time
        for r in range(0, rows, step):
            part = (min(step, rows - r),) + tuple(shape[1:]) if len(shape) > 1 else shape
            if name.endswith("norm.weight"):
                w = np.ones(part, np.float32)
            elif TILED:
                w = pool[: int(np.prod(part))].reshape(part)
            else:
                w = rng.standard_normal(part, np.float32) * np.float32(0.02)
            if dtype == "BF16":
                w = (w.view(np.uint32) >> 16).astype(np.uint16)  # bf16: the top half of each f32
            f.write(w.tobytes())
print(out, sum(int(np.prod(s)) for s in shapes.values()), "parameters,", dtype)
