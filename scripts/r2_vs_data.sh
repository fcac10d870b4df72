#!/usr/bin/env bash
# Held-out R² of the KVzap surrogates against the amount of training data (docs/TRAINING.md §4.1):
# one KVzip+ collection of TRAIN_WINDOWS windows, and the surrogates retrained on its first
# BASE_PAIRS x m pairs for m in MULTIPLES (the first windows of a collection do not depend on how many
# are collected, so each prefix is the dataset a shorter collection would have made; m = 1 is the data
# of the shipped surrogates). Writes OUT/r2_vs_data.csv and OUT/r2_vs_data.svg.
#
#   scripts/r2_vs_data.sh            (resumable: a finished collection or training is not run again)
#
# Environment: KVZAP_BIN (default build/kvzap), KVZAP_MODEL (default: the default model), THREADS (2),
# WORK (default runs/r2_vs_data; ~13 GB of datasets for the default sizes), OUT (docs/results/r2_vs_data),
# TEST_WINDOWS / TEST_POSITIONS (24 / 200), TRAIN_WINDOWS / TRAIN_POSITIONS (1440 / 250: the windows of the
# largest multiple, the last of MULTIPLES),
# BASE_PAIRS (45000), MULTIPLES ("1 2 4 8"), EPOCHS (15).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BIN="${KVZAP_BIN:-$ROOT/build/kvzap}"
THREADS="${THREADS:-2}"
WORK="${WORK:-$ROOT/runs/r2_vs_data}"
OUT="${OUT:-$ROOT/docs/results/r2_vs_data}"
TEST_WINDOWS="${TEST_WINDOWS:-24}" TEST_POSITIONS="${TEST_POSITIONS:-200}"
TRAIN_WINDOWS="${TRAIN_WINDOWS:-1440}" TRAIN_POSITIONS="${TRAIN_POSITIONS:-250}"
BASE_PAIRS="${BASE_PAIRS:-45000}" MULTIPLES="${MULTIPLES:-1 2 4 8}" EPOCHS="${EPOCHS:-15}"
CORPUS="$ROOT/data/corpus-build"
MODEL_ARGS=()
if [ -n "${KVZAP_MODEL:-}" ]; then MODEL_ARGS=(-m "$KVZAP_MODEL"); fi

[ -x "$BIN" ] || { echo "r2_vs_data: no kvzap binary at $BIN (build first or set KVZAP_BIN)" >&2; exit 1; }
if [ ! -f "$CORPUS/train.txt" ]; then bash "$ROOT/scripts/make_corpus.sh" "$CORPUS"; fi
mkdir -p "$WORK" "$OUT"

"$BIN" collect "${MODEL_ARGS[@]}" --corpus "$CORPUS" --split test --out "$WORK/test.kvzd" \
  --windows "$TEST_WINDOWS" --tokens-per-window "$TEST_POSITIONS" --seed 0 -t "$THREADS"
