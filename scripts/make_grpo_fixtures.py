#!/usr/bin/env python3
"""Oracle fixtures for GRPO's loss from TRL 1.16's own GRPOTrainer code.

Writes tests/fixtures/grpo/ (see the "GRPO against TRL" section of tests/fixtures/README.md): fixed prompts and
completions (2 prompts x G=4, different lengths, some ending in eos, some cut at max_completion_length), fixed
rewards from two weighted reward functions (one group with all-equal weighted totals), and for each case TRL's
advantages, per-token log-probs (policy, old, reference), loss, logged metrics and the gradients of the loss w.r.t.
every LoRA weight (PEFT's names). The model is tests/fixtures/tiny-llama with the preference fixtures' LoRA adapter
(tests/fixtures/preference/tiny-llama-adapter: all 7 projections, r=4, alpha=8, B non-zero).

How TRL is driven (its own code wherever it has one):
  1. `GRPOTrainer(model=base, reward_funcs=[exact_answer, format], args=GRPOConfig(...), train_dataset=...,
     processing_class=tok, peft_config=LoraConfig(...), rollout_func=fixed_rollout)`: TRL wraps the base with PEFT
     (so its reference is the base with the adapter disabled) and patches its fused LM head at `temperature`; the
     adapter's weights are then copied into TRL's "default" adapter.
  2. `trainer._generate_and_score_completions(inputs)` with the 8 rows ([prompt 0] x 4 + [prompt 1] x 4, as TRL's
     RepeatSampler orders them): TRL calls `fixed_rollout`, which returns our fixed prompt_ids / completion_ids
     (TRL's documented `rollout_func` hook, in place of sampling), then pads, computes `old_per_token_logps` (when
     `num_iterations` > 1) and `ref_per_token_logps` (beta > 0) with `_get_per_token_logps_and_entropies`, calls
     the reward functions (which return our fixed values), forms the advantages, and logs reward / completion
     metrics. TRL's `_prepare_inputs` would also shuffle the rows; it is not called, so the order stays ours.
  3. "Off-policy" cases (num_iterations 2): `old_per_token_logps` TRL computed (equal to the current ones, the
     model has not moved) are perturbed by a fixed pattern of +-0.05..0.5 nats, so some ratios clip below 1-eps
     (negative advantages) and some above 1+eps_high (positive advantages), as after a first optimizer step.
  4. `loss = trainer._compute_loss(trainer.model, inputs)`; `loss.backward()` (per micro-batch, in order, when
     gradient_accumulation_steps is 2; `trainer.current_gradient_accumulation_steps` is set as Trainer's loop sets
     it). Metrics are `trainer._metrics["train"]`; a metric logged once per micro-batch is reported as TRL's
     `log` reports it (the mean of the list).
  5. The policy's per-token log-probs are `trainer._get_per_token_logps_and_entropies(...)` (no grad), cross-checked
     against a plain forward: log_softmax(logits / temperature).

Deterministic (float32, CPU, one thread, dropout 0): re-running rewrites identical bytes.

    /work/venv-tf/bin/python scripts/make_grpo_fixtures.py
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import tempfile
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "grpo"
ADAPTER = FIX / "preference" / "tiny-llama-adapter"
SEED = 1234
TEMPERATURE = 0.7
MAX_COMPLETION = 8
GROUP = 4
EOS = 2  # <|im_end|>
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

PROMPTS = ["What is 2+3? Reply with the number only.", "Name a colour."]
# Completion lengths (eos included): group 0 has two cut at max_completion_length; group 1 starts with an
# eos-only completion and has one cut.
LENGTHS = [[3, MAX_COMPLETION, 5, MAX_COMPLETION], [1, 6, MAX_COMPLETION, 4]]
FINISHED = [[True, False, True, False], [True, True, False, True]]
# Two rewards, weights 1 and 0.5. Group 0: distinct totals. Group 1: the rewards differ but every weighted total
# is 1 (zero std: frac_reward_zero_std 0.5 and advantages 0 under `group` scaling).
REWARD_NAMES = ["exact_answer", "format"]
REWARD_WEIGHTS = [1.0, 0.5]
REWARDS = {
    "exact_answer": [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
    "format": [1.0, 0.0, 0.0, 2.0, 0.0, 2.0, 0.0, 2.0],
}
# Added to TRL's old log-probs in the off-policy cases (cycled over completion tokens). ratio = exp(-delta):
# |delta| > ln(1/0.8) = 0.223 clips low, delta < -ln(1.2) = -0.182 clips high with eps 0.2, < -ln(1.28) = -0.247
# with eps_high 0.28; -0.21 sits between the two; no value is within 0.02 of a bound.
OLD_DELTAS = [-0.45, -0.1, 0.05, 0.35, -0.3, 0.15, 0.5, -0.05, -0.21, 0.27, 0.0, -0.6]

# name -> GRPOConfig overrides (and whether the old log-probs are perturbed).
BASE_CASES = {
    "grpo": dict(loss_type="grpo"),
    "bnpo": dict(loss_type="bnpo"),
    "dr_grpo": dict(loss_type="dr_grpo"),
    "dapo": dict(loss_type="dapo"),
}
CASES = {
    **BASE_CASES,
    # On-policy with the KL term, per-sequence and per-token normalised (every loss type has beta > 0 below).
    "grpo_beta": dict(loss_type="grpo", beta=0.04),
    "dapo_beta": dict(loss_type="dapo", beta=0.04),
    **{f"{k}_offpolicy": dict(v, beta=0.04, num_iterations=2) for k, v in BASE_CASES.items()},
    "dapo_offpolicy_eps_high": dict(loss_type="dapo", beta=0.04, num_iterations=2, epsilon_high=0.28),
    "grpo_offpolicy_beta0": dict(loss_type="grpo", num_iterations=2),
    "dapo_scale_batch": dict(loss_type="dapo", scale_rewards="batch"),
    "grpo_scale_none": dict(loss_type="grpo", scale_rewards="none", beta=0.04),
    "grpo_accum2": dict(loss_type="grpo", per_device_train_batch_size=4, gradient_accumulation_steps=2),
    "dapo_accum2": dict(loss_type="dapo", per_device_train_batch_size=4, gradient_accumulation_steps=2, beta=0.04),
}


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")


def completions(prompt_ids: list[list[int]]) -> list[list[int]]:
    """Fixed completion ids: ordinary tokens (3..511) from a seeded generator, eos last where finished."""
    g = torch.Generator().manual_seed(SEED)
    out = []
    for p in range(len(prompt_ids)):
        for k in range(GROUP):
            n, finished = LENGTHS[p][k], FINISHED[p][k]
            ids = torch.randint(3, 512, (n,), generator=g).tolist()
            if finished:
                ids[-1] = EOS
            out.append(ids)
    return out


def reward_func(name: str):
    """A reward function named `name` that returns the fixed values (TRL names its metrics by __name__)."""

    def f(prompts, completions, completion_ids, **kwargs):
        assert len(completions) == len(REWARDS[name])
        return list(REWARDS[name])

    f.__name__ = name
    return f


def make_trainer(base, tok, overrides: dict, prompt_ids, completion_ids, weights, tmp: str):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    def fixed_rollout(prompts, trainer):
        assert prompts == [PROMPTS[i // GROUP] for i in range(len(prompt_ids))], prompts
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    cfg = dict(
        output_dir=tmp, temperature=TEMPERATURE, max_completion_length=MAX_COMPLETION, num_generations=GROUP,
        per_device_train_batch_size=2 * GROUP, reward_weights=REWARD_WEIGHTS, beta=0.0, epsilon=0.2,
        report_to=[], use_cpu=True, disable_dropout=True, disable_tqdm=True, seed=SEED, bf16=False, fp16=False,
        dataloader_num_workers=0, logging_steps=1,
        # TRL 1.16's default, named: the KL term is multiplied by the (unclipped) ratio, in the loss, its gradient
        # (even on-policy, where the ratio is 1 but not its derivative) and the logged `kl`.
        use_bias_correction_kl=True,
    )
    cfg.update(overrides)
    args = GRPOConfig(**cfg)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=ALL_LINEAR, bias="none",
                      task_type="CAUSAL_LM")
    trainer = GRPOTrainer(
        model=copy.deepcopy(base), reward_funcs=[reward_func(n) for n in REWARD_NAMES], args=args,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]), processing_class=tok, peft_config=lora,
        rollout_func=fixed_rollout,
    )
    n = 0
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if ".lora_" in name:
                p.copy_(weights[name.replace(".default.", ".")])
                n += 1
    assert n == len(weights), (n, len(weights))
    trainer.model.train()  # mode "train": TRL's training normalisers
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def unpad(t: torch.Tensor, mask: torch.Tensor) -> list[list[float]]:
    return [[float(v) for v, m in zip(row, mrow) if m] for row, mrow in zip(t.tolist(), mask.tolist())]


def policy_logps(trainer, inputs) -> torch.Tensor:
    """TRL's own per-token log-probs of the batch under the current policy (no grad)."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        lp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, inputs["completion_ids"].size(1))
    return lp


