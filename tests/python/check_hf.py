#!/usr/bin/env python3
"""Hugging Face checkpoints (`kvzap ... -m DIR`) against transformers and tokenizers.

Everything is written by this script into a temporary folder (nothing downloaded):
  1. tokenizer.json files of each kind kvzap reads, trained with `tokenizers` on a varied corpus:
     byte-level BPE with the Llama 3 (Split regex + ByteLevel, ignore_merges, BOS template), Qwen2 (NFC +
     Split regex + ByteLevel, non-special added tokens) and SmolLM2 (Digits + ByteLevel) pre-tokenizers,
     and SentencePiece-style BPE with byte fallback (Gemma 3: Replace(' ', '▁'), <0xXX> byte tokens).
     `kvzap tokenize --jsonl` on >= 500 strings (tests/python/peer_tokenize.py's cases plus random
     ones) must give the ids `tokenizers` gives, for every string.
  2. tiny random models written with transformers' save_pretrained (f32 safetensors; 2 layers, hidden
     64, 4 query heads over 2 KV heads): LlamaForCausalLM (+ a sharded copy, BF16 and F16 copies,
     --quantize q8_0, Llama 3 rope_scaling), Qwen2ForCausalLM (biases, tied, vocab_size > tokenizer,
     linear rope_scaling), Qwen3ForCausalLM (q/k norms, head_dim 32), Gemma3ForCausalLM (a sliding
     local layer and a global one with their own RoPE bases, (1 + w) norms, GeGLU, final soft-cap), and
     Gemma3ForConditionalGeneration around the same text model (text_config, language_model.* tensors,
     a tiny SigLIP vision tower that kvzap leaves unread).
     `kvzap perplexity --dump-logits` gives every position's logits; their log-softmax is compared with
     transformers' (eager attention, f32) over the whole vocabulary: max |diff| <= 2e-2 and mean
     |diff| <= 2e-3 with kvzap's f16 K/V cache, and <= 1e-3 / 1e-4 with --kv-type f32 (where this
     kvzap has it; SKIPPED otherwise). BF16/F16/q8_0 copies are compared with looser bounds
     (their activations are rounded as ggml does; q8_0 also quantises them) and the figures printed.
     Gemma 3 on a folder computes GeGLU in f32 like transformers (held to the same 1e-3 / 1e-4; GELU
     rounded to f16 is a negative control); on a GGUF file it uses ggml's f16 GELU table like llama.cpp.
  3. negative controls: transformers with the wrong RoPE pairing (q/k rows of every head permuted to
     what adjacent pairing would mean), without the q/k norms, without Qwen2's biases, without Gemma's
     soft-cap, with Gemma's window one wider, or without the RoPE scaling must NOT match kvzap.
  4. the same checkpoints converted to GGUF by llama.cpp's own convert_hf_to_gguf.py (hf_to_gguf.py, from
     the llama-cpp-python sdist that scripts/build_llamacpp.sh fetches; SKIPPED without it): Llama, Qwen2,
     Qwen3, both rope_scaling kinds (llama3 becomes rope_freqs.weight) and a 6-layer Gemma 3 (SentencePiece
     vocabulary in the GGUF): the ids must equal transformers', the log-probs meet the same bounds through
     the GGUF path (Gemma's reference with GELU rounded to f16 as ggml's table), and with an f32 cache
     they are within 1e-4 of kvzap's on the folder (Gemma: 3e-3 / 5e-4, the two GELU roundings).
     `--gguf-only` runs only these.
torch, transformers and tokenizers are test-only dependencies (pip install torch transformers
tokenizers); without them the script prints SKIPPED lines and exits 0.
Env: KVZAP_BIN (default <repo>/build/kvzap). Prints "N passed, M failed, K skipped"; exits 1 on failure.
"""
import copy
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_tokenize as pt  # noqa: E402
from check_report import kvzap_bin, peers_missing, report, skip, summary  # noqa: E402,F401

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
             r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
            r"\s*[\r\n]+|\s+(?!\S)|\s+")
TOL_MAX, TOL_MEAN = 2e-2, 2e-3

TEXT = (
    "The cat sat on the mat, and the dog ran in the park. Is it raining? 42 apples, 7 pears; some were "
    "eaten at noon.\nWords of power: the quick brown fox jumps over the lazy dog! It's 1999 again, "
    "isn't it?\n  Indented line\twith a tab, caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9.\n"
    "def f(x):\n    return x * 2  # double\n"
)

