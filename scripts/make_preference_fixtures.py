#!/usr/bin/env python3
"""Oracle fixtures for preference training (DPO sigmoid / IPO / cDPO and ORPO) from TRL 1.16.

Writes tests/fixtures/preference/ (see the "Preference training" section of tests/fixtures/README.md):
rows in both column forms, a LoRA adapter whose policy differs from the base model, TRL's tokenization, its
evaluation metrics over one batch of all rows, per-row log-probs, and the gradients of the loss w.r.t. every
LoRA weight. With models/smollm2/SmolLM2-135M-Instruct-Q4_1.gguf present, also preference/smollm2/ (metrics only).

Deterministic (float32, CPU, one thread, dropout 0): re-running rewrites identical bytes.

    /work/venv-tf/bin/python scripts/make_preference_fixtures.py [--skip-smollm2]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "preference"
GGUF = ROOT / "models" / "smollm2" / "SmolLM2-135M-Instruct-Q4_1.gguf"

BETA = 0.1
MAX_LENGTH = 64
CDPO_EPS = 0.1
SEED = 1234
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# --- rows ------------------------------------------------------------------------------------------------------

# Standard (text) rows. Row 1's prompt ends in a space ("the " + "mat" merge into one token across the boundary);
# row 3's chosen already ends in the eos string (TRL appends it only if missing); row 3's chosen passes max_length.
STANDARD_ROWS = [
    {"prompt": "What is the capital of France?", "chosen": " Paris is the capital.", "rejected": " London, I think."},
    {"prompt": "Complete the sentence: The cat sat on the ", "chosen": "mat.", "rejected": "roof, loudly."},
    {"prompt": "2+2=", "chosen": "4", "rejected": "5"},
    {
        "prompt": "Write a haiku about rain.",
        "chosen": "\nSoft rain on the roof,\nwhispers through the sleeping town,\npuddles hold the sky.<|im_end|>",
        "rejected": " Rain is wet.",
    },
    {"prompt": "Translate to French: good morning", "chosen": " bonjour", "rejected": " bonsoir"},
    {"prompt": "Name a primary colour.", "chosen": " Blue.", "rejected": " Green, which many people like a lot."},
]


def _u(text: str) -> dict:
    return {"role": "user", "content": text}


def _a(text: str) -> dict:
    return {"role": "assistant", "content": text}


# Conversational rows. Row 1 has a system message; row 2 has no "prompt": chosen/rejected are full conversations
# sharing the first three turns (TRL's extract_prompt); row 3's chosen passes max_length; row 4's chosen has
# surrounding spaces (the template trims them).
CONVERSATIONAL_ROWS = [
    {"prompt": [_u("What is the capital of France?")], "chosen": [_a("Paris.")], "rejected": [_a("London.")]},
    {
        "prompt": [{"role": "system", "content": "You are terse."}, _u("Say hi.")],
        "chosen": [_a("Hi.")],
        "rejected": [_a("Hello there, how are you?")],
    },
    {
        "chosen": [_u("Pick a number."), _a("Seven."), _u("Another?"), _a("Three.")],
        "rejected": [_u("Pick a number."), _a("Seven."), _u("Another?"), _a("No.")],
    },
    {
        "prompt": [_u("Describe the sea.")],
        "chosen": [_a("The sea is vast and deep, full of waves that roll under a grey sky.")],
        "rejected": [_a("Water.")],
    },
    {"prompt": [_u("Favourite colour?")], "chosen": [_a("  Blue.  ")], "rejected": [_a("I have none.")]},
    {"prompt": [_u("2+2?")], "chosen": [_a("4")], "rejected": [_a("Five, probably.")]},
]

# SmolLM2: fewer rows, metrics only (the real vocabulary makes these short).
SMOL_STANDARD_ROWS = [STANDARD_ROWS[0], STANDARD_ROWS[1], STANDARD_ROWS[5]]
SMOL_CONVERSATIONAL_ROWS = [CONVERSATIONAL_ROWS[1], CONVERSATIONAL_ROWS[2], CONVERSATIONAL_ROWS[3]]


# --- helpers ---------------------------------------------------------------------------------------------------


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def with_prompt(rows: list[dict]) -> list[dict]:
    """Rows as TRL sees them: TRL maps `extract_prompt` over a dataset only when it has no "prompt" column at all,
    so a single implicit-prompt row among explicit ones gets TRL's own `extract_prompt` here, row by row."""
    from trl.data_utils import extract_prompt

    return [r if "prompt" in r else extract_prompt(r) for r in rows]


