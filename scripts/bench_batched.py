#!/usr/bin/env python3
"""Batched throughput of kvzap against llama.cpp's own llama-batched-bench, same GGUF, same threads.

For every batch size B in --parallel, both tools prefill B distinct prompts of --prefill tokens from an
empty cache, then run --decode forward steps of B tokens each (one new token per sequence per step):

  llama.cpp: llama-batched-bench -m M -t T -c B_max*(P+D) -b 2048 -ub 512 -npp P -ntg D -npl B1,B2,..
             --output-format jsonl      (binaries from scripts/build_llamacpp.sh)
  kvzap:     kvzap bench -m M --parallel B1,B2,.. --prefill P --decode D -t T --json

The tools run alternately (llama.cpp first on even repetitions, kvzap first on odd ones), each
repetition a fresh process; the table shows medians over --reps of the aggregate tokens/s over all B
sequences, and the ratios kvzap / llama.cpp (> 1: kvzap is faster).

How llama-batched-bench counts (tools/batched-bench/batched-bench.cpp of the vendored llama.cpp):
  * without -pps (what this script runs) every sequence gets its own P random token ids; the whole
    B*P-token batch is decoded in n_batch chunks (n_ubatch per graph) and prefill t/s = B*P / T_PP;
  * with -pps one prompt is decoded once and copied to the B sequences; it reports P / T_PP: not comparable;
  * decode: D steps of B tokens (each with logits), right after the prefill, t/s = B*D / T_TG;
  * a configuration whose B*(P+D) exceeds -c is skipped silently, so -c is set to max(B)*(P+D);
    the KV cache is per sequence (not unified), each sequence's share rounded up to 256 cells.

Usage:
  python3 scripts/bench_batched.py -t 2 --reps 3 [--json out.json]
  python3 scripts/bench_batched.py --peer-only -t 2            # llama.cpp only (kvzap side not needed)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchserve.report import median
from benchserve.servers import REPO, default_model, llama_bin_dir, log


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}")
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


# ---------------------------------------------------------------------------------------------------
# llama-batched-bench output
# ---------------------------------------------------------------------------------------------------

def parse_batched_bench(text: str) -> dict[int, dict]:
    """Rows of llama-batched-bench keyed by B: from its JSON lines, else from its markdown table.

    Returns {B: {"pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed"}}.
    """
    rows: dict[int, dict] = {}
    for line in text.splitlines():
        line = line.strip()
        if not (line.startswith("{") and "speed_pp" in line):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        try:
            rows[int(obj["pl"])] = {k: obj[k] for k in
                                    ("pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed")}
            for k in ("n_batch", "n_ubatch", "flash_attn", "is_pp_shared", "n_threads", "n_threads_batch", "n_kv_max"):
                if k in obj:
                    rows[int(obj["pl"])][k] = obj[k]
        except (KeyError, TypeError, ValueError):
            continue
    if rows:
        return rows

    # markdown: |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
    names = {"PP": "pp", "TG": "tg", "B": "pl", "N_KV": "n_kv", "T_PP s": "t_pp", "S_PP t/s": "speed_pp",
             "T_TG s": "t_tg", "S_TG t/s": "speed_tg", "T s": "t", "S t/s": "speed"}
    header: list[str] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if "S_PP t/s" in cells and "B" in cells:
            header = cells
            continue
        if header is None or len(cells) != len(header) or all(set(c) <= set("-: ") for c in cells):
            continue
        try:
            row = {names[h]: float(c) for h, c in zip(header, cells) if h in names}
            for k in ("pp", "tg", "pl", "n_kv"):
                row[k] = int(row[k])
        except (KeyError, ValueError):
            continue
        rows[row["pl"]] = row
    return rows


def run_llama(bin_dir: Path, args, model: Path) -> dict:
    exe = bin_dir / "llama-batched-bench"
    n_ctx = max(args.parallel) * (args.prefill + args.decode)
    cmd = [str(exe), "-m", str(model), "-t", str(args.threads), "-c", str(n_ctx),
           "-b", str(args.batch), "-ub", str(args.ubatch),
           "-npp", str(args.prefill), "-ntg", str(args.decode), "-npl", ",".join(map(str, args.parallel)),
           "--output-format", "jsonl"]
    if args.flash_attn:
        cmd += ["-fa", args.flash_attn]
    cmd += args.llama_arg
    t0 = time.time()
    load0 = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"llama-batched-bench failed (rc {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    rows = parse_batched_bench(proc.stdout) or parse_batched_bench(proc.stdout + "\n" + proc.stderr)
    missing = [b for b in args.parallel if b not in rows]
    if missing:
        raise RuntimeError(f"llama-batched-bench printed no row for B={missing} (context too small?)\n"
                           f"{proc.stdout[-2000:]}")
    fa = re.search(r"Flash Attention was auto, set to (\w+)", proc.stderr)
    results = []
    for b in args.parallel:
        r = rows[b]
        results.append({
            "parallel": b,
            "prefill_tokens": b * int(r["pp"]), "prefill_seconds": float(r["t_pp"]),
            "prefill_tok_s": float(r["speed_pp"]),
            "decode_tokens": b * int(r["tg"]), "decode_seconds": float(r["t_tg"]),
            "decode_tok_s": float(r["speed_tg"]),
            "n_kv": int(r["n_kv"]),
            **{k: r[k] for k in ("n_batch", "n_ubatch", "flash_attn", "n_threads") if k in r},
        })
    return {"tool": "llama.cpp", "cmd": cmd, "wall_s": wall, "load_before": load0,
            "flash_attn_resolved": fa.group(1) if fa else None, "results": results}


def run_kvzap(args, model: Path) -> dict:
    cmd = [str(args.kvzap), "bench", "-m", str(model), "--parallel", ",".join(map(str, args.parallel)),
           "--prefill", str(args.prefill), "--decode", str(args.decode), "-t", str(args.threads), "--json"]
    cmd += args.kvzap_arg
    t0 = time.time()
    load0 = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"kvzap bench failed (rc {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    out = proc.stdout.strip()
    try:
        data = json.loads(out)
    except json.JSONDecodeError:
        start = out.find("{")  # tolerate a line of chatter before the object
        data = json.loads(out[start:]) if start >= 0 else None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise RuntimeError(f"kvzap bench printed no results object: {out[-1000:]}")
    by_b = {}
    for r in data["results"]:
        try:
            b = int(r["parallel"])
            by_b[b] = {
                "parallel": b,
                "prefill_tokens": int(r["prefill_tokens"]), "prefill_seconds": float(r["prefill_seconds"]),
                "prefill_tok_s": float(r["prefill_tok_s"]),
                "decode_tokens": int(r["decode_tokens"]), "decode_seconds": float(r["decode_seconds"]),
                "decode_tok_s": float(r["decode_tok_s"]),
                "kv_bytes_peak": int(r["kv_bytes_peak"]) if r.get("kv_bytes_peak") is not None else None,
            }
        except (KeyError, TypeError, ValueError) as e:
            raise RuntimeError(f"kvzap bench result malformed ({e}): {r}")
    missing = [b for b in args.parallel if b not in by_b]
    if missing:
        raise RuntimeError(f"kvzap bench printed no result for B={missing}")
    for b in args.parallel:
        r = by_b[b]
        if r["prefill_tokens"] != b * args.prefill or r["decode_tokens"] != b * args.decode:
            log(f"warning: kvzap B={b} counted {r['prefill_tokens']} prefill / {r['decode_tokens']} decode tokens, "
                f"expected {b * args.prefill} / {b * args.decode}")
    return {"tool": "kvzap", "cmd": cmd, "wall_s": wall, "load_before": load0,
            "model": data.get("model"), "threads": data.get("threads"),
            "results": [by_b[b] for b in args.parallel]}


# ---------------------------------------------------------------------------------------------------
# --capacity (planned, not implemented yet)
# ---------------------------------------------------------------------------------------------------

def run_capacity(args, model: Path, bin_dir: Path) -> int:
    """Planned: under a fixed KV memory budget, the largest B each tool sustains and its throughput.

    This is where it goes: the llama.cpp side would search B with llama-batched-bench at a fixed -c,
    the kvzap side with `kvzap bench --kv-budget ... --press ...`; the report would get its own table.
    """
    sys.exit("error: --capacity is planned but not implemented yet")


# ---------------------------------------------------------------------------------------------------

def fmt(v, digits=1) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def ratio(a, b) -> str:
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def spread(values) -> str:
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return ""
    return f"{min(values):.1f}–{max(values):.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("-m", "--model", help="GGUF file (default: the output of `kvzap pull`)")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1, help="threads for both tools")
    ap.add_argument("--parallel", type=int_list, default=[1, 4, 16, 64], help="batch sizes B (default 1,4,16,64)")
    ap.add_argument("--prefill", type=int, default=256, help="prompt tokens per sequence (default 256)")
    ap.add_argument("--decode", type=int, default=64, help="decode steps (tokens per sequence, default 64)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions, tools alternating (default 3)")
    ap.add_argument("--kvzap", type=Path, default=REPO / "build" / "kvzap", help="kvzap binary (default build/kvzap)")
    ap.add_argument("--llama-bin", help="folder with llama-batched-bench (default: scripts/build_llamacpp.sh)")
    ap.add_argument("--batch", type=int, default=2048, help="llama.cpp -b, logical batch (default 2048, its default)")
    ap.add_argument("--ubatch", type=int, default=512, help="llama.cpp -ub, physical batch (default 512, its default)")
    ap.add_argument("--flash-attn", choices=["on", "off", "auto"], help="llama.cpp -fa (default: its own, auto)")
    ap.add_argument("--llama-arg", action="append", default=[], help="extra argument for llama-batched-bench")
    ap.add_argument("--kvzap-arg", action="append", default=[], help="extra argument for kvzap bench")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per tool run (default 1800)")
    ap.add_argument("--json", dest="json_out", type=Path, help="write the raw figures of every run here")
    ap.add_argument("--peer-only", action="store_true", help="run llama.cpp only")
    ap.add_argument("--capacity", action="store_true", help="capacity mode (planned; not implemented yet)")
    args = ap.parse_args()
    if args.reps < 1 or args.threads < 1 or args.prefill < 1 or args.decode < 1:
        ap.error("--reps, -t, --prefill and --decode must be positive")
    args.kvzap = args.kvzap.resolve() if args.kvzap.exists() else args.kvzap

    model = Path(args.model) if args.model else default_model(args.kvzap)
    if not model.is_file():
        sys.exit(f"error: model not found: {model}")
    bin_dir = llama_bin_dir(args.llama_bin)
    if not os.access(bin_dir / "llama-batched-bench", os.X_OK):
        sys.exit(f"error: no llama-batched-bench in {bin_dir}")
    if args.capacity:
        return run_capacity(args, model, bin_dir)
    if not args.peer_only and not os.access(args.kvzap, os.X_OK):
        sys.exit(f"error: kvzap binary not executable: {args.kvzap} (or pass --peer-only)")

    tools = ["llama.cpp"] if args.peer_only else ["llama.cpp", "kvzap"]
    runs: list[dict] = []
    for rep in range(args.reps):
        order = tools if rep % 2 == 0 else tools[::-1]
        for tool in order:
            log(f"rep {rep + 1}/{args.reps}: {tool} (load average {os.getloadavg()[0]:.2f})")
            run = run_llama(bin_dir, args, model) if tool == "llama.cpp" else run_kvzap(args, model)
            run["rep"] = rep
            runs.append(run)
            summary = ", ".join(f"B={r['parallel']}: {r['prefill_tok_s']:.1f}/{r['decode_tok_s']:.1f}"
                                for r in run["results"])
            log(f"  {tool} prefill/decode tok/s {summary} ({run['wall_s']:.1f} s)")

    def figures(tool: str, b: int, key: str) -> list[float]:
        return [r[key] for run in runs if run["tool"] == tool for r in run["results"] if r["parallel"] == b]

    table = []
    for b in args.parallel:
        row = {"parallel": b}
        for tool in ("llama.cpp", "kvzap"):
            for key in ("prefill_tok_s", "decode_tok_s"):
                vals = figures(tool, b, key)
                row[f"{tool}:{key}"] = median(vals)
                row[f"{tool}:{key}:all"] = vals
        table.append(row)

    build_info = (bin_dir.parent / "build-info.txt")
    print(f"model {model.name}, {args.threads} threads, prefill {args.prefill} x B, decode {args.decode} steps x B, "
          f"median of {args.reps} (aggregate tok/s over all B sequences; ratio = kvzap / llama.cpp)")
    print()
    print("| B | llama.cpp prefill tok/s | kvzap prefill tok/s | ratio | llama.cpp decode tok/s | kvzap decode tok/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for row in table:
        lp, kp = row["llama.cpp:prefill_tok_s"], row["kvzap:prefill_tok_s"]
        ld, kd = row["llama.cpp:decode_tok_s"], row["kvzap:decode_tok_s"]
        print(f"| {row['parallel']} | {fmt(lp)} | {fmt(kp)} | {ratio(kp, lp)} | {fmt(ld)} | {fmt(kd)} | {ratio(kd, ld)} |")
    if args.reps > 1:
        print()
        print("range over reps (min–max), prefill / decode:")
        for row in table:
            parts = [f"{tool} {spread(row[f'{tool}:prefill_tok_s:all'])} / {spread(row[f'{tool}:decode_tok_s:all'])}"
                     for tool in tools]
            print(f"  B={row['parallel']}: " + "; ".join(parts))

    if args.json_out:
        doc = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "cpu_count": os.cpu_count(), "model": str(model),
            "threads": args.threads, "parallel": args.parallel, "prefill": args.prefill, "decode": args.decode,
            "reps": args.reps, "llama_bin": str(bin_dir),
            "llama_build_info": build_info.read_text() if build_info.is_file() else None,
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "runs": runs,
            "medians": [{k: v for k, v in row.items() if not k.endswith(":all")} for row in table],
        }
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
        log(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
