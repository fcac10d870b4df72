#!/usr/bin/env bash
# Full live peer check of kvzap against llama.cpp (through llama-cpp-python):
#   1. tests/python/peer_forward.py --check   scoring + greedy generation, llama.cpp computed live
#   2. tests/python/peer_tokenize.py --check  tokenizer cases, llama.cpp computed live
# Builds nothing: point KVZAP_BIN at a built kvzap (default build/kvzap). The model is found through
# KVZAP_MODEL / KVZAP_MODELS / ~/.cache/kvzap/models. Extra arguments go to peer_forward.py
# (e.g. -t 4). Installs llama-cpp-python with pip when it is missing (compiles llama.cpp: minutes).
# Exit status: 0 only when both checks pass.
set -u

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
export KVZAP_BIN="${KVZAP_BIN:-$repo/build/kvzap}"

if [[ ! -x "$KVZAP_BIN" ]]; then
  echo "error: kvzap binary not found or not executable: $KVZAP_BIN (build it or set KVZAP_BIN)" >&2
  exit 2
fi

if ! "$python" -c "import llama_cpp, numpy" 2>/dev/null; then
  echo "llama-cpp-python not installed: installing with pip (builds llama.cpp from source) ..."
  "$python" -m pip install --quiet llama-cpp-python numpy || {
    echo "error: pip install llama-cpp-python failed" >&2
    exit 2
  }
fi
"$python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"

status=0
echo "== forward pass: tests/python/peer_forward.py --check $*"
"$python" "$repo/tests/python/peer_forward.py" --check "$@" || status=1

echo "== tokenizer: tests/python/peer_tokenize.py --check"
if [[ -f "$repo/tests/python/peer_tokenize.py" ]]; then
  "$python" "$repo/tests/python/peer_tokenize.py" --check || status=1
else
  echo "error: tests/python/peer_tokenize.py is missing" >&2
  status=1
fi

if [[ $status -eq 0 ]]; then echo "peer check: PASS"; else echo "peer check: FAIL"; fi
exit $status
