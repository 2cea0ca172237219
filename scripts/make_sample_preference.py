#!/usr/bin/env python3
"""Write assets/sample-preference/{train,valid}.jsonl: a small conversational preference dataset (TRL's
conversational form with an explicit prompt) of two-number sums. The chosen answer is the right sum; the
rejected one is a near miss (off by one, two or ten), so a model must add to tell them apart.

Deterministic (fixed seed, no dependencies): rerunning it rewrites the same bytes.
Usage: python3 scripts/make_sample_preference.py [OUT_DIR]
"""
import json
import random
import sys
from pathlib import Path

TRAIN_ROWS = 40
VALID_ROWS = 10
SEED = 34
MISSES = [-10, -2, -1, 1, 2, 10]


def rows(rng, count, seen):
    out = []
    while len(out) < count:
        a, b = rng.randint(2, 49), rng.randint(2, 49)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        right = a + b
        wrong = right + rng.choice(MISSES)
        out.append({
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "chosen": [{"role": "assistant", "content": f"{a} + {b} = {right}."}],
            "rejected": [{"role": "assistant", "content": f"{a} + {b} = {wrong}."}],
        })
    return out


def main():
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "assets/sample-preference"
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    seen = set()
    for name, count in [("train", TRAIN_ROWS), ("valid", VALID_ROWS)]:
        lines = [json.dumps(row, ensure_ascii=False) for row in rows(rng, count, seen)]
        (out / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"wrote {out / (name + '.jsonl')}: {count} pairs")


if __name__ == "__main__":
    main()
