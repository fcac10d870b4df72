#!/usr/bin/env bash
# The exact commands behind docs/RESULTS.md (SmolLM2-135M-Instruct Q4_1, 2 threads).
#
#   scripts/run_results.sh [calibration|sweep|focus|report|faithfulness|all]   (default: all)
#
# Raw per-sample outputs go to runs/results/ (git-ignored); the small, committed files (per-task CSV,
# summaries, leaderboard, SVG plots, faithfulness JSON) are copied into docs/results/. Every step is
# resumable: a finished eval cell (its summary.json exists) or faithfulness file is not run again, so
# the script can be stopped and restarted. Delete runs/results/ to start from scratch.
#
# Environment: KVZAP_BIN (default build/kvzap), THREADS (default 2), KVZAP_MODEL (-m for every run: a
# path or a catalogue name; default: the default model).
# Every setting below can be overridden from the environment (same name), so the same steps run for
# another model or length; docs/RESULTS.md gives the Qwen2.5-Coder-0.5B 4k settings, e.g.
#   KVZAP_MODEL=qwen2.5-coder-0.5b WORK=runs/results-qwen05 OUT=docs/results/qwen05-4k \
#     CALIBRATION_LENGTHS=4096 LENGTH=4096 FAITH_CONTEXT=4096 FAITH_WINDOWS=2 scripts/run_results.sh faithfulness
set -euo pipefail
cd "$(dirname "$0")/.."

KVZAP="${KVZAP_BIN:-build/kvzap}"
THREADS="${THREADS:-2}"
WORK="${WORK:-runs/results}"
OUT="${OUT:-docs/results}"
step="${1:-all}"

# The operating point of the sweep (see docs/RESULTS.md, "Choosing the length and the tasks").
CALIBRATION_LENGTHS="${CALIBRATION_LENGTHS:-512 1024 2048}"
LENGTH="${LENGTH:-1024}"
SAMPLES="${SAMPLES:-5}"
TASKS="${TASKS:-niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multivalue,qa_1}"
RATIO_PRESSES="${RATIO_PRESSES:-random,knorm,streaming_llm,snapkv,expected_attention,kvzip}"
RATIOS="${RATIOS:-0.25,0.5,0.75,0.875}"
KVZAP_PRESSES="${KVZAP_PRESSES:-kvzap-linear,kvzap-mlp}"
THRESHOLDS="${THRESHOLDS:--5,-4,-3,-2,0}"
FAITH_THRESHOLDS="${FAITH_THRESHOLDS:-$THRESHOLDS}"
DECODING_THRESHOLD="${DECODING_THRESHOLD:--3}"

# A second, focused sweep with twice the samples where the question is decided (evicted 0.5-0.75):
# the strongest baselines against KVzap, 10 samples per task (samples 0-4 are the main sweep's).
FOCUS_SAMPLES="${FOCUS_SAMPLES:-10}"
FOCUS_RATIO_PRESSES="${FOCUS_RATIO_PRESSES:-kvzip,expected_attention}"
FOCUS_RATIOS="${FOCUS_RATIOS:-0.5,0.75}"
FOCUS_THRESHOLDS="${FOCUS_THRESHOLDS:--4,-3,-2}"

# Faithfulness: teacher-forced windows of held-out text (an eval haystack novel, never training text).
FAITH_TEXT="${FAITH_TEXT:-data/eval/haystack/persuasion.txt}"
FAITH_ARGS=(--context-tokens "${FAITH_CONTEXT:-1024}" --window-tokens "${FAITH_WINDOW_TOKENS:-64}" --windows "${FAITH_WINDOWS:-8}")
FAITH_RATIO_PRESSES="${FAITH_RATIO_PRESSES:-$RATIO_PRESSES}"
FAITH_RATIOS="${FAITH_RATIOS:-$RATIOS}"

MODEL_ARGS=()
if [[ -n "${KVZAP_MODEL:-}" ]]; then MODEL_ARGS=(-m "$KVZAP_MODEL"); fi
CALIBRATION_SAMPLES="${CALIBRATION_SAMPLES:-5}"

[[ -x "$KVZAP" ]] || { echo "no kvzap binary at $KVZAP (build first, or set KVZAP_BIN)" >&2; exit 1; }
mkdir -p "$WORK" "$OUT"

