#!/usr/bin/env python3
"""The MLX side of scripts/bench_mac.sh: mlx-lm and plain MLX on the same model and shapes as `metal-candle bench`.

Subcommands (each prints one JSON line per measurement, with "impl", "device", "dtype" and versions):

  gguf-to-hf --gguf F --out DIR   Write a Hugging Face llama folder (f32 safetensors, config.json, tokenizer.json)
                                  from a llama GGUF, dequantized: the folder both sides then load, so both run the
                                  same numbers. numpy + gguf + tokenizers only (no torch).
  train      --model DIR ...      mlx-lm LoRA training step: load_model, linear_to_lora_layers (rank, scale =
                                  alpha / rank, dropout 0, the same targets, every layer), tuner.trainer.default_loss,
                                  nn.value_and_grad, AdamW (lr 1e-4, no weight decay), the step compiled with
                                  mx.compile as mlx-lm's trainer does. Random token batches; the model runs over
                                  exactly --seq-len positions per row (the batch holds seq-len + 1 tokens, since
                                  default_loss shifts by one; ours feeds seq-len tokens and scores seq-len - 1).
  generate   --model DIR ...      mlx-lm generate_step, greedy, on the same synthetic prompt as ours (the same text
                                  repeated, encoded with the folder's tokenizer.json, cut to --prompt-tokens);
                                  prefill tok/s = prompt tokens / time to the first token, decode tok/s = tokens
                                  after the first / time after the first; best of --repeats after one warm-up, as ours.
  check      --model DIR --raw F  mlx-lm greedy ids for the prompt ids of ours' `generate --json` line in F (a chat
                                  prompt): the same model gives the same ids (f32), a sanity check of both sides.
  lora-micro --repeats N          Plain MLX version of `metal-candle bench lora`: y = x W^T + 2 (x A) B over a
                                  (512, hidden) f32 input, forward and forward + gradients of x, A, B (W frozen) for
                                  hidden 512/1024/2048 at rank 8 and ranks 4/16/32/64 at 1024; softmax, layer norm
                                  and RMS norm (mx.softmax, mx.fast.layer_norm, mx.fast.rms_norm) at (512, 1024),
                                  forward and forward + input gradient (mx.vjp). Mean of N after one warm-up, as ours.
  report     --raw F --out-md F   Markdown tables (ours vs theirs, ratios) from the JSON lines bench_mac.sh collected.

MLX runs on its default device (the GPU on Apple silicon, the CPU with the `mlx[cpu]` wheel on Linux).
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path


def versions() -> dict:
    import mlx.core as mx

    out = {"mlx": getattr(mx, "__version__", None), "python": platform.python_version(), "machine": platform.machine(),
           "system": platform.system()}
    try:
        import mlx_lm

        out["mlx_lm"] = getattr(mlx_lm, "__version__", None)
    except ImportError:
        out["mlx_lm"] = None
    # The Linux `mlx[cpu]` wheel bundles its own BLAS (netlib's reference libblas in mlx_cpu.libs/): name it,
    # since CPU matrix products run through it.
    libs = Path(mx.__file__).resolve().parent.parent / "mlx_cpu.libs"
    if libs.is_dir():
        out["mlx_cpu_bundled_libs"] = sorted(p.name for p in libs.iterdir() if "blas" in p.name or "lapack" in p.name)
    return out


def device_name() -> str:
    import mlx.core as mx

    d = mx.default_device()
    return "metal" if d.type == mx.gpu else "cpu"


def max_rss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024  # bytes on macOS, KiB on Linux


def emit(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


MX_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


# ---------------------------------------------------------------------------------------------------------------
# gguf-to-hf
# ---------------------------------------------------------------------------------------------------------------

GGUF_TO_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def unpermute_qk(w, n_head: int):
    """Undo llama.cpp's convert permutation of q/k rows (interleaved rope -> HF's half-split rope)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def cmd_gguf_to_hf(args) -> None:
    import gguf
    import mlx.core as mx
    import numpy as np
    from gguf.quants import dequantize
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = gguf.GGUFReader(str(args.gguf))

    def field(key, default=None):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch != "llama":
        sys.exit(f"gguf-to-hf: {args.gguf} is a {arch!r} GGUF; only llama is supported")
    n_head = int(field("llama.attention.head_count"))
    n_kv = int(field("llama.attention.head_count_kv", n_head))
    hidden = int(field("llama.embedding_length"))
    tokens = field("tokenizer.ggml.tokens")
    tensors = {}
    for t in r.tensors:
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF lists dims innermost first
        name = t.name
        if name == "token_embd.weight":
            hf = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            hf = "model.norm.weight"
        elif name == "output.weight":
            hf = "lm_head.weight"
        elif name.startswith("blk."):
            _, layer, kind, leaf = name.split(".", 3)
            if kind not in GGUF_TO_HF:
                sys.exit(f"gguf-to-hf: unknown tensor {name}")
            if kind == "attn_q":
                w = unpermute_qk(w, n_head)
            elif kind == "attn_k":
                w = unpermute_qk(w, n_kv)
            hf = f"model.layers.{layer}.{GGUF_TO_HF[kind]}.{leaf}"
        else:
            sys.exit(f"gguf-to-hf: unknown tensor {name}")
        tensors[hf] = mx.array(w)
    tied = "lm_head.weight" not in tensors
    n_layers = int(field("llama.block_count"))
    head_dim = int(field("llama.rope.dimension_count", hidden // n_head))
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(tokens),
        "hidden_size": hidden,
        "intermediate_size": int(field("llama.feed_forward_length")),
        "num_hidden_layers": n_layers,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(field("llama.context_length", 2048)),
        "rms_norm_eps": float(field("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(field("llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": int(field("tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(field("tokenizer.ggml.eos_token_id", 2)),
        "torch_dtype": "float32",
    }
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))

    # tokenizer.json: byte-level BPE (GGUF tokenizer model "gpt2"), the vocabulary and merges of the GGUF.
    if field("tokenizer.ggml.model") != "gpt2":
        sys.exit("gguf-to-hf: only byte-level BPE (tokenizer.ggml.model = gpt2) tokenizers are supported")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    types = field("tokenizer.ggml.token_type")
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t, ty in zip(tokens, types) if ty == 3])
    tok.save(str(out / "tokenizer.json"))
    tcfg = {"bos_token": tokens[cfg["bos_token_id"]], "eos_token": tokens[cfg["eos_token_id"]]}
    template = field("tokenizer.chat_template")
    if template:
        tcfg["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    emit({"out": str(out), "source": str(args.gguf), "tensors": len(tensors),
          "parameters": int(sum(v.size for v in tensors.values()))})


