#!/usr/bin/env python3
"""kvzap's presses against NVIDIA kvpress on tiny random Hugging Face checkpoints (docs/PARITY.md).

For every press both have, the same compression ratio (or, for DMSPress, the same threshold) is run by
kvpress (the installed package, on transformers, f32 on the CPU) and by kvzap (`kvzap generate --json --kv-type f32`) on the same folder
and the same token ids, and compared:
  * the kept set of every (layer, KV head): Jaccard |A n B| / |A u B| of the context positions kept;
  * the answer: the greedy tokens generated after the compressed context (kvpress's pipeline way:
    position ids continue after the full context whatever the cache holds).
kvpress's kept set is read from the cache it leaves: every kept key row is found, bit for bit, among
the keys of an uncompressed run of the same model (compression happens after each layer's attention,
so the keys are the same), less the rows it masks instead of removing (`masked_key_indices`: AdaKV,
KVzip).

Models (written by this script into a temporary folder, nothing downloaded): a tiny random Llama
(Llama 3 style BPE tokenizer with BOS, untied head, a content-only chat template) and a tiny random
SmolLM2-form model (LlamaForCausalLM with tied embeddings, SmolLM2's digit-splitting tokenizer, a
ChatML template with a system turn). Three contexts of about 300, 400 and 500 tokens.

Each press has an expectation (PRESSES below): "exact" presses must keep identical sets (Jaccard 1.0
on every head of every context) and give identical answers, or the check fails; "report" presses are
measured and printed only, with the reason they cannot match (different random numbers, a deliberate
difference). A press whose exact parity breaks fails the run.

Needs torch, transformers (< 5.3, what kvpress 0.5.5 accepts), tokenizers and kvpress; without them it
prints SKIPPED and exits 0. Env: KVZAP_BIN (default <repo>/build/kvzap). Options: -v (per-head detail),
--press NAME (only that kvzap press; repeatable), --json FILE (the measured table), --markdown (the table
as docs/PARITY.md shows it).
Prints "N passed, M failed, K skipped"; exits 1 on failure.
"""
import json
import os

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import random
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from check_report import kvzap_bin, peers_missing, report, skip, summary  # noqa: E402,F401

ARGS = sys.argv[1:]
VERBOSE = "-v" in ARGS
ONLY = [ARGS[i + 1] for i, a in enumerate(ARGS) if a == "--press" and i + 1 < len(ARGS)]
JSON_OUT = next((ARGS[i + 1] for i, a in enumerate(ARGS) if a == "--json" and i + 1 < len(ARGS)), None)
RATIO = 0.5
PER_LAYER_RATIOS = [0.0, 0.25, 0.5, 0.75]  # per_layer_<press>: one per layer of the harness's 4-layer models
EOG_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>",
             "<end_of_turn>", "<|return|>")
N_ANSWER = 6


def finish():
    sys.exit(summary())


# ---------------------------------------------------------------------------------------------
# The presses: kvzap name, its ratio scope (kvpress's budget split), the kvpress press, the
# attention implementation kvpress needs, and the expectation.
# ---------------------------------------------------------------------------------------------

