#!/usr/bin/env python3
"""Tiny GGUF files of every family metal-candle reads, written with the PyPI `gguf` package (llama.cpp's own
writer, architecture names and per-architecture tensor name tables) from the tiny Hugging Face fixtures, and the
reference numbers tests/ggufarch.rs compares our reader with.

    python3 scripts/make_gguf_fixtures.py          # needs `npm ci` in scripts/llamacpp (llama.cpp, the oracle)

Writes tests/fixtures/gguf/:
  tiny-qwen2-f32.gguf, tiny-qwen3-f32.gguf, tiny-qwen3-f16.gguf, tiny-mistral-f32.gguf
      the fixture's weights and byte-level BPE vocabulary; qwen2/qwen3 files say `tokenizer.ggml.pre = qwen2`
      (Qwen's split), the mistral file `gpt-2`; a mistral model is a `llama` file (llama.cpp has no dense
      `mistral` architecture) with its q/k rows permuted as llama.cpp's convert script does for `llama`.
  tiny-mistral-spm.gguf, tiny-mistral-spm-noprefix.gguf
      tiny-mistral's weights (f16) with a 512-piece SentencePiece BPE vocabulary (tiny-spm.model, trained here on the
      repository's README with byte fallback and the identity normalizer, as Llama/Mistral tokenizers are):
      `tokenizer.ggml.model = llama` (tokens, scores, token types), add_bos, `add_space_prefix` true / false
      (the second like Gemma's vocabulary).
  tiny-gemma3-f32.gguf, tiny-phi3-f32.gguf
      what llama.cpp's convert_hf_to_gguf.py (Gemma3Model, Phi3MiniModel) writes for these families, with the
      fixture's byte-level BPE vocabulary (`gpt2`, as the converter writes for a folder without tokenizer.model):
      gemma3 with every `*norm.weight` stored as w + 1, `gemma3.attention.key_length`, `sliding_window`, the rope
      base of the global layers and their linear scaling, <bos> added, tied embeddings; phi3 with fused `attn_qkv`
      and gate|up `ffn_up`, `phi3.rope.dimension_count` (partial rotary), the LongRoPE factors as the tensors
      `rope_factors_long.weight` / `rope_factors_short.weight` with `rope.scaling.attn_factor` and
      `rope.scaling.original_context_length`, `sliding_window = 0` (none).
      A gemma3 file cannot say two things tiny-gemma3 sets on purpose: `query_pre_attn_scalar` (llama.cpp scales
      scores by 1 / sqrt(key_length), except for the 62-layer 27B) and `layer_types` (llama.cpp makes every 6th
      layer global, so both of tiny-gemma3's two layers slide). Its reference is therefore the Hugging Face model
      with the config the file implies (query_pre_attn_scalar = head_dim, every layer sliding); the difference
      to the unchanged original is recorded as `hf_original_logprob_max_diff`.
  tiny-olmo2-f32.gguf, tiny-smollm3-f32.gguf, tiny-granite-f32.gguf
      what convert_hf_to_gguf.py writes for these families (Olmo2Model, SmolLM3Model, GraniteModel): olmo2 with
      `post_attention_norm` / `post_ffw_norm`, whole-projection `attn_q_norm` / `attn_k_norm`, q/k rows as in Hugging
      Face (Olmo2Model derives from TextModel; llama.cpp runs olmo2 with NEOX rope); smollm3 and granite with q/k
      rows permuted (both derive from LlamaModel; llama.cpp runs them with its interleaved rope), `vocab_size` and
      `rope.dimension_count`; granite with `attention.scale`, `embedding_scale`, `residual_scale`, `logit_scale`
      and without `attention.key_length` (GraniteModel drops `head_dim`). A smollm3 file cannot say which layers
      skip rope: llama.cpp fixes every 4th (`n_no_rope_layer_step = 4`), while tiny-smollm3 skips layer 0 on
      purpose. Its reference is the Hugging Face model with `no_rope_layers` as llama.cpp reads the file (here:
      both layers rotate), the difference to the original recorded as for gemma3.
  expected.json
      per file: the score text's ids (llama.cpp's tokenization), the Hugging Face original's log-probs of them
      (for the f16 file: the original with its 2-D weights rounded to f16 as the file stores them), llama.cpp's
      ids of every string in hostile_strings.json, and the cross-checks below (recorded, not asserted here).

Cross-checks recorded per file: llama.cpp's log-probs on the GGUF vs the Hugging Face original; the reference
tokenizer's ids vs llama.cpp's (the fixture's tokenizer.json with Qwen's pre-tokenizer for the qwen files,
sentencepiece itself for the SPM files); transformers' own GGUF loader (`from_pretrained(..., gguf_file=...)`)
on the same file: its log-probs and its tokenizer's ids.
"""
from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "gguf"
ORACLE = ROOT / "scripts" / "llamacpp" / "oracle.mjs"

