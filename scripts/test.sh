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
skipped=0
# Runs one Python check, echoing its output; counts its failure and the lines it starts with "SKIPPED".
run_check() {
  echo "== $*"
  local log rc=0
  log="$(mktemp)"
  "${CHECK_PYTHON:-python3}" "$@" 2>&1 | tee "$log" || rc=$?
  skipped=$((skipped + $(grep -c '^SKIPPED' "$log" || true)))
  rm -f "$log"
  if [ "$rc" -ne 0 ]; then failed=$((failed + 1)); echo "!! FAILED: $*"; fi
}
run_check tests/python/check_golden.py
# Gemma-3-270M (gemma3 + SentencePiece) against llama.cpp's stored results; SKIPPED unless pulled.
run_check tests/python/check_gemma3.py
run_check tests/python/check_tiny_arch.py
# Hugging Face checkpoints and tokenizer.json against transformers/tokenizers, and the presses against
# kvpress, on tiny random models the checks write. KVZAP_PEER_CHECKS=1 (CI sets it) makes the peers' venv
# (scripts/peer_venv.sh: torch, transformers, tokenizers, kvpress; about 2 minutes cold) and runs both
# with KVZAP_REQUIRE_PEERS=1, so a missing peer fails instead of passing unchecked; otherwise check_hf
# runs with this python3 (SKIPPED without torch + transformers + tokenizers) and parity is left to
# scripts/kvpress_parity.sh.
if [ "${KVZAP_PEER_CHECKS:-0}" = 1 ]; then
  echo "== the peers' venv (scripts/peer_venv.sh)"
  if peer_py="$(bash scripts/peer_venv.sh | tail -1)"; then
    CHECK_PYTHON="$peer_py" KVZAP_REQUIRE_PEERS=1 run_check tests/python/check_hf.py
    CHECK_PYTHON="$peer_py" KVZAP_REQUIRE_PEERS=1 run_check tests/python/check_kvpress_parity.py
  else
    peer_py=""
    failed=$((failed + 1)); echo "!! FAILED: the peers' venv (pip could not install torch, transformers, tokenizers, kvpress)"
  fi
else
  run_check tests/python/check_hf.py
  echo "SKIPPED: kvpress parity (KVZAP_PEER_CHECKS=1 or scripts/kvpress_parity.sh runs it)"
  skipped=$((skipped + 1))
fi
run_check tests/python/check_surrogate_roundtrip.py --run "$BUILD_DIR/kvzap_tests"
run_check tests/python/check_kvzip_numpy.py
run_check tests/python/check_passkey.py
# The Jinja chat-template renderer against Python jinja2 on the real templates (tests/golden/templates/).
run_check tests/python/check_chat_templates.py
run_check tests/python/check_pull_catalogue.py
# The server: the real binary on loopback ports, called with the openai client and httpx. Any non-zero
# pytest status fails the run, including 5 (no tests collected).
echo "== pytest tests/python/test_server*.py"
pytest_rc=0
python3 -m pytest -q tests/python/test_server*.py || pytest_rc=$?
if [ "$pytest_rc" -ne 0 ]; then failed=$((failed + 1)); echo "!! FAILED: server tests (pytest exit $pytest_rc)"; fi
# The Python package (docs/python.md): built against $BUILD_DIR's libkvzap.so in a fresh venv (only the
# nanobind binding compiles), pytest against the installed package (scripts/test_python_pkg.sh). About 1 min
# on 2 cores with cold caches (venv, PyPI build tools, binding, 62 tests). KVZAP_PYTHON_TESTS=0 skips it.
if [ "${KVZAP_PYTHON_TESTS:-1}" = 1 ]; then
  echo "== python package tests"
  if ! bash scripts/test_python_pkg.sh; then failed=$((failed + 1)); echo "!! FAILED: python package tests"; fi
  # Parity while decoding (dms_knorm, decoding_knorm, compression_ratio_decoding_knorm against kvpress): the
  # kvpress half in the peers' venv, the kvzap half in the package's venv just built. About 2 minutes.
  if [ -n "${peer_py:-}" ]; then
    for check in tests/python/check_dms_decoding.py tests/python/check_decoding_press.py; do
      KVZAP_PY="${KVZAP_PY_VENV:-$BUILD_DIR/venv-py}/bin/python" CHECK_PYTHON="$peer_py" KVZAP_REQUIRE_PEERS=1 \
        run_check "$check"
    done
  else
    echo "SKIPPED: kvpress parity while decoding (KVZAP_PEER_CHECKS=1 runs it)"
    skipped=$((skipped + 1))
  fi