def presses():
    import kvpress as K
    sn = K.SnapKVPress
    ea = lambda: K.ExpectedAttentionPress(epsilon=1e-2)  # noqa: E731  (kvzap's epsilon: kvpress's leaderboard setting)
    P = []

    def add(name, scope, make, attn="sdpa", expect="exact", why="", variant="", params=None, threshold=None,
            window=None, ratios=None):
        # params: the press's own kvpress arguments, given to kvzap as --press-param NAME=VALUE.
        # threshold / window: a threshold press (kvpress DMSPress), run by kvzap with --threshold / --window.
        # ratios: a list press's ratios (per layer for per_layer_<press>), given as --press-ratios instead
        # of --ratio (scope None); `make` then ignores RATIO.
        P.append(dict(name=name, scope=scope, make=make, attn=attn, expect=expect, why=why, variant=variant,
                      params=params or {}, threshold=threshold, window=window, ratios=ratios))

    add("knorm", "head", lambda r: K.KnormPress(compression_ratio=r))
    add("streaming_llm", "head", lambda r: K.StreamingLLMPress(compression_ratio=r))
    add("snapkv", "head", lambda r: sn(compression_ratio=r))
    add("adakv_snapkv", "adakv", lambda r: K.AdaKVPress(sn(compression_ratio=r)))
    add("pyramidkv", "head", lambda r: K.PyramidKVPress(compression_ratio=r))
    add("chunkkv", "head", lambda r: K.ChunkKVPress(press=sn(compression_ratio=r), chunk_length=20))
    add("tova", "head", lambda r: K.TOVAPress(compression_ratio=r))
    add("observed_attention", "head", lambda r: K.ObservedAttentionPress(compression_ratio=r), attn="eager")
    add("expected_attention_uniform", "head", lambda r: (lambda p: (setattr(p, "compression_ratio", r), p)[1])(ea()))
    add("expected_attention", "adakv",
        lambda r: K.AdaKVPress((lambda p: (setattr(p, "compression_ratio", r), p)[1])(ea())))
    add("keydiff", "head", lambda r: K.KeyDiffPress(compression_ratio=r))
    add("lagkv", "head", lambda r: K.LagKVPress(compression_ratio=r))
    add("cur", "head", lambda r: K.CURPress(compression_ratio=r))
    add("kvzip", "global", lambda r: protect_prefix(K.KVzipPress(compression_ratio=r)))
    add("kvzip+", "global", lambda r: protect_prefix(K.KVzipPress(compression_ratio=r, kvzip_plus_normalization=True)))
    prefix_why = ("kvpress scores the chat-template prefix 0 beyond its 4 sinks, kvzap protects it "
                  "(docs/ALGORITHMS.md 2.3); equal where the prefix has at most 4 tokens")
    add("kvzip", "global", lambda r: protect_prefix(K.KVzipPress(compression_ratio=r), False), expect="report",
        why=prefix_why, variant="kvpress unchanged")
    add("kvzip+", "global",
        lambda r: protect_prefix(K.KVzipPress(compression_ratio=r, kvzip_plus_normalization=True), False),
        expect="report", why=prefix_why, variant="kvpress unchanged")
    add("non_causal_attn", "head", lambda r: K.NonCausalAttnPress(compression_ratio=r))
    add("adakv_non_causal_attn", "adakv", lambda r: K.AdaKVPress(K.NonCausalAttnPress(compression_ratio=r)))
    add("critical_snapkv", "head", lambda r: K.CriticalKVPress(sn(compression_ratio=r)))
    add("critical_expected_attention", "head",
        lambda r: K.CriticalKVPress(K.ExpectedAttentionPress(compression_ratio=r, use_vnorm=False)))
    add("critical_adakv_expected_attention", "adakv",
        lambda r: K.CriticalAdaKVPress(K.ExpectedAttentionPress(compression_ratio=r, use_vnorm=False)))
    add("critical_adakv_snapkv", "adakv", lambda r: K.CriticalAdaKVPress(sn(compression_ratio=r)))
    add("entropy_gated_chunkkv", "head", lambda r: K.EntropyGatedChunkKVPress(press=sn(compression_ratio=r)))
    add("block_keydiff", "head", lambda r: K.BlockPress(press=K.KeyDiffPress(compression_ratio=r), block_size=128))
    add("chunk_snapkv", "head", lambda r: K.ChunkPress(press=sn(compression_ratio=r), chunk_length=1024))
    add("chunk_keydiff", "head", lambda r: K.ChunkPress(press=K.KeyDiffPress(compression_ratio=r), chunk_length=1024))
    add("chunk_tova", "head", lambda r: K.ChunkPress(press=K.TOVAPress(compression_ratio=r), chunk_length=1024))
    add("chunk_knorm", "head", lambda r: K.ChunkPress(press=K.KnormPress(compression_ratio=r), chunk_length=1024))
    add("chunk_expected_attention", "head",
        lambda r: K.ChunkPress(press=(lambda p: (setattr(p, "compression_ratio", r), p)[1])(ea()), chunk_length=1024))
    # KeyRerotationPress: the kept keys re-rotated to contiguous positions, so kvpress's kept set is read from
    # the indices it re-rotates (record_rerotation) instead of matching key rows; the answers check the keys.
    add("key_rerotation_knorm", "head", lambda r: K.KeyRerotationPress(K.KnormPress(compression_ratio=r)))
    add("key_rerotation_snapkv", "head", lambda r: K.KeyRerotationPress(sn(compression_ratio=r)))
    add("cap", "head", lambda r: K.CapPress(compression_ratio=r))
    add("adakv_cap", "adakv", lambda r: K.AdaKVPress(K.CapPress(compression_ratio=r)))
    add("compactor", "head", lambda r: K.CompactorPress(compression_ratio=r), expect="report",
        why="kvpress draws its Gaussian sketch unseeded from torch's generator, kvzap from PressSpec::seed")
    add("adakv_compactor", "adakv", lambda r: K.AdaKVPress(K.CompactorPress(compression_ratio=r)), expect="report",
        why="as compactor")
    add("leverage_score", "head", lambda r: K.LeverageScorePress(compression_ratio=r), expect="report",
        why="kvpress draws its Gaussian sketch unseeded from torch's generator, kvzap from PressSpec::seed")
    # The presses reading statistics: kvzap computes them (`kvzap query-stats`, beside the model where its
    # presses find them) and the same file is injected into kvpress's press instead of the hub's download.
    add("qfilter", "head", lambda r: qfilter_press(K, r))
    add("expected_attention_stats", "head", lambda r: expected_attention_stats_press(K, r))
    add("expected_attention_stats", "head", lambda r: expected_attention_stats_press(K, r, epsilon=0.05, n_sink=8),
        variant="epsilon=0.05 n_sink=8", params={"epsilon": 0.05, "n_sink": 8})
    # kvpress's own arguments, away from their defaults.
    add("snapkv", "head", lambda r: sn(compression_ratio=r, window_size=24, kernel_size=3),
        variant="window_size=24 kernel_size=3", params={"window_size": 24, "kernel_size": 3})
    add("streaming_llm", "head", lambda r: K.StreamingLLMPress(compression_ratio=r, n_sink=9),
        variant="n_sink=9", params={"n_sink": 9})
    add("pyramidkv", "head", lambda r: K.PyramidKVPress(compression_ratio=r, window_size=32, kernel_size=7, beta=10),
        variant="window_size=32 kernel_size=7 beta=10", params={"window_size": 32, "kernel_size": 7, "beta": 10})
    add("chunkkv", "head", lambda r: K.ChunkKVPress(press=sn(compression_ratio=r), chunk_length=12),
        variant="chunk_length=12", params={"chunk_length": 12})
    EA = K.ExpectedAttentionPress
    add("expected_attention_uniform", "head",
        lambda r: EA(compression_ratio=r, n_future_positions=64, n_sink=8, epsilon=0.05),
        variant="n_future_positions=64 n_sink=8 epsilon=0.05",
        params={"n_future_positions": 64, "n_sink": 8, "epsilon": 0.05})
    add("expected_attention_uniform", "head",
        lambda r: EA(compression_ratio=r, use_covariance=False, use_vnorm=False),
        variant="use_covariance=0 use_vnorm=0", params={"use_covariance": 0, "use_vnorm": 0})
    add("expected_attention", "adakv",
        lambda r: K.AdaKVPress(EA(compression_ratio=r, epsilon=1e-2, n_sink=8), alpha_safeguard=0.5),
        variant="alpha_safeguard=0.5 n_sink=8", params={"alpha_safeguard": 0.5, "n_sink": 8})
    add("adakv_snapkv", "adakv", lambda r: K.AdaKVPress(sn(compression_ratio=r, window_size=24), alpha_safeguard=0.6),
        variant="alpha_safeguard=0.6 window_size=24", params={"alpha_safeguard": 0.6, "window_size": 24})
    add("adakv_non_causal_attn", "adakv",
        lambda r: K.AdaKVPress(K.NonCausalAttnPress(compression_ratio=r, chunk_size=64), alpha_safeguard=0.05),
        variant="alpha_safeguard=0.05 chunk_size=64", params={"alpha_safeguard": 0.05, "chunk_size": 64})
    add("non_causal_attn", "head", lambda r: K.NonCausalAttnPress(compression_ratio=r, chunk_size=64),
        variant="chunk_size=64", params={"chunk_size": 64})
    add("lagkv", "head", lambda r: K.LagKVPress(compression_ratio=r, n_sink=8, lag_size=32),
        variant="n_sink=8 lag_size=32", params={"n_sink": 8, "lag_size": 32})
    add("block_keydiff", "head", lambda r: K.BlockPress(press=K.KeyDiffPress(compression_ratio=r), block_size=32),
        variant="block_size=32", params={"block_size": 32})
    add("cur", "head", lambda r: K.CURPress(compression_ratio=r, num_sinks=8, local_window_size=32),
        variant="num_sinks=8 local_window_size=32", params={"num_sinks": 8, "local_window_size": 32})
    add("cur", "head", lambda r: K.CURPress(compression_ratio=r, use_local_approximation=False),
        variant="use_local_approximation=0", params={"use_local_approximation": 0})
    for lt in ("key", "value", "kv_avg"):  # a word-valued kvpress argument (a choice parameter here)
        add("cur", "head", lambda r, lt=lt: K.CURPress(compression_ratio=r, leverage_type=lt),
            variant="leverage_type=" + lt, params={"leverage_type": lt})
    add("lagkv", "head", lambda r: K.LagKVPress(compression_ratio=r, cross_scoring=True),
        variant="cross_scoring=True", params={"cross_scoring": 1})
    add("compactor", "head",
        lambda r: K.CompactorPress(compression_ratio=r, sink_size_start=4, sink_size_end=2, chunk_size=64,
                                   sketch_dimension=16),
        expect="report", why="as compactor",
        variant="sink_size_start=4 sink_size_end=2 chunk_size=64 sketch_dimension=16",
        params={"sink_size_start": 4, "sink_size_end": 2, "chunk_size": 64, "sketch_dimension": 16})
    add("compactor", "head", lambda r: K.CompactorPress(compression_ratio=r, blending=0.7),
        expect="report", why="as compactor", variant="blending=0.7", params={"blending": 0.7})
    add("leverage_score", "head", lambda r: K.LeverageScorePress(compression_ratio=r, sketch_dimension=16),
        expect="report", why="as leverage_score", variant="sketch_dimension=16", params={"sketch_dimension": 16})
    add("critical_snapkv", "head",
        lambda r: K.CriticalKVPress(sn(compression_ratio=r), epsilon=1e-2, first_stage_ratio=0.25),
        variant="epsilon=0.01 first_stage_ratio=0.25", params={"epsilon": 0.01, "first_stage_ratio": 0.25})
    add("critical_expected_attention", "head",
        lambda r: K.CriticalKVPress(EA(compression_ratio=r, use_vnorm=False), first_stage_ratio=0.8),
        variant="first_stage_ratio=0.8", params={"first_stage_ratio": 0.8})
    add("critical_adakv_snapkv", "adakv",
        lambda r: K.CriticalAdaKVPress(sn(compression_ratio=r), alpha_safeguard=0.5, epsilon=1e-3, first_stage_ratio=0.3),
        variant="alpha_safeguard=0.5 epsilon=0.001 first_stage_ratio=0.3",
        params={"alpha_safeguard": 0.5, "epsilon": 0.001, "first_stage_ratio": 0.3})
    add("critical_adakv_expected_attention", "adakv",
        lambda r: K.CriticalAdaKVPress(EA(compression_ratio=r, use_vnorm=False), alpha_safeguard=0.05,
                                       first_stage_ratio=0.7),
        variant="alpha_safeguard=0.05 first_stage_ratio=0.7", params={"alpha_safeguard": 0.05, "first_stage_ratio": 0.7})
    add("cap", "head", lambda r: K.CapPress(compression_ratio=r, tau=2.0, n_future_positions=64, n_sink=8, epsilon=1e-3),
        variant="tau=2 n_future_positions=64 n_sink=8 epsilon=0.001",
        params={"tau": 2, "n_future_positions": 64, "n_sink": 8, "epsilon": 0.001})
    add("adakv_cap", "adakv", lambda r: K.AdaKVPress(K.CapPress(compression_ratio=r, tau=2.0), alpha_safeguard=0.5),
        variant="alpha_safeguard=0.5 tau=2", params={"alpha_safeguard": 0.5, "tau": 2})
    add("entropy_gated_chunkkv", "head",
        lambda r: K.EntropyGatedChunkKVPress(press=sn(compression_ratio=r), chunk_length=16, low_entropy_chunk_length=6),
        variant="chunk_length=16 low_entropy_chunk_length=6", params={"chunk_length": 16, "low_entropy_chunk_length": 6})
    # Edges where kvpress's rule changes: no safeguard at alpha_safeguard 0, no first stage at 0.
    add("expected_attention", "adakv",
        lambda r: K.AdaKVPress(EA(compression_ratio=r, epsilon=1e-2), alpha_safeguard=0.0),
        variant="alpha_safeguard=0", params={"alpha_safeguard": 0})
    add("critical_snapkv", "head", lambda r: K.CriticalKVPress(sn(compression_ratio=r), first_stage_ratio=0.0),
        variant="first_stage_ratio=0", params={"first_stage_ratio": 0})
    # Every context in 3 to 5 chunks (the last one longer than the window: kvpress asserts otherwise).
    add("chunk_snapkv", "head", lambda r: K.ChunkPress(press=sn(compression_ratio=r), chunk_length=256),
        variant="chunk_length=256", params={"chunk_length": 256})
    add("chunk_snapkv", "head",
        lambda r: K.ChunkPress(press=sn(compression_ratio=r, window_size=32, kernel_size=3), chunk_length=200),
        variant="chunk_length=200 window_size=32 kernel_size=3",
        params={"chunk_length": 200, "window_size": 32, "kernel_size": 3})
    add("chunk_keydiff", "head", lambda r: K.ChunkPress(press=K.KeyDiffPress(compression_ratio=r), chunk_length=100),
        variant="chunk_length=100", params={"chunk_length": 100})
    add("chunk_tova", "head", lambda r: K.ChunkPress(press=K.TOVAPress(compression_ratio=r), chunk_length=100),
        variant="chunk_length=100", params={"chunk_length": 100})
    add("chunk_knorm", "head", lambda r: K.ChunkPress(press=K.KnormPress(compression_ratio=r), chunk_length=100),
        variant="chunk_length=100", params={"chunk_length": 100})
    add("chunk_expected_attention", "head",
        lambda r: K.ChunkPress(press=K.ExpectedAttentionPress(compression_ratio=r, epsilon=0.0), chunk_length=100),
        variant="chunk_length=100 epsilon=0", params={"chunk_length": 100, "epsilon": 0})
    # DMSPress(press, threshold): the press's raw scores below the threshold evicted outside the last
    # sliding_window_size tokens (kvpress masks them, kvzap frees them). Thresholds near the median score of
    # these models (about half of the judged entries evicted).
    add("dms_knorm", None, lambda r: K.DMSPress(K.KnormPress(), threshold=-4.6), threshold=-4.6,
        variant="threshold=-4.6")
    add("dms_knorm", None, lambda r: K.DMSPress(K.KnormPress(), threshold=-4.6, sliding_window_size=32),
        threshold=-4.6, window=32, variant="threshold=-4.6 sliding_window_size=32")
    add("dms_keydiff", None, lambda r: K.DMSPress(K.KeyDiffPress(), threshold=-0.15), threshold=-0.15,
        variant="threshold=-0.15")
    add("dms_snapkv", None, lambda r: K.DMSPress(sn(), threshold=0.00105), threshold=0.00105,
        variant="threshold=0.00105")
    add("dms_tova", None, lambda r: K.DMSPress(K.TOVAPress(), threshold=0.00074), threshold=0.00074,
        variant="threshold=0.00074")
    add("dms_knorm", None, lambda r: K.DMSPress(K.KnormPress(), threshold=-4.5), threshold=-4.6, expect="differ",
        why="negative control: a threshold 0.1 apart must be told apart", variant="threshold=-4.6 against kvpress -4.5")
    # PerLayerCompressionPress: one ratio per layer of the 4-layer models, a layer of ratio 0 among them.
    for inner, make_inner in (("knorm", K.KnormPress), ("snapkv", sn)):
        add("per_layer_" + inner, None,
            lambda r, m=make_inner: K.PerLayerCompressionPress(m(), compression_ratios=PER_LAYER_RATIOS),
            variant="ratios=" + ":".join("%g" % x for x in PER_LAYER_RATIOS), ratios=PER_LAYER_RATIOS)
    # ComposedPress: SnapKV, then KnormPress on what SnapKV kept (a later stage must score keys alone:
    # kvpress hands it the kept keys in topk order), and the same press twice.
    add("composed_snapkv+knorm", None,
        lambda r: K.ComposedPress([sn(compression_ratio=0.3), K.KnormPress(compression_ratio=0.3)]),
        variant="ratios=0.3:0.3", ratios=[0.3, 0.3])
    add("composed_knorm+knorm", None,
        lambda r: K.ComposedPress([K.KnormPress(compression_ratio=0.5), K.KnormPress(compression_ratio=0.2)]),
        variant="ratios=0.5:0.2", ratios=[0.5, 0.2])
    # Negative control: a different press must be told apart (the comparison can fail).
    # SimLayerKV sets its own budget (no ratio, scope None): kvpress's defaults (lazy_threshold 1, n_recent
    # 1024) leave these contexts whole. Here 14 of the 24 (context, layer) pairs are lazy (8 on llama, 6 on
    # smollm2), the nearest end mass 0.004 from the threshold (0.2942 on smollm2).
    add("simlayerkv", None, lambda r: K.SimLayerKVPress(lazy_threshold=0.29, n_recent=256),
        variant="lazy_threshold=0.29 n_recent=256", params={"lazy_threshold": 0.29, "n_recent": 256})
    add("knorm", "head", lambda r: K.KeyDiffPress(compression_ratio=r), expect="differ",
        why="negative control", variant="against kvpress KeyDiffPress")
    add("random", "head", lambda r: K.RandomPress(compression_ratio=r, seed=42), expect="report",
        why="different generators (torch.rand vs a hash of (seed, layer, head, position)): only the counts match")
    return P