# (file stem, HF fixture, general.architecture, tokenizer.ggml.pre, dtype)
BPE_FILES = [
    ("tiny-qwen2-f32", "tiny-qwen2", "qwen2", "qwen2", "f32"),
    ("tiny-qwen3-f32", "tiny-qwen3", "qwen3", "qwen2", "f32"),
    ("tiny-qwen3-f16", "tiny-qwen3", "qwen3", "qwen2", "f16"),
    ("tiny-mistral-f32", "tiny-mistral", "llama", "gpt-2", "f32"),
]
SPM_FILES = [("tiny-mistral-spm", True), ("tiny-mistral-spm-noprefix", False)]
# (file stem, HF fixture, general.architecture): families with their own llama.cpp layout, f32, BPE vocabulary.
FAMILY_FILES = [("tiny-gemma3-f32", "tiny-gemma3", "gemma3"), ("tiny-phi3-f32", "tiny-phi3", "phi3"),
                ("tiny-olmo2-f32", "tiny-olmo2", "olmo2"), ("tiny-smollm3-f32", "tiny-smollm3", "smollm3"),
                ("tiny-granite-f32", "tiny-granite", "granite")]
# Architectures whose converter (LlamaModel and its subclasses) permutes the q/k rows for llama.cpp's interleaved rope.
PERMUTED_QK = ("llama", "smollm3", "granite")

# Qwen2.5's tokenizer.json pre-tokenizer (public data), for the reference tokenizer of the qwen files.
QWEN2_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"},
         "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
    ],
}
SPM_CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                     "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def arch_enum(name: str):
    return {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[name]


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert script's q/k row permutation for the `llama` architecture (HF half-split rope ->
    GGML interleaved): rows viewed as (head, 2 halves, half) become (head, half, 2)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_hf(fixture: str, **overrides):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(FIX / fixture, torch_dtype=torch.float32, **overrides).eval()
    return model, json.loads((FIX / fixture / "config.json").read_text())


