#!/usr/bin/env python3
"""End-to-end golden check of the forward pass for every supported architecture (llama, qwen2, qwen3).

For each architecture it writes a tiny random model as GGUF with the `gguf` package (2 layers, n_embd 64,
4 query heads over 2 KV heads; qwen3 with key_length 32 != n_embd / n_head; qwen2 with Q/K/V biases;
qwen3 with per-head q/k RMSNorm; tied embeddings for qwen2, a separate output.weight for llama and
qwen3; a second llama with Llama-3.1-style rope_freqs.weight divisors), scores an ASCII text with
`kvzap perplexity --jsonl` and compares every predicted token's log-prob and top-1 with an independent
NumPy forward pass (tiny_models.py):
  - F32 weights, whole windows per step;
  - F32 weights, 7 tokens per step (-b 7: attention over cached pages from earlier steps);
  - F16 weights (the reference uses the same f16-rounded weights and, as ggml does for F16 weights,
    rounds each matrix product's input to f16);
  - F16 weights with KVZAP_ISA=scalar (the portable matmul kernels);
  - negative controls: the reference with the other RoPE pairing (adjacent <-> half-split) must NOT
    match, which proves the comparison is sensitive to the pairing the architecture uses; likewise a
    reference without the qwen2 biases, without the qwen3 q/k norms, or (llama) with query head h
    reading KV head h % n_head_kv instead of h / group size.
A comparison passes when max |logprob diff| <= 2e-3 and top-1 is identical except at exact near-ties.

Usage: python3 tests/python/check_tiny_arch.py [-v]
Env: KVZAP_BIN (default <repo>/build/kvzap). Requires numpy and gguf (pip install gguf).
Prints "N passed, M failed"; exits 1 on any failure.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_models as tm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 2e-3        # max |logprob diff|
TIE_GAP = 1e-3    # reference logit gap under which a different top-1 counts as a tie
WINDOW = 40       # tokens per scoring window (the text is ~120 tokens: three windows of several 16-token pages)

TEXT = (
    "The cat sat on the mat, and the dog ran in the park.\n"
    "Is it raining? 42 apples, 7 pears; some were eaten at noon.\n"
    "Words of power: the quick brown fox jumps over the lazy dog!\n"
)

SPECS = [
    # Llama 3 style: llama-bpe pre-tokenizer with BOS, separate output matrix, adjacent RoPE pairs.
    tm.TinySpec("llama", tied=False, add_bos=True, pre="llama-bpe", rope_base=10000.0, rms_eps=1e-5, seed=11),
    # Qwen2.5 style: Q/K/V biases, tied embeddings, half-split RoPE.
    tm.TinySpec("qwen2", tied=True, pre="qwen2", rope_base=1e6, rms_eps=1e-6, seed=22),
    # Qwen3 style: q/k RMSNorm per head, head_dim 32 != 64 / 4 (explicit key_length), half-split RoPE.
    tm.TinySpec("qwen3", head_dim=32, tied=False, pre="qwen2", rope_base=1e6, rms_eps=1e-6, seed=33),
    # Llama 3.1 style RoPE scaling: a rope_freqs.weight tensor divides each of the 8 frequencies.
    tm.TinySpec("llama", tied=False, add_bos=True, pre="llama-bpe", rope_base=10000.0, rms_eps=1e-5, seed=44,
                rope_freqs=(1.0, 0.5, 2.0, 4.0, 0.25, 3.0, 8.0, 1.5), tag="llama-rope_freqs"),
]

VERBOSE = "-v" in sys.argv[1:]


def kvzap_bin():
    b = os.environ.get("KVZAP_BIN", os.path.join(ROOT, "build", "kvzap"))
    if not os.path.isfile(b):
        print(f"FAIL: kvzap binary not found at {b} (build it, or set KVZAP_BIN)")
        sys.exit(1)
    return b


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()[-500:]}")
    return r.stdout


def tokenize(binary, model, text_file, bos):
    cmd = [binary, "tokenize", "-m", model, "--text-file", text_file, "--json", "--no-special"]
    return json.loads(run(cmd + (["--bos"] if bos else [])))


def score(binary, model, text_file, out_dir, tag, extra=(), env=None):
    jsonl = os.path.join(out_dir, f"{tag}.jsonl")
    run([binary, "perplexity", "-m", model, "-f", text_file, "--jsonl", jsonl, "--window", str(WINDOW), "-t", "2",
         *extra], env)
    with open(jsonl) as f:
        return [json.loads(line) for line in f if line.strip()]


def compare(rows, ref):
    """(ok, max |diff|, message). rows: kvzap's JSONL; ref: tiny_models.reference_predictions."""
    got = {r["pos"]: r for r in rows}
    if len(got) != len(rows) or set(got) != set(ref):
        return False, float("nan"), f"scored positions differ: kvzap {sorted(got)[:5]}.. ({len(rows)}), ref {len(ref)}"
    max_diff, bad_top1 = 0.0, []
    for pos, (lp, logits) in ref.items():
        r = got[pos]
        max_diff = max(max_diff, abs(r["logprob"] - lp))
        ref_top = int(np.argmax(logits))
        if r["top1"] != ref_top and logits[ref_top] - logits[r["top1"]] > TIE_GAP:
            bad_top1.append((pos, r["top1"], ref_top, float(logits[ref_top] - logits[r["top1"]])))
    ok = max_diff <= TOL and not bad_top1
    msg = f"max |dlogprob| {max_diff:.2e} over {len(ref)} tokens, top-1 mismatches {len(bad_top1)}"
    if bad_top1:
        msg += f" (first: pos {bad_top1[0][0]} kvzap {bad_top1[0][1]} ref {bad_top1[0][2]} gap {bad_top1[0][3]:.3g})"
    return ok, max_diff, msg


