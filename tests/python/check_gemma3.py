#!/usr/bin/env python3
"""Peer check of kvzap on Gemma-3-270M (gemma3 architecture, SentencePiece tokenizer) against llama.cpp.

  (default)       compare kvzap with tests/golden/gemma3_peer.json, llama.cpp's results stored once
                  (no llama_cpp needed); prints SKIPPED and exits 0 when the model is not downloaded
                  (`kvzap pull gemma-3-270m`)
  --make-golden   compute the reference with llama-cpp-python (vocab and model from the same GGUF) and
                  write the golden file
  --live          compare with llama-cpp-python computed now instead of the golden file

Checks:
  1. tokenizer: `kvzap tokenize --jsonl` on >= 500 varied strings (the byte-level suite's strings plus
     Gemma-specific ones: turn markers, runs of spaces and newlines, HTML, byte fallback), with and
     without special-token parsing: ids identical to llama.cpp's for every string;
  2. teacher-forced scoring (`kvzap perplexity`): a ~200-token text, and a ~1000-token one that is longer
     than the local layers' 512-token window (so the sliding window is exercised); |mean log-prob
     difference| <= 0.01 nats and top-1 agreement >= 94 %. Like SmolLM2 (peer_common.py), this Q4_K_M
     model is chaotic under 1-ulp changes: llama.cpp against itself with flash attention on, or an F32
     K/V cache, agrees on top-1 for only ~95-97 % of positions (measured by --make-golden, stored as
     reference_noise), so the pass bar is that noise floor and the 99 % target is reported beside it;
  3. greedy generation (`kvzap generate --chat --temp 0`) of chat prompts in Gemma's turn format (the file
     has no chat template): prompt ids identical, generations reported, every divergence at a llama.cpp
     near-tie (top1 - top2 < 1 nat).
The reference uses llama.cpp's CPU defaults (F16 K/V cache, flash attention off), as peer_forward.py does.
Env: KVZAP_BIN, KVZAP_GEMMA3_MODEL (default $KVZAP_MODELS or ~/.cache/kvzap/models /gemma-3-270m-Q4_K_M.gguf).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_common as pc  # noqa: E402
import peer_tokenize as pt  # noqa: E402

MODEL_FILE = "gemma-3-270m-Q4_K_M.gguf"
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GOLDEN = pc.GOLDEN_DIR / "gemma3_peer.json"
EOS_IDS = (1, 106)  # <eos>, <end_of_turn>
N_CTX = 2048
GREEDY_TOKENS = 48
MIN_TOP1 = pc.MIN_TOP1_AGREEMENT  # 0.94: llama.cpp's own noise floor (see the docstring)
TARGET_TOP1 = 0.99
MAX_MEAN_DIFF = 0.01
NOISE_VARIANTS = {"flash_attn_on": {"flash_attn": True}, "kv_cache_f32": {"type_k": 0, "type_v": 0}}
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the ocean.",
    "List three prime numbers greater than 20.",
    "Explain what a KV cache is in two sentences.",
]

GEMMA_TEXTS = [
    "<start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\nIt is 4.<end_of_turn>\n",
    "<eos><pad><unk><mask>[multimodal]<start_of_image><end_of_image>",
    "<unused0><unused17> and <unused6241>",
    "a\n\nb\n\n\nc\n\n\n\n\n\n\n\nd", "x  y   z    w          v", "\t\t\tindented\n    four spaces",
    "<div class=\"main\"><p>Hello</p></div></iframe></footer>", "<table><tr><td>1</td></tr></table>",
    " leading space", "trailing space ", "  two leading", "\u2581already a block char",
    "Emoji \U0001f600\U0001f44d\U0001f3fd and ZWJ \U0001f468\u200d\U0001f469\u200d\U0001f467",
    "Rare: \u0f00\u1680\u2e80\U00010348\U0001d11e\U0001f9ff", "Control \x01\x02\x7f bytes",
    "Mixed scripts: English, Ελληνικά, Русский, עברית, العربية, हिन्दी, 日本語, 한국어",
    "def f(x):\n    return x ** 2  # square\n", "SELECT * FROM t WHERE id = 42;",
    "1234567890 3.14159 -17 1e-9 0xFF", "naïve café résumé Zürich façade", "ÀÉÎÕÜ àéîõü",
]


def find_model() -> Path:
    if os.environ.get("KVZAP_GEMMA3_MODEL"):
        return Path(os.environ["KVZAP_GEMMA3_MODEL"])
    if os.environ.get("KVZAP_MODELS"):
        return Path(os.environ["KVZAP_MODELS"]) / MODEL_FILE
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kvzap" / "models" / MODEL_FILE


def tokenizer_cases() -> list[str]:
    seen, out = set(), []
    for t in GEMMA_TEXTS + pt.make_cases():
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def scoring_texts() -> dict[str, str]:
    """A ~200-token passage and a ~1000-token one (longer than the 512-token local window)."""
    text = pc.ENGLISH_TEXT.read_text(encoding="utf-8")
    return {"short": text[:900], "long": text[:4600]}


def render_chat(prompt: str) -> str:
    """Gemma's turn format (what kvzap falls back to for a file without a chat template)."""
    return f"<bos><start_of_turn>user\n{prompt.strip()}<end_of_turn>\n<start_of_turn>model\n"