# Collected in stages (each a prefix of the next), each size trained as soon as its windows are in, so
# an interrupted run has the smaller sizes' results.
for m in $MULTIPLES; do
  dir="$WORK/x$m"
  [ -f "$dir/report.json" ] && continue
  t0=$SECONDS
  "$BIN" collect "${MODEL_ARGS[@]}" --corpus "$CORPUS" --split train --out "$WORK/train.kvzd" \
    --windows $((TRAIN_WINDOWS * m / ${MULTIPLES##* })) --tokens-per-window "$TRAIN_POSITIONS" --seed 0 -t "$THREADS"
  echo "r2_vs_data: collection up to x$m: $((SECONDS - t0)) s in this run" >&2
  t0=$SECONDS
  "$BIN" train --data "$WORK/train.kvzd" --test "$WORK/test.kvzd" --out "$dir" --kind both \
    --max-pairs $((BASE_PAIRS * m)) --epochs "$EPOCHS" --lr 5e-3 --batch 512 --seed 0 -t "$THREADS" > /dev/null
  echo "r2_vs_data: x$m trained in $((SECONDS - t0)) s" >&2
done

python3 - "$WORK" "$OUT" "$MULTIPLES" <<'PY'
import csv, json, os, sys
work, out, multiples = sys.argv[1], sys.argv[2], [int(m) for m in sys.argv[3].split()]
rows = []
for m in multiples:
    r = json.load(open(os.path.join(work, f"x{m}", "report.json")))
    row = {"multiple": m, "train_pairs": r["options"]["n_train"], "test_pairs": r["options"]["n_test"]}
    for kind in ("linear", "mlp"):
        mod = r["models"][kind]
        row[f"{kind}_r2"] = round(mod["mean_r2"], 4)
        row[f"{kind}_min_layer_r2"] = round(min(mod["per_layer"]), 4)
        row[f"{kind}_train_s"] = round(mod["train_seconds"], 1)
    rows.append(row)
with open(os.path.join(out, "r2_vs_data.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
    w.writeheader()
    w.writerows(rows)
# SVG: mean held-out R² (y) against training pairs (x, log2 axis), one line per surrogate.
W, H, L, B, T, R = 640, 400, 70, 55, 40, 130
xs = [r["train_pairs"] for r in rows]
import math
lx0, lx1 = math.log2(min(xs)), math.log2(max(xs)) if max(xs) > min(xs) else math.log2(min(xs)) + 1
ys = [r[k] for r in rows for k in ("linear_r2", "mlp_r2")]
y0, y1 = math.floor(min(ys) * 20) / 20, math.ceil(max(ys) * 20) / 20 + 1e-9
X = lambda x: L + (W - L - R) * (math.log2(x) - lx0) / (lx1 - lx0)
Y = lambda y: H - B - (H - B - T) * (y - y0) / (y1 - y0)
s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
     f'<rect width="{W}" height="{H}" fill="white"/>',
     f'<text x="{(W - R + L) / 2}" y="22" text-anchor="middle" font-size="15">Held-out R² against training pairs</text>',
     f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/><line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>',
     f'<text x="{(W - R + L) / 2}" y="{H - 12}" text-anchor="middle">training pairs (log scale)</text>',
     f'<text x="16" y="{(H - B + T) / 2}" text-anchor="middle" transform="rotate(-90 16 {(H - B + T) / 2})">mean R² (squared Pearson)</text>']
for x in xs:
    s.append(f'<line x1="{X(x):.1f}" y1="{H-B}" x2="{X(x):.1f}" y2="{H-B+5}" stroke="black"/>')
    s.append(f'<text x="{X(x):.1f}" y="{H-B+19}" text-anchor="middle">{x:,}</text>')
k = 0
while y0 + k * 0.05 <= y1:
    y = y0 + k * 0.05
    s.append(f'<line x1="{L}" y1="{Y(y):.1f}" x2="{W-R}" y2="{Y(y):.1f}" stroke="#ddd"/>')
    s.append(f'<text x="{L-8}" y="{Y(y)+4:.1f}" text-anchor="end">{y:.2f}</text>')
    k += 1
for i, (kind, colour) in enumerate((("linear", "#1f77b4"), ("mlp", "#d62728"))):
    pts = " ".join(f"{X(r['train_pairs']):.1f},{Y(r[kind + '_r2']):.1f}" for r in rows)
    s.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
    for r in rows:
        s.append(f'<circle cx="{X(r["train_pairs"]):.1f}" cy="{Y(r[kind + "_r2"]):.1f}" r="3.5" fill="{colour}"/>')
    s.append(f'<rect x="{W-R+15}" y="{T+20*i}" width="14" height="3" fill="{colour}"/>')
    s.append(f'<text x="{W-R+35}" y="{T+20*i+5}">KVzap-{"MLP" if kind == "mlp" else "Linear"}</text>')
s.append("</svg>")
open(os.path.join(out, "r2_vs_data.svg"), "w").write("\n".join(s) + "\n")
for r in rows:
    print(f"x{r['multiple']}: {r['train_pairs']} pairs  linear R² {r['linear_r2']:.4f}  mlp R² {r['mlp_r2']:.4f}")
PY