def plain_logps(base, prompt_ids, completion_ids) -> list[list[float]]:
    """The same from a plain forward of one unpadded sequence: log_softmax(logits / T) (the sanity check)."""
    out = []
    for p, c in zip(prompt_ids, completion_ids):
        ids = torch.tensor([p + c])
        with torch.no_grad():
            logits = base(input_ids=ids, use_cache=False).logits[0].double()
        lp = torch.log_softmax(logits / TEMPERATURE, -1)
        out.append([lp[len(p) - 1 + t, tok].item() for t, tok in enumerate(c)])
    return out


def perturb_old(inputs) -> None:
    mask = inputs["completion_mask"]
    delta = torch.zeros_like(inputs["old_per_token_logps"])
    k = 0
    for i in range(mask.size(0)):
        for t in range(int(mask[i].sum())):
            delta[i, t] = OLD_DELTAS[k % len(OLD_DELTAS)]
            k += 1
    inputs["old_per_token_logps"] = inputs["old_per_token_logps"] + delta


def lora_grads(model) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        if ".lora_" in name:
            assert p.grad is not None, name
            out[name.replace(".default.", ".")] = p.grad.detach().clone().float().contiguous()
    return dict(sorted(out.items()))


def metric_means(trainer) -> dict[str, float]:
    """`trainer._metrics["train"]` as TRL's `log` reports it: each list's mean."""
    skip = {"num_tokens"}
    return {k: sum(v) / len(v) for k, v in sorted(trainer._metrics["train"].items()) if k not in skip and v}


