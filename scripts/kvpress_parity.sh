#!/usr/bin/env bash
# kvzap's presses against NVIDIA kvpress on tiny random Hugging Face models (docs/PARITY.md), in one command:
#   scripts/kvpress_parity.sh [check options: -v, --press NAME, --json FILE]
# Makes the virtual environment KVZAP_PARITY_VENV (default /work/venv-parity, or .venv-parity in the repo
# when /work is not there) with torch, transformers < 5.3, tokenizers and kvpress 0.5.5 if it lacks them,
# builds kvzap if build/kvzap is missing, and runs tests/python/check_kvpress_parity.py.
# KVZAP_TORCH_INDEX: a pip index URL to take torch from (a CPU-only wheel index keeps the venv small);
# without it torch comes from the default index.
set -euo pipefail
cd "$(dirname "$0")/.."
default_venv=/work/venv-parity
[ -d /work ] || default_venv="$PWD/.venv-parity"
VENV="${KVZAP_PARITY_VENV:-$default_venv}"
PY="$VENV/bin/python"
if ! [ -x "$PY" ] || ! "$PY" -c "import torch, transformers, tokenizers, kvpress" 2>/dev/null; then
  echo "== making $VENV (torch, transformers<5.3, tokenizers, kvpress==0.5.5)"
  start=$(date +%s)
  python3 -m venv "$VENV"
  if [ -n "${KVZAP_TORCH_INDEX:-}" ]; then
    "$VENV/bin/pip" install -q torch --index-url "$KVZAP_TORCH_INDEX"
  fi
  "$VENV/bin/pip" install -q torch 'transformers>=4.56,<5.3' tokenizers 'kvpress==0.5.5'
  echo "== venv ready in $(( $(date +%s) - start )) s"
fi
BUILD_DIR="${KVZAP_BUILD_DIR:-build}"
if ! [ -x "$BUILD_DIR/kvzap" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$BUILD_DIR" -j"$(nproc)" --target kvzap
fi
KVZAP_BIN="$PWD/$BUILD_DIR/kvzap" exec "$PY" tests/python/check_kvpress_parity.py "$@"
