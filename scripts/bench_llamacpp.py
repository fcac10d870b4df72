#!/usr/bin/env python3
"""Single-sequence speed of kvzap against llama.cpp's own llama-bench: same GGUF, same threads, one run.

Tests (llama-bench's names), each a fresh process per repetition, the two tools alternating (llama.cpp
first on even repetitions, kvzap first on odd ones); the table shows medians over --reps:

  pp512        llama-bench -m M -t T -p 512 -n 0 -r 1 -o json
               kvzap bench -m M -t T --prefill 512 --decode 1 --reps 1 --json        (prefill_tok_s)
  tg128        llama-bench -m M -t T -p 0 -n 128 -r 1 -o json
               kvzap bench -m M -t T --prefill 1 --decode 128 --reps 1 --json        (decode_tok_s)
  tg128@4096   llama-bench ... -p 0 -n 128 -d 4096 -fa on  and  -fa off (the faster counts)
               kvzap bench ... --prefill 4096 --decode 128 --keep 0.35 --json
               (decode after a 4096-token prefill with the full cache, and with the cache cut to 35 %)

llama-bench runs one warm-up before each test and times 128 decode steps starting at depth d (0 or 4096);
kvzap bench warms up the same way (an untimed step that touches every weight) and times the same steps.
Decode bandwidth: bytes per token = weights + the KV cache read (kvzap bench's bandwidth_gb_s), against the
machine's read bandwidth measured here by scripts/membw.c (2 threads, 1 GiB buffer) when --membw is given.

Binaries: llama-bench from scripts/build_llamacpp.sh (built once, cached); kvzap from $KVZAP_BIN or build/.
Models: catalogue names resolved with `kvzap pull NAME` (downloaded once, sha256-checked).

Usage:
  bash scripts/bench_llamacpp.sh                                      # both models, 1 and 2 threads
  python3 scripts/bench_llamacpp.py --models smollm2-135m --threads 2 --reps 3 --tests pp512,tg128
  python3 scripts/bench_llamacpp.py --json docs/bench/llamacpp.json --membw
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchserve.servers import llama_bin_dir

ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_json(cmd: list[str]) -> object:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    out = r.stdout.strip()
    start = min([i for i in (out.find("["), out.find("{")) if i >= 0], default=-1)
    if start < 0:
        raise SystemExit(f"error: no JSON from {' '.join(cmd)}:\n{out[-2000:]}")
    return json.loads(out[start:])


def llama_ts(bench: str, model: str, threads: int, p: int, n: int, depth: int = 0, fa: str | None = None) -> float:
    cmd = [bench, "-m", model, "-t", str(threads), "-p", str(p), "-n", str(n), "-r", "1", "-o", "json"]
    if depth:
        cmd += ["-d", str(depth)]
    if fa:
        cmd += ["-fa", fa]
    rows = run_json(cmd)
    assert isinstance(rows, list) and rows, rows
    return float(rows[0]["avg_ts"])


def kvzap_bench(kvzap: str, model: str, threads: int, prefill: int, decode: int, keep: list[float]) -> dict:
    cmd = [kvzap, "bench", "-m", model, "-t", str(threads), "--prefill", str(prefill), "--decode", str(decode),
           "--reps", "1", "--json"]
    if keep:
        cmd += ["--keep", *[str(k) for k in keep]]
    j = run_json(cmd)
    assert isinstance(j, dict)
    return j


def median(v: list[float]) -> float:
    return statistics.median(v) if v else float("nan")


def membw(threads: int) -> float:
    src, exe = ROOT / "scripts" / "membw.c", Path("/tmp") / f"kvzap-membw-{os.getuid()}"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["cc", "-O3", "-march=native", "-pthread", str(src), "-o", str(exe)], check=True)
    r = subprocess.run([str(exe), str(threads), "1024"], capture_output=True, text=True, check=True)
    return float(r.stdout.split()[-2])  # "... N GB/s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b", help="catalogue names or GGUF paths")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--depth-reps", type=int, default=0, help="repetitions of the depth test (default: --reps)")
    ap.add_argument("--tests", default="pp512,tg128,tg128@4096")
    ap.add_argument("--depth", type=int, default=4096)
    ap.add_argument("--keep", type=float, default=0.35, help="cache fraction for the pruned depth test")
    ap.add_argument("--membw", action="store_true", help="also measure read bandwidth (scripts/membw.c)")
    ap.add_argument("--json", help="write all samples here")
    a = ap.parse_args()

    kvzap = os.environ.get("KVZAP_BIN", str(ROOT / "build" / "kvzap"))
    if not Path(kvzap).exists():
        raise SystemExit(f"error: {kvzap} not found (build kvzap first: bash scripts/setup.sh)")
    bench = str(llama_bin_dir(None) / "llama-bench")
    tests = [t for t in a.tests.split(",") if t]
    threads = [int(t) for t in a.threads.split(",") if t]

    results = []
    units = []
    for name in [m for m in a.models.split(",") if m]:
        path = name if name.endswith(".gguf") else \
            subprocess.run([kvzap, "pull", name], check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        for t in threads:
            for test in tests:
                units.append((name, path, t, test))
    started = time.time()
    depth_reps = a.depth_reps or a.reps
    reps_of = {u: (depth_reps if u[3].startswith("tg128@") else a.reps) for u in units}
    total = sum(reps_of.values())
    done = 0
    for name, path, t, test in units:
        samples: dict[str, list[float]] = {"llama": [], "kvzap": [], "llama_fa_on": [], "llama_fa_off": [],
                                           "kvzap_pruned": [], "kvzap_gbs": []}
        for rep in range(reps_of[(name, path, t, test)]):
            order = ["llama", "kvzap"] if rep % 2 == 0 else ["kvzap", "llama"]
            for tool in order:
                if test == "pp512":
                    if tool == "llama":
                        samples["llama"].append(llama_ts(bench, path, t, 512, 0))
                    else:
                        samples["kvzap"].append(kvzap_bench(kvzap, path, t, 512, 1, [])["prefill_tok_s"])
                elif test == "tg128":
                    if tool == "llama":
                        samples["llama"].append(llama_ts(bench, path, t, 0, 128))
                    else:
                        j = kvzap_bench(kvzap, path, t, 1, 128, [])
                        samples["kvzap"].append(j["decode_tok_s"])
                        samples["kvzap_gbs"].append(j["bandwidth_gb_s"])
                else:  # tg128@depth
                    if tool == "llama":
                        on = llama_ts(bench, path, t, 0, 128, a.depth, "on")
                        off = llama_ts(bench, path, t, 0, 128, a.depth, "off")
                        samples["llama_fa_on"].append(on)
                        samples["llama_fa_off"].append(off)
                        samples["llama"].append(max(on, off))
                    else:
                        j = kvzap_bench(kvzap, path, t, a.depth, 128, [a.keep])
                        samples["kvzap"].append(j["decode_tok_s"])
                        samples["kvzap_gbs"].append(j["bandwidth_gb_s"])
                        samples["kvzap_pruned"].append(j["decode_with_smaller_cache"][0]["decode_tok_s"])
            done += 1
            el = time.time() - started
            log(f"[{done}/{total}] {name} t={t} {test}: llama {samples['llama'][-1]:.1f} kvzap {samples['kvzap'][-1]:.1f} "
                f"tok/s  (elapsed {el:.0f} s, ETA {el / done * (total - done):.0f} s)")
        row = {"model": name, "threads": t, "test": test, "samples": samples,
               "llama": median(samples["llama"]), "kvzap": median(samples["kvzap"])}
        if samples["kvzap_pruned"]:
            row["kvzap_pruned"] = median(samples["kvzap_pruned"])
            row["llama_fa_on"] = median(samples["llama_fa_on"])
            row["llama_fa_off"] = median(samples["llama_fa_off"])
        if samples["kvzap_gbs"]:
            row["kvzap_gbs"] = median(samples["kvzap_gbs"])
        results.append(row)

    bw = {t: membw(t) for t in threads} if a.membw else {}
    print(f"\nmedians of {a.reps} alternating runs ({depth_reps} for the depth test); ratio = kvzap / llama.cpp (> 1: kvzap faster)\n")
    print("| model | threads | test | llama.cpp tok/s | kvzap tok/s | ratio | notes |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        notes = []
        if "kvzap_pruned" in r:
            notes.append(f"fa on {r['llama_fa_on']:.1f} / off {r['llama_fa_off']:.1f}; kvzap at {a.keep:.0%} cache "
                         f"{r['kvzap_pruned']:.1f} = {r['kvzap_pruned'] / r['llama']:.2f}x")
        if "kvzap_gbs" in r:
            s = f"kvzap reads {r['kvzap_gbs']:.1f} GB/s"
            if r["threads"] in bw:
                s += f" = {r['kvzap_gbs'] / bw[r['threads']]:.0%} of {bw[r['threads']]:.1f} GB/s measured"
            notes.append(s)
        print(f"| {r['model']} | {r['threads']} | {r['test']} | {r['llama']:.1f} | {r['kvzap']:.1f} | "
              f"{r['kvzap'] / r['llama']:.2f}x | {'; '.join(notes)} |")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"reps": a.reps, "depth_reps": depth_reps, "results": results, "membw_gb_s": bw}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