def lora_config(targets: list[str]):
    from peft import LoraConfig

    return LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, bias="none", task_type="CAUSAL_LM"
    )


def peft_key(name: str) -> str:
    """PEFT's saved tensor name for a parameter name of the live model ("default" adapter)."""
    return name.replace(".default.", ".")


def make_adapter(base, base_rel: str, targets: list[str], out: Path, seed: int) -> dict[str, torch.Tensor]:
    """Random A (N(0, 1/in)) and random non-zero B (N(0, 0.05)): the policy differs from the reference."""
    from peft import get_peft_model
    from safetensors.torch import load_file

    pm = get_peft_model(copy.deepcopy(base), lora_config(targets))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(pm.named_parameters()):
            if ".lora_A." in name:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    pm.peft_config["default"].base_model_name_or_path = base_rel
    if out.exists():
        shutil.rmtree(out)
    pm.save_pretrained(out, safe_serialization=True)
    (out / "README.md").unlink(missing_ok=True)  # boilerplate model card
    acfg_path = out / "adapter_config.json"
    acfg = json.load(open(acfg_path))
    acfg["target_modules"] = sorted(acfg["target_modules"])  # a set inside PEFT: make the order stable
    write_json(acfg_path, dict(sorted(acfg.items())))
    return load_file(out / "adapter_model.safetensors")


def install_adapter(trainer, weights: dict[str, torch.Tensor]) -> None:
    """Copy the saved adapter into the trainer's freshly made "default" adapter (TRL made it from `peft_config`,
    so its reference is the base model with the adapter disabled)."""
    n = 0
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if ".lora_" in name:
                p.copy_(weights[peft_key(name)])
                n += 1
    assert n == len(weights), (n, len(weights))


def base_logps(base, input_ids, attention_mask, completion_mask) -> torch.Tensor:
    """Summed completion log-probs from the plain base model (no PEFT, no TRL): the sanity check of the reference."""
    with torch.no_grad():
        logits = base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, input_ids[:, 1:, None])[..., 0]
    return (lp * completion_mask[:, 1:]).sum(1)


def lora_grads(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        if ".lora_" in name:
            assert p.grad is not None, name
            out[peft_key(name)] = p.grad.detach().clone().float().contiguous()
    return dict(sorted(out.items()))


def close(a: float, b: float, tol: float, what: str) -> None:
    assert abs(a - b) <= tol * max(1.0, abs(b)), f"{what}: {a} vs {b}"


# --- DPO -------------------------------------------------------------------------------------------------------


def dpo_trainer(base, tok, rows: list[dict], loss_type: str, targets: list[str], weights, tmp: str):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        output_dir=tmp, beta=BETA, loss_type=[loss_type], max_length=MAX_LENGTH, truncation_mode="keep_start",
        per_device_eval_batch_size=len(rows), per_device_train_batch_size=len(rows), report_to=[],
        use_cpu=True, disable_dropout=True, disable_tqdm=True, seed=SEED, dataloader_num_workers=0, bf16=False, fp16=False,
    )
    ds = Dataset.from_list(rows)
    trainer = DPOTrainer(
        model=copy.deepcopy(base), args=args, processing_class=tok, train_dataset=ds, eval_dataset=ds,
        peft_config=lora_config(targets),
    )
    install_adapter(trainer, weights)
    assert len(trainer.eval_dataset) == len(rows), "TRL dropped a row (prompt >= max_length)"
    return trainer


def one_batch(trainer):
    batches = list(trainer.get_eval_dataloader())
    assert len(batches) == 1
    return trainer._prepare_inputs(batches[0])


