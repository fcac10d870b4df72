"""Python overhead of the kvzap package against the CLI (issue 36 target: < 2 %), on the same prefill and
64-token answer: the CLI's own timing of the work (`kvzap generate --json`: context seconds + answer
prefill + decode seconds) against the wall time of the Python call around the same work. Same model,
press, seed and thread count; the tokens are checked equal. Medians of --reps runs each.

    python bench/python_overhead.py --bin build/kvzap [--model SmolLM2-135M-Instruct] [--reps 5]
"""
import argparse
import json
import statistics
import subprocess
import tempfile
import time

import kvzap

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--model", default="SmolLM2-135M-Instruct")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()

context = " ".join(f"Entry {i}: the {['red', 'green', 'blue'][i % 3]} box on shelf {i * 7 % 23} holds {i * 13 % 97} "
                   f"marbles." for i in range(60))
question = "Write a long story about the boxes and their marbles."
path = kvzap._kvzap.resolve_model(a.model)
with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    f.write(context)
cmd = [a.bin, "generate", "-m", path, "-t", str(a.threads), "--context-file", f.name, "--question", question, "--chat",
       "--press", "snapkv", "--ratio", "0.5", "--ratio-scope", "head", "--temp", "0", "-n", "64", "--json"]
pipe = kvzap.pipeline(path, threads=a.threads)
press = kvzap.SnapKVPress(compression_ratio=0.5)
cli_t, py_t, py_engine_t = [], [], []
for _ in range(a.reps):
    c = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    ans = c["answers"][0]
    cli_t.append(c["context_seconds"] + ans["prefill_seconds"] + ans["decode_seconds"])
    t0 = time.perf_counter()
    p = pipe(context, question=question, press=press, temperature=0, max_new_tokens=64)
    py_t.append(time.perf_counter() - t0)
    d = p["details"][0]
    py_engine_t.append(p["kv_stats"]["context_seconds"] + d["prefill_seconds"] + d["decode_seconds"])
    assert d["tokens"] == ans["tokens"], "Python and CLI tokens differ"
cli, py, eng = statistics.median(cli_t), statistics.median(py_t), statistics.median(py_engine_t)
print(f"tokens generated: {len(ans['tokens'])}, context tokens: {c['n_context_tokens']}")
print(f"CLI engine time (median of {a.reps}): {cli * 1e3:.1f} ms")
print(f"Python call wall time:             {py * 1e3:.1f} ms  ({100 * (py - cli) / cli:+.2f} % vs CLI)")
print(f"Python call, engine time inside:   {eng * 1e3:.1f} ms  (binding + JSON overhead {1e3 * (py - eng):.2f} ms, "
      f"{100 * (py - eng) / eng:.2f} %)")