def f16_rounded(model):
    """The model as an f16 GGUF stores it: 2-D weights rounded to f16, 1-D (norms, biases) kept f32."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(p.half().float())
    return model


def write_shape_keys(w: gguf.GGUFWriter, cfg: dict, name: str, file_type: int):
    """The keys every architecture's file starts with, in convert_hf_to_gguf.py's order."""
    w.add_name(name)
    w.add_basename(name)
    w.add_file_type(file_type)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])


def write_hyperparameters(w: gguf.GGUFWriter, cfg: dict, name: str, file_type: int):
    write_shape_keys(w, cfg, name, file_type)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])


def write_tensors(w: gguf.GGUFWriter, model, cfg: dict, arch: str, dtype: str):
    names = gguf.get_tensor_name_map(arch_enum(arch), cfg["num_hidden_layers"])
    for hf_name, t in model.state_dict().items():
        if hf_name.endswith("rotary_emb.inv_freq") or ".rotary_emb" in hf_name:
            continue
        # Tied checkpoints save no lm_head (gemma3's config leaves the key out: tied by default).
        if hf_name == "lm_head.weight" and cfg.get("tie_word_embeddings", model.config.tie_word_embeddings):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            sys.exit(f"no llama.cpp name for {hf_name} in {arch}")
        data = t.detach().float().numpy()
        if arch in PERMUTED_QK and ".attn_q." in name:
            data = permute(data, cfg["num_attention_heads"])
        elif arch in PERMUTED_QK and ".attn_k." in name:
            data = permute(data, cfg["num_key_value_heads"])
        if arch == "gemma3" and hf_name.endswith("norm.weight"):
            data = data + 1  # Gemma3Model.norm_shift: the file stores the (1 + w) the norm multiplies by
        if dtype == "f16" and data.ndim >= 2:
            data = data.astype(np.float16)
        w.add_tensor(name, np.ascontiguousarray(data))


def bpe_vocabulary(fixture: str, n_vocab: int):
    tok = json.loads((FIX / fixture / "tokenizer.json").read_text())
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    added = {a["id"]: a for a in tok["added_tokens"]}
    tokens, types = [], []
    for i in range(n_vocab):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(TOKEN_CONTROL if added[i]["special"] else TOKEN_USER_DEFINED)
        elif i in by_id:
            tokens.append(by_id[i])
            types.append(TOKEN_NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    return tokens, types, merges


def chat_template(fixture: str) -> str | None:
    jinja = FIX / fixture / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text()
    return json.loads((FIX / fixture / "tokenizer_config.json").read_text()).get("chat_template")


def write_bpe_file(stem, fixture, arch, pre, dtype):
    model, cfg = load_hf(fixture)
    path = OUT / f"{stem}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    file_type = gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32
    write_hyperparameters(w, cfg, fixture, file_type)
    tokens, types, merges = bpe_vocabulary(fixture, cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    if (template := chat_template(fixture)) is not None:
        w.add_chat_template(template)
    write_tensors(w, model, cfg, arch, dtype)
    finish(w)
    return path, (f16_rounded(model) if dtype == "f16" else model)


def gemma3_as_the_file_says(cfg: dict) -> dict:
    """The config overrides that make tiny-gemma3 what llama.cpp reads from its GGUF file: scores scaled by
    1 / sqrt(key_length) and every 6th layer global (llama-model.cpp, LLM_ARCH_GEMMA3)."""
    n = cfg["num_hidden_layers"]
    return {"query_pre_attn_scalar": cfg["head_dim"],
            "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]}


def smollm3_as_the_file_says(cfg: dict) -> dict:
    """The config override that makes tiny-smollm3 what llama.cpp reads from its GGUF file: no rope on every 4th
    layer (llama-model.cpp / models/smollm3.cpp, `n_no_rope_layer_step = 4`), rope everywhere else."""
    return {"no_rope_layers": [0 if (i + 1) % 4 == 0 else 1 for i in range(cfg["num_hidden_layers"])]}


def write_llama_like_keys(w: gguf.GGUFWriter, cfg: dict, arch: str):
    """The keys Olmo2Model (TextModel's own), SmolLM3Model and GraniteModel (LlamaModel's, plus granite's
    multipliers) add after the common ones."""
    head_dim = cfg.get("head_dim") if arch != "granite" else None  # GraniteModel drops head_dim
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "olmo2":
        assert "sliding_window" not in cfg and cfg.get("rope_scaling") is None
        return
    assert cfg.get("rope_scaling") is None
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(head_dim or cfg["hidden_size"] // cfg["num_attention_heads"])
    if arch == "granite":
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])


def write_family_file(stem, fixture, arch):
    """What convert_hf_to_gguf.py writes for a gemma3 (Gemma3Model), phi3 (Phi3MiniModel), olmo2 (Olmo2Model),
    smollm3 (SmolLM3Model) or granite (GraniteModel) folder."""
    model, cfg = load_hf(fixture)
    path = OUT / f"{stem}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    # llama.cpp's vocabulary loader gives SentencePiece's <unk>, <s>, </s> and <|endoftext|> special attributes when
    # general.name contains "phi3" or "phi-3", and fails on a vocabulary without them; this file's byte-level BPE
    # vocabulary is Phi-4-mini's kind, whose files are named "Phi 4 Mini ...".
    name = "tiny-phi-mini" if arch == "phi3" else fixture
    write_shape_keys(w, cfg, name, gguf.LlamaFileType.ALL_F32)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    if arch == "gemma3":
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_sliding_window(cfg["sliding_window"])
        if (scaling := cfg.get("rope_scaling")) is not None:
            assert scaling["rope_type"] == "linear"
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(scaling["factor"])
    elif arch != "phi3":
        write_llama_like_keys(w, cfg, arch)
    else:
        scaling = cfg["rope_scaling"]
        original = cfg["original_max_position_embeddings"]
        rope_dims = int(cfg.get("partial_rotary_factor", 1.0) * cfg["hidden_size"]) // cfg["num_attention_heads"]
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_dimension_count(rope_dims)
        w.add_sliding_window(cfg.get("sliding_window") or 0)
        scale = cfg["max_position_embeddings"] / original
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        w.add_tensor("rope_factors_long.weight", np.array(scaling["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(scaling["short_factor"], dtype=np.float32))
    tokens, types, merges = bpe_vocabulary(fixture, cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    bos = cfg["bos_token_id"]
    eos = cfg["eos_token_id"][0] if isinstance(cfg["eos_token_id"], list) else cfg["eos_token_id"]
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(arch == "gemma3")
    w.add_chat_template(chat_template(fixture))
    write_tensors(w, model, cfg, arch, "f32")
    finish(w)
    if arch == "gemma3":
        as_read, _ = load_hf(fixture, **gemma3_as_the_file_says(cfg))
        return path, as_read, model
    if arch == "smollm3":
        as_read, _ = load_hf(fixture, **smollm3_as_the_file_says(cfg))
        return path, as_read, model
    return path, model, model


def train_spm():
    import sentencepiece as spm
    model_path = OUT / "tiny-spm.model"
    if not model_path.exists():
        text = (ROOT / "README.md").read_text().splitlines()
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter([l for l in text if l.strip()]), model_writer=buf, vocab_size=512,
            model_type="bpe", byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
            split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=0.9995,
            num_threads=1, allow_whitespace_only_pieces=True, minloglevel=2)
        model_path.write_bytes(buf.getvalue())
    return spm.SentencePieceProcessor(model_file=str(model_path))


def write_spm_file(stem, sp, add_space_prefix):
    model, cfg = load_hf("tiny-mistral")
    assert sp.get_piece_size() == cfg["vocab_size"]
    path = OUT / f"{stem}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    write_hyperparameters(w, cfg, "tiny-mistral", gguf.LlamaFileType.MOSTLY_F16)
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(TOKEN_UNKNOWN if sp.is_unknown(i) else TOKEN_CONTROL if sp.is_control(i)
                     else TOKEN_UNUSED if sp.is_unused(i) else TOKEN_BYTE if sp.is_byte(i) else TOKEN_NORMAL)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(add_space_prefix)
    w.add_chat_template(SPM_CHAT_TEMPLATE)
    write_tensors(w, model, cfg, "llama", "f16")
    finish(w)
    return path, f16_rounded(model)


def finish(w: gguf.GGUFWriter):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def oracle(*args) -> dict:
    res = subprocess.run(["node", str(ORACLE), *map(str, args)], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"oracle {args[:2]} failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]


def max_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else math.inf


def differing(a: list[list[int]], b: list[list[int]]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


def transformers_gguf(path: Path, ids, texts, **config_overrides):
    """transformers' own GGUF loader on our file: its log-probs of `ids` and its tokenizer's ids of `texts`
    (`tokenizer_error` instead when only its tokenizer fails)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, torch_dtype=torch.float32,
                                                     **config_overrides)
    except Exception as e:  # noqa: BLE001 - recorded as the finding
        return {"loads": False, "error": f"{type(e).__name__}: {e}"[:300]}
    found = {"loads": True, "model_class": type(model).__name__, "logprobs": logprobs(model.eval(), ids)}
    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        found["ids"] = [tok(t)["input_ids"] for t in texts]
    except Exception as e:  # noqa: BLE001 - recorded as the finding
        found["tokenizer_error"] = f"{type(e).__name__}: {e}"[:300]
    return found


