#!/usr/bin/env python3
"""Resident KV cache against generated tokens while pruning during decoding (issue: per-head eviction).

Runs `kvzap generate --kv-trace` for N generated tokens with and without a decoding press, writes the
traces as CSV and an SVG plot (resident KV MB vs generated tokens, plus the full-cache line), and prints
a short summary. Example:

    python3 scripts/decode_curve.py --press kvzap-mlp --threshold -6 -n 1000 --out docs/results/decode_curve
"""
import argparse, csv, json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trace(bin_, n, press, out_csv, threads, seed):
    cmd = [bin_, "generate", "--chat", "-p", "Tell me a very long story about a lighthouse keeper and her cat.",
           "-n", str(n), "--temp", "0.8", "--seed", str(seed), "-t", str(threads), "--json", "--kv-trace", out_csv,
           "--stop", "<|im_end|>"] + press
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr}")
    rows = list(csv.DictReader(open(out_csv)))
    return json.loads(r.stdout), [(int(x["step"]), int(x["kv_bytes"]), int(x["kv_bytes_full"]), float(x["evicted_fraction"])) for x in rows]


def svg(series, path, title):
    W, H, L, B, T, R = 760, 440, 70, 50, 40, 20
    xmax = max(s[-1][0] for _, s, _ in series)
    ymax = max(max(p[1] for p in s) for _, s, _ in series) / 1e6 * 1.1
    X = lambda x: L + (W - L - R) * x / xmax
    Y = lambda y: H - B - (H - B - T) * y / ymax
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W/2}" y="22" text-anchor="middle" font-size="15">{title}</text>',
           f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/><line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>']
    for i in range(6):
        xv, yv = xmax * i / 5, ymax * i / 5
        out.append(f'<text x="{X(xv):.1f}" y="{H-B+18}" text-anchor="middle">{xv:.0f}</text>')
        out.append(f'<text x="{L-8}" y="{Y(yv)+4:.1f}" text-anchor="end">{yv:.1f}</text>')
        out.append(f'<line x1="{L}" y1="{Y(yv):.1f}" x2="{W-R}" y2="{Y(yv):.1f}" stroke="#ddd"/>')
    out.append(f'<text x="{W/2}" y="{H-10}" text-anchor="middle">generated tokens</text>')
    out.append(f'<text x="16" y="{H/2}" text-anchor="middle" transform="rotate(-90 16 {H/2})">resident KV cache (MB)</text>')
    for i, (label, s, color) in enumerate(series):
        pts = " ".join(f"{X(p[0]):.1f},{Y(p[1]/1e6):.1f}" for p in s)
        dash = ' stroke-dasharray="6 4"' if label.startswith("full") else ""
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{pts}"/>')
        out.append(f'<text x="{L+12}" y="{T+16+16*i}" fill="{color}">{label}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("KVZAP_BIN", os.path.join(ROOT, "build", "kvzap")))
    ap.add_argument("--press", default="kvzap-mlp")
    ap.add_argument("--threshold", type=float, required=True)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "decode_curve"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    press = ["--press", a.press, "--threshold", str(a.threshold), "--window", str(a.window), "--decode-press"]
    rp, sp = trace(a.bin, a.n, press, os.path.join(a.out, "pruned.csv"), a.threads, a.seed)
    full = [(s, f, f, 0.0) for s, _, f, _ in sp]
    label = f"{a.press}, threshold {a.threshold}, window {a.window}, decoding"
    svg([(f"full cache", full, "#888"), (label, sp, "#c0392b")], os.path.join(a.out, "decode_curve.svg"),
        "KV cache while generating (SmolLM2-135M-Instruct)")
    last = sp[-1]
    mid = sp[len(sp) // 2]
    print(f"{label}: {len(sp)} tokens generated; resident {last[1]/1e6:.2f} MB of {last[2]/1e6:.2f} MB full at the end "
          f"(evicted {last[3]:.3f}); at step {mid[0]}: {mid[1]/1e6:.2f} of {mid[2]/1e6:.2f} MB; decode {rp['answers'][0]['decode_tok_s'] if 'answers' in rp else rp['decode_tok_s']:.1f} tok/s")


if __name__ == "__main__":
    main()