# ---------------------------------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------------------------------

def lora_keys(targets: list[str]) -> list[str]:
    """Our target names (q_proj, ..., down_proj) as mlx-lm's module keys inside a decoder layer."""
    keys = []
    for t in targets:
        if "." in t:
            keys.append(t)
        elif t in ("q_proj", "k_proj", "v_proj", "o_proj"):
            keys.append(f"self_attn.{t}")
        elif t in ("gate_proj", "up_proj", "down_proj"):
            keys.append(f"mlp.{t}")
        else:
            sys.exit(f"train: unknown target {t!r}")
    return keys


def cmd_train(args) -> None:
    from functools import partial

    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.trainer import default_loss
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load_model

    t0 = time.perf_counter()
    model, config = load_model(Path(args.model))
    model.set_dtype(getattr(mx, MX_DTYPES[args.dtype]))
    if args.quantize_bits:
        # QLoRA as mlx-lm trains it on a model converted with `-q`: the linears' weights in affine groups of 64
        # (nn.QuantizedLinear; the embedding stays dense), the adapters over them.
        nn.quantize(model, group_size=64, bits=args.quantize_bits,
                    class_predicate=lambda _, m: isinstance(m, nn.Linear) and m.weight.shape[-1] % 64 == 0)
    model.freeze()
    alpha = args.alpha if args.alpha is not None else 2.0 * args.rank
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    lcfg = {"rank": args.rank, "scale": alpha / args.rank, "dropout": 0.0, "keys": lora_keys(targets)}
    linear_to_lora_layers(model, len(model.layers), lcfg)
    model.train()
    mx.eval(model.parameters())
    load_s = time.perf_counter() - t0
    trainable = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))

    opt = optim.AdamW(learning_rate=1e-4, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0)
    loss_value_and_grad = nn.value_and_grad(model, default_loss)
    state = [model.state, opt.state, mx.random.state]

    def step(batch, lengths):
        (lvalue, toks), grad = loss_value_and_grad(model, batch, lengths)
        opt.update(model, grad)
        return lvalue, toks

    if not args.no_compile:
        step = partial(mx.compile, inputs=state, outputs=state)(step)

    vocab = config["vocab_size"]
    B, T = args.batch_size, args.seq_len
    lengths = mx.array([[0, T + 1]] * B)  # every target counts: T targets after the shift
    mx.random.seed(args.seed)

    def run(i):
        batch = mx.random.randint(0, vocab, (B, T + 1), key=mx.random.key(1000 + i)).astype(mx.int32)
        lvalue, _ = step(batch, lengths)
        mx.eval(state, lvalue)
        return lvalue.item()

    losses = [run(i) for i in range(args.warmup)]
    mx.reset_peak_memory()
    times = []
    for i in range(max(1, args.steps)):
        t = time.perf_counter()
        losses.append(run(args.warmup + i))
        times.append(time.perf_counter() - t)
    mean_s = statistics.mean(times)
    emit({
        "impl": "mlx-lm", "bench": "train-q4" if args.quantize_bits else "train", "device": device_name(),
        "dtype": args.dtype, "quantize_bits": args.quantize_bits,
        "model": str(args.model), "batch_size": B, "seq_len": T, "rank": args.rank, "alpha": alpha,
        "scale": lcfg["scale"], "targets": targets, "trainable_params": trainable, "compiled": not args.no_compile,
        "warmup_steps": args.warmup, "steps": len(times), "mean_step_secs": mean_s,
        "median_step_secs": statistics.median(times), "min_step_secs": min(times),
        "tokens_per_sec": B * T / mean_s, "first_loss": losses[0], "last_loss": losses[-1],
        "mlx_peak_memory_bytes": mx.get_peak_memory(), "process_max_rss_bytes": max_rss_bytes(),
        "load_secs": load_s, **versions(),
    })


