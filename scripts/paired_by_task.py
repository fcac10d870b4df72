#!/usr/bin/env python3
"""Per-task view of a sweep folder: for each cell, the score and evicted fraction per task and the paired
difference to the full cache (same samples) with its standard error, as a Markdown table.

    python3 scripts/paired_by_task.py SWEEP_DIR [CELL ...]   (default: every finished cell)
    python3 scripts/paired_by_task.py --reference REF_DIR SWEEP_DIR [CELL ...]
        the reference of each cell is the cell of the same name in REF_DIR instead of SWEEP_DIR's full
        cache (e.g. the same press with other surrogates, on the same samples)
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
    args = sys.argv[1:]
    reference = None
    if args[:1] == ["--reference"]:
        if len(args) < 2:
            sys.exit(__doc__)
        reference, args = args[1], args[2:]
    if not args:
        sys.exit(__doc__)
    src = args[0]
    cells = args[1:] or sorted(c for c in os.listdir(src) if os.path.isfile(os.path.join(src, c, "summary.json")))
    full_path = os.path.join(src, "no_press", "samples.jsonl")
    reference_of = (lambda c: os.path.join(reference, c, "samples.jsonl")) if reference else (lambda c: full_path)
    cells = [c for c in cells if os.path.isfile(reference_of(c))]
    if not cells:
        sys.exit(f"paired_by_task: no cell of {src} has a finished reference "
                 f"({'a cell of the same name in ' + reference if reference else 'the full-cache cell no_press'})")
    references = {}  # path -> samples: the full cache is read once, not per cell

    def reference_samples(c):
        path = reference_of(c)
        if path not in references:
            references[path] = load(path)
        return references[path]

    tasks = list(dict.fromkeys(t for t, _ in reference_samples(cells[0])))  # the suite's order
    print("| cell | " + " | ".join(tasks) + " | all |")
    print("|---|" + "---:|" * (len(tasks) + 1))
    for c in cells:
        full = reference_samples(c)
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
