#!/usr/bin/env python3
"""Checks that dependencies between src/ folders point down (docs/ARCHITECTURE.md, "Which folder may
include which"): every `#include "<folder>/..."` in src/<a>/ must name a folder listed before <a>, or a
folder of the same level. Prints each include that points up or sideways and exits 1; exits 0 when clean.
Usage: python3 scripts/check_layers.py [REPO]"""
import os
import re
import sys

# Lowest first; folders on one level may not include each other.
LEVELS = [["kvzap"], ["common"], ["kernels"], ["format"], ["tokenizer"], ["chat"], ["cache"], ["model"],
          ["press"], ["engine"], ["train", "eval", "fetch"], ["server", "capi"], ["cli"]]
RANK = {folder: i for i, level in enumerate(LEVELS) for folder in level}
INCLUDE = re.compile(r'\s*#\s*include\s+"([a-z_]+)/')


def main() -> int:
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = os.path.join(repo, "src")
    bad, checked = [], 0
    for root, _, files in os.walk(src):
        folder = os.path.relpath(root, src).split(os.sep)[0]
        if folder == ".":
            continue  # src/ itself holds only folders
        if folder not in RANK:
            bad.append(f"src/{folder}/ is not in the layer list of scripts/check_layers.py")
            continue
        for name in sorted(files):
            if not name.endswith((".cpp", ".h", ".inc")):
                continue
            path = os.path.join(root, name)
            with open(path, encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m or m.group(1) == folder:
                        continue
                    checked += 1
                    dep = m.group(1)
                    if dep not in RANK:
                        bad.append(f"{os.path.relpath(path, repo)}:{n}: includes unknown folder {dep}/")
                    elif RANK[dep] >= RANK[folder]:
                        bad.append(f"{os.path.relpath(path, repo)}:{n}: {folder}/ includes {dep}/, which is not below it")
    for b in sorted(set(bad)):
        print(b)
    print(f"check_layers: {checked} includes across folders, {len(set(bad))} pointing up or sideways")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
