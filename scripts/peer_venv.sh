#!/usr/bin/env bash
# The peers' virtual environment (torch, transformers < 5.3 — what kvpress 0.5.5 accepts —, tokenizers,
# kvpress 0.5.5, numpy, safetensors), made if it lacks them; prints its python's path on the last line.
#   scripts/peer_venv.sh
# KVZAP_PEER_VENV: where (default /work/venv-parity, or .venv-peers in the repo when /work is not there).
# KVZAP_TORCH_INDEX: a pip index URL to take torch from (a CPU-only wheel index keeps the venv small);
# without it torch comes from the default index, CUDA libraries and all (about 2 minutes and 5.9 GB here).
# Exits non-zero when pip cannot install them (no network, no disk).
set -euo pipefail
cd "$(dirname "$0")/.."
default_venv=/work/venv-parity
[ -d /work ] || default_venv="$PWD/.venv-peers"
VENV="${KVZAP_PEER_VENV:-${KVZAP_PARITY_VENV:-$default_venv}}"
PY="$VENV/bin/python"
if ! [ -x "$PY" ] || ! "$PY" -c "import torch, transformers, tokenizers, kvpress, numpy, safetensors" 2>/dev/null; then
  echo "== making $VENV (torch, transformers<5.3, tokenizers, kvpress==0.5.5)" >&2
  start=$(date +%s)
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >&2
  if [ -n "${KVZAP_TORCH_INDEX:-}" ]; then
    "$VENV/bin/pip" install -q torch --index-url "$KVZAP_TORCH_INDEX" >&2
  fi
  "$VENV/bin/pip" install -q torch 'transformers>=4.56,<5.3' tokenizers 'kvpress==0.5.5' numpy safetensors >&2
  echo "== venv ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))" >&2
fi
echo "$PY"