# ------------------------------------------------------------------------------------------ llama.cpp side

def open_llama(model: Path, **overrides):
    import llama_cpp

    return llama_cpp.Llama(model_path=str(model), n_ctx=N_CTX, logits_all=True, n_threads=2, seed=0,
                           verbose=False, **overrides)


def reference_noise(model: Path, scoring: dict, greedy: list[dict]) -> dict:
    """llama.cpp against itself with one numerics setting changed, on the same texts."""
    import peer_forward as pf

    out = {}
    for name, overrides in NOISE_VARIANTS.items():
        llm = open_llama(model, **overrides)
        for key, ref in scoring.items():
            s = pf.score_text(llm, ref["tokens"], N_CTX)
            n = len(s["pos"])
            diffs = [a - b for a, b in zip(s["logprob"], ref["logprob"])]
            out[f"{name}/{key}"] = {"top1_agreement": round(sum(a == b for a, b in zip(s["top1"], ref["top1"])) / n, 6),
                                    "mean_logprob_diff": round(sum(diffs) / n, 6),
                                    "max_abs_logprob_diff": round(max(abs(d) for d in diffs), 6)}
        runs = greedy_runs(llm)
        steps = [agreed_steps(r["tokens"], g["tokens"]) for r, g in zip(runs, greedy)]
        out[f"{name}/greedy"] = {"identical": sum(r["tokens"] == g["tokens"] for r, g in zip(runs, greedy)),
                                 "agreed_steps": steps}
    return out


def greedy_runs(llm) -> list[dict]:
    """llama.cpp's greedy continuation of each chat prompt, with its top-5 log-probs at every step."""
    import numpy as np
    import peer_forward as pf

    greedy = []
    for prompt in PROMPTS:
        rendered = render_chat(prompt)
        ptoks = list(llm.tokenize(rendered.encode("utf-8"), add_bos=False, special=True))
        llm.reset()
        llm.eval(ptoks)
        toks, margins, top5, stop = [], [], [], "length"
        for _ in range(GREEDY_TOKENS):
            lp = pf.log_softmax_rows(np.array(llm.scores[llm.n_tokens - 1: llm.n_tokens], dtype=np.float32))[0]
            best = np.argsort(-lp)[:5]
            margins.append(round(float(lp[best[0]] - lp[best[1]]), 4))
            top5.append([[int(t), round(float(lp[t]), 4)] for t in best])
            tok = int(best[0])
            if tok in EOS_IDS:
                stop = "eos"
                break
            toks.append(tok)
            if len(toks) < GREEDY_TOKENS:
                llm.eval([tok])
        greedy.append({"prompt": prompt, "rendered": rendered, "prompt_tokens": ptoks, "tokens": toks,
                       "text": llm.detokenize(toks).decode("utf-8", errors="replace"), "stop_reason": stop,
                       "margins": margins, "top5": top5})
    return greedy