def dpo_case(base, tok, rows: list[dict], targets: list[str], weights, with_grads: bool, tmp: str):
    """TRL's metrics for sigmoid / ipo (+ cDPO from TRL's per-pair logps), per-row logps, tokenization, grads."""
    metrics, grads, per_row, tokenized = {}, {}, None, None
    for loss_type in ["sigmoid", "ipo"]:
        trainer = dpo_trainer(base, tok, rows, loss_type, targets, weights, tmp)
        ev = trainer.evaluate()
        m = {k[len("eval_"):]: ev[f"{k}"] for k in [
            "eval_loss", "eval_rewards/chosen", "eval_rewards/rejected", "eval_rewards/accuracies",
            "eval_rewards/margins", "eval_logps/chosen", "eval_logps/rejected"]}
        metrics[f"dpo_{loss_type}"] = m
        inputs = one_batch(trainer)
        model = trainer.model
        if tokenized is None:
            tokenized = [
                {"prompt_ids": r["prompt_ids"], "chosen_ids": r["chosen_ids"], "rejected_ids": r["rejected_ids"]}
                for r in trainer.eval_dataset
            ]
            # Per-row policy logps exactly as DPOTrainer._compute_loss gets them; reference with TRL's own method.
            cm = inputs["completion_mask"]
            labels = inputs["input_ids"].masked_fill(cm == 0, -100)
            with torch.no_grad():
                out = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels,
                            use_cache=False, fused_lm_head=True)
            logps = out.log_probs[:, -(cm.size(1) - 1):].sum(1)
            pc, pr = logps.chunk(2)
            rc, rr = trainer.compute_ref_log_probs(model, inputs)
            # Sanity: the reference (adapter disabled) is the plain base model; the policy is not.
            b = base_logps(base, inputs["input_ids"], inputs["attention_mask"], cm)
            ref = torch.cat([rc, rr]).double()
            assert (ref - b).abs().max() < 1e-4, (ref - b).abs().max()
            assert (logps.double() - b).abs().max() > 1e-2, "adapter has no effect"
            per_row = {
                "chosen_logps": pc.tolist(), "rejected_logps": pr.tolist(),
                "ref_chosen_logps": rc.tolist(), "ref_rejected_logps": rr.tolist(),
                "chosen_tokens": cm.chunk(2)[0].sum(1).tolist(), "rejected_tokens": cm.chunk(2)[1].sum(1).tolist(),
            }
        check_dpo_means(m, per_row, loss_type)
        if with_grads:
            model.zero_grad()
            loss = trainer.compute_loss(model, inputs)
            close(loss.item(), m["loss"], 1e-5, f"dpo_{loss_type} grad-pass loss")
            loss.backward()
            grads[f"dpo_{loss_type}"] = lora_grads(model)
    metrics["dpo_cdpo_0.1"] = cdpo_metrics(metrics["dpo_sigmoid"], per_row)
    return tokenized, metrics, per_row, grads


def _pairs(per_row):
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in per_row.items()}
    return t["chosen_logps"] - t["ref_chosen_logps"], t["rejected_logps"] - t["ref_rejected_logps"], t


def check_dpo_means(m: dict, per_row: dict, loss_type: str) -> None:
    """The batch means TRL reported are the means of the per-row numbers (float32 tolerances)."""
    c, r, t = _pairs(per_row)
    close(m["logps/chosen"], t["chosen_logps"].mean().item(), 1e-5, "logps/chosen")
    close(m["logps/rejected"], t["rejected_logps"].mean().item(), 1e-5, "logps/rejected")
    close(m["rewards/chosen"], (BETA * c).mean().item(), 1e-4, "rewards/chosen")
    close(m["rewards/rejected"], (BETA * r).mean().item(), 1e-4, "rewards/rejected")
    close(m["rewards/margins"], (BETA * (c - r)).mean().item(), 1e-4, "rewards/margins")
    close(m["rewards/accuracies"], (c > r).double().mean().item(), 1e-7, "rewards/accuracies")
    if loss_type == "sigmoid":
        loss = -F.logsigmoid(BETA * (c - r)).mean().item()
    else:  # ipo: log-ratios averaged over completion tokens
        d = c / t["chosen_tokens"] - r / t["rejected_tokens"]
        loss = ((d - 1 / (2 * BETA)) ** 2).mean().item()
    close(m["loss"], loss, 1e-5, f"{loss_type} loss")


def cdpo_metrics(sigmoid: dict, per_row: dict) -> dict:
    """cDPO (label smoothing e): -(1-e) logsig(b d) - e logsig(-b d), from TRL's per-pair logps (float64)."""
    c, r, _ = _pairs(per_row)
    z = BETA * (c - r)
    loss = (-(1 - CDPO_EPS) * F.logsigmoid(z) - CDPO_EPS * F.logsigmoid(-z)).mean().item()
    return {**sigmoid, "loss": loss}


# --- ORPO ------------------------------------------------------------------------------------------------------


