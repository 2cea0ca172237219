#!/usr/bin/env bash
# Memory and time of reading a large parquet dataset (`metal-candle data`, the dataset page's report), beside the
# same rows as JSONL. Rows are Alpaca-form random text written by pyarrow (snappy, row groups of 10k rows).
# Usage: scripts/bench_parquet_memory.sh [PARQUET_MIB=1024]. Needs: cargo build --release; pyarrow; /usr/bin/time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MIB="${1:-1024}"
PY="${PYTHON:-python3}"
BIN="$ROOT/target/release/metal-candle"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PY" - "$WORK" "$MIB" <<'PYEOF'
import json, os, random, sys
import pyarrow as pa, pyarrow.parquet as pq
work, mib = sys.argv[1], int(sys.argv[2])
random.seed(0)
words = [''.join(random.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(random.randint(2, 9))) for _ in range(50000)]
def text(n): return ' '.join(random.choice(words) for _ in range(n))
schema = pa.schema([('instruction', pa.string()), ('input', pa.string()), ('output', pa.string())])
path = os.path.join(work, 'big.parquet')
writer = pq.ParquetWriter(path, schema, compression='snappy')
jsonl = open(os.path.join(work, 'big.jsonl'), 'w')
rows = 0
while os.path.getsize(path) < mib << 20:
    batch = {'instruction': [text(20) for _ in range(10000)], 'input': [text(10) for _ in range(10000)],
             'output': [text(60) for _ in range(10000)]}
    writer.write_table(pa.table(batch, schema=schema), row_group_size=10000)
    for i in range(10000):
        jsonl.write(json.dumps({k: batch[k][i] for k in batch}) + '\n')
    rows += 10000
writer.close(); jsonl.close()
print(f"rows: {rows}; parquet {os.path.getsize(path) / 2**20:.0f} MiB; jsonl {os.path.getsize(jsonl.name) / 2**20:.0f} MiB")
PYEOF
for f in big.parquet big.jsonl; do
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$WORK/rss" "$BIN" data --data "$WORK/$f" > /dev/null
  t1=$(date +%s.%N)
  python3 -c "import sys; print(f'{sys.argv[1]:<12} {float(sys.argv[2])-float(sys.argv[3]):7.1f} s  peak RSS {int(open(sys.argv[4]).read().split()[-1])/1024:8.0f} MiB')" "$f" "$t1" "$t0" "$WORK/rss"
done
