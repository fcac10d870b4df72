"""Behaviour golden for refactors (issue 35): greedy tokens, kept entries per (layer, KV head) and KV bytes
for a fixed context x every registered press x {context + two forked questions, decode pruning, pruning
while prefilling, the server}. Record before a refactor, compare after: any difference is printed.

  python3 scripts/press_golden.py record  --bin OLD/kvzap --out /tmp/golden.json
  python3 scripts/press_golden.py compare --bin build/kvzap --golden /tmp/golden.json

Uses the default model (SmolLM2-135M-Instruct, `kvzap pull`); about two minutes on 2 cores."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

CONTEXT = " ".join(
    f"Record {i}: the {['red', 'blue', 'green', 'amber'][i % 4]} valve on line {i * 7 % 23} was checked by "
    f"{['Ada', 'Brook', 'Chen', 'Dara', 'Eli'][i % 5]} and logged as {['open', 'closed', 'leaking'][i % 3]}."
    for i in range(24))
QUESTIONS = ["Who checked the valve on line 14?", "Which valves were leaking?"]
TIMING_KEYS = {"decode_seconds", "decode_tok_s", "prefill_seconds", "prefill_tok_s", "context_seconds", "threads"}


def strip(v):
    if isinstance(v, dict):
        return {k: strip(x) for k, x in v.items() if k not in TIMING_KEYS}
    if isinstance(v, list):
        return [strip(x) for x in v]
    return v


def press_cases(binary):
    presses = json.loads(subprocess.run([binary, "presses", "--json"], check=True, capture_output=True, text=True).stdout)["presses"]
    cases = []
    for p in presses:
        name = p["name"]
        if "own_budget" in p["policies"]:  # sets its own budget: no ratio, no threshold
            cases.append((f"{name}:own_budget", ["--press", name]))
        if "ratio" in p["policies"]:
            cases.append((f"{name}:ratio", ["--press", name, "--ratio", "0.5"]))
        if "threshold" in p["policies"]:
            t = {"knorm": "-9", "random": "0.5"}.get(name, "-4")
            base = ["--press", name, "--threshold", t, "--window", "32"]
            cases.append((f"{name}:threshold", base))
            cases.append((f"{name}:decode", base + ["--decode-press"]))
            cases.append((f"{name}:prefill_evict", base + ["--prefill-evict-every", "48", "--sink-tokens", "2"]))
    return [("none", [])] + cases


def run_cli(binary, ctx_file, args):
    cmd = [binary, "generate", "-t", "2", "--chat", "--context-file", ctx_file, "-n", "12", "--json", "--seed", "7"]
    for q in QUESTIONS:
        cmd += ["--question", q]
    r = subprocess.run(cmd + args, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return strip(json.loads(r.stdout))


def run_server(binary, cases):
    os.environ["KVZAP_BIN"] = binary
    import httpx
    from server_harness import Server
    out = {}
    s = Server("-c", "2048", "--parallel", "4")
    try:
        for label, args in cases:
            body = {"messages": [{"role": "user", "content": CONTEXT + "\n\n" + QUESTIONS[0]}], "max_tokens": 12,
                    "temperature": 0}
            if args:
                kv = {"press": args[1]}
                for flag, key, conv in (("--ratio", "ratio", float), ("--threshold", "threshold", float),
                                        ("--window", "window", int), ("--prefill-evict-every", "prefill_evict_every", int),
                                        ("--sink-tokens", "sink_tokens", int)):
                    if flag in args:
                        kv[key] = conv(args[args.index(flag) + 1])
                if "--decode-press" in args:
                    kv["decoding"] = True
                body["kv_compression"] = kv
            r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=120)
            j = r.json()
            if r.status_code != 200:
                out[label] = {"status": r.status_code, "error": j.get("error", {}).get("message", "")}
                continue
            usage = j.get("usage", {})
            out[label] = {"text": j["choices"][0]["message"]["content"],
                          "completion_tokens": usage.get("completion_tokens"),
                          "kv_compression": strip(usage.get("kv_compression"))}
    finally:
        s.stop()
    return out


def collect(binary):
    cases = press_cases(binary)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(CONTEXT)
        ctx_file = f.name
    out = {"cli": {}, "server": {}}
    t0 = time.time()
    for i, (label, args) in enumerate(cases):
        out["cli"][label] = run_cli(binary, ctx_file, args)
        done = i + 1
        eta = (time.time() - t0) / done * (len(cases) - done)
        print(f"\r[cli {done}/{len(cases)}] {label:40s} ETA {eta:4.0f} s", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    out["server"] = run_server(binary, cases)
    os.unlink(ctx_file)
    return out


def diff(a, b, path=""):
    if type(a) != type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'golden' if k in a else 'new'}")
            else:
                out += diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["record", "compare"])
    ap.add_argument("--bin", default=str(ROOT / "build" / "kvzap"))
    ap.add_argument("--out")
    ap.add_argument("--golden")
    a = ap.parse_args()
    got = collect(os.path.abspath(a.bin))
    if a.mode == "record":
        Path(a.out).write_text(json.dumps(got, indent=1, sort_keys=True))
        n_err = sum("error" in v for v in got["cli"].values())
        print(f"recorded {len(got['cli'])} CLI cases ({n_err} errors) and {len(got['server'])} server cases to {a.out}")
        return 0
    golden = json.loads(Path(a.golden).read_text())
    d = diff(golden, got)
    for line in d[:200]:
        print(line)
    print(f"{len(d)} differences over {len(got['cli'])} CLI and {len(got['server'])} server cases")
    return 1 if d else 0


if __name__ == "__main__":
    sys.exit(main())