def orpo_batch(tokenized: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """ORPOTrainer's batch dict built from the DPO-style ids (prompt + completion, keep_start at max_length)."""
    batch = {}
    for side in ["chosen", "rejected"]:
        seqs, labs = [], []
        for t in tokenized:
            ids = (t["prompt_ids"] + t[f"{side}_ids"])[:MAX_LENGTH]
            lab = ([-100] * len(t["prompt_ids"]) + t[f"{side}_ids"])[:MAX_LENGTH]
            seqs.append(ids)
            labs.append(lab)
        n = max(len(s) for s in seqs)
        batch[f"{side}_input_ids"] = torch.tensor([s + [pad_id] * (n - len(s)) for s in seqs])
        batch[f"{side}_attention_mask"] = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in seqs])
        batch[f"{side}_labels"] = torch.tensor([s + [-100] * (n - len(s)) for s in labs])
    return batch


def orpo_case(base, tok, rows: list[dict], tokenized: list[dict], targets, weights, with_grads: bool, tmp: str):
    from datasets import Dataset
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    args = ORPOConfig(
        output_dir=tmp, beta=BETA, max_length=MAX_LENGTH, report_to=[], use_cpu=True, disable_dropout=True, disable_tqdm=True,
        seed=SEED, dataloader_num_workers=0, bf16=False, fp16=False,
    )
    # ORPOTrainer tokenizes its train set its own way at init; that set is unused here.
    trainer = ORPOTrainer(
        model=copy.deepcopy(base), args=args, processing_class=tok, train_dataset=Dataset.from_list(rows),
        peft_config=lora_config(targets),
    )
    install_adapter(trainer, weights)
    model = trainer.model
    model.eval()
    batch = orpo_batch(tokenized, tok.pad_token_id)
    with torch.no_grad():
        loss, ev = trainer.get_batch_loss_metrics(model, batch, "eval")
        pc, pr = trainer.concatenated_forward(model, batch)[:2]
    keys = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
            "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"]
    m = {"loss": loss.item(), **{k: ev[f"eval_{k}"] for k in keys}}
    # Per-row: completion-averaged logps; nll_tokens = positions the pooled nll_loss averages over (the full
    # chosen sequence, prompt included, minus its first token).
    per_row = {
        "chosen_logps": pc.tolist(), "rejected_logps": pr.tolist(),
        "nll_tokens": (batch["chosen_attention_mask"].sum(1) - 1).tolist(),
    }
    check_orpo(m, per_row, batch, model)
    grads = {}
    if with_grads:
        model.zero_grad()
        loss, _ = trainer.get_batch_loss_metrics(model, batch, "train")
        close(loss.item(), m["loss"], 1e-5, "orpo grad-pass loss")
        loss.backward()
        grads["orpo"] = lora_grads(model)
    return m, per_row, grads


def check_orpo(m: dict, per_row: dict, batch: dict, model) -> None:
    pc = torch.tensor(per_row["chosen_logps"], dtype=torch.float64)
    pr = torch.tensor(per_row["rejected_logps"], dtype=torch.float64)
    log_odds = (pc - pr) - (torch.log1p(-torch.exp(pc)) - torch.log1p(-torch.exp(pr)))
    close(m["log_odds_chosen"], log_odds.mean().item(), 1e-5, "log_odds_chosen")
    close(m["log_odds_ratio"], F.logsigmoid(log_odds).mean().item(), 1e-5, "log_odds_ratio")
    close(m["logps/chosen"], pc.mean().item(), 1e-5, "orpo logps/chosen")
    close(m["rewards/margins"], (BETA * (pc - pr)).mean().item(), 1e-5, "orpo margins")
    # nll_loss: token-pooled mean over every chosen position (prompt included), not a mean of row means.
    ids, am = batch["chosen_input_ids"], batch["chosen_attention_mask"]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am, use_cache=False).logits
    lp = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    nll = -(lp * am[:, 1:]).sum() / am[:, 1:].sum()
    close(m["nll_loss"], nll.item(), 1e-5, "nll_loss")
    close(m["loss"], nll.item() - (BETA * F.logsigmoid(log_odds)).mean().item(), 1e-5, "orpo loss")


# --- driver ----------------------------------------------------------------------------------------------------


