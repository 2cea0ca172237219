#!/usr/bin/env python3
"""Write tests/fixtures/grpo-prompts/: GRPO prompt rows in TRL's two forms and the prompt ids TRL 1.16's own
`GRPOTrainer._tokenize_prompts` gives them with the tiny-llama fixture's tokenizer (ChatML template).

    /work/venv-tf/bin/python scripts/make_grpo_prompt_fixtures.py

TRL's method is called unbound on a stand-in holding only the attributes it reads (processing_class, _is_vlm,
environment_factories, tools, chat_template, chat_template_kwargs), so no model or trainer is built: a
conversational batch goes through `apply_chat_template(add_generation_prompt=True, tokenize=True)`, a standard
batch through `processing_class(text=prompts)`. Files: rows-standard.jsonl, rows-conversational.jsonl and
expected.json (`{"standard": [[ids]...], "conversational": [[ids]...], "trl_version": ...}`).
"""
import json
import pathlib
import types

import trl
from transformers import AutoTokenizer
from trl.trainer.grpo_trainer import GRPOTrainer

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests/fixtures/grpo-prompts"

STANDARD = [
    {"prompt": "What is 17 + 25? Reply with the number only.", "answer": "42"},
    {"prompt": "Natalia sold 48 clips in April and half as many in May. How many in all?", "answer": 72},
]
CONVERSATIONAL = [
    {"prompt": [{"role": "user", "content": "What is 17 + 25? Reply with the number only."}], "answer": "42"},
    {"prompt": [{"role": "system", "content": "Think, then answer."},
                {"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many?"}],
     "answer": "72"},
]


def main():
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "tests/fixtures/tiny-llama")
    stand_in = types.SimpleNamespace(processing_class=tokenizer, _is_vlm=False, environment_factories=None,
                                     tools=None, chat_template=None, chat_template_kwargs={})
    expected = {"trl_version": trl.__version__}
    for name, rows in [("standard", STANDARD), ("conversational", CONVERSATIONAL)]:
        prompt_ids, _, _ = GRPOTrainer._tokenize_prompts(stand_in, [r["prompt"] for r in rows])
        expected[name] = [list(map(int, ids)) for ids in prompt_ids]
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"rows-{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT}: {expected}")


if __name__ == "__main__":
    main()