VERBOSE = "-v" in sys.argv[1:]
GGUF_ONLY = "--gguf-only" in sys.argv[1:]  # only the checkpoints converted to GGUF


def run(args, **kw):
    p = subprocess.run([kvzap_bin()] + args, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError("kvzap %s failed: %s" % (" ".join(args), p.stderr.strip()[-800:]))
    return p


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------

def corpus():
    rng = random.Random(7)
    base = pt.PROSE + pt.CODE_TEXTS + pt.DIGIT_TEXTS + pt.ACCENT_TEXTS + pt.CJK_TEXTS + pt.WHITESPACE_TEXTS
    return base * 20 + pt.random_texts(rng, 1500)


def test_strings():
    out = pt.make_cases() + pt.random_texts(random.Random(99), 150)
    seen, cases = set(), []
    for t in out:
        if t not in seen:
            seen.add(t)
            cases.append(t)
    return cases


BYTE_LEVEL_SPECIALS = {
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "smollm": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<file_sep>"],
}
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]


def byte_level_tokenizer(kind):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    t = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
    bl = pre_tokenizers.ByteLevel
    if kind == "qwen2":
        t.normalizer = normalizers.NFC()
    if kind == "smollm":
        t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                   bl(add_prefix_space=False, use_regex=True)])
    else:
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_RE if kind == "llama3" else QWEN2_RE), behavior="isolated", invert=False),
            bl(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    specials = BYTE_LEVEL_SPECIALS[kind]
    t.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=800, special_tokens=specials,
                                                        initial_alphabet=bl.alphabet(), show_progress=False))
    if kind == "qwen2":
        t.add_tokens([AddedToken("<think>", normalized=False, special=False),
                      AddedToken("</think>", normalized=False, special=False)])
    if kind == "llama3":
        bos = "<|begin_of_text|>"
        t.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=bos + " $A", pair=bos + " $A " + bos + " $B",
                                          special_tokens=[(bos, t.token_to_id(bos))])])
        names = {"bos_token": bos, "eos_token": "<|eot_id|>"}
    else:
        t.post_processor = processors.ByteLevel(trim_offsets=False)
        names = {"eos_token": "<|im_end|>" if kind == "qwen2" else "<|endoftext|>"}
    return t, names


def gemma_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    t = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    t.normalizer = normalizers.Replace(" ", "\u2581")
    t.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    t.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=700, special_tokens=GEMMA_SPECIALS,
                                                        limit_alphabet=90, show_progress=False))
    # Rebuild with the 256 <0xXX> byte tokens as ordinary vocabulary entries (as Gemma's file has them).
    j = json.loads(t.to_str())
    vocab, merges = j["model"]["vocab"], [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
                                          for m in j["model"]["merges"]]
    for b in range(256):
        vocab.setdefault("<0x%02X>" % b, len(vocab))
    g = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    g.normalizer = normalizers.Replace(" ", "\u2581")
    g.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    g.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    g.add_special_tokens(GEMMA_SPECIALS)
    g.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                     special_tokens=[("<bos>", vocab["<bos>"])])
    return g, {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"}


def save_tokenizer(tok, names, d, chat_template=None):
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, **names)
    if chat_template:
        hf.chat_template = chat_template
    hf.save_pretrained(d)
    # save_pretrained may rewrite tokenizer.json: the file on disk is what both sides read.
    return len(tok.get_vocab())


