"""Builds assets/sample-chat/{train,valid}.jsonl: a small fixed-format chat task.

Every assistant reply follows one rigid format, `<Country> -> capital: <City>; continent: <Continent>.`,
so after a short LoRA run the model visibly answers in that format. Deterministic (no randomness).
"""
import json, pathlib

FACTS = [
    ("France", "Paris", "Europe"), ("Germany", "Berlin", "Europe"), ("Italy", "Rome", "Europe"),
    ("Spain", "Madrid", "Europe"), ("Portugal", "Lisbon", "Europe"), ("Poland", "Warsaw", "Europe"),
    ("Austria", "Vienna", "Europe"), ("Greece", "Athens", "Europe"), ("Norway", "Oslo", "Europe"),
    ("Sweden", "Stockholm", "Europe"), ("Finland", "Helsinki", "Europe"), ("Ireland", "Dublin", "Europe"),
    ("Japan", "Tokyo", "Asia"), ("China", "Beijing", "Asia"), ("India", "New Delhi", "Asia"),
    ("Thailand", "Bangkok", "Asia"), ("Vietnam", "Hanoi", "Asia"), ("South Korea", "Seoul", "Asia"),
    ("Indonesia", "Jakarta", "Asia"), ("Nepal", "Kathmandu", "Asia"), ("Egypt", "Cairo", "Africa"),
    ("Kenya", "Nairobi", "Africa"), ("Nigeria", "Abuja", "Africa"), ("Ghana", "Accra", "Africa"),
    ("Morocco", "Rabat", "Africa"), ("Ethiopia", "Addis Ababa", "Africa"), ("Senegal", "Dakar", "Africa"),
    ("Canada", "Ottawa", "North America"), ("Mexico", "Mexico City", "North America"),
    ("Cuba", "Havana", "North America"), ("Brazil", "Brasília", "South America"),
    ("Argentina", "Buenos Aires", "South America"), ("Peru", "Lima", "South America"),
    ("Chile", "Santiago", "South America"), ("Colombia", "Bogotá", "South America"),
    ("Australia", "Canberra", "Oceania"), ("New Zealand", "Wellington", "Oceania"), ("Fiji", "Suva", "Oceania"),
]
QUESTIONS = [
    "Tell me about {c}.", "What is the capital of {c}?", "Where is {c}?", "Give me the facts on {c}.",
]

def row(country, capital, continent, q):
    return {"messages": [
        {"role": "user", "content": QUESTIONS[q].format(c=country)},
        {"role": "assistant", "content": f"{country} -> capital: {capital}; continent: {continent}."},
    ]}

out = pathlib.Path(__file__).resolve().parent.parent / "assets" / "sample-chat"
out.mkdir(parents=True, exist_ok=True)
train, valid = [], []
for i, (country, capital, continent) in enumerate(FACTS):
    for q in range(len(QUESTIONS)):
        (valid if (i + q) % 9 == 0 else train).append(row(country, capital, continent, q))
for name, rows in [("train", train), ("valid", valid)]:
    with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
print(f"{len(train)} train, {len(valid)} valid rows in {out}")