# ---------------------------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------------------------

# The same text as src/engine/bench.rs `synthetic_prompt`, so both sides see the same token ids.
PROMPT_TEXT = "The quick brown fox jumps over the lazy dog while the curious cat watches from the window. "


def synthetic_prompt(model_dir: Path, n: int) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    piece = tok.encode(PROMPT_TEXT, add_special_tokens=False).ids
    ids = []
    while len(ids) < n:
        ids.extend(piece)
    return ids[:n]


def cmd_generate(args) -> None:
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(args.model))
    model.set_dtype(getattr(mx, MX_DTYPES[args.dtype]))
    mx.eval(model.parameters())
    prompt = mx.array(synthetic_prompt(Path(args.model), args.prompt_tokens), dtype=mx.uint32)

    def once(n_new: int):
        ids = []
        t0 = time.perf_counter()
        t_first = None
        for tok, _ in generate_step(prompt, model, max_tokens=n_new):
            ids.append(int(tok))  # the sampler is greedy (argmax) by default; .item() waits for the token
            if t_first is None:
                t_first = time.perf_counter()
        t_end = time.perf_counter()
        prefill = len(prompt) / (t_first - t0)
        decode = (len(ids) - 1) / max(t_end - t_first, 1e-9)
        return prefill, decode, ids

    once(min(4, args.new_tokens))  # warm-up, as ours
    best_p, best_d, ids = 0.0, 0.0, []
    for _ in range(max(1, args.repeats)):
        p, d, ids = once(args.new_tokens)
        best_p, best_d = max(best_p, p), max(best_d, d)
    emit({
        "impl": "mlx-lm", "bench": "generate", "device": device_name(), "dtype": args.dtype,
        "model": str(args.model), "prompt_tokens": int(len(prompt)), "new_tokens": len(ids),
        "prefill_tokens_per_sec": best_p, "decode_tokens_per_sec": best_d, "repeats": max(1, args.repeats),
        "first_generated_ids": ids[:16], "mlx_peak_memory_bytes": mx.get_peak_memory(), **versions(),
    })


