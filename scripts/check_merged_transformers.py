"""A merged export as transformers loads it, against our own score of it.

Usage: python scripts/check_merged_transformers.py MERGED_FOLDER SCORE_JSON [MERGED_FOLDER SCORE_JSON ...]
where SCORE_JSON is `metal-candle score --model MERGED_FOLDER --text ... --json` (its ids and log-probs).
Prints transformers' NLL beside ours and the largest per-token difference; exits 1 above 1e-4.
Used for issue 40 on the merged folders exported from every tests/fixtures/gguf family (tests/merged_from_gguf.rs
checks the same folders against base + adapter in our engine). Needs torch + transformers (5.x).
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM

worst = 0.0
args = sys.argv[1:]
if not args or len(args) % 2:
    sys.exit(__doc__)
for folder, score_path in zip(args[::2], args[1::2]):
    with open(score_path) as f:
        ours = json.load(f)
    ids = torch.tensor([ours["ids"]])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double()
    lp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None]).squeeze(1)
    diff = (lp - torch.tensor(ours["token_logprobs"], dtype=torch.float64)).abs().max().item()
    worst = max(worst, diff)
    print(f"{folder}: {type(model).__name__}: transformers NLL {-lp.mean():.6f}, ours {ours['nll_mean']:.6f}, "
          f"max |d logprob| {diff:.2e}")
sys.exit(1 if worst > 1e-4 else 0)