# ---------------------------------------------------------------------------------------------
# Query statistics (issue 38): kvzap's own file for the model being checked, read by both sides.
# ---------------------------------------------------------------------------------------------

STATS = {}  # "path": the statistics file of the model under check (set by main before each model's presses)


def compute_query_stats(d, texts, tmp):
    """Runs `kvzap query-stats` on the model folder d over the check's contexts; returns the file (written
    beside the model's weights, where kvzap's presses look by default)."""
    files = []
    for i, t in enumerate(texts):
        f = os.path.join(tmp, "calib_%d.txt" % i)
        with open(f, "w", encoding="utf-8") as fh:
            fh.write(t)
        files.append(f)
    lst = os.path.join(tmp, "calib_files.txt")
    with open(lst, "w") as fh:
        fh.write("\n".join(files) + "\n")
    p = subprocess.run([kvzap_bin(), "query-stats", "-m", d, "--files", lst, "--windows", str(len(files)),
                        "--min-tokens", "64", "--max-tokens", "2048", "-t", "2"], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("kvzap query-stats failed: %s" % p.stderr.strip()[-600:])
    return p.stdout.strip().splitlines()[-1]


def load_query_stats():
    from safetensors.torch import load_file
    return load_file(STATS["path"])


def qfilter_press(K, r):
    """kvpress QFilterPress with kvzap's filters instead of the hub's (its post_init_from_model downloads)."""
    p = K.QFilterPress(compression_ratio=r)
    p.q_filters = load_query_stats()["q_filters"]
    p.post_init_from_model = lambda model: None
    return p


def expected_attention_stats_press(K, r, **kw):
    """kvpress ExpectedAttentionStatsPress with kvzap's mean and covariance (set, so nothing is downloaded)."""
    p = K.ExpectedAttentionStatsPress(compression_ratio=r, **kw)
    st = load_query_stats()
    p.mu, p.cov = st["query_mean"], st["query_cov"]
    return p


def protect_prefix(press, on=True):
    """KVzip with kvzap's rule for the chat-template prefix (docs/ALGORITHMS.md §2.3): kvpress scores the
    prefix 0 beyond its 4 sinks (evicted first), kvzap protects all of it. Where the prefix is longer than
    4 tokens (the SmolLM2 form's system turn) the prefix entries get kvpress's sink score too, so that the
    rest of the comparison stands; the unchanged kvpress result is printed beside it."""
    original = press.compress_post

    def compress_post(model):
        if on and press.prefix_length > press.n_sink:
            press.score_val[..., : press.prefix_length] = press.score_val.amax() + 1.0
        original(model)
    press.compress_post = compress_post
    return press


# ---------------------------------------------------------------------------------------------
# Models and contexts
# ---------------------------------------------------------------------------------------------

CHATML = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\n"
          "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n{% endif %}"
          "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Llama 3's special tokens; the user turn opens with 2 tokens (BOS, header), fewer than kvpress's 4 sinks, so
# KVzip's template-prefix rule (docs/ALGORITHMS.md §2.3, where kvzap deliberately departs) does not apply.
LLAMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['content'] }}<|eot_id|>{% endfor %}"
                  "{% if add_generation_prompt %}<|end_header_id|>{% endif %}")