def agreed_steps(a: list[int], b: list[int]) -> int:
    """Tokens two greedy runs share before they first differ (the whole run when identical)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)) if a != b else len(a))


def reference(model: Path, with_noise: bool = False) -> dict:
    import llama_cpp
    import peer_forward as pf

    llm = open_llama(model)
    cases = []
    for text in tokenizer_cases():
        b = text.encode("utf-8")
        cases.append({"text": text, "ids": list(llm.tokenize(b, add_bos=False, special=True)),
                      "ids_no_special": list(llm.tokenize(b, add_bos=False, special=False))})
    scoring = {}
    for name, text in scoring_texts().items():
        toks = list(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))
        s = pf.score_text(llm, toks, N_CTX)
        s["text"] = text
        scoring[name] = s
    greedy = greedy_runs(llm)
    out = {"model": MODEL_FILE, "model_sha256": MODEL_SHA256, "llama_cpp_python_version": llama_cpp.__version__,
           "flash_attn": False, "type_k": "f16", "n_ctx": N_CTX, "tokenize": cases, "scoring": scoring,
           "greedy": greedy}
    if with_noise:
        out["reference_noise"] = reference_noise(model, scoring, greedy)
    return out


# ------------------------------------------------------------------------------------------ kvzap side

def kvzap_tokenize_all(binary: Path, model: Path, texts: list[str], special: bool, workdir: Path) -> list[list[int]]:
    src = workdir / "cases.jsonl"
    src.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    cmd = [str(binary), "tokenize", "-m", str(model), "--jsonl", str(src)] + ([] if special else ["--no-special"])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise pc.KvzapError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()[-1000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    if len(rows) != len(texts):
        raise pc.KvzapError(f"kvzap tokenize --jsonl printed {len(rows)} rows for {len(texts)} texts")
    return rows


def check_tokenizer(checks: pc.Checks, ref_cases: list[dict], binary: Path, model: Path, workdir: Path) -> None:
    texts = [c["text"] for c in ref_cases]
    for special, key in ((True, "ids"), (False, "ids_no_special")):
        got = kvzap_tokenize_all(binary, model, texts, special, workdir)
        same = sum(1 for c, g in zip(ref_cases, got) if c[key] == g)
        bad = [c["text"] for c, g in zip(ref_cases, got) if c[key] != g]
        checks.add(f"tokenizer ids ({'special tokens parsed' if special else 'no special parsing'})",
                   same == len(ref_cases) and len(ref_cases) >= 500,
                   f"{same}/{len(ref_cases)} strings identical to llama.cpp")
        for t in bad[:5]:
            pc.info(f"differs: {t!r}")


def check_scoring(checks: pc.Checks, name: str, ref: dict, kv: pc.Kvzap, workdir: Path) -> None:
    text_file = workdir / f"{name}.txt"
    text_file.write_text(ref["text"], encoding="utf-8")
    ids = kv.tokenize_file(text_file)
    bos = ref["tokens"][0]
    pc.check_token_ids(checks, f"{name} text ids", ref["tokens"], [bos] + ids if ids[:1] != [bos] else ids)
    ppl = kv.perplexity(text_file, ref["ctx"], workdir / f"{name}.jsonl")
    got = pc.kvzap_scoring_as_golden(ppl["records"], ref["ctx"])
    pairs = [(i, j) for j, p in enumerate(got["pos"]) for i in [ref["pos"].index(p)] if p in ref["pos"]]
    n = len(pairs)
    diffs = [got["logprob"][j] - ref["logprob"][i] for i, j in pairs]
    mean_diff = sum(diffs) / max(n, 1)
    agree = sum(1 for i, j in pairs if got["top1"][j] == ref["top1"][i])
    near = sum(1 for i, j in pairs if got["top1"][j] != ref["top1"][i] and ref["margin"][i] < pc.NEAR_TIE_NATS)
    checks.add(f"{name} text: positions", n == len(ref["pos"]) and n > 0, f"{n} of {len(ref['pos'])} positions scored")
    checks.add(f"{name} text: mean log-prob difference", abs(mean_diff) <= MAX_MEAN_DIFF,
               f"kvzap {sum(got['logprob']) / max(len(got['logprob']), 1):.5f}, llama.cpp "
               f"{sum(ref['logprob']) / len(ref['logprob']):.5f}, difference {mean_diff:+.5f} nats "
               f"(|.| <= {MAX_MEAN_DIFF}); max |diff| {max(abs(d) for d in diffs):.4f}")
    top1 = agree / max(n, 1)
    checks.add(f"{name} text: top-1 agreement", top1 >= MIN_TOP1 or agree + near == n,
               f"{agree}/{n} ({100 * top1:.2f}%; need >= {100 * MIN_TOP1:.0f}%, llama.cpp's noise floor; target "
               f"{100 * TARGET_TOP1:.0f}%: {'met' if top1 >= TARGET_TOP1 else 'NOT met'}; {near} of the {n - agree} "
               f"disagreements are llama.cpp near-ties < {pc.NEAR_TIE_NATS} nats)")


def check_greedy(checks: pc.Checks, ref_runs: list[dict], kv: pc.Kvzap, noise: dict) -> None:
    """Greedy runs against llama.cpp's. Their pass bars are llama.cpp's own noise (the golden file's
    reference_noise: llama.cpp against itself with flash attention on, or an F32 K/V cache): at least as
    many identical runs as its worst variant, and at least 90 % of that variant's agreed tokens in all."""
    got_runs = []
    for ref in ref_runs:
        got_runs.append(kv.generate_chat(ref["prompt"], GREEDY_TOKENS))
    variants = {k.split("/")[0]: v for k, v in noise.items() if k.endswith("/greedy")}
    pc.GREEDY_MAX_TOKENS = GREEDY_TOKENS
    pc.EOS_IDS = EOS_IDS
    if variants:
        pc.MIN_GREEDY_IDENTICAL = min(v["identical"] for v in variants.values())
    pc.compare_greedy(checks, ref_runs, got_runs)
    steps = [agreed_steps(r["tokens"], [int(t) for t in g.get("tokens", [])]) for r, g in zip(ref_runs, got_runs)]
    if variants:
        floor = min(sum(v["agreed_steps"]) for v in variants.values())
        noise_txt = ", ".join(f"{k} {v['identical']} identical, {sum(v['agreed_steps'])} tokens {v['agreed_steps']}"
                              for k, v in variants.items())
        checks.add("greedy agreement length", sum(steps) >= 0.9 * floor,
                   f"kvzap agrees with llama.cpp for {sum(steps)} tokens before each run's first divergence "
                   f"{steps}; need >= 90 % of llama.cpp's own worst variant ({floor}); llama.cpp vs itself: {noise_txt}")
    else:
        print(f"SKIPPED: greedy agreement length (the golden file has no greedy reference_noise; "
              f"kvzap agreed for {steps})")
    for ref, got in zip(ref_runs, got_runs):
        pc.info(f"{ref['prompt']!r} -> kvzap: {got.get('text', '')!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-golden", action="store_true")
    ap.add_argument("--live", action="store_true")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    model = find_model()
    if not model.is_file():
        print(f"SKIPPED: {model} not found (run `kvzap pull gemma-3-270m`)")
        return 0
    if args.make_golden:
        ref = reference(model, with_noise=True)
        pc.save_json(GOLDEN, ref)
        sizes = ", ".join(f"{k} {len(v['tokens'])} tokens" for k, v in ref["scoring"].items())
        print(f"wrote {GOLDEN}: {len(ref['tokenize'])} tokenizer cases, {sizes}")
        return 0
    binary = pc.find_kvzap_bin()
    pc.require_file(binary, "kvzap binary (build it or set KVZAP_BIN)")
    if args.live:
        ref = reference(model)
    else:
        pc.require_file(GOLDEN, "golden file (make it with --make-golden)")
        ref = pc.load_json(GOLDEN)
    print(f"reference: llama-cpp-python {ref['llama_cpp_python_version']} ({'live' if args.live else 'golden'}); "
          f"kvzap: {binary}; model {model}")
    for name, noise in ref.get("reference_noise", {}).items():
        if name.endswith("/greedy"):
            continue
        pc.info(f"llama.cpp vs itself, {name}: top-1 {100 * noise['top1_agreement']:.2f}%, mean logprob diff "
                f"{noise['mean_logprob_diff']:+.5f}, max |diff| {noise['max_abs_logprob_diff']:.4f}")
    checks = pc.Checks()
    kv = pc.Kvzap(binary, model, args.threads)
    with tempfile.TemporaryDirectory(prefix="kvzap_gemma3_") as tmp:
        work = Path(tmp)
        try:
            check_tokenizer(checks, ref["tokenize"], binary, model, work)
            for name, s in ref["scoring"].items():
                check_scoring(checks, name, s, kv, work)
            check_greedy(checks, ref["greedy"], kv, ref.get("reference_noise", {}))
        except (pc.KvzapError, KeyError, ValueError) as e:
            checks.add("kvzap run", False, str(e))
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
