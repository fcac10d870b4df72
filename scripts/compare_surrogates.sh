#!/usr/bin/env bash
# Two sets of KVzap surrogates of one model, side by side on the same samples (docs/RESULTS.md,
# "Surrogates retrained on 8x data"): the RULER suite (one sweep per surrogate folder, same samples, so
# every difference is paired) and teacher-forced faithfulness (same windows), at the same thresholds.
#
#   scripts/compare_surrogates.sh OLD_DIR NEW_DIR    (each holds linear/ and mlp/ in kvpress format)
#
# Resumable: a finished sweep cell or faithfulness file is not run again. Writes the raw runs under WORK and
# two tables (suite.md, faithfulness.md, plus their csv) under OUT.
# Environment: KVZAP_BIN (build/kvzap), KVZAP_MODEL (default model), THREADS (2), WORK
# (runs/results/compare-surrogates), OUT (docs/results/compare-surrogates), THRESHOLDS (-5,-4,-3,-2,0),
# LENGTH (1024), SAMPLES (10), TASKS (the six of the SmolLM2 focused sweep), KINDS (mlp linear),
# FAITH_TEXT (data/eval/haystack/persuasion.txt), FAITH_CONTEXT (1024), FAITH_WINDOWS (8),
# DECODING_THRESHOLD (-3: one extra faithfulness run of kvzap-mlp that also prunes the continuation).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[ "$#" -eq 2 ] || { sed -n 2,14p "$0" >&2; exit 2; }
OLD="$(cd "$1" && pwd)" NEW="$(cd "$2" && pwd)"
BIN="${KVZAP_BIN:-$ROOT/build/kvzap}"
THREADS="${THREADS:-2}"
WORK="${WORK:-$ROOT/runs/results/compare-surrogates}"
OUT="${OUT:-$ROOT/docs/results/compare-surrogates}"
THRESHOLDS="${THRESHOLDS:--5,-4,-3,-2,0}"
LENGTH="${LENGTH:-1024}" SAMPLES="${SAMPLES:-10}" KINDS="${KINDS:-mlp linear}"
TASKS="${TASKS:-niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multivalue,qa_1}"
FAITH_TEXT="${FAITH_TEXT:-data/eval/haystack/persuasion.txt}"
FAITH_ARGS=(--context-tokens "${FAITH_CONTEXT:-1024}" --window-tokens 64 --windows "${FAITH_WINDOWS:-8}")
DECODING_THRESHOLD="${DECODING_THRESHOLD:--3}"
MODEL_ARGS=()
if [ -n "${KVZAP_MODEL:-}" ]; then MODEL_ARGS=(-m "$KVZAP_MODEL"); fi
[ -x "$BIN" ] || { echo "compare_surrogates: no kvzap binary at $BIN" >&2; exit 1; }
for d in "$OLD" "$NEW"; do
  for k in $KINDS; do [ -f "$d/$k/config.json" ] || { echo "compare_surrogates: no $d/$k/config.json" >&2; exit 1; }; done
done
mkdir -p "$WORK/faithfulness" "$OUT"

# Suite: the full cache once (in the `new` sweep), then each (set, kind) with its own --surrogate.
for set in new old; do
  dir="$NEW"; [ "$set" = old ] && dir="$OLD"
  for k in $KINDS; do
    base=(--no-baseline); [ "$set" = new ] && [ "$k" = "${KINDS%% *}" ] && base=()
    "$BIN" sweep "${MODEL_ARGS[@]}" --presses "kvzap-$k" --surrogate "$dir/$k" "${base[@]}" --thresholds="$THRESHOLDS" \
      --length "$LENGTH" --samples "$SAMPLES" --tasks "$TASKS" --out "$WORK/suite-$set-$k" -t "$THREADS" -q
  done
done

