#!/usr/bin/env python3
"""Check that adapters trained by OUR trainer interoperate with the reference (Hugging Face PEFT/transformers).

For each adapter fixture in tests/fixtures/ours-*-adapter/ (adapter_config.json + adapter_model.safetensors,
copied verbatim from a `metal-candle train` checkpoint):

1. `peft.PeftModel.from_pretrained(base, adapter_dir)` must load it without complaint (any warning about
   missing/unexpected adapter keys or config fields is an error here: it means our format is off), every
   LoRA tensor in the file must end up in the PEFT model unchanged, and the adapter must change the output.
   Records `peft_score` {ids, token_logprobs, nll_mean} for the base fixture's `score` text.
2. The merged export (`metal-candle export --format merged`) must load with AutoModelForCausalLM +
   AutoTokenizer with no missing/unexpected/mismatched keys or warnings, and reproduce the PEFT log-probs
   within 1e-4. Records `merged_score`.
3. The mlx-lm export (`metal-candle export --format mlx-lm`) must hold `model.layers.N.<group>.<module>.lora_a`
   (in, r) == PEFT lora_A^T and `lora_b` (r, out) == PEFT lora_B^T, and an adapter_config.json with mlx-lm's
   fields (fine_tune_type, num_layers, lora_parameters {rank, scale, dropout, keys}), scale = alpha/r
   (alpha/sqrt(r) for rsLoRA). Records `mlx_check: true` plus the tensor shapes and config.

4. Optionally, when mlx-lm is importable (`pip install mlx[cpu] mlx-lm` works on Linux; not in
   requirements-reference.txt), `mlx_lm.load(base, adapter_path=<mlx export>)` must reproduce PEFT's
   log-probs within 1e-4 (reported, not recorded).

Exports are made by running the release binary on the fixture folder into a temporary folder, unless given
with --merged NAME=DIR / --mlx NAME=DIR (e.g. the CLI exports of the original checkpoint).

    cargo build --release
    # (once) train and copy the fixtures:
    python scripts/check_interop.py --copy-from-runs /tmp/interop-runs
    # check and (re)write tests/fixtures/ours-*-adapter/expected.json:
    python scripts/check_interop.py [--merged ours-tiny-llama-adapter=/tmp/interop-merged] \
                                    [--mlx ours-tiny-llama-adapter=/tmp/interop-mlx]

Deterministic: re-running rewrites identical expected.json files. Exit status 1 on any failed check.
Versions: scripts/requirements-reference.txt.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
DEFAULT_BINARY = ROOT / "target" / "release" / "metal-candle"

# fixture folder -> (base model fixture, run name under --copy-from-runs)
CASES = {
    "ours-tiny-llama-adapter": ("tiny-llama", "ours"),
    "ours-tiny-qwen3-adapter": ("tiny-qwen3", "ours-qwen3"),
    "ours-tiny-gemma3-adapter": ("tiny-gemma3", "ours-gemma3"),
    "ours-tiny-olmo2-adapter": ("tiny-olmo2", "ours-olmo2"),
}
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
LOGPROB_TOL = 1e-4
STRICT = False  # set by --strict: unknown adapter_config.json fields are errors too
CHANGE_MIN = 1e-3


class InteropError(Exception):
    pass


def write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


@contextmanager
def captured_warnings():
    """Collect Python warnings and transformers/peft log records at WARNING or above."""
    records: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record):
            records.append(f"[{record.name}] {record.getMessage()}")

    handler = Handler(level=logging.WARNING)
    loggers = [logging.getLogger(n) for n in ("transformers", "peft")]
    for lg in loggers:
        lg.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield records
        finally:
            for lg in loggers:
                lg.removeHandler(handler)
            records.extend(f"[{w.category.__name__}] {w.message}" for w in caught)


def load_base(base_dir: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


@torch.no_grad()
def score_ids(model, ids: list[int]) -> dict:
    """token_logprobs[i] = log p(ids[i+1] | ids[..=i]); float64 log_softmax over float32 logits (as make_fixtures.py)."""
    x = torch.tensor([ids], dtype=torch.long)
    logits = model(input_ids=x).logits[0].float()
    lp = torch.log_softmax(logits.double(), dim=-1)
    tgt = torch.tensor(ids[1:], dtype=torch.long)
    tok_lp = lp[:-1].gather(1, tgt[:, None])[:, 0]
    return {"ids": list(ids), "token_logprobs": [float(v) for v in tok_lp], "nll_mean": float(-tok_lp.mean())}


def max_abs(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b))


def run_export(binary: Path, adapter_dir: Path, fmt: str, out: Path, base_dir: Path) -> None:
    if not binary.exists():
        raise InteropError(f"{binary} not found: run `cargo build --release` first (or pass --merged/--mlx)")
    cmd = [str(binary), "export", "--checkpoint", str(adapter_dir), "--format", fmt, "--out", str(out),
           "--model", str(base_dir)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise InteropError(f"`{' '.join(cmd)}` failed ({r.returncode}):\n{r.stdout}{r.stderr}")


# ----------------------------------------------------------------------------------------------------------
# 1. PEFT loads our adapter

def check_peft(name: str, adapter_dir: Path, base_dir: Path, ids: list[int], base_expected: dict, report: dict):
    from peft import PeftModel
    from safetensors.torch import load_file

    acfg = json.loads((adapter_dir / "adapter_config.json").read_text())
    file_tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    base = load_base(base_dir)
    base_score = score_ids(base, ids)
    d_base = max_abs(base_score["token_logprobs"], base_expected["token_logprobs"])
    if d_base > 1e-5:
        raise InteropError(f"{name}: base model {base_dir.name} does not reproduce its own expected.json (diff {d_base:.3g})")

    try:
        with captured_warnings() as logs:
            pm = PeftModel.from_pretrained(base, str(adapter_dir))
    except Exception as e:  # PEFT refused our format: say exactly what it said
        raise InteropError(
            f"{name}: PEFT refused to load {adapter_dir}:\n  {type(e).__name__}: {e}\n"
            "This is a bug in our adapter format (src/engine/checkpoint.rs peft_config_json / peft_tensors)."
        ) from e
    pm.eval()
    # Fields of our adapter_config.json that PEFT's LoraConfig does not have: PEFT drops them with a
    # UserWarning. Not fatal (the adapter still loads and computes the same thing), but a format wart that
    # is reported every run, and fatal with --strict.
    import dataclasses

    from peft import LoraConfig

    unknown = sorted(set(acfg) - {f.name for f in dataclasses.fields(LoraConfig)})
    known_msg = f"Unexpected keyword arguments {unknown} for class LoraConfig"
    format_warnings = [m for m in logs if unknown and known_msg in m]
    other = [m for m in logs if m not in format_warnings]
    report["peft_unknown_config_fields"] = unknown
    report["peft_load_warnings"] = format_warnings
    if other:
        raise InteropError(f"{name}: PEFT loaded {adapter_dir} but complained:\n  " + "\n  ".join(other))
    if format_warnings:
        msg = (f"{name}: adapter_config.json has fields PEFT's LoraConfig does not know: {unknown}. PEFT said:\n  "
               + "\n  ".join(format_warnings))
        if STRICT:
            raise InteropError(msg)
        print(f"WARNING (format, fatal with --strict): {msg}", file=sys.stderr)

    # Every tensor in the file must land, unchanged, in the PEFT model (no silently dropped adapters).
    sd = pm.state_dict()
    loaded = 0
    for key, t in file_tensors.items():
        if not key.endswith((".lora_A.weight", ".lora_B.weight")):
            raise InteropError(f"{name}: unexpected tensor `{key}` in adapter_model.safetensors")
        peft_key = key[: -len(".weight")] + ".default.weight"
        if peft_key not in sd:
            raise InteropError(f"{name}: PEFT model has no parameter for `{key}` (looked for `{peft_key}`)")
        d = (sd[peft_key].float() - t.float()).abs().max().item()
        if d != 0.0:
            raise InteropError(f"{name}: `{key}` differs after PEFT loaded it (max |diff| {d})")
        loaded += 1
    n_lora_modules = sum(1 for k in sd if k.endswith(".lora_A.default.weight"))
    if 2 * n_lora_modules != loaded:
        raise InteropError(f"{name}: PEFT built {n_lora_modules} LoRA modules but the file holds {loaded // 2} pairs")

    # PEFT's scaling must be what our config means.
    r, alpha = acfg["r"], acfg["lora_alpha"]
    want_scale = alpha / math.sqrt(r) if acfg.get("use_rslora") else alpha / r
    from peft.tuners.lora import LoraLayer

    scales = {m.scaling["default"] for m in pm.modules() if isinstance(m, LoraLayer)}
    if scales != {want_scale}:
        raise InteropError(f"{name}: PEFT scaling {scales} != expected {want_scale}")

    peft_score = score_ids(pm, ids)
    change = max_abs(peft_score["token_logprobs"], base_score["token_logprobs"])
    if change <= CHANGE_MIN:
        raise InteropError(f"{name}: the adapter does not change the output (max |diff| vs base {change:.3g})")
    report.update(peft_tensors_loaded=loaded, peft_scale=want_scale, max_abs_change_vs_base=change,
                  base_reproduces_fixture_diff=d_base)
    return pm, peft_score, file_tensors, acfg


# ----------------------------------------------------------------------------------------------------------
# 2. Merged export loads in transformers and matches PEFT

def check_merged(name: str, merged_dir: Path, pm, ids: list[int], text: str, peft_score: dict, report: dict):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    problems: list[str] = []
    with captured_warnings() as logs:
        try:
            tok = AutoTokenizer.from_pretrained(merged_dir)
            model, info = AutoModelForCausalLM.from_pretrained(
                merged_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
            )
        except Exception as e:
            raise InteropError(f"{name}: transformers could not load the merged export {merged_dir}:\n  "
                               f"{type(e).__name__}: {e}") from e
    model.eval()
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(kind):
            problems.append(f"{kind}: {sorted(map(str, info[kind]))}")
    problems.extend(logs)
    report["merged_load_messages"] = problems
    if problems:
        raise InteropError(f"{name}: loading the merged export {merged_dir} reported:\n  " + "\n  ".join(problems))
    tok_ids = tok(text)["input_ids"]
    if tok_ids != ids:
        raise InteropError(f"{name}: the merged export's tokenizer gives {tok_ids[:8]}... not the fixture ids {ids[:8]}...")

    merged_score = score_ids(model, ids)
    d = max_abs(merged_score["token_logprobs"], peft_score["token_logprobs"])
    report["merged_vs_peft_max_abs_logprob_diff"] = d
    if d > LOGPROB_TOL:
        raise InteropError(f"{name}: merged export log-probs differ from PEFT's by {d:.3g} (> {LOGPROB_TOL})")

    # Weight-level view: our merged file vs PEFT's own merge_and_unload().
    import copy

    ref = copy.deepcopy(pm).merge_and_unload().state_dict()
    ours = load_file(str(merged_dir / "model.safetensors"))
    wd = 0.0
    for k, t in ours.items():
        if k not in ref:
            raise InteropError(f"{name}: merged export has `{k}` which PEFT's merged model lacks")
        wd = max(wd, (ref[k].float() - t.float()).abs().max().item())
    report["merged_vs_peft_merge_and_unload_max_abs_weight_diff"] = wd
    if wd > 1e-5:
        raise InteropError(f"{name}: merged weights differ from PEFT merge_and_unload() by {wd:.3g}")
    return merged_score


# ----------------------------------------------------------------------------------------------------------
# 3. mlx-lm export

def check_mlx(name: str, mlx_dir: Path, file_tensors: dict, acfg: dict, num_hidden_layers: int, report: dict):
    from safetensors.torch import load_file

    cfg_path, w_path = mlx_dir / "adapter_config.json", mlx_dir / "adapters.safetensors"
    for p in (cfg_path, w_path):
        if not p.exists():
            raise InteropError(f"{name}: mlx-lm export lacks {p.name}")
    cfg = json.loads(cfg_path.read_text())
    mlx = load_file(str(w_path))
    errors: list[str] = []

    r, alpha = acfg["r"], acfg["lora_alpha"]
    want_scale = alpha / math.sqrt(r) if acfg.get("use_rslora") else alpha / r
    if cfg.get("fine_tune_type") != "lora":
        errors.append(f"fine_tune_type = {cfg.get('fine_tune_type')!r}, want 'lora'")
    lp = cfg.get("lora_parameters")
    if not isinstance(lp, dict):
        errors.append("lora_parameters missing")
        lp = {}
    for field in ("rank", "scale", "dropout", "keys"):
        if field not in lp:
            errors.append(f"lora_parameters.{field} missing")
    if lp.get("rank") != r:
        errors.append(f"lora_parameters.rank = {lp.get('rank')}, want {r}")
    if not isinstance(lp.get("scale"), (int, float)) or abs(lp["scale"] - want_scale) > 1e-9:
        errors.append(f"lora_parameters.scale = {lp.get('scale')}, want {want_scale}")

    # PEFT name -> mlx name; shapes and values.
    expected_mlx: dict[str, torch.Tensor] = {}
    layers, keys = set(), set()
    for k, t in file_tensors.items():
        stem = k.removeprefix("base_model.model.")
        if k.endswith(".lora_A.weight"):
            expected_mlx[stem.removesuffix(".lora_A.weight") + ".lora_a"] = t.t()
        else:
            expected_mlx[stem.removesuffix(".lora_B.weight") + ".lora_b"] = t.t()
        parts = stem.split(".")  # model.layers.N.group.module.lora_X.weight
        layers.add(int(parts[2]))
        keys.add(f"{parts[3]}.{parts[4]}")
    if set(mlx) != set(expected_mlx):
        errors.append(f"tensor names differ: extra {sorted(set(mlx) - set(expected_mlx))}, "
                      f"missing {sorted(set(expected_mlx) - set(mlx))}")
    max_val_diff = 0.0
    for k in sorted(set(mlx) & set(expected_mlx)):
        a, b = mlx[k], expected_mlx[k]
        if tuple(a.shape) != tuple(b.shape):
            errors.append(f"{k}: shape {tuple(a.shape)}, want {tuple(b.shape)}")
            continue
        max_val_diff = max(max_val_diff, (a.float() - b.float()).abs().max().item())
    if max_val_diff != 0.0:
        errors.append(f"lora_a/lora_b differ from PEFT lora_A^T/lora_B^T by {max_val_diff}")
    if sorted(lp.get("keys", [])) != sorted(keys):
        errors.append(f"lora_parameters.keys = {lp.get('keys')}, want {sorted(keys)}")
    # mlx-lm adapts the last num_layers layers.
    want_num_layers = num_hidden_layers - min(layers)
    if cfg.get("num_layers") != want_num_layers:
        errors.append(f"num_layers = {cfg.get('num_layers')}, want {want_num_layers} (adapted layers {sorted(layers)})")
    if errors:
        raise InteropError(f"{name}: mlx-lm export {mlx_dir}:\n  " + "\n  ".join(errors))
    report["mlx_vs_peft_max_abs_value_diff"] = max_val_diff
    return {
        "mlx_check": True,
        "mlx_config": {
            "fine_tune_type": cfg["fine_tune_type"],
            "num_layers": cfg["num_layers"],
            "lora_parameters": {"rank": lp["rank"], "scale": lp["scale"], "dropout": lp["dropout"],
                                "keys": sorted(lp["keys"])},
        },
        "mlx_tensor_shapes": {k: list(mlx[k].shape) for k in sorted(mlx)},
    }


def check_mlx_lm_runtime(name: str, base_dir: Path, mlx_dir: Path, ids: list[int], peft_score: dict, report: dict):
    """Optional, not recorded in expected.json: if mlx-lm is importable (its CPU build runs on Linux), load the
    base model with our mlx-lm adapter through mlx_lm.load and compare log-probs with PEFT's."""
    try:
        import mlx.core as mx
        import numpy as np
        from mlx_lm import load as mlx_load
    except ImportError:
        report["mlx_lm_runtime"] = "skipped (mlx-lm not installed)"
        return
    try:
        with captured_warnings() as logs:
            model, _ = mlx_load(str(base_dir), adapter_path=str(mlx_dir))
    except Exception as e:
        raise InteropError(f"{name}: mlx_lm.load refused {mlx_dir}:\n  {type(e).__name__}: {e}") from e
    logits = np.array(model(mx.array([ids]))[0].astype(mx.float32), dtype=np.float64)
    m = logits.max(-1, keepdims=True)
    lp = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
    tok_lp = lp[np.arange(len(ids) - 1), ids[1:]]
    d = float(np.abs(tok_lp - np.array(peft_score["token_logprobs"])).max())
    report["mlx_lm_runtime"] = f"mlx-lm vs PEFT max |logprob diff| {d:.3g}" + (f"; messages: {logs}" if logs else "")
    if d > LOGPROB_TOL:
        raise InteropError(f"{name}: mlx-lm with our adapter differs from PEFT by {d:.3g} (> {LOGPROB_TOL})")