QUESTION = "First number?"


def write_model(d, kind, seed):
    """A 4-layer random LlamaForCausalLM (hidden 64, 4 query heads over 2 KV heads, head_dim 16) with a
    trained tokenizer, saved as a Hugging Face folder (f32 safetensors)."""
    import torch
    import transformers as T
    from check_hf import byte_level_tokenizer, save_tokenizer
    tok, names = byte_level_tokenizer("llama3" if kind == "llama" else "smollm")
    ids = {k.replace("_token", "_token_id"): tok.token_to_id(v) for k, v in names.items()
           if k in ("bos_token", "eos_token")}
    torch.manual_seed(seed)
    cfg = T.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=len(tok.get_vocab()), max_position_embeddings=4096,
                        rms_norm_eps=1e-5, tie_word_embeddings=kind != "llama", **ids)
    model = T.LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger than the default init: peaked attention, scores far from uniform
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
            else:
                p.normal_(1.0, 0.1)
    model.save_pretrained(d, safe_serialization=True)
    save_tokenizer(tok, names, d, chat_template=LLAMA_TEMPLATE if kind == "llama" else CHATML)


WORDS = ("the of and to in is was that for on with as by at from it his her they this which be an had not are "
         "but were have one all their there been has would when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now "
         "such like our over man me even most made after also did many before must through back years where "
         "much your way well down should because each just those people how too little state good very make "
         "world still own see men work long get here between both life being under never day same another "
         "know while last might us great old year off come since against go came right used take three").split()


