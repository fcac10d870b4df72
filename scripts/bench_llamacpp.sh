#!/usr/bin/env bash
# Single-sequence speed against llama.cpp's llama-bench (pp512, tg128, tg128 at depth 4096 with the full
# cache and cut to 35 %), both catalogue models, 1 and 2 threads, alternating runs in one script; prints
# the table docs/BENCHMARKS.md records. Builds llama-bench once (scripts/build_llamacpp.sh, cached) and
# pulls the models once (kvzap pull). Arguments go to scripts/bench_llamacpp.py (see its --help).
# Run it on an otherwise idle machine: llama.cpp's thread pool collapses under any other load.
# Usage: bash scripts/bench_llamacpp.sh [--reps 3] [--threads 1,2] [--models smollm2-135m,qwen2.5-coder-0.5b]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "${KVZAP_BIN:-build/kvzap}" ] || bash scripts/setup.sh >&2
exec python3 scripts/bench_llamacpp.py --membw "$@"