def cmd_check(args) -> None:
    """Greedy ids from mlx-lm for the prompt ids ours used (`metal-candle generate --json`): same model, same ids?"""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model
    from tokenizers import Tokenizer

    ours = None
    for line in Path(args.raw).read_text().splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("impl") == "metal-candle" and r.get("bench") == "check":
                ours = r
    if ours is None:
        sys.exit("check: no metal-candle check line in " + args.raw)
    model, _ = load_model(Path(args.model))
    model.set_dtype(getattr(mx, MX_DTYPES[args.dtype]))
    prompt = mx.array(ours["prompt_ids"], dtype=mx.uint32)
    want = ours["generated_ids"]
    ids = [int(t) for t, _ in generate_step(prompt, model, max_tokens=len(want))]
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    emit({"impl": "mlx-lm", "bench": "check", "device": device_name(), "dtype": args.dtype,
          "prompt_tokens": len(ours["prompt_ids"]), "generated_ids": ids, "text": tok.decode(ids),
          "ours_generated_ids": want, "same_ids": ids == want,
          "first_difference": next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), None), **versions()})


# ---------------------------------------------------------------------------------------------------------------
# lora-micro
# ---------------------------------------------------------------------------------------------------------------

def cmd_lora_micro(args) -> None:
    import mlx.core as mx

    rows = 4 * 128
    common = {"impl": "mlx", "bench": "lora", "device": device_name(), "dtype": "f32", **versions()}

    def time_ms(f) -> float:
        mx.eval(f())  # warm-up, as ours
        t = time.perf_counter()
        for _ in range(max(1, args.repeats)):
            mx.eval(f())
        return (time.perf_counter() - t) * 1e3 / max(1, args.repeats)

    mx.random.seed(0)
    cases = [(h, 8) for h in (512, 1024, 2048)] + [(1024, r) for r in (4, 16, 32, 64)]
    for hidden, rank in cases:
        x = mx.random.normal((rows, hidden))
        w = mx.random.normal((hidden, hidden)) * 0.02
        a = mx.random.normal((hidden, rank)) * 0.02
        b = mx.random.normal((rank, hidden)) * 0.02
        upstream = mx.random.normal((rows, hidden))
        mx.eval(x, w, a, b, upstream)

        def forward(x, a, b):
            return x @ w.T + 2.0 * ((x @ a) @ b)

        # As ours: the output, and the input gradient and both adapter gradients for an upstream gradient
        # (W is a constant, so no weight gradient).
        def fwd_bwd(forward=forward, x=x, a=a, b=b, upstream=upstream):
            outs, grads = mx.vjp(forward, [x, a, b], [upstream])
            return outs + grads

        emit({**common, "op": "lora", "hidden": hidden, "rank": rank,
              "forward_ms": time_ms(lambda: forward(x, a, b)), "backward_ms": time_ms(fwd_bwd)})

    hidden = 1024
    x = mx.random.normal((rows, hidden))
    upstream = mx.random.normal((rows, hidden))
    gamma = mx.ones((hidden,))
    beta = mx.zeros((hidden,))
    mx.eval(x, upstream, gamma, beta)
    ops = {
        "softmax": lambda x: mx.softmax(x, axis=-1),
        "layer_norm": lambda x: mx.fast.layer_norm(x, gamma, beta, 1e-5),
        "rms_norm": lambda x: mx.fast.rms_norm(x, gamma, 1e-5),
    }
    for name, f in ops.items():
        def fwd_bwd(f=f):
            outs, vjps = mx.vjp(f, [x], [upstream])
            return outs + vjps

        emit({**common, "op": name, "hidden": hidden, "rank": 0, "forward_ms": time_ms(lambda f=f: f(x)),
              "backward_ms": time_ms(fwd_bwd)})


