"""Builds tests/fixtures/datasets/: tiny datasets in each format and file type the data module reads, written by
pyarrow as the Hugging Face `datasets` library writes them (parquet with snappy compression, nested columns as
list<struct>), plus the chat JSONL each one is equivalent to.

    pip install pyarrow
    python scripts/make_dataset_fixtures.py

Deterministic: re-running rewrites identical bytes (parquet's `created_by` names the pyarrow version; the tests
read values, never bytes). Layout:

    chat.parquet          messages: list<struct<role, content, tool_calls: list<struct<...>> (all null)>>
    sharegpt.parquet      conversations: list<struct<from, value>>, system
    alpaca.parquet        instruction, input (one empty), output
    completions.parquet   prompt, completion
    text.parquet          text
    equivalent/*.jsonl    the same rows as chat JSONL (text rows as text JSONL): what each must tokenize like
    hub/                  a Hub dataset repo: README.md, data/train-0000{0,1}-of-00002.parquet, data/test-00000-of-00001.parquet
    array.json            a JSON array of alpaca rows
    alpaca_text.jsonl     Alpaca columns beside a rendered `text` column (as tatsu-lab/alpaca has them): alpaca
    ambiguous.jsonl       Alpaca columns beside prompt/completion columns: two formats, never guessed
    qa.jsonl              `question` / `answer` columns: read as GRPO prompts, as completions once mapped
    preference-hub/       trl-lib/ultrafeedback_binarized's layout: chosen/rejected conversations, scores, train/test
    gsm8k-hub/            openai/gsm8k's layout (main/{train,test}-00000-of-00001.parquet, `question` / `answer`
                          with the worked solution ending in `#### N`): GRPO prompts
    malformed.parquet     completions whose row 2 has an empty completion
    mixed/                a train split of two files in different formats
    tools.jsonl           a chat row with tools and tool-call turns
"""
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "datasets"

QA = [
    ("What is the capital of France?", "Paris."),
    ("Name a prime number.", "Seven."),
    ("What colour is the sky?", "Blue, on a clear day."),
]
SYSTEM = "Answer in one short sentence."


def chat(q, a, system=None):
    turns = [{"role": "system", "content": system}] if system else []
    return turns + [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def write_parquet(path, table):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="snappy")


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


TOOL_CALL = pa.struct([("type", pa.string()), ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.list_(TOOL_CALL))])