def check_tokenizer(kind, tok, names, tmp):
    from tokenizers import Tokenizer
    d = os.path.join(tmp, "tok-" + kind)
    os.makedirs(d, exist_ok=True)
    save_tokenizer(tok, names, d)
    ref = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    cases = test_strings()
    path = os.path.join(d, "cases.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c) + "\n")
    # config.json is what makes a folder a checkpoint for tokenize too.
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"]}, f)
    got = [json.loads(line) for line in run(["tokenize", "-m", d, "--jsonl", path]).stdout.splitlines()]
    bad = [(c, g, ref.encode(c, add_special_tokens=False).ids) for c, g in zip(cases, got)
           if g != ref.encode(c, add_special_tokens=False).ids]
    if len(got) != len(cases):
        bad.append(("<count>", len(got), len(cases)))
    for c, g, r in bad[:3]:
        print("   %r\n     kvzap %s\n     tokenizers %s" % (c, g, r))
    report(not bad, "tokenizer.json %-7s %d strings, %d differ (vocab %d)" % (kind, len(cases), len(bad),
                                                                               ref.get_vocab_size()))


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

def rope_kwargs(theta, scaling=None, local_theta=None):
    import transformers
    v5 = int(transformers.__version__.split(".")[0]) >= 5
    if v5:
        p = {"rope_type": "default", "rope_theta": theta}
        if scaling:
            p.update(scaling)
        if local_theta is not None:
            return {"rope_parameters": {"full_attention": p, "sliding_attention": {"rope_type": "default", "rope_theta": local_theta}}}
        return {"rope_parameters": p}
    kw = {"rope_theta": theta}
    if scaling:
        kw["rope_scaling"] = scaling
    if local_theta is not None:
        kw["rope_local_base_freq"] = local_theta
    return kw


def build_model(arch, vocab, names_ids, seed, **extra):
    import torch
    import transformers as T
    torch.manual_seed(seed)
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=extra.pop("num_hidden_layers", 2),
                  num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=512, **names_ids)
    scaling = extra.pop("rope_scaling", None)
    if arch == "llama":
        cfg = T.LlamaConfig(rms_norm_eps=1e-5, tie_word_embeddings=False, **rope_kwargs(10000.0, scaling), **common, **extra)
        model = T.LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = T.Qwen2Config(rms_norm_eps=1e-6, tie_word_embeddings=True, **rope_kwargs(1e6, scaling), **common, **extra)
        model = T.Qwen2ForCausalLM(cfg)
    elif arch == "qwen3":
        cfg = T.Qwen3Config(rms_norm_eps=1e-6, head_dim=32, tie_word_embeddings=False, **rope_kwargs(1e6, scaling),
                            **common, **extra)
        model = T.Qwen3ForCausalLM(cfg)
    else:
        # layer_types None: transformers' default, 5 local layers to 1 global
        types = extra.pop("layer_types", ["sliding_attention", "full_attention"])
        if types is not None:
            extra["layer_types"] = types
        extra.setdefault("query_pre_attn_scalar", 24)
        cfg = T.Gemma3TextConfig(rms_norm_eps=1e-6, head_dim=32, sliding_window=6,
                                 final_logit_softcapping=3.0,
                                 **rope_kwargs(1e6, scaling, local_theta=10000.0), **common, **extra)
        if arch == "gemma3-mm":  # the image-text model around the same text model, with a tiny SigLIP tower
            vision = T.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, image_size=28, patch_size=14)
            cfg = T.Gemma3Config(text_config=cfg.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4)
            cfg.text_config._attn_implementation = "eager"
            model = T.Gemma3ForConditionalGeneration(cfg)
        else:
            model = T.Gemma3ForCausalLM(cfg)
    cfg._attn_implementation = "eager"
    # Larger than the default init, so attention and logits are far from uniform (the controls need it).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.15)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:  # norm gains: Gemma stores w for (1 + w)
                p.normal_(0.0 if arch.startswith("gemma3") else 1.0, 0.1)
    return model.eval()


def text_layers(model):
    """The decoder layers of a causal LM or of an image-text model's language model."""
    inner = model.model
    return inner.language_model.layers if hasattr(inner, "language_model") else inner.layers


def hf_logprobs(model, ids):
    import torch
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1).numpy()


def kvzap_logprobs(d, text_path, tmp, extra=()):
    import numpy as np
    jl, dump = os.path.join(tmp, "lp.jsonl"), os.path.join(tmp, "logits.bin")
    p = run(["perplexity", "-m", d, "-f", text_path, "--jsonl", jl, "--dump-logits", dump, "--window", "512",
             "-c", "512", "-t", "2"] + list(extra))
    tokens = [json.loads(line)["token"] for line in open(jl)]
    logits = np.fromfile(dump, dtype=np.float32)
    n = len(tokens) + 1
    logits = logits.reshape(n, -1).astype(np.float64)
    m = logits.max(axis=1, keepdims=True)
    lp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    return tokens, lp, p.stderr


def diff(a, b):
    import numpy as np
    d = np.abs(a[:, : b.shape[1]] - b[:, : a.shape[1]])
    return float(d.max()), float(d.mean())


