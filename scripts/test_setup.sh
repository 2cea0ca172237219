#!/usr/bin/env bash
# What the test suite needs besides Rust: the real SmolLM2 GGUF (scripts/fetch_smollm2.sh) and the Python
# `huggingface_hub` client, which tests/hub_interop.rs runs against our Hugging Face cache. Idempotent.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
bash "$ROOT/scripts/fetch_smollm2.sh" >/dev/null
# huggingface_hub from the Python on PATH when it has it, else in a virtual environment of our own (.venv-test/,
# which tests/hub_interop.rs uses), so a system Python that refuses pip installs (PEP 668) is left alone.
if ! "$PY" -c "import huggingface_hub" 2>/dev/null && ! "$ROOT/.venv-test/bin/python" -c "import huggingface_hub" 2>/dev/null; then
  "$PY" -m venv "$ROOT/.venv-test" >&2
  "$ROOT/.venv-test/bin/python" -m pip install --quiet "huggingface_hub>=1.0" >&2
fi
# The op recorder (tests/op_coverage.rs): metal-candle's CLI against a recording copy of candle-core, made from
# cargo's registry copy by patch_candle.py, built in its own workspace (its lock file is a copy of ours) into the
# shared target/ folder, so the crates both builds share compile once.
cargo fetch --quiet
python3 "$ROOT/tools/op-recorder/patch_candle.py" >/dev/null
cp "$ROOT/Cargo.lock" "$ROOT/tools/op-recorder/Cargo.lock"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}" cargo build --release --quiet --manifest-path "$ROOT/tools/op-recorder/Cargo.toml"
