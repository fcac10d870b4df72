#!/usr/bin/env python3
"""CI peer check: kvzap against the llama.cpp golden files (no llama_cpp needed).

Runs `kvzap tokenize`, `kvzap perplexity` and `kvzap generate --chat --temp 0` on the inputs stored in
tests/golden/peer_logprobs.json and tests/golden/peer_greedy.json (made by
`tests/python/peer_forward.py --make-golden`) and applies the thresholds of peer_common.py:
top-1 agreement >= 99 %, |mean logprob diff| <= 0.01 nats, perplexity within 1 %, >= 8/10 greedy
generations identical over 64 tokens, plus exact token ids. Exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_common as pc  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="GGUF model (default: KVZAP_MODEL / cache)")
    ap.add_argument("--kvzap-bin", type=Path, default=None, help="kvzap binary (default: KVZAP_BIN or build/kvzap)")
    ap.add_argument("-t", "--threads", type=int, default=2, help="kvzap threads (default 2)")
    args = ap.parse_args()

    model = args.model or pc.find_model()
    kvzap_bin = args.kvzap_bin or pc.find_kvzap_bin()
    pc.require_file(model, "model (CI pulls it first; set KVZAP_MODEL)")
    pc.require_file(kvzap_bin, "kvzap binary (build it or set KVZAP_BIN)")
    pc.require_file(pc.GOLDEN_LOGPROBS, "golden scoring file")
    pc.require_file(pc.GOLDEN_GREEDY, "golden greedy file")

    scoring = pc.load_json(pc.GOLDEN_LOGPROBS)
    greedy = pc.load_json(pc.GOLDEN_GREEDY)
    print(f"reference: llama-cpp-python {scoring['llama_cpp_python_version']} (flash_attn "
          f"{scoring['flash_attn']}, K/V {scoring['type_k']}), {scoring['n_tokens']} tokens, ctx "
          f"{scoring['ctx']}, ppl {scoring['perplexity']:.4f}; kvzap: {kvzap_bin} -t {args.threads}")
    for name, noise in scoring.get("reference_noise", {}).items():
        pc.info(f"llama.cpp vs itself with {name}: top-1 {100 * noise['top1_agreement']:.2f}%, "
                f"mean logprob diff {noise['mean_logprob_diff']:+.5f}, greedy identical "
                f"{noise['greedy_identical']}/{len(greedy['runs'])}")

    checks = pc.Checks()
    # The golden files are only meaningful for the exact inputs they were made from.
    prompts_ok = [run["prompt"] for run in greedy["runs"]] == pc.GREEDY_PROMPTS and all(
        run["rendered"] == pc.render_chat(run["prompt"]) for run in greedy["runs"])
    text_ok = scoring.get("text_sha256") == pc.sha256_file(pc.ENGLISH_TEXT)
    checks.add("golden inputs current", prompts_ok and text_ok and scoring["ctx"] == pc.SCORING_CTX,
               f"english.txt sha256 {'matches' if text_ok else 'DIFFERS from'} the golden file; prompts and "
               f"chat template {'match' if prompts_ok else 'DIFFER from'} peer_common.py "
               "(if not: rerun peer_forward.py --make-golden)")

    kv = pc.Kvzap(kvzap_bin, model, args.threads)
    with tempfile.TemporaryDirectory(prefix="kvzap_peer_") as tmp:
        pc.run_kvzap_suite(kv, scoring, greedy["runs"], Path(tmp), checks)
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