def run_model(base, tok, name: str, rows_by_form: dict, targets, weights, with_grads: bool, out: Path) -> dict:
    from safetensors.torch import save_file

    expected = {"model": name, "max_length": MAX_LENGTH, "beta": BETA, "tokenized": {}, "metrics": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for form, rows in rows_by_form.items():
            trl_rows = with_prompt(rows)
            tokenized, metrics, dpo_rows, grads = dpo_case(base, tok, trl_rows, targets, weights, with_grads, tmp)
            om, orpo_rows, og = orpo_case(base, tok, trl_rows, tokenized, targets, weights, with_grads, tmp)
            metrics["orpo"] = {**om, "per_row": orpo_rows}
            for k in ["dpo_sigmoid", "dpo_ipo", "dpo_cdpo_0.1"]:
                metrics[k] = {**metrics[k], "per_row": dpo_rows}
            grads.update(og)
            expected["tokenized"][form] = tokenized
            expected["metrics"][form] = metrics
            for method, g in grads.items():
                save_file(g, str(out / f"grads-{form}-{method}.safetensors"))
            print(f"{name} {form}: " + ", ".join(f"{k} loss {v['loss']:.6f}" for k, v in metrics.items()))
    return expected


def make_tiny() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = FIX / "tiny-llama"
    tok = AutoTokenizer.from_pretrained(d)
    base = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    OUT.mkdir(parents=True, exist_ok=True)
    write_jsonl(OUT / "rows-standard.jsonl", STANDARD_ROWS)
    write_jsonl(OUT / "rows-conversational.jsonl", CONVERSATIONAL_ROWS)
    weights = make_adapter(base, "../../tiny-llama", ALL_LINEAR, OUT / "tiny-llama-adapter", SEED)
    rows = {"standard": STANDARD_ROWS, "conversational": CONVERSATIONAL_ROWS}
    expected = run_model(base, tok, "tiny-llama", rows, ALL_LINEAR, weights, True, OUT)
    write_json(OUT / "expected.json", expected)


def make_smollm2() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    exp = json.load(open(FIX / "smollm2_expected.json"))
    tok = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    base = AutoModelForCausalLM.from_pretrained(
        GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    # The weights are already dequantized f32 tensors; only these "quantized" markers make the Trainer refuse them.
    base.hf_quantizer = None
    base.is_quantized = False
    base.config.__dict__.pop("quantization_config", None)
    # The loader still agrees with smollm2_expected.json, which tests/real_model.rs checks our engine against.
    ids = exp["score"]["ids"]
    with torch.no_grad():
        logits = base(input_ids=torch.tensor([ids])).logits[0]
    lp = torch.log_softmax(logits.double(), -1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    diff = (lp - torch.tensor(exp["score"]["token_logprobs"], dtype=torch.float64)).abs().max().item()
    assert diff < 1e-4, f"transformers' GGUF load drifted from smollm2_expected.json: {diff}"
    # The GGUF says add_bos_token=false (our engine adds none); transformers' GGUF tokenizer would prepend
    # <|im_start|> to text rows, so turn that off. Chat-template rows are tokenized without special tokens anyway.
    tok.add_bos_token = False
    assert tok("Hi")["input_ids"] == tok("Hi", add_special_tokens=False)["input_ids"]
    out = OUT / "smollm2"
    out.mkdir(parents=True, exist_ok=True)
    rows = {"standard": SMOL_STANDARD_ROWS, "conversational": SMOL_CONVERSATIONAL_ROWS}
    write_jsonl(out / "rows-standard.jsonl", SMOL_STANDARD_ROWS)
    write_jsonl(out / "rows-conversational.jsonl", SMOL_CONVERSATIONAL_ROWS)
    targets = ["q_proj", "v_proj"]
    weights = make_adapter(base, "../../../../models/smollm2", targets, out / "adapter", SEED + 1)
    expected = run_model(base, tok, "SmolLM2-135M-Instruct-Q4_1.gguf", rows, targets, weights, False, out)
    expected["gguf_path"] = str(GGUF.relative_to(ROOT))
    expected["loader_check_max_abs_logprob_diff_vs_smollm2_expected"] = diff
    write_json(out / "expected.json", expected)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--only-smollm2", action="store_true")
    a = ap.parse_args()
    os.chdir(ROOT)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    import datasets
    import transformers

    datasets.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    if not a.only_smollm2:
        make_tiny()
    if not a.skip_smollm2:
        if GGUF.exists():
            make_smollm2()
        else:
            print(f"warning: {GGUF} missing (scripts/fetch_smollm2.sh); skipping SmolLM2", file=sys.stderr)


if __name__ == "__main__":
    main()