def run_case(name, overrides, base, tok, prompt_ids, completion_ids, weights, plain, tmp):
    from trl.trainer.utils import split_tensor_dict

    trainer = make_trainer(base, tok, overrides, prompt_ids, completion_ids, weights, tmp)
    rows = [{"prompt": PROMPTS[i // GROUP]} for i in range(len(prompt_ids))]
    inputs = trainer._generate_and_score_completions(rows)
    mask = inputs["completion_mask"]
    assert mask.sum(1).tolist() == [len(c) for c in completion_ids]
    offpolicy = overrides.get("num_iterations", 1) > 1
    assert ("old_per_token_logps" in inputs) == offpolicy, name
    current = policy_logps(trainer, inputs)
    worst = max(abs(a - b) for r, q in zip(unpad(current, mask), plain) for a, b in zip(r, q))
    assert worst < 1e-5, f"{name}: TRL's log-probs vs a plain forward at T={TEMPERATURE}: {worst}"
    if offpolicy:
        assert (inputs["old_per_token_logps"] - current).abs().max() < 1e-6
        perturb_old(inputs)
    micro = split_tensor_dict(inputs, trainer.args.steps_per_generation)
    trainer.model.zero_grad()
    losses = []
    for part in micro:
        loss = trainer._compute_loss(trainer.model, part)
        loss.backward()
        losses.append(loss.item())
    m = metric_means(trainer)
    per_micro = {k: v for k, v in trainer._metrics["train"].items() if len(v) == len(micro) > 1}
    if offpolicy:
        assert m["clip_ratio/low_mean"] > 0 and m["clip_ratio/high_mean"] > 0, (name, m)
    case = {
        "config": {k: getattr(trainer.args, k) for k in [
            "loss_type", "beta", "epsilon", "epsilon_high", "scale_rewards", "num_iterations",
            "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
            "max_completion_length", "temperature", "num_generations", "use_bias_correction_kl"]},
        "advantages": inputs["advantages"].tolist(),
        "logps": unpad(current, mask),
        "loss": sum(losses),
        "micro_losses": losses,
        "metrics": m,
    }
    if per_micro:
        # TRL logs the mean of the micro-batches' token means; the step's token mean weighs them by tokens.
        tokens = [float(part["completion_mask"].sum()) for part in micro]
        case["micro_tokens"] = tokens
        case["token_weighted"] = {
            k: sum(x * n for x, n in zip(v, tokens)) / sum(tokens)
            for k, v in sorted(per_micro.items()) if k in ("kl", "entropy") or k.endswith("_mean")
        }
    if offpolicy:
        case["old_logps"] = unpad(inputs["old_per_token_logps"], mask)
    if "ref_per_token_logps" in inputs:
        case["ref_logps"] = unpad(inputs["ref_per_token_logps"], mask)
    return case, lora_grads(trainer.model)


def check_reference(cases, base, prompt_ids, completion_ids) -> None:
    """The reference TRL used (adapter disabled) is the plain base model."""
    plain = plain_logps(base, prompt_ids, completion_ids)
    for name, c in cases.items():
        if "ref_logps" in c:
            worst = max(abs(a - b) for r, q in zip(c["ref_logps"], plain) for a, b in zip(r, q))
            assert worst < 1e-5, f"{name}: reference vs plain base: {worst}"


def main() -> None:
    from peft import PeftModel
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.chdir(ROOT)
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import datasets
    import transformers

    datasets.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()

    d = FIX / "tiny-llama"
    tok = AutoTokenizer.from_pretrained(d)
    base = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    weights = load_file(ADAPTER / "adapter_model.safetensors")
    prompt_ids = [tok(PROMPTS[i // GROUP])["input_ids"] for i in range(2 * GROUP)]
    completion_ids = completions(prompt_ids[::GROUP])
    policy = PeftModel.from_pretrained(copy.deepcopy(base), ADAPTER).eval()
    plain = plain_logps(policy, prompt_ids, completion_ids)

    cases, grads = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in CASES.items():
            cases[name], g = run_case(name, overrides, base, tok, prompt_ids, completion_ids, weights, plain, tmp)
            grads.update({f"{name}/{k}": v for k, v in g.items()})
            c = cases[name]
            print(f"{name}: loss {c['loss']:.6f} " + " ".join(
                f"{k} {c['metrics'][k]:.4f}" for k in ["kl", "clip_ratio/low_mean", "clip_ratio/high_mean"]
                if k in c["metrics"]))
    check_reference(cases, base, prompt_ids, completion_ids)
    totals = [sum(w * REWARDS[n][i] for n, w in zip(REWARD_NAMES, REWARD_WEIGHTS)) for i in range(2 * GROUP)]
    expected = {
        "model": "tiny-llama",
        "adapter": "../preference/tiny-llama-adapter",
        "prompts": PROMPTS,
        "group": GROUP,
        "temperature": TEMPERATURE,
        "max_completion_length": MAX_COMPLETION,
        "eos_token_id": EOS,
        "pad_token_id": tok.pad_token_id,
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "finished": [f for row in FINISHED for f in row],
        "reward_names": REWARD_NAMES,
        "reward_weights": REWARD_WEIGHTS,
        "rewards": REWARDS,
        "reward_totals": totals,
        "cases": cases,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    write_json(OUT / "expected.json", expected)
    save_file(dict(sorted(grads.items())), str(OUT / "grads.safetensors"))


if __name__ == "__main__":
    main()
