#!/usr/bin/env bash
# What the test suite needs besides Rust: the real SmolLM2 GGUF (scripts/fetch_smollm2.sh) and the Python
# `huggingface_hub` client, which tests/hub_interop.rs runs against our Hugging Face cache. Idempotent.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
bash "$ROOT/scripts/fetch_smollm2.sh" >/dev/null
if ! "$PY" -c "import huggingface_hub" 2>/dev/null; then
  "$PY" -m pip install --quiet "huggingface_hub>=1.0" >&2
fi