def permute_rope_pairs(model, arch):
    """q/k rows of every head reordered to [0, 2, 4, ..., 1, 3, ...]: transformers' half-split RoPE on these
    weights is what adjacent pairing on the original ones computes (the wrong pairing for HF layouts)."""
    import torch
    cfg = model.config
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    idx = torch.tensor(list(range(0, D, 2)) + list(range(1, D, 2)))
    with torch.no_grad():
        for layer in model.model.layers:
            a = layer.self_attn
            for proj, heads in ((a.q_proj, cfg.num_attention_heads), (a.k_proj, cfg.num_key_value_heads)):
                full = torch.cat([h * D + idx for h in range(heads)])
                proj.weight.copy_(proj.weight[full])
                if proj.bias is not None:
                    proj.bias.copy_(proj.bias[full])
            for norm in (getattr(a, "q_norm", None), getattr(a, "k_norm", None)):
                if norm is not None:
                    norm.weight.copy_(norm.weight[idx])


def check_model(label, d, model, text_path, tmp, controls=(), extra=(), tol=(TOL_MAX, TOL_MEAN), hf_model=None,
                tok_dir=None):
    """kvzap on folder (or GGUF file) d against `model` (transformers); each control(model copy) must not
    match. tok_dir: the folder whose tokenizer gives the reference ids (default d)."""
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir or d)
    text = open(text_path, encoding="utf-8").read()
    ids = tok(text)["input_ids"]
    try:
        k_tokens, k_lp, stderr = kvzap_logprobs(d, text_path, tmp, extra)
    except RuntimeError as e:
        report(False, "%s: %s" % (label, e))
        return None
    if k_tokens != ids[1:]:
        report(False, "%s: kvzap's ids differ from transformers' (%d vs %d tokens)" % (label, len(k_tokens) + 1, len(ids)))
        return None
    ref = hf_logprobs(hf_model or model, ids)
    mx, mean = diff(k_lp, ref)
    top1 = float((k_lp.argmax(1) == ref.argmax(1)).mean())
    note = (" [%s]" % stderr.strip().splitlines()[0]) if "quantised" in stderr else ""
    report(mx <= tol[0] and mean <= tol[1],
           "%s: %d tokens, log-prob |diff| max %.2e mean %.2e (bounds %.0e / %.0e), top-1 agreement %.3f%s"
           % (label, len(ids), mx, mean, tol[0], tol[1], top1, note))
    for name, fn in controls:
        bad = copy.deepcopy(model)
        fn(bad)
        cmx, cmean = diff(k_lp, hf_logprobs(bad, ids))
        report(cmx > tol[0], "%s: negative control '%s' detected (max %.2e > %.0e)" % (label, name, cmx, tol[0]))
    return k_lp


def gelu_f16_module():
    import torch

    class GeluF16(torch.nn.Module):
        """gelu (tanh) with input and result rounded to f16: what ggml's GELU table computes."""
        def forward(self, x):
            return torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
    return GeluF16


