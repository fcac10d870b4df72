#!/usr/bin/env bash
# Reproduces the shipped KVzap surrogates of the default model (SmolLM2-135M-Instruct Q4_1):
#   data/surrogates/Smollm2_135M_8k_Lc100K_Mix1_Ep2/{linear,mlp}/ (config.json, model.safetensors,
#   kvzap.json) plus the training report and the threshold calibration next to them.
# Steps (docs/TRAINING.md explains each): corpus -> KVzip+ targets (test, then train split) -> ridge +
# MLP -> threshold calibration on the corpus test split. Collection is resumable: if the script is
# interrupted, run it again and it continues where it stopped.
#
# Environment: KVZAP_BIN (default build/kvzap), KVZAP_MODEL (default: the pulled default model),
# THREADS (default 2), WORK (intermediate files, default runs/train_default), DEST (the shipped folder),
# TEST_WINDOWS / TRAIN_WINDOWS / TEST_POSITIONS / TRAIN_POSITIONS (data sizes, default 24 / 720 / 200 / 500).
# About 1 hour on 2 cores (docs/TRAINING.md has measured timings); the datasets take
# ~12 GB under $WORK.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${KVZAP_BIN:-$ROOT/build/kvzap}"
THREADS="${THREADS:-2}"
WORK="${WORK:-$ROOT/runs/train_default}"
DEST="${DEST:-$ROOT/data/surrogates/Smollm2_135M_8k_Lc100K_Mix1_Ep2}"
# Data sizes (the default model's; docs/TRAINING.md §8 gives the Qwen2.5-Coder-0.5B settings).
TEST_WINDOWS="${TEST_WINDOWS:-24}" TRAIN_WINDOWS="${TRAIN_WINDOWS:-720}"
TEST_POSITIONS="${TEST_POSITIONS:-200}" TRAIN_POSITIONS="${TRAIN_POSITIONS:-500}"
CORPUS="$ROOT/data/corpus-build"
MODEL_ARGS=()
if [ -n "${KVZAP_MODEL:-}" ]; then MODEL_ARGS=(-m "$KVZAP_MODEL"); fi

[ -x "$BIN" ] || { echo "train_default: no kvzap binary at $BIN (build first or set KVZAP_BIN)" >&2; exit 1; }
if [ ! -f "$CORPUS/train.txt" ]; then bash "$ROOT/scripts/make_corpus.sh" "$CORPUS"; fi
mkdir -p "$WORK" "$DEST"

stamp() { date +%s; }
t0=$(stamp)
# Held-out pairs first (corpus test split: other documents than the training ones).
"$BIN" collect "${MODEL_ARGS[@]}" --corpus "$CORPUS" --split test --out "$WORK/test.kvzd" \
  --windows "$TEST_WINDOWS" --tokens-per-window "$TEST_POSITIONS" --seed 0 -t "$THREADS"
t1=$(stamp)
"$BIN" collect "${MODEL_ARGS[@]}" --corpus "$CORPUS" --split train --out "$WORK/train.kvzd" \
  --windows "$TRAIN_WINDOWS" --tokens-per-window "$TRAIN_POSITIONS" --seed 0 -t "$THREADS"
t2=$(stamp)
"$BIN" train --data "$WORK/train.kvzd" --test "$WORK/test.kvzd" --out "$WORK/surrogates" --kind both \
  --epochs 15 --lr 5e-3 --batch 512 --seed 0 -t "$THREADS"
t3=$(stamp)

for kind in linear mlp; do
  mkdir -p "$DEST/$kind"
  cp "$WORK/surrogates/$kind/config.json" "$WORK/surrogates/$kind/model.safetensors" "$DEST/$kind/"
done
cp "$WORK/surrogates/report.json" "$WORK/surrogates/report.md" "$DEST/"

# Thresholds: evicted fraction per threshold on held-out texts; the default is the grid point
# closest to 55 % eviction (docs/TRAINING.md, "Default thresholds").
"$BIN" calibrate "${MODEL_ARGS[@]}" --surrogate "$DEST/linear" --surrogate "$DEST/mlp" --corpus "$CORPUS" \
  --split test --max-files 16 --max-tokens 2048 --window 128 --thresholds=-10:0:0.5 --target 0.55 \
  --out-dir "$DEST" --write-default -t "$THREADS" | tee "$DEST/calibration.md"
t4=$(stamp)

echo "train_default: collect test $((t1 - t0)) s, collect train $((t2 - t1)) s, train $((t3 - t2)) s, calibrate $((t4 - t3)) s"
echo "train_default: surrogates in $DEST"
