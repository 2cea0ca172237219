#!/usr/bin/env python3
"""Multiple-choice reference fixtures from lm-evaluation-harness itself (tests/eval_multiple_choice.rs).

Writes tests/fixtures/mc/: the rows in each column form -- plain.jsonl (context/choices/gold),
ai2_arc/ARC-Easy/test-00000-of-00001.parquet (allenai/ai2_arc's columns and Hub layout), hellaswag.jsonl
(Rowan/hellaswag's columns) and mmlu.jsonl (cais/mmlu's) -- and expected.json: what lm-eval's `simple_evaluate`
with model `hf` (`pretrained=<tiny fixture>`, and `peft=<tiny-llama-peft>`, dtype float32, CPU) reports on them,
per row (the (context, continuation) pairs it built, each choice's loglikelihood and is_greedy, acc, acc_norm)
and in aggregate (acc, acc_norm and their stderr).

The ARC, HellaSwag and MMLU rows go through lm-eval's real task configs (arc_easy.yaml, hellaswag.yaml with its
utils.process_docs, the mmlu default template) with only the dataset swapped for the local file (`include:` the
installed YAML, `dataset_path: json|parquet`, `dataset_kwargs.data_files`); the plain rows through a task of
ours (doc_to_text `{{context}}`, doc_to_choice `{{choices}}`, doc_to_target `{{gold}}`).

The tiny models are random, so their choices can come out near ties; candidate rows whose best and second
choice (by ll and by ll/len) are within 0.01 for any model are dropped before the final run, so acc and acc_norm
are decided by margins far above float noise.

    /work/venv-tf/bin/python scripts/make_lmeval_fixtures.py
"""
from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import lm_eval
import pandas as pd
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "mc"
TASKS = Path(lm_eval.__file__).parent / "tasks"
MODELS = [("tiny-llama", None), ("tiny-llama", "tiny-llama-peft"), ("tiny-qwen2", None)]
KEEP = 6
WORDS = "the a cat dog sat ran on under blue red sky sea green tree over quickly slowly house river old new".split()


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def candidates(rng: random.Random, count: int) -> dict[str, list[dict]]:
    plain, arc, hella, mmlu = [], [], [], []
    for i in range(count):
        choices = [sentence(rng, rng.randint(1, 4)) for _ in range(rng.randint(2, 4))]
        context = sentence(rng, rng.randint(3, 8)).capitalize() + ("" if i % 3 else " ")  # some trailing spaces
        plain.append({"context": context if i % 7 else "", "choices": choices, "gold": rng.randrange(len(choices))})
        labels = ["A", "B", "C", "D"][: len(choices)] if i % 2 else ["1", "2", "3", "4"][: len(choices)]
        arc.append({"id": f"q{i}", "question": sentence(rng, 6) + "?",
                    "choices": {"text": choices, "label": labels}, "answerKey": rng.choice(labels)})
        hella.append({"ind": i, "activity_label": sentence(rng, 2).title(), "ctx_a": sentence(rng, 5) + " [header] x.",
                      "ctx_b": sentence(rng, 3).upper(), "ctx": "", "endings": [sentence(rng, 4) + " [step] y." for _ in range(4)],
                      "source_id": "s", "split": "val", "split_type": "indomain", "label": str(rng.randrange(4))})
        mmlu.append({"question": " " + sentence(rng, 7) + "? ", "subject": "high_school_biology",
                     "choices": [sentence(rng, 2) for _ in range(4)], "answer": rng.randrange(4)})
    return {"plain": plain, "arc": arc, "hellaswag": hella, "mmlu": mmlu}


def write_rows(form: str, rows: list[dict]) -> Path:
    if form == "arc":
        path = OUT / "ai2_arc" / "ARC-Easy" / "test-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_parquet(path, index=False)
        return path
    path = OUT / f"{form}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def task_yaml(form: str, data: Path, folder: Path) -> str:
    name = f"mc_fixture_{form}"
    kind = "parquet" if data.suffix == ".parquet" else "json"
    source = f"dataset_path: {kind}\ndataset_name: null\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
    if form == "plain":
        body = ("output_type: multiple_choice\ntest_split: test\ndoc_to_text: \"{{context}}\"\n"
                "doc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{gold}}\"\n"
                "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    else:
        include = {"arc": TASKS / "arc" / "arc_easy.yaml", "hellaswag": TASKS / "hellaswag" / "hellaswag.yaml",
                   "mmlu": TASKS / "mmlu" / "default" / "mmlu_high_school_biology.yaml"}[form]
        body = (f"include: {include}\ntest_split: test\nvalidation_split: null\ntraining_split: null\n"
                "fewshot_split: null\n")
        if form == "mmlu":
            body += "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    (folder / f"{name}.yaml").write_text(f"task: {name}\ntag: []\n{source}{body}")
    return name


def evaluate(model: str, adapter: str | None, forms: dict[str, Path]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        names = {form: task_yaml(form, path, Path(tmp)) for form, path in forms.items()}
        args = f"pretrained={FIX / model},dtype=float32" + (f",peft={FIX / adapter}" if adapter else "")
        out = simple_evaluate(model="hf", model_args=args, tasks=list(names.values()), device="cpu", batch_size=4,
                              log_samples=True, task_manager=TaskManager(include_path=tmp, include_defaults=False))
    result = {}
    for form, name in names.items():
        samples = sorted(out["samples"][name], key=lambda s: s["doc_id"])
        rows = [{"context": s["arguments"][0][0], "continuations": [a[1] for a in s["arguments"]],
                 "gold": s["target"], "loglikelihoods": [float(r[0][0]) for r in s["resps"]],
                 "is_greedy": [bool(r[0][1]) for r in s["resps"]], "acc": s["acc"], "acc_norm": s["acc_norm"]}
                for s in samples]
        metrics = out["results"][name]
        result[form] = {"rows": rows, **{k: metrics[f"{k},none"] for k in ["acc", "acc_norm", "acc_stderr", "acc_norm_stderr"]}}
    return result


def clear_margin(values: list[float]) -> bool:
    top = sorted(values, reverse=True)
    return len(top) < 2 or top[0] - top[1] > 0.01


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = candidates(random.Random(0), 24)
    forms = {form: write_rows(form, r) for form, r in rows.items()}
    keep = {form: set(range(len(r))) for form, r in rows.items()}
    for model, adapter in MODELS:
        for form, res in evaluate(model, adapter, forms).items():
            for i, row in enumerate(res["rows"]):
                lens = [len(c) - 1 for c in row["continuations"]]  # without the " " delimiter
                if not (clear_margin(row["loglikelihoods"]) and
                        clear_margin([ll / n for ll, n in zip(row["loglikelihoods"], lens)])):
                    keep[form].discard(i)
    final = {form: [r for i, r in enumerate(rows[form]) if i in keep[form]][:KEEP] for form in rows}
    forms = {form: write_rows(form, r) for form, r in final.items()}
    cases = []
    for model, adapter in MODELS:
        for form, res in evaluate(model, adapter, forms).items():
            cases.append({"model": model, "adapter": adapter, "form": form,
                          "data": str(forms[form].relative_to(FIX)), **res})
    expected = {"lm_eval": lm_eval.__version__ if hasattr(lm_eval, "__version__") else "0.4",
                "note": "written by scripts/make_lmeval_fixtures.py; do not edit", "cases": cases}
    (OUT / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print({form: len(r) for form, r in final.items()})


if __name__ == "__main__":
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