def main():
    # chat: the first row has a system turn; every message carries a null `tool_calls`, as a union schema does.
    chat_rows = [chat(q, a, SYSTEM if i == 0 else None) for i, (q, a) in enumerate(QA)]
    messages = [[dict(m, tool_calls=None) for m in row] for row in chat_rows]
    write_parquet(OUT / "chat.parquet", pa.table({"messages": pa.array(messages, type=pa.list_(MESSAGE))}))
    write_jsonl(OUT / "equivalent/chat.jsonl", [{"messages": row} for row in chat_rows])

    # sharegpt: human/gpt turns, the first row's system prompt in a `system` column (null elsewhere).
    speaker = {"user": "human", "assistant": "gpt"}
    conversations = [[{"from": speaker[m["role"]], "value": m["content"]} for m in chat(q, a)] for q, a in QA]
    systems = [SYSTEM, None, None]
    write_parquet(OUT / "sharegpt.parquet", pa.table({"conversations": conversations, "system": systems}))
    write_jsonl(OUT / "equivalent/sharegpt.jsonl", [{"messages": row} for row in chat_rows])

    # alpaca: the second row has an input, joined to the instruction by a blank line.
    alpaca = [
        {"instruction": QA[0][0], "input": "", "output": QA[0][1]},
        {"instruction": "Name a prime number.", "input": "Between 5 and 10.", "output": "Seven."},
        {"instruction": QA[2][0], "input": "", "output": QA[2][1]},
    ]
    write_parquet(OUT / "alpaca.parquet", pa.Table.from_pylist(alpaca))
    user = lambda r: r["instruction"] + ("\n\n" + r["input"] if r["input"] else "")
    write_jsonl(OUT / "equivalent/alpaca.jsonl", [{"messages": chat(user(r), r["output"])} for r in alpaca])
    (OUT / "array.json").write_text(json.dumps(alpaca, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")

    completions = [{"prompt": q, "completion": a} for q, a in QA]
    write_parquet(OUT / "completions.parquet", pa.Table.from_pylist(completions))
    write_jsonl(OUT / "equivalent/completions.jsonl", [{"messages": chat(q, a)} for q, a in QA])

    texts = [f"{q} {a}" for q, a in QA]
    write_parquet(OUT / "text.parquet", pa.table({"text": texts, "id": [1, 2, 3]}))
    write_jsonl(OUT / "equivalent/text.jsonl", [{"text": t} for t in texts])

    # A Hub dataset repo: two train shards (concatenated in name order) and a test shard, all chat.
    hub = OUT / "hub"
    (hub / "data").mkdir(parents=True, exist_ok=True)
    (hub / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/train-*\n---\n# tiny chat\n")
    shard_rows = [chat(q, a) for q, a in QA] + [chat("And of Italy?", "Rome.")]
    for i, rows in enumerate([shard_rows[:2], shard_rows[2:]]):
        write_parquet(hub / f"data/train-0000{i}-of-00002.parquet", pa.table({"messages": rows}))
    write_parquet(hub / "data/test-00000-of-00001.parquet", pa.table({"messages": [chat("Capital of Spain?", "Madrid.")]}))
    write_jsonl(OUT / "equivalent/hub-train.jsonl", [{"messages": row} for row in shard_rows])

    write_jsonl(OUT / "alpaca_text.jsonl", [dict(r, text=f"### Instruction:\n{r['instruction']}\n\n### Response:\n{r['output']}") for r in alpaca])
    write_jsonl(OUT / "ambiguous.jsonl", [dict(r, prompt=r["instruction"], completion=r["output"]) for r in alpaca])
    write_jsonl(OUT / "qa.jsonl", [{"question": q, "answer": a} for q, a in QA])

    malformed = [dict(completions[0]), {"prompt": "Nothing to learn here.", "completion": ""}, dict(completions[2])]
    write_parquet(OUT / "malformed.parquet", pa.Table.from_pylist(malformed))

    write_parquet(OUT / "mixed/train-a.parquet", pa.Table.from_pylist(completions))
    write_parquet(OUT / "mixed/train-b.parquet", pa.Table.from_pylist(alpaca))

    tools = [{
        "tools": [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
                   "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}],
        "messages": [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}}]},
            {"role": "tool", "content": "4"},
            {"role": "assistant", "content": "2 + 2 is 4."},
        ],
    }]
    write_jsonl(OUT / "tools.jsonl", tools)

    # A preference repo laid out as trl-lib/ultrafeedback_binarized: whole conversations in `chosen` / `rejected`
    # (the shared user turn is the implicit prompt), scores beside them, train and test shards.
    plain = pa.struct([("role", pa.string()), ("content", pa.string())])
    def pair(q, good, bad):
        return {"chosen": chat(q, good), "rejected": chat(q, bad), "score_chosen": 8.0, "score_rejected": 3.0}
    pairs = [pair(q, a, "I do not know.") for q, a in QA]
    schema = pa.schema([("chosen", pa.list_(plain)), ("rejected", pa.list_(plain)),
                        ("score_chosen", pa.float64()), ("score_rejected", pa.float64())])
    write_parquet(OUT / "preference-hub/data/train-00000-of-00001.parquet", pa.Table.from_pylist(pairs * 2, schema))
    write_parquet(OUT / "preference-hub/data/test-00000-of-00001.parquet", pa.Table.from_pylist(pairs[:1], schema))

    # A GRPO prompt repo laid out as openai/gsm8k's `main` config: question, and the worked answer ending in `#### N`.
    gsm8k = [
        ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
         "clips did Natalia sell altogether in April and May?",
         "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in "
         "April and May.\n#### 72"),
        ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did "
         "she earn?",
         "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
         "$<<0.2*50=10>>10.\n#### 10"),
        ("A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
         "It takes 2/2=<<2/2=1>>1 bolt of white fiber\nSo the total amount of fabric is 2+1=<<2+1=3>>3 bolts of "
         "fabric\n#### 3"),
    ]
    schema = pa.schema([("question", pa.string()), ("answer", pa.string())])
    rows = [{"question": q, "answer": a} for q, a in gsm8k]
    write_parquet(OUT / "gsm8k-hub/main/train-00000-of-00001.parquet", pa.Table.from_pylist(rows[:2], schema))
    write_parquet(OUT / "gsm8k-hub/main/test-00000-of-00001.parquet", pa.Table.from_pylist(rows[2:], schema))


if __name__ == "__main__":
    main()
