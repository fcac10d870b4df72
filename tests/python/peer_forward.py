#!/usr/bin/env python3
"""llama.cpp peer check of the kvzap forward pass (scoring and greedy generation).

  --make-golden  compute the llama.cpp reference with llama-cpp-python and write
                 tests/golden/peer_logprobs.json and tests/golden/peer_greedy.json
  --check        run kvzap on the same inputs and compare against llama.cpp computed live now
                 (default) or against the golden files (--against golden); exits non-zero when a
                 threshold fails (see peer_common.py)

The reference uses llama.cpp's CPU defaults for everything that changes numerics: F16 K/V cache and
llama-cpp-python's default attention path (flash attention off). --make-golden also measures how far
llama.cpp moves from itself when flash attention is switched on or the K/V cache is F32, recorded as
"reference_noise": it says how tight the thresholds are compared with llama.cpp's own precision choices.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_common as pc  # noqa: E402

N_CTX = 4096
N_THREADS = 2
TOP_K_SAVED = 5
# llama.cpp against itself with one numerics setting changed: how far it moves shows how much of a
# kvzap difference could be precision choices rather than a bug.
NOISE_VARIANTS = {
    "flash_attn_on": {"flash_attn": True},
    "kv_cache_f32": {"type_k": 0, "type_v": 0},  # GGML_TYPE_F32
}


def open_llama(model: Path, **overrides):
    """overrides: only for the noise measurements (flash_attn=True, type_k/type_v=0 for F32)."""
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(model), n_ctx=N_CTX, logits_all=True, n_threads=N_THREADS, seed=0,
        verbose=False, **overrides,
    )


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    """[n][vocab] float32 logits -> float64 log-probabilities."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def tokenize_text(llm, text: str) -> list[int]:
    # add_bos=False: the GGUF sets tokenizer.ggml.add_bos_token = false; special=False: plain prose.
    return list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))


def score_text(llm, tokens: list[int], ctx: int) -> dict:
    """Teacher-forced scoring with the kvzap perplexity windowing, in the golden layout."""
    pos, logprob, top1, margin = [], [], [], []
    for start in pc.window_starts(len(tokens), ctx):
        window = tokens[start:start + ctx]
        llm.reset()  # next eval() removes the whole KV cache: each window starts empty
        llm.eval(window)
        logits = np.array(llm.scores[: len(window) - 1], dtype=np.float32)  # [n-1][vocab]
        for lo in range(0, len(logits), 256):  # chunks keep the float64 copy small
            lp = log_softmax_rows(logits[lo:lo + 256])
            order = np.argsort(-lp, axis=1)[:, :2]
            for r in range(lp.shape[0]):
                i = lo + r  # row i predicts window[i + 1]
                pos.append(start + i + 1)
                logprob.append(round(float(lp[r, window[i + 1]]), 6))
                top1.append(int(np.argmax(lp[r])))
                margin.append(round(float(lp[r, order[r, 0]] - lp[r, order[r, 1]]), 4))
    return {"ctx": ctx, "tokens": list(tokens), "pos": pos, "logprob": logprob, "top1": top1,
            "margin": margin}


def greedy_chat(llm, prompt: str, max_tokens: int) -> dict:
    rendered = pc.render_chat(prompt)
    prompt_tokens = list(llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=True))
    llm.reset()
    llm.eval(prompt_tokens)
    tokens, margins, top5 = [], [], []
    stop_reason = "length"
    for _ in range(max_tokens):
        lp = log_softmax_rows(np.array(llm.scores[llm.n_tokens - 1: llm.n_tokens], dtype=np.float32))[0]
        best = np.argsort(-lp)[:TOP_K_SAVED]
        margins.append(round(float(lp[best[0]] - lp[best[1]]), 4))
        top5.append([[int(t), round(float(lp[t]), 4)] for t in best])
        tok = int(np.argmax(lp))
        if tok in pc.EOS_IDS:
            stop_reason = "eos"
            break
        tokens.append(tok)
        if len(tokens) < max_tokens:
            llm.eval([tok])
    return {"prompt": prompt, "rendered": rendered, "prompt_tokens": prompt_tokens, "tokens": tokens,
            "text": llm.detokenize(tokens).decode("utf-8", errors="replace"), "stop_reason": stop_reason,
            "margins": margins, "top5": top5}


def compute_reference(model: Path, **overrides) -> tuple[dict, list[dict]]:
    llm = open_llama(model, **overrides)
    text = pc.ENGLISH_TEXT.read_text(encoding="utf-8")
    tokens = tokenize_text(llm, text)
    scoring = score_text(llm, tokens, pc.SCORING_CTX)
    greedy = [greedy_chat(llm, p, pc.GREEDY_MAX_TOKENS) for p in pc.GREEDY_PROMPTS]
    return scoring, greedy


def self_agreement(a: dict, b: dict) -> dict:
    n = len(a["pos"])
    diffs = [y - x for x, y in zip(a["logprob"], b["logprob"])]
    return {
        "top1_agreement": sum(x == y for x, y in zip(a["top1"], b["top1"])) / n,
        "mean_logprob_diff": sum(diffs) / n,
        "max_abs_logprob_diff": max(abs(d) for d in diffs),
        "ppl_rel_diff": pc.perplexity_of(b["logprob"]) / pc.perplexity_of(a["logprob"]) - 1.0,
    }