def write_checkpoint(model, d, tok, names, **save_kw):
    model.save_pretrained(d, safe_serialization=True, **save_kw)
    save_tokenizer(tok, names, d, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")


def check_gguf_conversions(tmp, toks, ids_of, text_path):
    """The same checkpoints converted to GGUF by llama.cpp's convert_hf_to_gguf.py (hf_to_gguf.py) give the
    same log-probs through kvzap's GGUF path: against transformers (f32 and f16 KV cache, same bounds as
    the folders) and against kvzap on the folder itself (f32 cache)."""
    import hf_to_gguf
    root, why = hf_to_gguf.converter_root(tmp)
    if root is None:
        skip("checkpoints converted to GGUF: %s" % why)
        return
    r3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
    # (label, arch, tokenizer kind, pre-tokenizer, extra build args). Gemma 3: llama.cpp's converter writes
    # neither the sliding-window pattern nor query_pre_attn_scalar, and llama.cpp assumes Gemma 3's 5 local
    # : 1 global layers and 1/sqrt(head_dim) (both true of every Gemma 3 but the 27B's scale), so this
    # model has 6 layers and query_pre_attn_scalar = head_dim.
    cases = [("llama", "llama", "llama3", "llama-bpe", {}),
             ("qwen2", "qwen2", "qwen2", "qwen2", {}),
             ("qwen3", "qwen3", "qwen2", "qwen2", {}),
             ("llama rope_scaling llama3", "llama", "llama3", "llama-bpe", {"rope_scaling": r3}),
             ("qwen2 rope_scaling linear", "qwen2", "qwen2", "qwen2", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
             ("gemma3 6 layers", "gemma3", "gemma", None, {"num_hidden_layers": 6, "layer_types": None,
                                                             "query_pre_attn_scalar": 32})]
    for n, (label, arch, kind, pre, extra) in enumerate(cases):
        tok, names = toks[kind]
        model = build_model(arch, len(tok.get_vocab()), ids_of(tok, names), 100 + n, **extra)
        d = os.path.join(tmp, "conv-%d" % n)
        write_checkpoint(model, d, tok, names)
        g = d + ".gguf"
        try:
            hf_to_gguf.convert(root, d, g, pre=pre, spm=pre is None)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            report(False, "%s -> GGUF: %s" % (label, e))
            continue
        ref = model
        if arch == "gemma3":  # on GGUF files kvzap's GeGLU rounds GELU to f16 as ggml does
            ref = copy.deepcopy(model)
            for layer in ref.model.layers:
                layer.mlp.act_fn = GeluF16()
        gl = "%s -> GGUF (convert_hf_to_gguf.py, f32)" % label
        check_model(gl, g, model, text_path, tmp, tok_dir=d, hf_model=ref)
        lp_gguf = check_model(gl + ", --kv-type f32", g, model, text_path, tmp, extra=["--kv-type", "f32"],
                              tol=(1e-3, 1e-4), hf_model=ref, tok_dir=d)
        if lp_gguf is None:
            continue
        _, lp_dir, _ = kvzap_logprobs(d, text_path, tmp, ["--kv-type", "f32"])
        mx, mean = diff(lp_gguf, lp_dir)
        # Gemma: the folder's GeGLU is f32, the GGUF's ggml's f16 table, so they differ by that rounding.
        bound = (3e-3, 5e-4) if arch == "gemma3" else (1e-4, 1e-4)
        report(mx <= bound[0] and mean <= bound[1] and lp_gguf.shape == lp_dir.shape,
               "%s: GGUF path vs the folder's, f32 cache: log-prob |diff| max %.2e mean %.2e (bound %.0e / %.0e)"
               % (label, mx, mean, bound[0], bound[1]))


def main():
    try:
        import numpy  # noqa: F401
        import tokenizers  # noqa: F401
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        peers_missing("Hugging Face checks: %s (pip install torch transformers tokenizers)" % e)
        return summary()
    if not os.path.isfile(kvzap_bin()):
        print("kvzap binary not found: %s (set KVZAP_BIN)" % kvzap_bin())
        return 1
    torch.set_num_threads(2)
    global GeluF16
    GeluF16 = gelu_f16_module()
    with tempfile.TemporaryDirectory(prefix="kvzap_hf_") as tmp:
        toks = {k: byte_level_tokenizer(k) for k in ("llama3", "qwen2", "smollm")}
        toks["gemma"] = gemma_tokenizer()
        for kind, (tok, names) in toks.items():
            if not GGUF_ONLY:
                check_tokenizer(kind, tok, names, tmp)

        kv_f32 = "--kv-type" in run(["perplexity", "--help"]).stdout
        text_path = os.path.join(tmp, "text.txt")
        with open(text_path, "w", encoding="utf-8") as f:
            f.write(TEXT)

        def ids_of(tok, names):
            return {k.replace("_token", "_token_id"): tok.token_to_id(v) for k, v in names.items()
                    if k in ("bos_token", "eos_token")}

        def no_qk_norm(m):
            import torch as t
            for layer in text_layers(m):
                layer.self_attn.q_norm = t.nn.Identity()
                layer.self_attn.k_norm = t.nn.Identity()

        def no_bias(m):
            for layer in m.model.layers:
                for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    p.bias.data.zero_()

        def no_softcap(m):
            m.config.final_logit_softcapping = None

        def wider_window(m):
            cfg = m.config.get_text_config()
            cfg.sliding_window += 1
            for layer in text_layers(m):
                if getattr(layer.self_attn, "sliding_window", None):
                    layer.self_attn.sliding_window += 1

        rope = ("wrong RoPE pairing (adjacent)", lambda m: permute_rope_pairs(m, None))
        specs = [
            ("llama", "llama3", 0, [rope]),
            ("qwen2", "qwen2", 3, [rope, ("no q/k/v biases", no_bias)]),
            ("qwen3", "qwen2", 0, [rope, ("no q/k norm", no_qk_norm)]),
            ("gemma3", "gemma", 0, [rope, ("no q/k norm", no_qk_norm), ("no final soft-cap", no_softcap),
                                    ("sliding window one wider", wider_window)]),
            # Gemma3ForConditionalGeneration: text fields in text_config, tensors under language_model.,
            # a vision tower kvzap must leave unread.
            # Its config keeps final_logit_softcapping = 3.0, which transformers' image-text class never
            # applies (only Gemma3ForCausalLM does), so kvzap must not either.
            ("gemma3-mm", "gemma", 0, [("no q/k norm", no_qk_norm), ("sliding window one wider", wider_window)]),
        ]
        for seed, (arch, kind, pad, controls) in enumerate([] if GGUF_ONLY else specs):
            tok, names = toks[kind]
            vocab = len(tok.get_vocab()) + pad
            model = build_model(arch, vocab, ids_of(tok, names), seed + 1)
            d = os.path.join(tmp, arch)
            write_checkpoint(model, d, tok, names)
            check_model("%s f32" % arch, d, model, text_path, tmp, controls)
            if kv_f32 and arch.startswith("gemma3"):
                # On a folder kvzap's GeGLU is f32, as transformers'; GELU rounded to f16 (ggml's table,
                # what kvzap uses on GGUF files) is a negative control (it moves log-probs by ~1.6e-3).
                def gelu_f16(m):
                    for layer in text_layers(m):
                        layer.mlp.act_fn = GeluF16()
                check_model("%s f32, --kv-type f32" % arch, d, model, text_path, tmp,
                            [("GELU rounded to f16 as ggml", gelu_f16)], extra=["--kv-type", "f32"], tol=(1e-3, 1e-4))
            elif kv_f32:
                check_model("%s f32, --kv-type f32" % arch, d, model, text_path, tmp, extra=["--kv-type", "f32"],
                            tol=(1e-3, 1e-4))
            else:
                skip("%s with an f32 KV cache: this kvzap has no --kv-type" % arch)
            if arch == "llama":
                ds = os.path.join(tmp, "llama-sharded")
                write_checkpoint(model, ds, tok, names, max_shard_size="150KB")
                n_shards = len([f for f in os.listdir(ds) if f.endswith(".safetensors")])
                report(n_shards > 1 and os.path.isfile(os.path.join(ds, "model.safetensors.index.json")),
                       "llama sharded copy has %d shards and an index" % n_shards)
                check_model("llama f32 sharded", ds, model, text_path, tmp)
                for dtype, tol in (("bfloat16", (0.15, 0.02)), ("float16", (0.05, 5e-3))):
                    dd = os.path.join(tmp, "llama-" + dtype)
                    low = build_model(arch, vocab, ids_of(tok, names), seed + 1).to(getattr(torch, dtype))
                    write_checkpoint(low, dd, tok, names)
                    check_model("llama %s weights" % dtype, dd, low, text_path, tmp, tol=tol, hf_model=low.float())
                check_model("llama --quantize q8_0", d, model, text_path, tmp, extra=["--quantize", "q8_0"], tol=(0.5, 0.05))
                # Llama 3.1 rope_scaling (wavelengths on both sides of the band at this head size)
                r3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 32}
                m3 = build_model(arch, vocab, ids_of(tok, names), 42, rope_scaling=r3)
                d3 = os.path.join(tmp, "llama-rope3")
                write_checkpoint(m3, d3, tok, names)
                plain = build_model(arch, vocab, ids_of(tok, names), 42)

                def unscaled(m, plain=plain):
                    m.model.rotary_emb = plain.model.rotary_emb
                check_model("llama rope_scaling llama3", d3, m3, text_path, tmp, [("RoPE scaling ignored", unscaled)])
            if arch == "qwen2":
                rl = {"rope_type": "linear", "factor": 4.0}
                m2 = build_model(arch, vocab, ids_of(tok, names), 43, rope_scaling=rl)
                d2 = os.path.join(tmp, "qwen2-linear")
                write_checkpoint(m2, d2, tok, names)
                plain = build_model(arch, vocab, ids_of(tok, names), 43)

                def unscaled2(m, plain=plain):
                    m.model.rotary_emb = plain.model.rotary_emb
                check_model("qwen2 rope_scaling linear", d2, m2, text_path, tmp, [("RoPE scaling ignored", unscaled2)])
        if kv_f32:
            check_gguf_conversions(tmp, toks, ids_of, text_path)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