def contexts():
    """Three plain-prose contexts (seeded word salad with numbers and punctuation)."""
    out = []
    for seed, n_words in ((1, 230), (2, 310), (3, 390)):
        rng = random.Random(seed)
        parts = []
        for i in range(n_words):
            w = rng.choice(WORDS)
            if rng.random() < 0.05:
                w = str(rng.randint(0, 9999))
            parts.append(w)
            if rng.random() < 0.08:
                parts[-1] += rng.choice([".", ",", ";", "?"])
        out.append(" ".join(parts) + ".")
    return out


def pipeline_ids(tok, context, question):
    """kvpress's pipeline preprocessing: the context inside the user turn of the chat template (text up to
    the content, the content), the question after it followed by the end of the turn and the assistant
    header; encoded without added special tokens. kvzap's --context-file --question --chat puts "\n\n"
    before the question, so it is part of the question text here."""
    sep = "#" * (len(context) + 10)
    text = tok.apply_chat_template([{"role": "user", "content": context + sep}], add_generation_prompt=True,
                                   tokenize=False)
    ctx_text, suffix = text.split(sep)
    return (tok.encode(ctx_text, add_special_tokens=False),
            tok.encode("\n\n" + question + suffix, add_special_tokens=False))


# ---------------------------------------------------------------------------------------------
# kvpress side
# ---------------------------------------------------------------------------------------------

