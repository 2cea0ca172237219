#!/usr/bin/env bash
# The test command from README.md: fetch the real test model (once), then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch_smollm2.sh >/dev/null
export METAL_CANDLE_SMOLLM2="${METAL_CANDLE_SMOLLM2:-$(ls models/smollm2/*.gguf | head -1)}"
cargo test --release "$@"