have_kvzap_surrogates() {
  # The kvzap presses need shipped surrogates (data/surrogates/<model>/{linear,mlp}).
  compgen -G "data/surrogates/*/linear/config.json" > /dev/null && compgen -G "data/surrogates/*/mlp/config.json" > /dev/null
}

# 1. Where does the full cache do well? All 13 tasks, 5 samples each, at three lengths.
calibration() {
  for L in $CALIBRATION_LENGTHS; do
    local dir="$WORK/calibration/L$L"
    if [[ ! -f "$dir/summary.json" ]]; then
      "$KVZAP" eval "${MODEL_ARGS[@]}" --suite ruler --length "$L" --samples "$CALIBRATION_SAMPLES" --out "$dir" -t "$THREADS" -q
    fi
    mkdir -p "$OUT/calibration/L$L"
    cp "$dir/tasks.csv" "$dir/summary.json" "$OUT/calibration/L$L/"
  done
}

# 2. The press x setting grid at LENGTH (resumable; results.csv holds every row incl. no_press).
sweep() {
  local presses="$RATIO_PRESSES"
  if have_kvzap_surrogates; then presses="$presses,$KVZAP_PRESSES"; else
    echo "note: no KVzap surrogates in data/surrogates/, sweeping the baselines only" >&2
  fi
  local t0=$SECONDS
  "$KVZAP" sweep "${MODEL_ARGS[@]}" --presses "$presses" --ratios "$RATIOS" --thresholds "$THRESHOLDS" \
    --length "$LENGTH" --samples "$SAMPLES" --tasks "$TASKS" --out "$WORK/sweep-$LENGTH" -t "$THREADS" \
    > "$WORK/sweep-$LENGTH.md"
  echo "sweep: $((SECONDS - t0)) s wall in this invocation" >&2
}

# 2b. The focused sweep (needs the KVzap surrogates).
focus() {
  have_kvzap_surrogates || { echo "no KVzap surrogates: skipping the focused sweep" >&2; return 0; }
  local t0=$SECONDS
  "$KVZAP" sweep "${MODEL_ARGS[@]}" --presses "$FOCUS_RATIO_PRESSES,$KVZAP_PRESSES" --ratios "$FOCUS_RATIOS" --thresholds "$FOCUS_THRESHOLDS" \
    --length "$LENGTH" --samples "$FOCUS_SAMPLES" --tasks "$TASKS" --out "$WORK/focus-$LENGTH" -t "$THREADS" \
    > "$WORK/focus-$LENGTH.md"
  echo "focused sweep: $((SECONDS - t0)) s wall in this invocation" >&2
}

# 3. Leaderboard + plots, and the per-cell summaries (small) next to them.
report() {
  report_one sweep "$SAMPLES"
  [[ -d "$WORK/focus-$LENGTH" ]] && report_one focus "$FOCUS_SAMPLES"
  return 0
}

