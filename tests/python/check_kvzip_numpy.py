#!/usr/bin/env python3
"""Recomputes the engine's KVzip / KVzip+ scores of one layer with numpy (float64) and compares.

It runs `$KVZAP_BIN score --dump-layer L --dump-dir D` (default binary: build/kvzap; the model is found
the way kvzap finds it: $KVZAP_MODEL, else the default model) on the first ~200 tokens of
tests/golden/texts/english.txt, for KVzip+ and for plain KVzip, then reads what the layer used:
  q.npy [n_in][H][D], keys.npy / values.npy [Hkv][n_keys][D] (sinks | chunk | repeat input),
  h.npy [n_in][E], wo.npy [E][H*D], scores.npy [Hkv][chunk], meta.json
and recomputes, independently of the engine's Gram-matrix and blocked-softmax code:
  a = softmax(q k^T / sqrt(D)) with the causal mask inside the repeat-input block,
  (KVzip+) a_ji * ||W_O^(q) v_i|| / ||h_j||, then the max over rows and the group's query heads,
for the chunk's columns. Passes when every score matches within 1e-4 relative, and when the JSON
log-scores of that layer are the logs of the dumped scores.

Usage: python3 tests/python/check_kvzip_numpy.py [DUMP_DIR]   (a given DIR is checked as is)
Requires: numpy.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-4


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def load(d, name):
    return np.load(os.path.join(d, name)).astype(np.float64)


def recompute(d):
    meta = json.load(open(os.path.join(d, "meta.json")))
    q, keys, values = load(d, "q.npy"), load(d, "keys.npy"), load(d, "values.npy")
    h, wo, scores = load(d, "h.npy"), load(d, "wo.npy"), load(d, "scores.npy")
    n_in, H, D = q.shape
    Hkv, nk, _ = keys.shape
    G = H // Hkv
    ns, m = meta["n_sinks"], meta["chunk_end"] - meta["chunk_start"]
    assert nk == ns + m + n_in, "key set size"
    # Row j of the repeat input sees the sinks, the chunk and input keys 0..j.
    visible = np.arange(nk)[None, :] < (ns + m + 1 + np.arange(n_in))[:, None]
    hnorm = np.linalg.norm(h, axis=1)
    ref = np.zeros((Hkv, m))
    for hk in range(Hkv):
        for g in range(G):
            qh = hk * G + g
            logits = q[:, qh, :] @ keys[hk].T / np.sqrt(D)
            logits = np.where(visible, logits, -np.inf)
            a = np.exp(logits - logits.max(axis=1, keepdims=True))
            a /= a.sum(axis=1, keepdims=True)
            if meta["plus"]:
                w = wo[:, qh * D:(qh + 1) * D]                   # W_O^(q): [E][D]
                vnorm = np.linalg.norm(values[hk] @ w.T, axis=1)  # ||W_O^(q) v_i||
                a = a * vnorm[None, :] / hnorm[:, None]
            ref[hk] = np.maximum(ref[hk], a[:, ns:ns + m].max(axis=0))
    return meta, scores, ref


def check_dump(d, json_path=None):
    meta, got, ref = recompute(d)
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-30)
    worst = float(rel.max())
    what = "KVzip+" if meta["plus"] else "KVzip"
    if not worst <= TOL:
        i = np.unravel_index(np.argmax(rel), rel.shape)
        fail(f"{what} layer {meta['layer']}: engine {got[i]:.6g} vs numpy {ref[i]:.6g} at head/column {i} "
             f"(relative error {worst:.3g} > {TOL})")
    if json_path:
        j = json.load(open(json_path))
        c0 = meta["chunk_start"]
        for hk in range(got.shape[0]):
            row = j["log_scores"][meta["layer"]][hk][c0:c0 + got.shape[1]]
            keep = np.array([v is not None for v in row])  # null = protected (sinks), not scored
            row = np.array([v for v in row if v is not None], dtype=np.float64)
            want = np.log(np.maximum(got[hk][keep], 1e-30))
            if not np.allclose(row, want, rtol=1e-5, atol=1e-5):
                fail(f"{json_path}: log_scores of layer {meta['layer']} head {hk} are not the logs of the dumped scores")
    print(f"ok: {what} layer {meta['layer']}, {got.shape[0]} KV heads x {got.shape[1]} tokens, "
          f"{meta['n_in']} repeat rows, {meta['n_sinks']} sinks: engine matches numpy (max relative error {worst:.2g})")


def main():
    if len(sys.argv) > 1:
        check_dump(sys.argv[1])
        return
    binary = os.environ.get("KVZAP_BIN", os.path.join(ROOT, "build", "kvzap"))
    if not os.path.exists(binary):
        fail(f"kvzap binary not found at {binary} (set KVZAP_BIN)")
    with open(os.path.join(ROOT, "tests", "golden", "texts", "english.txt"), encoding="utf-8") as f:
        text = f.read()[:900]  # about 200 tokens
    with tempfile.TemporaryDirectory() as tmp:
        # KVzip+ on the stripped text (the template prefix is recognised: 4 sink keys join the chunk's),
        # KVzip on the raw text (it starts with spaces that merge with the template's newline, so the
        # prefix is not recognised and scoring starts at token 0 without sinks).
        for method, layer, body in (("kvzip+", 7, text.strip()), ("kvzip", 21, text)):
            src = os.path.join(tmp, method + ".txt")
            with open(src, "w", encoding="utf-8") as f:
                f.write(body)
            dump = os.path.join(tmp, method)
            out = os.path.join(tmp, method + ".json")
            cmd = [binary, "score", "-f", src, "--out", out, "--method", method, "--chat", "-t", "2",
                   "--dump-layer", str(layer), "--dump-dir", dump]
            if os.environ.get("KVZAP_MODEL"):
                cmd += ["-m", os.environ["KVZAP_MODEL"]]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"{' '.join(cmd)} failed:\n{r.stderr}")
            check_dump(dump, out)


if __name__ == "__main__":
    main()