def full_keys(model, ids):
    """Keys of every layer after an uncompressed prefill: {layer: [H, T, D] tensor}."""
    import torch
    from transformers import DynamicCache
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), past_key_values=cache)
    return [cache.layers[l].keys[0].clone() for l in range(len(cache.layers))]


def record_scores(press, ref_keys=None):
    """Wraps the score() of the ScorerPress inside `press` (itself, or the one AdaKV / ChunkKV wrap) so that
    its scores [layer] -> [H, T] are kept (a copy: AdaKV overwrites its protected entries)."""
    from kvpress import ScorerPress
    from kvpress import BlockPress
    from kvpress import ComposedPress
    if isinstance(press, BlockPress):  # scores subsets block by block: no per-position scores to keep
        return {}
    if isinstance(press, ComposedPress):
        return record_composed_scores(press, ref_keys)
    from kvpress import ChunkPress
    inner = press if isinstance(press, ScorerPress) else getattr(press, "press", None)
    recorded = {}
    if not isinstance(inner, ScorerPress):
        return recorded
    original = inner.score
    chunked = isinstance(press, ChunkPress)  # scores chunk by chunk, in order: concatenated per layer

    def score(module, *a, **k):
        import torch
        s = original(module, *a, **k)
        layer = int(module.layer_idx)
        row = s[0].detach().clone()
        recorded[layer] = torch.cat([recorded[layer], row], dim=-1) if chunked and layer in recorded else row
        return s
    inner.score = score
    return recorded


def record_composed_scores(press, ref_keys):
    """ComposedPress: a later stage scores the earlier stage's kept keys in torch.topk's order, not by
    position. Each stage's scores are put back at the positions of the keys they score (found in the full
    prefill's keys), the last stage's over the first's: {layer: [H, T]}, NaN where not scored."""
    import torch
    from kvpress import ScorerPress
    recorded = {}
    index = {}
    for stage in press.presses:
        if not isinstance(stage, ScorerPress):
            continue
        original = stage.score

        def score(module, hidden_states, keys, *a, _original=original, **k):
            s = _original(module, hidden_states, keys, *a, **k)
            layer = int(module.layer_idx)
            ref = ref_keys[layer]
            H, T = ref.shape[0], ref.shape[1]
            if layer not in index:
                index[layer] = [{ref[h, t].numpy().tobytes(): t for t in range(T)} for h in range(H)]
            row = recorded.setdefault(layer, torch.full((H, T), float("nan")))
            for h in range(H):
                for i in range(keys.shape[2]):
                    row[h, index[layer][h][keys[0, h, i].numpy().tobytes()]] = float(s[0, h, i])
            return s
        stage.score = score
    return recorded


def record_rerotation(press):
    """KeyRerotationPress: its kept keys are rotated, so no longer rows of the uncompressed prefill. The sorted
    indices it re-rotates, {layer: [H][n_kept]}, are its kept set (empty for other presses)."""
    from kvpress import KeyRerotationPress
    recorded = {}
    if not isinstance(press, KeyRerotationPress):
        return recorded
    original = press.rerotate_keys

    def rerotate_keys(module, indices, keys):
        recorded[int(module.layer_idx)] = [sorted(int(t) for t in row) for row in indices[0].tolist()]
        return original(module, indices, keys)
    press.rerotate_keys = rerotate_keys  # the instance's: the class keeps its static method
    return recorded


def kvpress_run(model, press, ids, q_ids, ref_keys, n_answer, eog=()):
    """Kept positions [layer][head] (sorted lists), the greedy answer under `press`, and the scores its
    ScorerPress gave ({layer: [H, T]}, empty for other presses)."""
    import torch
    from transformers import DynamicCache
    cache = DynamicCache()
    T = len(ids)
    scores = record_scores(press, ref_keys)
    rerotated = record_rerotation(press)
    with torch.no_grad():
        with press(model):
            model.model(input_ids=torch.tensor([ids]), past_key_values=cache)
        kept = []
        layers = model.model.layers
        for l, layer in enumerate(layers):
            if rerotated:
                kept.append(rerotated[l])
                continue
            keys = cache.layers[l].keys[0]
            ref = ref_keys[l]
            H = keys.shape[0]
            masked = getattr(layer.self_attn, "masked_key_indices", None)
            masked_by_head = [set() for _ in range(H)]
            if masked is not None:
                _, hs, ss = masked
                for h, s in zip(hs.tolist(), ss.tolist()):
                    masked_by_head[h].add(s)
            row = []
            for h in range(H):
                index = {ref[h, t].numpy().tobytes(): t for t in range(T)}
                pos = []
                for i in range(keys.shape[1]):
                    if i in masked_by_head[h]:
                        continue
                    t = index.get(keys[h, i].numpy().tobytes())
                    if t is None:
                        raise RuntimeError("layer %d head %d: kept key row %d is not a key of the context" % (l, h, i))
                    pos.append(t)
                row.append(sorted(pos))
            kept.append(row)
        # The question, then the greedy answer, on the compressed cache (kvpress's pipeline: position ids
        # continue after the full context whatever the cache holds).
        # One token per step: kvpress masks (AdaKV, KVzip) with a fake key that must send every query of the
        # step to -inf, which a multi-token step on a random model may not allow; layers of different lengths
        # (PyramidKV) also break transformers' multi-token mask. Same result as one step otherwise.
        masked = any(getattr(layer.self_attn, "masked_key_indices", None) is not None for layer in model.model.layers)
        uneven = len({cache.layers[l].keys.shape[2] for l in range(len(cache.layers))}) > 1
        for i0 in range(0, len(q_ids), 1 if masked or uneven else len(q_ids)):
            part = q_ids[i0:] if not (masked or uneven) else q_ids[i0:i0 + 1]
            out = model(input_ids=torch.tensor([part]), past_key_values=cache,
                        position_ids=torch.arange(T + i0, T + i0 + len(part)).unsqueeze(0))
        answer = [int(out.logits[0, -1].argmax())]
        T += len(q_ids)
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos]) | set(eog)
        for i in range(n_answer - 1):
            if answer[-1] in eos:
                break
            o = model(input_ids=torch.tensor([[answer[-1]]]), past_key_values=cache,
                      position_ids=torch.tensor([[T + i]]))
            answer.append(int(o.logits[0, -1].argmax()))
    if answer[-1] in eos:  # kvzap's answer tokens leave the end-of-sequence token out
        answer.pop()
    for layer in model.model.layers:  # AdaKV / KVzip leave their masks on the modules
        layer.self_attn.masked_key_indices = None
    return kept, answer, scores