report_one() {  # sweep-name samples-per-task
  local src="$WORK/$1-$LENGTH" dst="$OUT/ruler-$LENGTH"
  [[ "$1" == sweep ]] || dst="$OUT/ruler-$LENGTH-$1"
  "$KVZAP" report "$src" --out "$dst" \
    --title "RULER $LENGTH, $2 per task" > /dev/null
  mkdir -p "$dst/cells"
  for cell in "$src"/*/; do
    [[ -f "$cell/summary.json" ]] && cp "$cell/summary.json" "$dst/cells/$(basename "$cell").json"
  done
  # Paired differences to the full cache (same samples), and the sweep's total cell time.
  python3 - "$src" "$dst" <<'EOF'
import json, math, os, sys, csv
src, dst = sys.argv[1], sys.argv[2]
def load(cell):
    with open(os.path.join(src, cell, "samples.jsonl")) as f:
        return {(r["task"], r["index"]): r for r in map(json.loads, f)}
cells = sorted(c for c in os.listdir(src) if os.path.isfile(os.path.join(src, c, "summary.json")))
base = load("no_press")
rows, wall, prefill = [], 0.0, {}
for c in cells:
    s = json.load(open(os.path.join(src, c, "summary.json")))
    wall += s["timings"]["wall_s"]
    # A sweep that prefilled each context once for all cells: every cell records that prefill's time on
    # its first sample of the context; count it once per sample.
    for k, r in load(c).items():
        t = r.get("timings", {}).get("shared_prefill_s", 0.0)
        if t > 0:
            prefill[k] = max(prefill.get(k, 0.0), t)
    if c == "no_press":
        continue
    d = [r["score"] - base[k]["score"] for k, r in load(c).items()]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    rows.append({"press": s["press"], "setting_kind": s["setting_kind"], "setting": s["setting"],
                 "evicted_fraction": round(s["evicted_fraction"], 4), "n": n,
                 "mean_diff_vs_full": round(mean, 2), "stderr": round(sd / math.sqrt(n), 2),
                 "wall_s": round(s["timings"]["wall_s"], 1)})
rows.sort(key=lambda r: (r["press"], r["setting"]))
with open(os.path.join(dst, "paired_vs_full.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)
shared = sum(prefill.values())
json.dump({"cells": len(cells), "sum_of_cell_wall_s": round(wall, 1), "shared_prefill_s": round(shared, 1),
           "total_s": round(wall + shared, 1)}, open(os.path.join(dst, "sweep_time.json"), "w"), indent=2)
print(f"paired differences: {dst}/paired_vs_full.csv; cells: {len(cells)}, summed cell wall time {wall/60:.1f} min"
      f" + shared prefills {shared/60:.1f} min")
EOF
}

# 4. Teacher-forced agreement with the full cache for the same presses and settings.
faithfulness() {
  local dir="$OUT/faithfulness"
  mkdir -p "$dir"
  run_one() {  # press kind value [--decoding]
    local f="$dir/$1${4:++decoding}__$2_$3.json"
    [[ -f "$f" ]] && return 0
    "$KVZAP" faithfulness "${MODEL_ARGS[@]}" --press "$1" "--$2" "$3" ${4:-} -f "$FAITH_TEXT" "${FAITH_ARGS[@]}" -t "$THREADS" -q \
      --out "$f.tmp" > /dev/null
    mv "$f.tmp" "$f"
  }
  local p r t
  for p in ${FAITH_RATIO_PRESSES//,/ }; do
    for r in ${FAITH_RATIOS//,/ }; do run_one "$p" ratio "$r"; done
  done
  if have_kvzap_surrogates; then
    for p in ${KVZAP_PRESSES//,/ }; do
      for t in ${FAITH_THRESHOLDS//,/ }; do run_one "$p" threshold "$t"; done
    done
    # Pruning the continuation too (the tail of the context then leaves the protected window).
    run_one kvzap-mlp threshold "$DECODING_THRESHOLD" --decoding
  fi
  # One CSV, and report-format rows (score = top-1 agreement in %) so `kvzap report` can plot them.
  python3 - "$dir" <<'EOF'
import csv, glob, json, os, sys
d = sys.argv[1]
rs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(d, "*.json")))]
for r in rs:
    if r["decoding"]:
        r["press"] += "+decoding"
rs.sort(key=lambda r: (r["press"], r["setting"]))
keys = ["press", "setting_kind", "setting", "evicted_fraction", "evicted_fraction_end", "mean_kl", "max_kl",
        "top1_agreement", "nll_full", "nll_pressed", "nll_diff", "ppl_ratio", "positions", "seconds"]
with open(os.path.join(d, "faithfulness.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(keys)
    for r in rs:
        w.writerow([round(r[k], 5) if isinstance(r[k], float) else r[k] for k in keys])
with open(os.path.join(d, "top1_rows.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["press", "setting_kind", "setting", "task", "n", "score", "evicted_fraction"])
    w.writerow(["no_press", "none", 0, "top1_agreement", rs[0]["positions"] if rs else 0, 100, 0])
    for r in rs:
        w.writerow([r["press"], r["setting_kind"], r["setting"], "top1_agreement", r["positions"],
                    r["top1_agreement"], r["evicted_fraction"]])
EOF
  "$KVZAP" report "$dir/top1_rows.csv" --out "$dir/report" \
    --title "Top-1 agreement ($(basename "$FAITH_TEXT" .txt), ${FAITH_CONTEXT:-1024}-token contexts)" > /dev/null
}

case "$step" in
  calibration) calibration ;;
  sweep) sweep ;;
  focus) focus ;;
  report) report ;;
  faithfulness) faithfulness ;;
  all) calibration; sweep; focus; report; faithfulness ;;
  *) echo "unknown step '$step' (calibration|sweep|focus|report|faithfulness|all)" >&2; exit 2 ;;
esac