def make_golden(model: Path) -> int:
    import llama_cpp

    t0 = time.time()
    scoring, greedy = compute_reference(model)
    t1 = time.time()
    print(f"llama.cpp reference (flash attention off) computed in {t1 - t0:.1f} s")
    noise = {}
    for name, overrides in NOISE_VARIANTS.items():
        var_scoring, var_greedy = compute_reference(model, **overrides)
        agreement = self_agreement(scoring, var_scoring)
        agreement["greedy_identical"] = sum(a["tokens"] == b["tokens"] for a, b in zip(greedy, var_greedy))
        noise[name] = {k: round(v, 6) for k, v in agreement.items()}
        print(f"llama.cpp {name} vs reference: {noise[name]}")

    settings = {
        "llama_cpp_python_version": llama_cpp.__version__,
        "model": pc.MODEL_NAME,
        "n_ctx": N_CTX,
        "n_threads": N_THREADS,
        "seed": 0,
        "logits_all": True,
        "flash_attn": False,
        "type_k": "f16 (default)",
        "type_v": "f16 (default)",
        "add_bos": False,
        "note": "generated by tests/python/peer_forward.py --make-golden",
    }
    scoring_out = {
        **settings,
        "text": str(pc.ENGLISH_TEXT.relative_to(pc.REPO_ROOT)),
        "text_sha256": pc.sha256_file(pc.ENGLISH_TEXT),
        "windowing": "consecutive non-overlapping windows of ctx tokens, each from an empty cache; "
                     "every token after a window's first is scored",
        "n_tokens": len(scoring["tokens"]),
        "n_scored": len(scoring["pos"]),
        "perplexity": round(pc.perplexity_of(scoring["logprob"]), 6),
        "reference_noise": noise,
        **scoring,
    }
    greedy_out = {
        **settings,
        "max_tokens": pc.GREEDY_MAX_TOKENS,
        "eos_ids": list(pc.EOS_IDS),
        "greedy": "argmax of the logits at every step (numpy argmax: lowest id on exact ties)",
        "runs": greedy,
    }
    pc.save_json(pc.GOLDEN_LOGPROBS, scoring_out)
    pc.save_json(pc.GOLDEN_GREEDY, greedy_out)
    print(f"wrote {pc.GOLDEN_LOGPROBS} ({scoring_out['n_scored']} scored tokens, ppl "
          f"{scoring_out['perplexity']:.4f}) and {pc.GOLDEN_GREEDY} ({len(greedy)} prompts)")
    for g in greedy:
        print(f"  [{g['stop_reason']:6s} {len(g['tokens']):2d} tok, min margin {min(g['margins']):.4f}] "
              f"{g['prompt'][:40]!r} -> {g['text'][:60]!r}")
    return 0


def check(model: Path, kvzap_bin: Path, threads: int, against: str) -> int:
    pc.require_file(model, "model")
    pc.require_file(kvzap_bin, "kvzap binary (set KVZAP_BIN)")
    checks = pc.Checks()
    if against == "live":
        import llama_cpp

        t0 = time.time()
        scoring, greedy = compute_reference(model)
        print(f"llama.cpp live reference (llama-cpp-python {llama_cpp.__version__}) in {time.time() - t0:.1f} s")
        if pc.GOLDEN_LOGPROBS.is_file():
            golden = pc.load_json(pc.GOLDEN_LOGPROBS)
            if golden["tokens"] == scoring["tokens"] and golden["pos"] == scoring["pos"]:
                drift = self_agreement(golden, scoring)
                pc.info(f"live llama.cpp vs golden (llama-cpp-python {golden['llama_cpp_python_version']}): "
                        f"top-1 {100 * drift['top1_agreement']:.2f}%, max |logprob diff| "
                        f"{drift['max_abs_logprob_diff']:.2e}")
            else:
                pc.info("live llama.cpp tokenization differs from the golden file (text or tokenizer changed)")
    else:
        scoring = pc.load_json(pc.GOLDEN_LOGPROBS)
        greedy = pc.load_json(pc.GOLDEN_GREEDY)["runs"]
    kv = pc.Kvzap(kvzap_bin, model, threads)
    with tempfile.TemporaryDirectory(prefix="kvzap_peer_") as tmp:
        pc.run_kvzap_suite(kv, scoring, greedy, Path(tmp), checks)
    return checks.finish()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--make-golden", action="store_true")
    mode.add_argument("--check", action="store_true")
    ap.add_argument("--against", choices=["live", "golden"], default="live",
                    help="reference for --check (default: llama.cpp computed live)")
    ap.add_argument("--model", type=Path, default=None, help="GGUF model (default: KVZAP_MODEL / cache)")
    ap.add_argument("--kvzap-bin", type=Path, default=None, help="kvzap binary (default: KVZAP_BIN or build/kvzap)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="kvzap threads (default 2)")
    args = ap.parse_args()
    model = args.model or pc.find_model()
    pc.require_file(model, "model")
    if args.make_golden:
        return make_golden(model)
    return check(model, args.kvzap_bin or pc.find_kvzap_bin(), args.threads, args.against)


if __name__ == "__main__":
    sys.exit(main())