# Faithfulness: the same windows of FAITH_TEXT under each (set, kind, threshold).
faith() {  # set dir kind threshold [--decode-press]
  local f="$WORK/faithfulness/$1__kvzap-$3${5:++decoding}__threshold_$4.json"
  [ -f "$f" ] && return 0
  "$BIN" faithfulness "${MODEL_ARGS[@]}" --press "kvzap-$3" --surrogate "$2/$3" --threshold="$4" ${5:-} -f "$FAITH_TEXT" \
    "${FAITH_ARGS[@]}" -t "$THREADS" -q --out "$f.tmp" > /dev/null
  mv "$f.tmp" "$f"
}
for set in new old; do
  dir="$NEW"; [ "$set" = old ] && dir="$OLD"
  for k in $KINDS; do
    for t in ${THRESHOLDS//,/ }; do faith "$set" "$dir" "$k" "$t"; done
  done
  [ -n "$DECODING_THRESHOLD" ] && faith "$set" "$dir" mlp "$DECODING_THRESHOLD" --decode-press
done

python3 - "$WORK" "$OUT" "$THRESHOLDS" "$KINDS" "$DECODING_THRESHOLD" "$ROOT/scripts" <<'PY'
import csv, json, os, sys
work, out, thresholds, kinds, dec_t = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(), sys.argv[5]
sys.path.insert(0, sys.argv[6])
from paired_by_task import load, mean_se  # samples.jsonl by (task, index); paired mean and standard error

full = load(os.path.join(work, f"suite-new-{kinds[0]}", "no_press", "samples.jsonl"))
keys = sorted(full)
rows = []
for k in kinds:
    for t in thresholds:
        cell = f"kvzap-{k}__threshold_{float(t):g}"
        new = load(os.path.join(work, f"suite-new-{k}", cell, "samples.jsonl"))
        old = load(os.path.join(work, f"suite-old-{k}", cell, "samples.jsonl"))
        assert set(new) == set(old) == set(full), f"{cell}: the sweeps did not score the same samples"
        avg = lambda r: sum(r[q]["score"] for q in keys) / len(keys)
        ev = lambda r: sum(r[q]["evicted_fraction"] for q in keys) / len(keys)
        dn = mean_se([new[q]["score"] - full[q]["score"] for q in keys])
        do = mean_se([old[q]["score"] - full[q]["score"] for q in keys])
        dd = mean_se([new[q]["score"] - old[q]["score"] for q in keys])
        rows.append({"press": f"kvzap-{k}", "threshold": t, "evicted_new": round(ev(new), 3), "evicted_old": round(ev(old), 3),
                     "score_new": round(avg(new), 2), "score_old": round(avg(old), 2),
                     "new_vs_full": round(dn[0], 2), "new_vs_full_se": round(dn[1], 2),
                     "old_vs_full": round(do[0], 2), "old_vs_full_se": round(do[1], 2),
                     "new_vs_old": round(dd[0], 2), "new_vs_old_se": round(dd[1], 2),
                     "same_prediction": sum(new[q]["prediction"] == old[q]["prediction"] for q in keys), "samples": len(keys)})
full_avg = sum(r["score"] for r in full.values()) / len(full)
with open(os.path.join(out, "suite.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
with open(os.path.join(out, "suite.md"), "w") as f:
    f.write(f"Full cache: {full_avg:.2f} on {len(full)} samples.\n\n")
    f.write("| Press | τ | Evicted new / old | Score new | Score old | New − full | Old − full | New − old | Same answer |\n")
    f.write("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        f.write(f"| {r['press']} | {r['threshold']} | {r['evicted_new']:.3f} / {r['evicted_old']:.3f} | {r['score_new']:.2f} | "
                f"{r['score_old']:.2f} | {r['new_vs_full']:+.2f} ± {r['new_vs_full_se']:.2f} | {r['old_vs_full']:+.2f} ± "
                f"{r['old_vs_full_se']:.2f} | {r['new_vs_old']:+.2f} ± {r['new_vs_old_se']:.2f} | {r['same_prediction']}/{r['samples']} |\n")

frows = []
runs = [(k, t, "") for k in kinds for t in thresholds] + ([("mlp", dec_t, "+decoding")] if dec_t else [])
for k, t, dec in runs:
    get = lambda s: json.load(open(os.path.join(work, "faithfulness", f"{s}__kvzap-{k}{dec}__threshold_{t}.json")))
    new, old = get("new"), get("old")
    d = mean_se([a - b for a, b in zip(new["kl_by_window"], old["kl_by_window"])])
    frows.append({"press": f"kvzap-{k}{dec}", "threshold": t, "evicted_new": round(new["evicted_fraction"], 3),
                  "evicted_old": round(old["evicted_fraction"], 3), "kl_new": round(new["mean_kl"], 4),
                  "kl_old": round(old["mean_kl"], 4), "kl_new_minus_old": round(d[0], 4), "kl_diff_se_over_windows": round(d[1], 4),
                  "top1_new": round(new["top1_agreement"], 1), "top1_old": round(old["top1_agreement"], 1),
                  "dnll_new": round(new["nll_diff"], 3), "dnll_old": round(old["nll_diff"], 3), "positions": new["positions"]})
with open(os.path.join(out, "faithfulness.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(frows[0]))
    w.writeheader()
    w.writerows(frows)
with open(os.path.join(out, "faithfulness.md"), "w") as f:
    f.write("| Press | τ | Evicted new / old | KL new | KL old | New − old (± s.e. over windows) | Top-1 % new / old | ΔNLL new / old |\n")
    f.write("|---|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in frows:
        f.write(f"| {r['press']} | {r['threshold']} | {r['evicted_new']:.3f} / {r['evicted_old']:.3f} | {r['kl_new']:.4f} | "
                f"{r['kl_old']:.4f} | {r['kl_new_minus_old']:+.4f} ± {r['kl_diff_se_over_windows']:.4f} | {r['top1_new']:.1f} / "
                f"{r['top1_old']:.1f} | {r['dnll_new']:+.3f} / {r['dnll_old']:+.3f} |\n")
print(open(os.path.join(out, "suite.md")).read())
print(open(os.path.join(out, "faithfulness.md")).read())
PY