# ----------------------------------------------------------------------------------------------------------

def copy_from_runs(runs: Path, names) -> None:
    for fixture in names:
        _, run_name = CASES[fixture]
        ckpts = sorted((runs / run_name).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        if not ckpts:
            raise InteropError(f"no checkpoint-* in {runs / run_name}")
        dst = FIX / fixture
        dst.mkdir(parents=True, exist_ok=True)
        for f in ADAPTER_FILES:
            shutil.copyfile(ckpts[-1] / f, dst / f)
        print(f"[{fixture}] copied {', '.join(ADAPTER_FILES)} from {ckpts[-1]}")


def parse_map(items: list[str]) -> dict[str, Path]:
    out = {}
    for it in items:
        k, _, v = it.partition("=")
        if k not in CASES or not v:
            raise SystemExit(f"bad mapping `{it}`: use NAME=DIR with NAME one of {', '.join(CASES)}")
        out[k] = Path(v)
    return out


def check_case(name: str, args, tmp: Path) -> dict:
    base_name, _ = CASES[name]
    adapter_dir, base_dir = FIX / name, FIX / base_name
    present = sorted(p.name for p in adapter_dir.iterdir() if p.name != "expected.json")
    if present != sorted(ADAPTER_FILES):
        raise InteropError(f"{adapter_dir} must hold exactly {ADAPTER_FILES} (+ expected.json), found {present}")
    base_expected = json.loads((base_dir / "expected.json").read_text())["score"]
    text, ids = base_expected["text"], base_expected["ids"]
    report: dict = {}

    pm, peft_score, file_tensors, acfg = check_peft(name, adapter_dir, base_dir, ids, base_expected, report)

    merged_dir = args.merged.get(name)
    if merged_dir is None:
        merged_dir = tmp / f"{name}-merged"
        run_export(args.binary, adapter_dir, "merged", merged_dir, base_dir)
    merged_score = check_merged(name, merged_dir, pm, ids, text, peft_score, report)

    mlx_dir = args.mlx.get(name)
    if mlx_dir is None:
        mlx_dir = tmp / f"{name}-mlx"
        run_export(args.binary, adapter_dir, "mlx-lm", mlx_dir, base_dir)
    num_hidden_layers = json.loads((base_dir / "config.json").read_text())["num_hidden_layers"]
    mlx = check_mlx(name, mlx_dir, file_tensors, acfg, num_hidden_layers, report)
    check_mlx_lm_runtime(name, base_dir, mlx_dir, ids, peft_score, report)

    r, alpha = acfg["r"], acfg["lora_alpha"]
    expected = {
        "base_model": base_name,
        "note": "adapter trained by metal-candle; numbers from HF PEFT/transformers (scripts/check_interop.py)",
        "lora": {"r": r, "lora_alpha": alpha, "use_rslora": bool(acfg.get("use_rslora")),
                 "target_modules": acfg["target_modules"], "layers_to_transform": acfg.get("layers_to_transform"),
                 "scale": report["peft_scale"]},
        "text": text,
        "peft_score": peft_score,
        "merged_score": merged_score,
        **mlx,
        "peft_unknown_config_fields": report["peft_unknown_config_fields"],
        "max_abs_logprob_change_vs_base": report["max_abs_change_vs_base"],
        "merged_vs_peft_max_abs_logprob_diff": report["merged_vs_peft_max_abs_logprob_diff"],
    }
    write_json(adapter_dir / "expected.json", expected)
    print(f"[{name}] OK  nll peft={peft_score['nll_mean']:.6f} merged={merged_score['nll_mean']:.6f}  "
          f"tensors={report['peft_tensors_loaded']} scale={report['peft_scale']:.4f}  "
          f"max|Δlp| vs base={report['max_abs_change_vs_base']:.3g}  "
          f"merged-vs-peft lp={report['merged_vs_peft_max_abs_logprob_diff']:.3g} "
          f"w={report['merged_vs_peft_merge_and_unload_max_abs_weight_diff']:.3g}  "
          f"mlx-vs-peft={report['mlx_vs_peft_max_abs_value_diff']:.3g}  mlx-lm runtime: {report['mlx_lm_runtime']}")
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", type=Path, default=DEFAULT_BINARY)
    ap.add_argument("--merged", action="append", default=[], metavar="NAME=DIR", help="use this merged export")
    ap.add_argument("--mlx", action="append", default=[], metavar="NAME=DIR", help="use this mlx-lm export")
    ap.add_argument("--copy-from-runs", type=Path, metavar="RUNS",
                    help="first copy the adapter files of RUNS/<run name>/checkpoint-<last>/ into the fixtures "
                         "(run names: " + ", ".join(r for _, r in CASES.values()) + ")")
    ap.add_argument("--only", choices=sorted(CASES), action="append")
    ap.add_argument("--strict", action="store_true",
                    help="also fail when PEFT warns about adapter_config.json fields it does not know")
    args = ap.parse_args()
    global STRICT
    STRICT = args.strict
    args.merged, args.mlx = parse_map(args.merged), parse_map(args.mlx)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    logging.getLogger("transformers").setLevel(logging.WARNING)

    failures = []
    try:
        if args.copy_from_runs:
            copy_from_runs(args.copy_from_runs, args.only or list(CASES))
    except InteropError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="check-interop-") as tmp:
        for name in args.only or CASES:
            try:
                check_case(name, args, Path(tmp))
            except InteropError as e:
                failures.append(name)
                print(f"ERROR: {e}", file=sys.stderr)
    if failures:
        print(f"FAILED: {', '.join(failures)}", file=sys.stderr)
        return 1
    total = sum(p.stat().st_size for n in CASES for p in (FIX / n).iterdir())
    print(f"all interop checks passed; ours-*-adapter fixtures total {total / 1e3:.1f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
