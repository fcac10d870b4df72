#!/usr/bin/env python3
"""Per-task view of a sweep folder: for each cell, the score and evicted fraction per task and the paired
difference to the full cache (same samples) with its standard error, as a Markdown table.

    python3 scripts/paired_by_task.py SWEEP_DIR [CELL ...]   (default: every finished cell)
"""
import json, math, os, sys


def load(path):
    with open(path) as f:
        return {(r["task"], r["index"]): r for r in map(json.loads, f) if r}


def mean_se(xs):
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    src = sys.argv[1]
    cells = sys.argv[2:] or sorted(c for c in os.listdir(src) if os.path.isfile(os.path.join(src, c, "summary.json")))
    full = load(os.path.join(src, "no_press", "samples.jsonl"))
    tasks = list(dict.fromkeys(t for t, _ in full))  # the suite's order
    print("| cell | " + " | ".join(tasks) + " | all |")
    print("|---|" + "---:|" * (len(tasks) + 1))
    for c in cells:
        rows = load(os.path.join(src, c, "samples.jsonl"))
        out = []
        for t in tasks + [None]:
            keys = [k for k in rows if k in full and (t is None or k[0] == t)]
            if not keys:
                out.append("-")
                continue
            d, se = mean_se([rows[k]["score"] - full[k]["score"] for k in keys])
            ev = sum(rows[k]["evicted_fraction"] for k in keys) / len(keys)
            out.append(f"{d:+.1f}±{se:.1f} (ev {ev:.2f})")
        print(f"| {c} | " + " | ".join(out) + " |")


if __name__ == "__main__":
    main()
