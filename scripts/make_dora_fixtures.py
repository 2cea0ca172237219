#!/usr/bin/env python3
"""DoRA (PEFT `use_dora`) fixtures and interop check, with transformers + PEFT as the oracle.

    python scripts/make_dora_fixtures.py                 # -> tests/fixtures/tiny-llama-dora-peft/
    python scripts/make_dora_fixtures.py --check DIR     # PEFT loads OUR DoRA adapter in DIR and scores it

Fixture: a PEFT DoRA adapter for tests/fixtures/tiny-llama (r=4, alpha=8, q_proj, v_proj, gate_proj,
down_proj, init_lora_weights=False so B is random and non-zero, every magnitude perturbed by 1 + 0.1 N(0, 1) so
it is not the weight norm), and `expected.json`: the adapter-on `score` of the base fixture's score text (as
make_fixtures.py scores), `merged_score` (PEFT's merge_and_unload), and `grad_loss`: the mean NLL over the score
text's tokens 1.. with dropout 0; `expected_grads.safetensors` holds that loss's gradients (torch autograd through
PEFT's DoRA forward, weight norm detached as PEFT does) under the adapter's own tensor names.

--check DIR: DIR is an adapter folder we saved plus `ours.json` beside it ({"ids": [...], "token_logprobs":
[...]}, written by tests/dora.rs); PEFT must load it with no missing or unexpected keys, and its log-probs must
equal ours within 1e-5. Prints the max difference; exit status 1 on failure.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import FIX, SCORE_TEXT, score_ids, seed_all, write_json  # noqa: E402

BASE = "tiny-llama"
OUT = "tiny-llama-dora-peft"
LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"], use_dora=True)
SEED = 4242


def load_base():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(FIX / BASE, dtype=torch.float32, attn_implementation="eager")
    return model, AutoTokenizer.from_pretrained(FIX / BASE)


def mean_nll(model, ids: list[int]) -> torch.Tensor:
    x = torch.tensor([ids], dtype=torch.long)
    logits = model(input_ids=x).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return -lp[:-1].gather(1, torch.tensor(ids[1:])[:, None]).mean()


def make() -> None:
    import shutil

    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import save_file

    out = FIX / OUT
    if out.exists():
        shutil.rmtree(out)
    model, tok = load_base()
    ids = tok(SCORE_TEXT)["input_ids"]
    seed_all(SEED)
    cfg = LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, init_lora_weights=False, bias="none", **LORA)
    pm = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_magnitude_vector" in name:
                p.mul_(1.0 + 0.1 * torch.randn_like(p))
    pm.peft_config["default"].base_model_name_or_path = f"../{BASE}"
    pm.save_pretrained(out, safe_serialization=True)
    (out / "README.md").unlink(missing_ok=True)
    acfg_path = out / "adapter_config.json"
    acfg = json.load(open(acfg_path))
    acfg["target_modules"] = sorted(acfg["target_modules"])
    with open(acfg_path, "w") as f:
        json.dump(acfg, f, indent=2, sort_keys=True)
        f.write("\n")

    pm.eval()
    s = score_ids(pm, ids)
    pm.train()
    loss = mean_nll(pm, ids)
    loss.backward()
    grads = {}
    for name, p in pm.named_parameters():
        if p.requires_grad:
            # PEFT's saved names: no adapter name; the magnitude vector is saved without `.weight`.
            key = name.replace(".default", "")
            if "lora_magnitude_vector" in key:
                key = key.removesuffix(".weight")
            grads[key] = p.grad.detach().clone().contiguous()
    save_file(grads, out / "expected_grads.safetensors")

    base2, _ = load_base()
    pm2 = PeftModel.from_pretrained(base2, out)
    pm2.eval()
    s2 = score_ids(pm2, ids)
    d = max(abs(a - b) for a, b in zip(s["token_logprobs"], s2["token_logprobs"]))
    assert d < 1e-6, d
    merged = score_ids(pm2.merge_and_unload(), ids)
    base_model, _ = load_base()
    expected = {
        "base_model": BASE,
        "lora": {**LORA, "lora_dropout": 0.0, "init_lora_weights": False, "seed": SEED, "scale": 2.0},
        "score": {"text": SCORE_TEXT, "ids": ids, **s},
        "merged_score": {"token_logprobs": merged["token_logprobs"]},
        "base_score": {"token_logprobs": score_ids(base_model, ids)["token_logprobs"]},
        "grad_loss": loss.item(),
    }
    write_json(out / "expected.json", expected)
    dm = max(abs(a - b) for a, b in zip(s["token_logprobs"], merged["token_logprobs"]))
    print(f"[{OUT}] nll={s['nll_mean']:.4f} loss={loss.item():.6f} grads={len(grads)} merged_diff={dm:.2e}")


def check(folder: Path) -> int:
    from peft import PeftModel

    ours = json.load(open(folder / "ours.json"))
    base, _ = load_base()
    pm = PeftModel.from_pretrained(base, folder)
    pm.eval()
    from safetensors import safe_open

    with safe_open(folder / "adapter_model.safetensors", "pt") as f:
        state = {k.replace(".default", ""): v for k, v in pm.state_dict().items()}
        for key in f.keys():
            want = f.get_tensor(key)
            got = state.get(key) if key in state else state.get(key + ".weight")
            if got is None or not torch.equal(got, want):
                print(f"tensor {key} did not load unchanged into PEFT")
                return 1
    n_mag = sum("lora_magnitude_vector" in k for k in state)
    s = score_ids(pm, ours["ids"])
    d = max(abs(a - b) for a, b in zip(s["token_logprobs"], ours["token_logprobs"]))
    print(f"PEFT on our DoRA adapter ({n_mag} magnitude vectors): max |logprob diff| vs ours = {d:.3e}")
    return 0 if d < 1e-5 else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", type=Path, help="an adapter folder we saved, with ours.json beside its files")
    args = ap.parse_args()
    if args.check:
        sys.exit(check(args.check))
    make()


if __name__ == "__main__":
    main()
