#!/usr/bin/env python3
"""Passkey retrieval on the default model with real eviction (issue: per-head KV eviction).

About 1,500 tokens of filler hide one 5-digit pass key at half depth. The full cache must find it, and so
must KVzip at ratio 0.5 with a per-layer budget (kvpress's `layerwise=True`). KVzip with the global
budget and random eviction at ratio 0.9 are reported: on this 135M model KVzip's score scale differs
between layers, so a global bottom-k keeps 17-82 % of a layer and can strip the needle from some layers.
Each run also checks that the resident KV bytes match (1 - evicted fraction) x full within 2 %.
Prints 'N passed, M failed' and exits non-zero on a failure.
"""
import json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("KVZAP_BIN", os.path.join(ROOT, "build", "kvzap"))
CTX = os.path.join(ROOT, "tests", "data", "passkey_1500.txt")
KEY = "68271"


def run(press_args):
    cmd = [BIN, "generate", "--chat", "--temp", "0", "-n", "8", "--json", "--context-file", CTX,
           "--question", "What is the pass key?", "--answer-prefix", "The pass key is"] + press_args
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def main():
    passed = failed = 0
    def check(name, ok, detail):
        nonlocal passed, failed
        passed += ok
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")

    for label, args, must_find in [("full cache", [], True),
                                   ("kvzip ratio 0.5, per-layer budget",
                                    ["--press", "kvzip", "--ratio", "0.5", "--ratio-scope", "layer"], True),
                                   ("kvzip ratio 0.5, global budget", ["--press", "kvzip", "--ratio", "0.5"], None),
                                   ("kvzap-mlp, default threshold", ["--press", "kvzap-mlp"], True),
                                   # negative control: 90 % random eviction must lose the key
                                   ("random ratio 0.9", ["--press", "random", "--ratio", "0.9"], False)]:
        r = run(args)
        text = r["answers"][0]["text"]
        found = KEY in text
        ef, kv, full = r["evicted_fraction"], r["kv_bytes"], r["kv_bytes_full"]
        detail = f"answer {text!r}, evicted {ef:.3f}, KV {kv/1e6:.2f} MB of {full/1e6:.2f} MB"
        if must_find is None:
            # Reported, not asserted: with one global budget KVzip may spend it unevenly across layers,
            # and whether the key survives on this small model is a measurement, not a requirement.
            print(f"INFO (not asserted) {label}: {'found' if found else 'lost'} the key; {detail}")
        else:
            check(f"{label} {'finds' if must_find else 'loses'} the pass key", found == must_find, detail)
        expected = (1 - ef) * full
        check(f"{label} resident bytes track the evicted fraction", abs(kv - expected) <= 0.02 * full,
              f"resident {kv} vs (1-{ef:.4f}) x {full} = {expected:.0f}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
