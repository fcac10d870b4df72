#!/usr/bin/env bash
# The whole test suite: set-up, unit and end-to-end tests (ctest), then the Python checks against peers
# (llama.cpp golden files, NumPy recomputations, tiny-model references, passkey retrieval) and the
# server tests (pytest).
# Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR="${KVZAP_BUILD_DIR:-build}"
export KVZAP_BIN="$PWD/$BUILD_DIR/kvzap"
(cd "$BUILD_DIR" && ctest --output-on-failure -j"$(nproc)")

failed=0
run_check() {
  echo "== $*"
  if ! python3 "$@"; then failed=$((failed + 1)); echo "!! FAILED: $*"; fi
}
run_check tests/python/check_golden.py
run_check tests/python/check_tiny_arch.py
run_check tests/python/check_surrogate_roundtrip.py --run "$BUILD_DIR/kvzap_tests"
[ -f tests/python/check_kvzip_numpy.py ] && run_check tests/python/check_kvzip_numpy.py
run_check tests/python/check_passkey.py
# The server: the real binary on loopback ports, called with the openai client and httpx. Any non-zero
# pytest status fails the run, including 5 (no tests collected).
echo "== pytest tests/python/test_server*.py"
pytest_rc=0
python3 -m pytest -q tests/python/test_server*.py || pytest_rc=$?
if [ "$pytest_rc" -ne 0 ]; then failed=$((failed + 1)); echo "!! FAILED: server tests (pytest exit $pytest_rc)"; fi
if [ "$failed" -ne 0 ]; then
  echo "$failed Python check(s) failed"
  exit 1
fi
echo "all Python checks passed"