def reference_ids(stem, fixture, texts, sp=None):
    """The ids a reference tokenizer (not ours, not llama.cpp's) gives each text: sentencepiece for the SPM file
    with a space prefix (sentencepiece's add_dummy_prefix), none for the one without."""
    if sp is not None:
        return [[1] + sp.encode(t) for t in texts]
    if "spm" in stem:
        return None
    from tokenizers import Tokenizer
    tok_json = json.loads((FIX / fixture / "tokenizer.json").read_text())
    if "qwen" in stem:
        tok_json["pre_tokenizer"] = QWEN2_PRE_TOKENIZER
    tok = Tokenizer.from_str(json.dumps(tok_json))
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def check(stem, path, fixture, model, texts, score_text, sp=None, **tf_overrides):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(texts + [score_text], f)
    llama_ids = oracle("tokenize-many", path, f.name)["ids"]
    os.unlink(f.name)
    hostile, score_ids = llama_ids[:-1], llama_ids[-1]
    ours_ref = reference_ids(stem, fixture, texts + [score_text], sp)
    want = logprobs(model, score_ids)
    lcpp = oracle("logprobs", path, json.dumps(score_ids))["token_logprobs"]
    tf = transformers_gguf(path, score_ids, texts, **tf_overrides)
    checks = {
        "reference_tokenizer": "sentencepiece" if sp is not None else None if ours_ref is None
        else "tokenizers (fixture tokenizer.json" + (", Qwen2.5 pre-tokenizer)" if "qwen" in stem else ")"),
        "reference_tokenizer_differs_from_llamacpp_on": None if ours_ref is None else differing(ours_ref, llama_ids),
        "llamacpp_logprob_max_diff_vs_hf": max_diff(lcpp, want),
        "transformers_gguf_loads": tf["loads"],
    }
    if tf_overrides:
        checks["transformers_gguf_config_overrides"] = tf_overrides
    if tf.get("tokenizer_error"):
        checks["transformers_gguf_class"] = tf["model_class"]
        checks["transformers_gguf_logprob_max_diff_vs_hf"] = max_diff(tf["logprobs"], want)
        checks["transformers_gguf_tokenizer_error"] = tf["tokenizer_error"]
    elif tf["loads"]:
        checks["transformers_gguf_class"] = tf["model_class"]
        checks["transformers_gguf_logprob_max_diff_vs_hf"] = max_diff(tf["logprobs"], want)
        checks["transformers_gguf_tokenizer_differs_from_llamacpp_on"] = differing(tf["ids"], hostile)
        # transformers 4.x prepends BOS whatever `add_bos_token` says; how it compares without that:
        bos = tf["ids"][0][:1]
        unprefixed = [ids[1:] if ids[:1] == bos and hostile_ids[:1] != bos else ids
                      for ids, hostile_ids in zip(tf["ids"], hostile)]
        checks["transformers_gguf_tokenizer_differs_ignoring_its_extra_bos"] = differing(unprefixed, hostile)
    else:
        checks["transformers_gguf_error"] = tf["error"]
    print(stem, json.dumps(checks))
    return {"file": path.name, "fixture": fixture,
            "score": {"text": score_text, "ids": score_ids, "token_logprobs": want},
            "hostile_ids": hostile, "checks": checks}


