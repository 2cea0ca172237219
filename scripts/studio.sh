#!/usr/bin/env bash
# The README's first command: fetch the real small model (once), build, and open the studio with
# SmolLM2-135M-Instruct and the bundled sample dataset selected, ready to train and chat.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$(bash scripts/fetch_smollm2.sh | tail -n1)"
cargo build --release
exec target/release/metal-candle --model "$MODEL" --data assets/sample-chat "$@"