def main():
    if importlib.util.find_spec("gguf") is None:  # tiny_models writes the models with it
        print("FAIL: the Python package 'gguf' is missing: python3 -m pip install 'gguf>=0.19'")
        return 1
    binary = kvzap_bin()
    vocab = tm.make_vocab()
    tokens, types, _, special = vocab
    tok_bytes = tm.token_bytes(tokens, types)
    passed = failed = 0

    def report(ok, name, msg):
        nonlocal passed, failed
        passed += ok
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {msg}")

    def check(name, rows, ref):
        ok, _, msg = compare(rows, ref)
        report(ok, name, msg)

    with tempfile.TemporaryDirectory(prefix="kvzap_tiny_") as tmp:
        text_file = os.path.join(tmp, "text.txt")
        with open(text_file, "wb") as f:
            f.write(TEXT.encode("ascii"))
        for spec in SPECS:
            a = spec.tag or spec.arch
            right = tm.ROPE_MODE[spec.arch]
            wrong = tm.HALF_SPLIT if right == tm.ADJACENT else tm.ADJACENT
            weights = tm.random_weights(spec, len(tokens))
            m32, m16 = os.path.join(tmp, f"{a}-f32.gguf"), os.path.join(tmp, f"{a}-f16.gguf")
            w32 = tm.write_gguf(m32, spec, weights, vocab, np.float32)
            w16 = tm.write_gguf(m16, spec, weights, vocab, np.float16)
            ref32 = None
            try:
                ids = tokenize(binary, m32, text_file, spec.add_bos)
                # The ids must spell the text (and start with BOS when the model adds it).
                body = ids[1:] if spec.add_bos else ids
                spelled = b"".join(tok_bytes[i] for i in body)
                ok = spelled == TEXT.encode() and (not spec.add_bos or ids[0] == special) and len(ids) > 2 * WINDOW
                report(ok, f"{a} tokenize", f"{len(ids)} tokens, {sum(i >= 256 for i in body)} of them merges"
                       if ok else f"ids do not spell the text (or too few): {ids[:20]}..")
                ref32 = tm.reference_predictions(spec, w32, ids, WINDOW, right)
                ref16 = tm.reference_predictions(spec, w16, ids, WINDOW, right, act_f16=True)
                rows = score(binary, m32, text_file, tmp, f"{a}-f32")
                check(f"{a} F32", rows, ref32)
                rows_b7 = score(binary, m32, text_file, tmp, f"{a}-f32-b7", ["-b", "7"])
                check(f"{a} F32 -b 7", rows_b7, ref32)
                rows16 = score(binary, m16, text_file, tmp, f"{a}-f16")
                check(f"{a} F16", rows16, ref16)
                scalar_env = dict(os.environ, KVZAP_ISA="scalar")  # the portable matmul kernels
                check(f"{a} F16 KVZAP_ISA=scalar", score(binary, m16, text_file, tmp, f"{a}-f16-scalar", env=scalar_env),
                      ref16)
                # Negative controls: a reference with the other RoPE pairing, or without the feature that
                # makes this architecture differ, must be told apart (clearly above the tolerance).
                controls = [(f"{wrong} RoPE", wrong, ())]
                if spec.qkv_bias:
                    controls.append(("no Q/K/V biases", right, ("bias",)))
                if spec.qk_norm:
                    controls.append(("no q/k RMSNorm", right, ("qk_norm",)))
                if spec.rope_freqs:
                    controls.append(("no rope_freqs", right, ("rope_freqs",)))
                if spec.arch == "llama":
                    controls.append(("KV head h % n_head_kv", right, ("gqa",)))
                for what, mode, ablate in controls:
                    ok_w, diff_w, msg_w = compare(rows, tm.reference_predictions(spec, w32, ids, WINDOW, mode, ablate))
                    report(not ok_w and diff_w > 10 * TOL, f"{a} reference with {what} is rejected",
                           msg_w + (" (should not match)" if ok_w else ""))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                report(False, f"{a}", str(e))
            if VERBOSE and ref32:
                lp = np.array([v[0] for v in ref32.values()])
                print(f"     {a}: reference mean logprob {lp.mean():.3f}, min {lp.min():.3f}")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
