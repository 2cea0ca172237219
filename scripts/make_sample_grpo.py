#!/usr/bin/env python3
"""Write assets/sample-grpo/{train,valid}.jsonl: GRPO prompts of two-number sums with their answers, as
`{"messages": [user turn], "answer": "42"}` rows (the prompt is the user's turn; the exact-answer reward compares
the first number of a completion with `answer`). The valid prompts are sums the train prompts never ask.

Deterministic (fixed seed, no dependencies): rerunning it rewrites the same bytes.
Usage: python3 scripts/make_sample_grpo.py [OUT_DIR]
"""
import json
import random
import sys
from pathlib import Path

TRAIN_ROWS = 400
VALID_ROWS = 48
SEED = 35


def rows(rng, count, seen):
    out = []
    while len(out) < count:
        a, b = rng.randint(2, 49), rng.randint(2, 49)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        out.append({
            "messages": [{"role": "user", "content": f"What is {a} + {b}? Reply with the number only."}],
            "answer": str(a + b),
        })
    return out


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "assets/sample-grpo"
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    seen = set()
    for name, count in [("train", TRAIN_ROWS), ("valid", VALID_ROWS)]:
        lines = [json.dumps(row, ensure_ascii=False) for row in rows(rng, count, seen)]
        (out / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {out / (name + '.jsonl')}: {count} prompts")


if __name__ == "__main__":
    main()
