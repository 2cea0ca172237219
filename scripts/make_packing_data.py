"""A text dataset with a realistic spread of row lengths, for the packing benchmark (scripts/bench_packing_gpu.sh).

Row lengths are log-normal, median MEDIAN bytes, sigma SIGMA, cut to [MIN, MAX]: the shape of instruction datasets
(Alpaca's and ShareGPT's token counts are roughly log-normal, most rows short, a long tail). With the byte-level
stand-in tokenizer of ../shared/anchors/gpu_unsloth.py every byte is one token, so the same rows have the same token
counts in every trainer. Prints the distribution it wrote.
Usage: make_packing_data.py OUT.jsonl [ROWS=4000] [MEDIAN=256] [SIGMA=0.9] [MIN=16] [MAX=2000]"""
import json, math, random, sys

out = sys.argv[1]
rows, median, sigma, lo, hi = (int(sys.argv[2]) if len(sys.argv) > 2 else 4000,
                               float(sys.argv[3]) if len(sys.argv) > 3 else 256.0,
                               float(sys.argv[4]) if len(sys.argv) > 4 else 0.9,
                               int(sys.argv[5]) if len(sys.argv) > 5 else 16,
                               int(sys.argv[6]) if len(sys.argv) > 6 else 2000)
rng = random.Random(0)
words = "the of and to in is was for on that with as by at from his her an have were which are this be".split()
lengths = []
with open(out, "w") as f:
    for _ in range(rows):
        n = min(hi, max(lo, int(rng.lognormvariate(math.log(median), sigma))))
        text = ""
        while len(text) < n:
            text += rng.choice(words) + " "
        f.write(json.dumps({"text": text[:n]}) + "\n")
        lengths.append(n)
lengths.sort()
q = lambda p: lengths[min(len(lengths) - 1, int(p * len(lengths)))]
print(json.dumps(dict(rows=rows, mean=round(sum(lengths) / rows, 1), p10=q(0.1), p50=q(0.5), p90=q(0.9), p99=q(0.99),
                      max=lengths[-1], total_tokens=sum(lengths))))