def our_family_name(fixture: str) -> str:
    """Our family name (`Architecture::as_str`) of a fixture."""
    name = fixture.removeprefix("tiny-")
    return "gemma3_text" if name == "gemma3" else name


def main():
    OUT.mkdir(exist_ok=True)
    texts = json.loads((OUT / "hostile_strings.json").read_text())
    entries = {}
    for stem, fixture, arch, pre, dtype in BPE_FILES:
        path, model = write_bpe_file(stem, fixture, arch, pre, dtype)
        score_text = json.loads((FIX / fixture / "expected.json").read_text())["score"]["text"]
        entries[stem] = check(stem, path, fixture, model, texts, score_text)
        entries[stem].update(family=fixture.removeprefix("tiny-"), dtype=dtype, gguf_architecture=arch)
    for stem, fixture, arch in FAMILY_FILES:
        path, model, original = write_family_file(stem, fixture, arch)
        score_text = json.loads((FIX / fixture / "expected.json").read_text())["score"]["text"]
        # transformers' phi3 config defaults pad_token_id to 32000, outside a 512-token vocabulary.
        overrides = {"pad_token_id": 0} if arch == "phi3" else {}
        entries[stem] = check(stem, path, fixture, model, texts, score_text, **overrides)
        want = entries[stem]["score"]
        entries[stem]["checks"]["hf_original_logprob_max_diff"] = max_diff(
            logprobs(original, want["ids"]), want["token_logprobs"])
        entries[stem].update(family=our_family_name(fixture), dtype="f32", gguf_architecture=arch)
    sp = train_spm()
    for stem, prefix in SPM_FILES:
        path, model = write_spm_file(stem, sp, prefix)
        score_text = "The studio trains LoRA adapters on your own machine."
        entries[stem] = check(stem, path, "tiny-mistral", model, texts, score_text, sp if prefix else None)
        entries[stem].update(family="mistral", dtype="f16", gguf_architecture="llama", add_space_prefix=prefix)
    (OUT / "expected.json").write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
