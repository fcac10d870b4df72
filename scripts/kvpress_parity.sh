#!/usr/bin/env bash
# kvzap's presses against NVIDIA kvpress on tiny random Hugging Face models (docs/PARITY.md), in one command:
#   scripts/kvpress_parity.sh [check options: -v, --press NAME, --json FILE]
# Makes the peers' virtual environment if it lacks them (scripts/peer_venv.sh: torch, transformers < 5.3,
# tokenizers and kvpress 0.5.5; KVZAP_PEER_VENV, KVZAP_TORCH_INDEX), builds kvzap if build/kvzap is
# missing, and runs tests/python/check_kvpress_parity.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$(bash scripts/peer_venv.sh | tail -1)"
BUILD_DIR="${KVZAP_BUILD_DIR:-build}"
if ! [ -x "$BUILD_DIR/kvzap" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$BUILD_DIR" -j"$(nproc)" --target kvzap
fi
KVZAP_BIN="$PWD/$BUILD_DIR/kvzap" exec "$PY" tests/python/check_kvpress_parity.py "$@"