# ---------------------------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------------------------

def fmt(v, nd=2) -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{nd}f}"


def ratio(num, den) -> str:
    if num is None or den is None or den == 0:
        return "n/a"
    return f"{num / den:.2f}x"


def cmd_report(args) -> None:
    recs = [json.loads(line) for line in Path(args.raw).read_text().splitlines() if line.startswith("{")]

    def pick(impl, bench):
        for r in recs:
            if r.get("impl") == impl and r.get("bench") == bench:
                return r
        return None

    ours_train, mlx_train = pick("metal-candle", "train"), pick("mlx-lm", "train")
    ours_wgsl = pick("metal-candle", "train-wgsl")
    ours_q4, mlx_q4 = pick("metal-candle", "train-q4"), pick("mlx-lm", "train-q4")
    ours_gen, mlx_gen = pick("metal-candle", "generate"), pick("mlx-lm", "generate")
    ours_chk, mlx_chk = pick("metal-candle", "check"), pick("mlx-lm", "check")
    any_mlx = mlx_train or mlx_q4 or mlx_gen or mlx_chk or pick("mlx", "lora") or {}
    any_ours = ours_train or ours_q4 or ours_gen or pick("metal-candle", "lora") or {}
    lines = []
    lines.append(f"metal-candle on `{any_ours.get('device', '?')}` ({any_ours.get('dtype', '?')}; `bench lora`: f32); "
                 f"MLX {any_mlx.get('mlx', '?')} / mlx-lm {any_mlx.get('mlx_lm', '?')} on `{any_mlx.get('device', '?')}` "
                 f"({any_mlx.get('system', '?')} {any_mlx.get('machine', '?')}).")
    if ours_train and ours_train.get("device") == "cpu":
        lines.append(f"Ours multiplies on the CPU with: {ours_train.get('blas') or 'its built-in kernels (no BLAS library loaded)'}.")
    if any_mlx.get("mlx_cpu_bundled_libs"):
        lines.append("MLX's CPU matrix products go through the BLAS bundled in its Linux wheel ("
                     + ", ".join(any_mlx["mlx_cpu_bundled_libs"]) + ": netlib's reference BLAS, unblocked and "
                     "single-threaded), so these MLX CPU figures say nothing about MLX on a Mac (Metal, Accelerate).")
    lines.append("")
    lines.append("| benchmark | metal-candle | mlx-lm / MLX | ratio |")
    lines.append("|---|---|---|---|")
    if ours_train or mlx_train:
        o, t = ours_train or {}, mlx_train or {}
        shape = (f"batch {o.get('batch_size', t.get('batch_size'))} x {o.get('seq_len', t.get('seq_len'))}, "
                 f"r{o.get('rank', t.get('rank'))} on {','.join(o.get('targets') or t.get('targets') or [])}, AdamW")
        lines.append(f"| train step, {shape}: mean s/step (median), {t.get('steps', o.get('steps', '?'))} measured steps "
                     f"| {fmt(o.get('mean_step_secs'), 3)} ({fmt(o.get('median_step_secs'), 3)}) "
                     f"| {fmt(t.get('mean_step_secs'), 3)} ({fmt(t.get('median_step_secs'), 3)}) "
                     f"| {ratio(t.get('mean_step_secs'), o.get('mean_step_secs'))} (mlx-lm time / ours) |")
        lines.append(f"| train: tokens/s | {fmt(o.get('tokens_per_sec'), 1)} | {fmt(t.get('tokens_per_sec'), 1)} "
                     f"| {ratio(o.get('tokens_per_sec'), t.get('tokens_per_sec'))} |")
        o_mem = o.get("peak_rss_bytes")
        lines.append(f"| train: peak memory, GB (ours: process RSS during the steps; mlx-lm: mx.get_peak_memory, "
                     f"process max RSS) | {fmt(o_mem / 1e9 if o_mem else None)} "
                     f"| {fmt((t.get('mlx_peak_memory_bytes') or 0) / 1e9 if t else None)}, "
                     f"{fmt((t.get('process_max_rss_bytes') or 0) / 1e9 if t else None)} | not like for like |")
    if ours_wgsl:
        o, t, d = ours_wgsl, mlx_train or {}, ours_train or {}
        lines.append(f"| train step under `--kernels wgsl` (our WGSL kernels): mean s/step (median) "
                     f"| {fmt(o.get('mean_step_secs'), 3)} ({fmt(o.get('median_step_secs'), 3)}) "
                     f"| {fmt(t.get('mean_step_secs'), 3)} ({fmt(t.get('median_step_secs'), 3)}) "
                     f"| {ratio(t.get('mean_step_secs'), o.get('mean_step_secs'))} (mlx-lm time / ours); "
                     f"{ratio(d.get('mean_step_secs'), o.get('mean_step_secs'))} (our default kernels' time / ours) |")
    if ours_q4 or mlx_q4:
        o, t = ours_q4 or {}, mlx_q4 or {}
        lines.append(f"| train step on a quantized base (QLoRA; ours `bench train --quantize`, q4_1 unless the command "
                     f"says, mlx-lm {t.get('quantize_bits', '?')}-bit groups of 64): mean s/step (median) "
                     f"| {fmt(o.get('mean_step_secs'), 3)} ({fmt(o.get('median_step_secs'), 3)}) "
                     f"| {fmt(t.get('mean_step_secs'), 3)} ({fmt(t.get('median_step_secs'), 3)}) "
                     f"| {ratio(t.get('mean_step_secs'), o.get('mean_step_secs'))} (mlx-lm time / ours) |")
    if ours_gen or mlx_gen:
        o, t = ours_gen or {}, mlx_gen or {}
        what = f"{o.get('prompt_tokens', t.get('prompt_tokens'))}-token prompt, {o.get('new_tokens', t.get('new_tokens'))} new, greedy, best of {o.get('repeats', t.get('repeats'))}"
        lines.append(f"| generate: decode tok/s ({what}) | {fmt(o.get('decode_tokens_per_sec'), 1)} "
                     f"| {fmt(t.get('decode_tokens_per_sec'), 1)} "
                     f"| {ratio(o.get('decode_tokens_per_sec'), t.get('decode_tokens_per_sec'))} (ours / mlx-lm) |")
        lines.append(f"| generate: prefill tok/s | {fmt(o.get('prefill_tokens_per_sec'), 1)} "
                     f"| {fmt(t.get('prefill_tokens_per_sec'), 1)} "
                     f"| {ratio(o.get('prefill_tokens_per_sec'), t.get('prefill_tokens_per_sec'))} (ours / mlx-lm) |")
    if ours_chk or mlx_chk:
        o, t = ours_chk or {}, mlx_chk or {}
        same = t.get("same_ids")
        verdict = ("n/a" if same is None else "**identical**" if same
                   else f"differ from token {t.get('first_difference')} (in bf16/f16 a near-tie can flip a greedy token)")
        lines.append(f"| same-model check: greedy ids for ours' chat prompt ({o.get('prompt_ids') and len(o['prompt_ids'])} "
                     f"tokens, \"What is the capital of France?\") | {json.dumps(o.get('text'))} "
                     f"| {json.dumps(t.get('text'))} | ids {verdict} |")
    lines.append("")

    ours_micro = [r for r in recs if r.get("impl") == "metal-candle" and "op" in r]
    mlx_micro = {(r["op"], r["hidden"], r["rank"]): r for r in recs if r.get("impl") == "mlx" and "op" in r}
    if ours_micro or mlx_micro:
        lines.append("LoRA layer micro-benchmark (`bench lora`; (512, hidden) f32 input, ms, mean of the repeats; "
                     "\"+bwd\" = forward plus the gradients of x, A and B; ratio = MLX time / ours):")
        lines.append("")
        lines.append("| op | hidden | rank | ours forward | MLX forward | ratio | ours fwd+bwd | MLX fwd+bwd | ratio |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        keys = [(r["op"], r["hidden"], r["rank"]) for r in ours_micro]
        keys += [k for k in mlx_micro if k not in keys]
        ours_by = {(r["op"], r["hidden"], r["rank"]): r for r in ours_micro}
        for k in keys:
            o, t = ours_by.get(k, {}), mlx_micro.get(k, {})
            op = {"lora": "LoRA linear", "softmax": "softmax (fwd+bwd: + input grad)",
                  "layer_norm": "layer norm (fwd+bwd: + input grad)",
                  "rms_norm": "RMS norm (fwd+bwd: + input grad)"}.get(k[0], k[0])
            lines.append(
                f"| {op} | {k[1]} | {k[2] or '-'} | {fmt(o.get('forward_ms'))} | {fmt(t.get('forward_ms'))} "
                f"| {ratio(t.get('forward_ms'), o.get('forward_ms'))} | {fmt(o.get('backward_ms'))} "
                f"| {fmt(t.get('backward_ms'))} | {ratio(t.get('backward_ms'), o.get('backward_ms'))} |")
        lines.append("")
    missing = []
    for name, r in [("metal-candle bench train", ours_train), ("mlx-lm train", mlx_train),
                    ("metal-candle bench train --kernels wgsl", ours_wgsl),
                    ("metal-candle bench train --quantize", ours_q4), ("mlx-lm train, 4-bit base", mlx_q4),
                    ("metal-candle bench generate", ours_gen), ("mlx-lm generate", mlx_gen),
                    ("metal-candle bench lora", ours_micro), ("MLX lora-micro", mlx_micro),
                    ("metal-candle generate (check)", ours_chk), ("mlx-lm check", mlx_chk)]:
        if not r:
            missing.append(name)
    if missing:
        lines.append("Not measured in this run (failed or skipped; see the log): " + ", ".join(missing) + ".")
        lines.append("")
    text = "\n".join(lines)
    if args.out_md:
        Path(args.out_md).write_text(text + "\n")
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("gguf-to-hf")
    p.add_argument("--gguf", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(fn=cmd_gguf_to_hf)

    p = sub.add_parser("train")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--dtype", choices=list(MX_DTYPES), default="f32")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=None, help="default 2 * rank, as ours")
    p.add_argument("--targets", default="q_proj,v_proj")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-compile", action="store_true", help="do not mx.compile the step")
    p.add_argument("--quantize-bits", type=int, default=0, help="QLoRA: the linears quantized to this many bits")
    p.set_defaults(fn=cmd_train)

    p = sub.add_parser("generate")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--dtype", choices=list(MX_DTYPES), default="f32")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.set_defaults(fn=cmd_generate)

    p = sub.add_parser("check")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--raw", required=True, help="the JSON lines holding ours `generate --json` (bench: check)")
    p.add_argument("--dtype", choices=list(MX_DTYPES), default="f32")
    p.set_defaults(fn=cmd_check)

    p = sub.add_parser("lora-micro")
    p.add_argument("--repeats", type=int, default=10)
    p.set_defaults(fn=cmd_lora_micro)

    p = sub.add_parser("report")
    p.add_argument("--raw", required=True)
    p.add_argument("--out-md", default=None)
    p.set_defaults(fn=cmd_report)

    args = ap.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