else
  echo "SKIPPED: python package tests (KVZAP_PYTHON_TESTS=0)"
  skipped=$((skipped + 1))
fi
# Sanitizer jobs (scripts/test_sanitizers.sh, docs/RELIABILITY.md): the whole suite under ASan+UBSan, the
# threaded parts and the server tests under TSan, each in its own build folder. Off unless
# KVZAP_SANITIZERS=1 (or a job list: KVZAP_SANITIZERS=asan,tsan); .ci/run sets KVZAP_SANITIZERS=asan,tsan
# (docs/RELIABILITY.md: cold-cache times; CI must finish within 90 minutes on 2 cores).
san="${KVZAP_SANITIZERS:-0}"
if [ "$san" != 0 ]; then
  san_jobs=(); [ "$san" != 1 ] && read -r -a san_jobs <<<"${san//,/ }"
  echo "== sanitizer jobs: ${san_jobs[*]:-asan tsan}"
  if ! bash scripts/test_sanitizers.sh "${san_jobs[@]}"; then failed=$((failed + 1)); echo "!! FAILED: sanitizer jobs"; fi
else
  echo "SKIPPED: sanitizer jobs (KVZAP_SANITIZERS=1 runs them)"
  skipped=$((skipped + 1))
fi
# Fuzzing (scripts/fuzz.sh): every harness for KVZAP_FUZZ_SECONDS each (KVZAP_FUZZ_PARALLEL at a time);
# off unless set. KVZAP_FUZZ_START_BY (a Unix time) guards a time limit: a fuzz job that would start
# later is SKIPPED with the reason, so a slow machine never pushes CI past its limit.
fz="${KVZAP_FUZZ_SECONDS:-0}"
if [ "$fz" != 0 ] && [ -n "${KVZAP_FUZZ_START_BY:-}" ] && [ "$(date +%s)" -gt "$KVZAP_FUZZ_START_BY" ]; then
  echo "SKIPPED: fuzzing (the run is $(( $(date +%s) - KVZAP_FUZZ_START_BY ))s past KVZAP_FUZZ_START_BY: no time left)"
  skipped=$((skipped + 1))
elif [ "$fz" != 0 ]; then
  echo "== fuzz: every harness for ${fz}s"
  # Appends this pass to a copy of the project's ledger and prints the accumulated totals (scripts/
  # fuzz_totals.sh), so the ledger format is checked on every run; fuzz/ledger.tsv itself is not touched.
  fz_ledger="${KVZAP_FUZZ_BUILD_DIR:-build-fuzz}/ledger.tsv"
  mkdir -p "$(dirname "$fz_ledger")" && cp fuzz/ledger.tsv "$fz_ledger"
  if ! KVZAP_FUZZ_LEDGER="$fz_ledger" bash scripts/fuzz.sh "$fz"; then failed=$((failed + 1)); echo "!! FAILED: fuzzing"; fi
else
  echo "SKIPPED: fuzzing (KVZAP_FUZZ_SECONDS=N runs every harness for N seconds)"
  skipped=$((skipped + 1))
fi
if [ "$failed" -ne 0 ]; then
  echo "$failed check(s) failed, $skipped SKIPPED"
  exit 1
fi
echo "all checks passed ($skipped SKIPPED lines from the Python checks and the optional jobs; ctest lists its own skips)"
