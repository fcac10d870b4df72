#!/usr/bin/env python3
"""Real memory of pruned caches: resident KV bytes vs the evicted fraction, and the process's peak RSS.

Runs `kvzap generate` on a ~2,000-token context (Persuasion, a held-out novel) with a press at several
settings, each in its own process under /usr/bin/time, and prints a markdown table. Ratio presses pick a
global bottom-k after the whole context is cached, so their *peak* includes the full cache; threshold
presses evict layer by layer during the prefill, so their peak falls with the evicted fraction.

    python3 scripts/memory_report.py [--bin build/kvzap] [--tokens 2000]
"""
import argparse, json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("KVZAP_BIN", os.path.join(ROOT, "build", "kvzap")))
    ap.add_argument("--chars", type=int, default=9000, help="characters of context (~2,000 tokens)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    src = os.path.join(ROOT, "data", "eval", "haystack", "persuasion.txt")
    text = open(src, encoding="utf-8").read()[:args.chars]
    runs = [("none", [])]
    runs += [(f"knorm ratio {r}", ["--press", "knorm", "--ratio", str(r)]) for r in (0.25, 0.5, 0.75)]
    runs += [(f"random threshold {t}", ["--press", "random", "--threshold", str(t)]) for t in (0.25, 0.5, 0.75)]
    with tempfile.TemporaryDirectory() as tmp:
        ctx = os.path.join(tmp, "context.txt")
        open(ctx, "w", encoding="utf-8").write(text)
        print("| press | evicted fraction | resident KV MB | full KV MB | resident / ((1-f) x full) | peak RSS MB |")
        print("|---|---|---|---|---|---|")
        for label, press in runs:
            cmd = ["/usr/bin/time", "-f", "MAXRSS %M", args.bin, "generate", "--chat", "--temp", "0", "-n", "1",
                   "-t", str(args.threads), "--json", "--context-file", ctx, "--question", "Who is speaking?"] + press
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{' '.join(cmd)} failed: {out.stderr}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rss = [l for l in out.stderr.splitlines() if l.startswith("MAXRSS")][-1].split()[1]
            f, kv, full = r["evicted_fraction"], r["kv_bytes"], r["kv_bytes_full"]
            track = kv / ((1 - f) * full) if f < 1 else float("nan")
            print(f"| {label} | {f:.3f} | {kv/1e6:.2f} | {full/1e6:.2f} | {track:.4f} | {int(rss)/1024:.1f} |")
            print(f"<!-- {r['n_context_tokens']} context tokens -->", file=sys.stderr)


if __name__ == "__main__":
    main()
