"""Builds the fixtures of `metal-candle eval` (tests/eval_loss.rs, tests/eval_generate.rs):

    tests/fixtures/datasets/arithmetic/{train,test}.jsonl   "What is 3+4?" -> "7" chat rows (a system row and a
                                                            two-turn row among the test rows)
    tests/fixtures/eval_loss_expected.json                  the test split's loss under transformers + PEFT

The expected loss is computed independently of our code, the way training defines it: each row rendered with
tiny-llama's chat template (`apply_chat_template`), tokenized without adding special tokens (the template writes
BOS), a token is a target when its character span overlaps an assistant turn (from the end of
`render(messages[:i], add_generation_prompt=True)` to the end of `render(messages[:i+1])` without trailing
whitespace), never token 0, and the row is cut to SEQ_LEN tokens. NLL in float64 from the f32 logits; `loss` is
the sum over all target tokens of the split divided by their count, for the base and with tiny-llama-peft.

    /work/venv-tf/bin/python scripts/make_eval_fixtures.py

Deterministic: re-running rewrites identical bytes.
"""
import json
import pathlib

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
DATA = FIXTURES / "datasets" / "arithmetic"
SEQ_LEN = 48


def chat(*turns):
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


def datasets():
    test_pairs = [(2, 3), (4, 4), (1, 6), (5, 3), (7, 2), (3, 6), (8, 1), (6, 2)]
    test = [chat(("user", f"What is {a}+{b}?"), ("assistant", str(a + b))) for a, b in test_pairs]
    test.append(chat(("system", "Answer with the number only."), ("user", "What is 4+5?"), ("assistant", "9")))
    test.append(chat(("user", "What is 1+1?"), ("assistant", "2"), ("user", "What is 2+5?"), ("assistant", "7")))
    held = set(test_pairs) | {(4, 5), (1, 1), (2, 5)}
    train = [
        chat(("user", f"What is {a}+{b}?"), ("assistant", str(a + b)))
        for a in range(1, 10)
        for b in range(1, 10)
        if (a, b) not in held
    ]
    return train, test


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def example(tok, messages):
    full = tok.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tok.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
        through = tok.apply_chat_template(messages[: i + 1], tokenize=False)
        assert full.startswith(through) and through.startswith(before)
        start = len(before)
        spans.append((start, start + len(full[start : len(through)].rstrip())))
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    mask = [e > s and any(s < b and e > a for a, b in spans) for s, e in enc["offset_mapping"]]
    mask[0] = False
    return ids[:SEQ_LEN], mask[:SEQ_LEN], len(ids) > SEQ_LEN


@torch.no_grad()
def row_nll(model, ids, mask):
    logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    return sum(-logp[j - 1, ids[j]].item() for j in range(1, len(ids)) if mask[j])


def main():
    train, test = datasets()
    write_jsonl(DATA / "train.jsonl", train)
    write_jsonl(DATA / "test.jsonl", test)

    tok = AutoTokenizer.from_pretrained(FIXTURES / "tiny-llama")
    base = AutoModelForCausalLM.from_pretrained(FIXTURES / "tiny-llama", dtype=torch.float32).eval()
    examples = [example(tok, row["messages"]) for row in test]
    base_nll = [row_nll(base, ids, mask) for ids, mask, _ in examples]
    adapted = PeftModel.from_pretrained(base, FIXTURES / "tiny-llama-peft").eval()
    adapter_nll = [row_nll(adapted, ids, mask) for ids, mask, _ in examples]

    tokens = [sum(mask) for _, mask, _ in examples]
    total = sum(tokens)
    expected = {
        "data": "datasets/arithmetic",
        "split": "test",
        "seq_len": SEQ_LEN,
        "truncated_rows": sum(t for _, _, t in examples),
        "target_tokens": total,
        "base_loss": sum(base_nll) / total,
        "adapter_loss": sum(adapter_nll) / total,
        "rows": [
            {"line": i + 1, "target_tokens": n, "base_loss": b / n, "adapter_loss": a / n}
            for i, (n, b, a) in enumerate(zip(tokens, base_nll, adapter_nll))
        ],
    }
    (FIXTURES / "eval_loss_expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(json.dumps({k: v for k, v in expected.items() if k != "rows"}))


if __name__ == "__main__":
    main()