def explained_by_ties(k_kept, p_kept, score_row, rel=1e-5, chunk=None):
    """Whether the positions one side keeps and the other does not all score the same in kvpress (within
    float noise): a tie whose order neither side defines (torch.topk's order among equal values is its
    selection algorithm's, not the index order). chunk: ChunkPress's chunk_length, whose chunks each take
    their own budget, so each chunk's differing positions must tie among themselves."""
    if score_row is None:
        return False
    diff = sorted(set(k_kept) ^ set(p_kept))
    groups = {}
    for p in diff:
        groups.setdefault(p // chunk if chunk else 0, []).append(float(score_row[p]))
    return all(max(v) - min(v) <= rel * max(1e-30, max(abs(x) for x in v)) for v in groups.values())


# ---------------------------------------------------------------------------------------------
# kvzap side
# ---------------------------------------------------------------------------------------------

def read_cache_file(path):
    """Kept positions [layer][head] from a `--save-cache` file (src/engine/cache_file.h, version 2)."""
    b = open(path, "rb").read()
    assert b[:8] == b"KVZCACHE", "not a kvzap cache file"
    version, header_bytes = struct.unpack_from("<II", b, 8)
    n_layer, n_head_kv, head_dim, n_vocab = struct.unpack_from("<IIII", b, 48)
    n_tokens, = struct.unpack_from("<Q", b, 72)
    press_bytes, has_logits, kv_type = struct.unpack_from("<III", b, 80)
    row = {0: 2 * head_dim, 1: 4 * head_dim}[kv_type if version >= 2 else 0]
    o = header_bytes + press_bytes + 4 * n_tokens + (4 * n_vocab if has_logits else 0)
    kept = []
    for _ in range(n_layer):
        heads = []
        for _ in range(n_head_kv):
            n, = struct.unpack_from("<I", b, o)
            o += 4
            heads.append(list(struct.unpack_from("<%di" % n, b, o)))
            o += 4 * n + 2 * n * row
        kept.append(heads)
    return kept


def kvzap_run(d, text, name, scope, tmp, n_answer, params=None, threshold=None, window=None, ratios=None):
    cache, ctx = os.path.join(tmp, "kvzap.cache"), os.path.join(tmp, "context.txt")
    with open(ctx, "w", encoding="utf-8") as f:
        f.write(text)
    args = [kvzap_bin(), "generate", "-m", d, "--context-file", ctx, "--question", QUESTION, "--chat",
            "--press", name, "--temp", "0", "-n", str(n_answer), "--json", "--kept-positions", "--kv-type", "f32",
            "-c", "4096", "-t", "2", "--save-cache", cache]
    if threshold is not None:  # a threshold press (DMSPress)
        args += ["--threshold", repr(threshold)] + (["--window", str(window)] if window is not None else [])
    elif scope is not None:  # None: a press that sets its own budget takes no ratio
        args += ["--ratio", str(RATIO), "--ratio-scope", scope]
    for k, v in (params or {}).items():
        args += ["--press-param", "%s=%s" % (k, v)]
    if ratios is not None:
        args += ["--press-ratios", ":".join(repr(float(x)) for x in ratios)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("kvzap generate --press %s failed: %s" % (name, p.stderr.strip()[-600:]))
    j = json.loads(p.stdout)
    kept = j.get("kept_positions") or read_cache_file(cache)
    return j.get("context_tokens"), kept, j["answers"][0]["tokens"]


# ---------------------------------------------------------------------------------------------

def jaccard(a, b):
    a, b = set(a), set(b)
    return 1.0 if not a and not b else len(a & b) / len(a | b)


def main():
    try:
        import torch  # noqa: F401
        import transformers
        import kvpress  # noqa: F401
        import tokenizers  # noqa: F401
    except Exception as e:  # ImportError, or a kvpress that refuses this transformers
        peers_missing("kvpress parity: torch, transformers, tokenizers and kvpress are needed (%s)" % e)
        finish()
    if not os.path.exists(kvzap_bin()):
        report(False, "kvpress parity: no kvzap binary at %s (set KVZAP_BIN)" % kvzap_bin())
        finish()
    import logging
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    logging.getLogger("kvpress").setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    t_start = time.time()
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        texts = contexts()
        for kind, seed in (("llama", 11), ("smollm2", 12)):
            d = os.path.join(tmp, kind)
            write_model(d, kind, seed)
            tok = PreTrainedTokenizerFast.from_pretrained(d)
            models = {a: AutoModelForCausalLM.from_pretrained(d, attn_implementation=a, dtype=torch.float32).eval()
                      for a in ("sdpa", "eager")}
            inputs = [pipeline_ids(tok, t, QUESTION) for t in texts]
            ctx_ids = [i for i, _ in inputs]
            refs = {a: [full_keys(models[a], ids) for ids in ctx_ids] for a in models}
            # kvzap also ends an answer at the chat's end-of-turn tokens (src/tokenizer/tokenizer.cpp
            # kEndOfGenerationTexts: SmolLM2's <|im_end|>), which generation_config's eos may leave out.
            vocab = tok.get_vocab()
            eog = {vocab[t] for t in EOG_TEXTS if t in vocab}
            if not ONLY or any(n in ONLY for n in ("qfilter", "expected_attention_stats")):
                STATS["path"] = compute_query_stats(d, texts, tmp)
            for P in presses():
                if ONLY and P["name"] not in ONLY:
                    continue
                label = "%s %s" % (kind, P["name"]) + (" [%s]" % P["variant"] if P["variant"] else "")
                jac, answers_equal, errors, min_j = [], 0, [], 1.0
                tie_heads, tie_contexts, answer_diff_contexts = 0, set(), set()
                try:
                    for c, (text, ids) in enumerate(zip(texts, ctx_ids)):
                        k_ids, k_kept, k_answer = kvzap_run(d, text, P["name"], P["scope"], tmp, N_ANSWER, P["params"],
                                                              P["threshold"], P["window"], P["ratios"])
                        if k_ids is not None and k_ids != ids:
                            raise RuntimeError("context %d: kvzap's token ids differ from the tokenizer's" % c)
                        torch.manual_seed(0)
                        press = P["make"](RATIO)
                        chunk = press.chunk_length if isinstance(press, kvpress.ChunkPress) else None
                        p_kept, p_answer, p_scores = kvpress_run(models[P["attn"]], press, ids,
                                                                 inputs[c][1], refs[P["attn"]][c], N_ANSWER, eog)
                        for l in range(len(p_kept)):
                            for h in range(len(p_kept[l])):
                                j = jaccard(k_kept[l][h], p_kept[l][h])
                                jac.append(j)
                                min_j = min(min_j, j)
                                if j < 1:
                                    row_scores = p_scores[l][h] if l in p_scores else None
                                    if explained_by_ties(k_kept[l][h], p_kept[l][h], row_scores, chunk=chunk):
                                        tie_heads += 1
                                        tie_contexts.add(c)
                                if VERBOSE and j < 1:
                                    only_k = sorted(set(k_kept[l][h]) - set(p_kept[l][h]))
                                    only_p = sorted(set(p_kept[l][h]) - set(k_kept[l][h]))
                                    print("   ctx %d layer %d head %d: J %.4f kvzap-only %s kvpress-only %s"
                                          % (c, l, h, j, only_k[:12], only_p[:12]))
                        answers_equal += int(k_answer == p_answer)
                        if k_answer != p_answer:
                            answer_diff_contexts.add(c)
                        if VERBOSE and k_answer != p_answer:
                            print("   ctx %d answer kvzap %s kvpress %s" % (c, k_answer, p_answer))
                except Exception as e:  # noqa: BLE001
                    errors.append(str(e))
                row = dict(model=kind, press=P["name"], variant=P["variant"], expect=P["expect"], why=P["why"])
                if errors:
                    row.update(error=errors[0])
                    table.append(row)
                    report(False, "%s: %s" % (label, errors[0]))
                    continue
                mean_j = sum(jac) / len(jac)
                exact_heads = sum(1 for j in jac if j == 1.0)
                differing = len(jac) - exact_heads
                row.update(mean_jaccard=mean_j, min_jaccard=min_j, heads_identical=exact_heads, heads=len(jac),
                           heads_tied=tie_heads, answers_identical=answers_equal, contexts=len(texts))
                table.append(row)
                line = ("%s: Jaccard mean %.4f min %.4f (%d/%d heads identical, %d differ only in tied scores), "
                        "answers %d/%d identical" % (label, mean_j, min_j, exact_heads, len(jac), tie_heads,
                                                     answers_equal, len(texts)))
                if P["expect"] == "exact":
                    # Identical, or different only where kvpress's own scores tie (then the answer of that
                    # context may differ too: its cache differs).
                    ok = differing == tie_heads and answer_diff_contexts <= tie_contexts
                    report(ok, line)
                elif P["expect"] == "differ":
                    report(differing > tie_heads, line + " [%s: must differ]" % P["why"])
                else:
                    print("info " + line + " [not expected to match: %s]" % P["why"], flush=True)
    if JSON_OUT:
        with open(JSON_OUT, "w") as f:
            json.dump(table, f, indent=1)
    if "--markdown" in ARGS:  # the table of docs/PARITY.md
        print("| model | kvzap press | Jaccard mean / min | heads identical (tied) | answers identical | expectation |")
        print("|---|---|---|---|---|---|")
        for r in table:
            name = r["press"] + (" [%s]" % r["variant"] if r["variant"] else "")
            if "error" in r:
                print("| %s | %s | error: %s | | | %s |" % (r["model"], name, r["error"], r["expect"]))
                continue
            print("| %s | %s | %.4f / %.4f | %d/%d (%d) | %d/%d | %s |"
                  % (r["model"], name, r["mean_jaccard"], r["min_jaccard"], r["heads_identical"], r["heads"],
                     r["heads_tied"], r["answers_identical"], r["contexts"], r["expect"]))
    print("kvpress parity: %.1f s" % (time.time() - t_start))
    finish()


if __name__ == "__main__":
    main()
