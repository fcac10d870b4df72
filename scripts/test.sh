#!/usr/bin/env bash
# The whole test suite: set-up, unit and end-to-end tests (ctest), then the golden peer checks
# against llama.cpp's recorded outputs. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR="${KVZAP_BUILD_DIR:-build}"
export KVZAP_BIN="$PWD/$BUILD_DIR/kvzap"
(cd "$BUILD_DIR" && ctest --output-on-failure -j"$(nproc)")
for t in tests/python/check_*.py; do
  echo "== $t"
  python3 "$t"
done
