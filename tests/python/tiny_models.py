"""Tiny random GGUF models (llama / qwen2 / qwen3) and an independent NumPy forward pass for them.

The writer uses the `gguf` PyPI package (llama.cpp's gguf-py), so the files follow the converter's
conventions (tensor names, `ne` order, key types) independently of kvzap's reader.

The reference computes in float64 except where the engine (like llama.cpp's default CPU path) rounds to
f16 on purpose: K and V as stored in the cache, the queries before Q.K, and the softmax probabilities
before P.V. RoPE angles are built the way the engine and ggml do (theta_i = pos * base^(-2i/D) by
repeated float32 multiplication, cos/sin rounded to float32) so the comparison can be tight.
"""
from dataclasses import dataclass

import numpy as np

ADJACENT, HALF_SPLIT = "adjacent", "half-split"
# Pairing each architecture uses in the GGUF layout (llama.cpp's LLAMA_ROPE_TYPE_NORM / _NEOX).
ROPE_MODE = {"llama": ADJACENT, "qwen2": HALF_SPLIT, "qwen3": HALF_SPLIT}


@dataclass
class TinySpec:
    arch: str
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16          # written as key_length/value_length only when != n_embd / n_head
    n_ff: int = 96
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    tied: bool = True           # no output.weight: the logits reuse token_embd
    add_bos: bool = False
    pre: str = "smollm"
    seed: int = 0
    rope_freqs: tuple = ()      # [head_dim/2] divisors of the RoPE frequencies (GGUF rope_freqs.weight)
    tag: str = ""               # label and file name when one architecture is checked twice

    @property
    def qkv_bias(self):
        return self.arch == "qwen2"

    @property
    def qk_norm(self):
        return self.arch == "qwen3"


# ---------------------------------------------------------------- vocabulary (byte-level BPE, GPT-2 form)

def bytes_to_unicode():
    """GPT-2's byte -> printable code point table (printable Latin-1 bytes map to themselves)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# Merge rules (rank = index). Every merge result is also a token, so tokenization stays in the vocab.
MERGES = [
    ("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("a", "n"), ("e", "r"), ("Ġ", "a"), ("o", "n"),
    ("r", "e"), ("Ġ", "s"), ("e", "n"), ("a", "t"), ("o", "u"), ("Ġ", "w"), ("i", "s"), ("in", "g"),
    ("Ġ", "o"), ("Ġ", "c"), ("e", "s"), ("o", "r"), ("Ġa", "n"), ("Ġan", "d"), ("Ġ", "f"), ("Ġ", "b"),
    ("e", "d"), ("Ġ", "p"), ("a", "r"), ("l", "e"), ("Ġ", "m"), ("i", "t"), ("Ġo", "f"), ("a", "l"),
]
N_BYTE_TOKENS = 256


def make_vocab():
    """Token texts, token types and merges: ids 0..255 are the bytes (id == byte value), then one
    token per merge, then a control token <|endoftext|> used as BOS/EOS."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    types = [1] * 256  # normal (llama.cpp's converter marks byte-level BPE byte tokens as normal too)
    for left, right in MERGES:
        tokens.append(left + right)
        types.append(1)
    assert len(set(tokens)) == len(tokens), "duplicate token text"
    special = len(tokens)
    tokens.append("<|endoftext|>")
    types.append(3)  # control
    merges = [f"{left} {right}" for left, right in MERGES]
    return tokens, types, merges, special


def token_bytes(tokens, types):
    """Bytes each token stands for (control tokens: their text)."""
    u2b = {u: b for b, u in bytes_to_unicode().items()}
    out = []
    for text, ty in zip(tokens, types):
        out.append(text.encode() if ty == 3 else bytes(u2b[c] for c in text))
    return out


# ---------------------------------------------------------------- weights and GGUF writer

def random_weights(spec: TinySpec, n_vocab: int):
    """Random weights in PyTorch layout ([n_out][n_in]) as float32, from spec.seed.

    Scales are chosen so logits have a standard deviation near 1 (tied: 0.125 * sqrt(64)). The engine
    and the reference round to f16 at the same points, but a value that lands within float32 noise of an
    f16 rounding boundary can round either way; each such flip moves later log-probs by an amount that
    grows with the logit scale. At this scale the worst case over 48 seeds was 8.6e-4 (typical 2e-4),
    well inside the check's 2e-3; a logit scale of ~4 gave up to 4e-3."""
    rng = np.random.default_rng(spec.seed)
    E, H, Hkv, D, F = spec.n_embd, spec.n_head, spec.n_head_kv, spec.head_dim, spec.n_ff

    def mat(n_out, n_in, gain=1.0):
        return (rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)).astype(np.float32)

    def gains(n, spread=0.2, centre=1.0):
        return (centre + spread * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": (0.125 * rng.standard_normal((n_vocab, E))).astype(np.float32)}
    for l in range(spec.n_layer):
        p = f"blk.{l}."
        w[p + "attn_norm.weight"] = gains(E)
        # Q/K a little larger than unit gain: attention peaked enough that positions (so RoPE) matter.
        w[p + "attn_q.weight"] = mat(H * D, E, 1.2)
        w[p + "attn_k.weight"] = mat(Hkv * D, E, 1.2)
        w[p + "attn_v.weight"] = mat(Hkv * D, E)
        if spec.qkv_bias:
            w[p + "attn_q.bias"] = (0.5 * rng.standard_normal(H * D)).astype(np.float32)
            w[p + "attn_k.bias"] = (0.5 * rng.standard_normal(Hkv * D)).astype(np.float32)
            w[p + "attn_v.bias"] = (0.5 * rng.standard_normal(Hkv * D)).astype(np.float32)
        if spec.qk_norm:
            w[p + "attn_q_norm.weight"] = gains(D, 0.2, 1.0)
            w[p + "attn_k_norm.weight"] = gains(D, 0.2, 1.0)
        w[p + "attn_output.weight"] = mat(E, H * D)
        w[p + "ffn_norm.weight"] = gains(E)
        w[p + "ffn_gate.weight"] = mat(F, E)
        w[p + "ffn_up.weight"] = mat(F, E)
        w[p + "ffn_down.weight"] = mat(E, F)
    w["output_norm.weight"] = gains(E)
    if spec.rope_freqs:
        w["rope_freqs.weight"] = np.asarray(spec.rope_freqs, np.float32)
    if not spec.tied:
        w["output.weight"] = mat(n_vocab, E, 1.0)
    return w


def write_gguf(path, spec: TinySpec, weights, vocab, matrix_dtype=np.float32):
    """Writes the model; 2-D tensors in matrix_dtype (float32 or float16), 1-D ones in float32 (as the
    converter does). Returns the weights as stored, in float64, for the reference."""
    import gguf  # pip install gguf

    tokens, types, merges, special = vocab
    wr = gguf.GGUFWriter(str(path), spec.arch)
    wr.add_name(f"tiny-{spec.arch}")
    wr.add_file_type(1 if matrix_dtype == np.float16 else 0)  # LLAMA_FTYPE_MOSTLY_F16 / ALL_F32
    wr.add_context_length(512)
    wr.add_embedding_length(spec.n_embd)
    wr.add_block_count(spec.n_layer)
    wr.add_feed_forward_length(spec.n_ff)
    wr.add_head_count(spec.n_head)
    wr.add_head_count_kv(spec.n_head_kv)
    if spec.head_dim != spec.n_embd // spec.n_head:
        wr.add_key_length(spec.head_dim)
        wr.add_value_length(spec.head_dim)
        wr.add_rope_dimension_count(spec.head_dim)
    wr.add_rope_freq_base(spec.rope_base)
    wr.add_layer_norm_rms_eps(spec.rms_eps)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre(spec.pre)
    wr.add_token_list(tokens)
    wr.add_token_types(types)
    wr.add_token_merges(merges)
    wr.add_bos_token_id(special)
    wr.add_eos_token_id(special)
    wr.add_add_bos_token(spec.add_bos)
    stored = {}
    for name, t in weights.items():
        t = t.astype(matrix_dtype) if t.ndim == 2 else t.astype(np.float32)
        wr.add_tensor(name, t)
        stored[name] = t.astype(np.float64)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return stored


# ---------------------------------------------------------------- reference forward pass

def f16(x):
    return np.asarray(x).astype(np.float16).astype(np.float64)


def rope_tables(n_pos, head_dim, base, factors=None):
    """cos/sin [n_pos][head_dim/2]: theta_0 = pos, theta_{i+1} = theta_i * base^(-2/D), all in float32;
    factors (rope_freqs, optional) divide theta_i as ggml does."""
    half = head_dim // 2
    theta_scale = np.float32(np.float64(np.float32(base)) ** np.float64(np.float32(-2.0) / np.float32(head_dim)))
    theta = np.arange(n_pos, dtype=np.float32)
    cos = np.empty((n_pos, half), np.float64)
    sin = np.empty((n_pos, half), np.float64)
    for i in range(half):
        t = theta if factors is None else (theta / np.float32(factors[i])).astype(np.float32)
        cos[:, i] = np.cos(t.astype(np.float64)).astype(np.float32)
        sin[:, i] = np.sin(t.astype(np.float64)).astype(np.float32)
        theta = (theta * theta_scale).astype(np.float32)
    return cos, sin


def rope(x, cos, sin, mode):
    """x [T][heads][D]; cos/sin [T][D/2]. Rotates (x[2i], x[2i+1]) or (x[i], x[i+D/2])."""
    D = x.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    if mode == ADJACENT:
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
    else:
        x0, x1 = x[..., : D // 2], x[..., D // 2:]
        out[..., : D // 2] = x0 * c - x1 * s
        out[..., D // 2:] = x0 * s + x1 * c
    return out


def rmsnorm(x, gain, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * gain


def forward_logits(spec: TinySpec, w, ids, rope_mode, ablate=(), act_f16=False):
    """Logits [T][n_vocab] (float64) of one window that starts from an empty cache at position 0.
    ablate: deliberate mistakes for negative controls: "bias" (skip the Q/K/V biases), "qk_norm" (skip
    the per-head q/k RMSNorm), "rope_freqs" (ignore the frequency divisors), "gqa" (query head h reads KV head h % n_head_kv instead of h / group).
    act_f16: round the input of every weight matrix product to f16, as ggml (and kvzap) do for F16
    weights (their vec_dot type is F16)."""
    act = f16 if act_f16 else (lambda a: a)
    T = len(ids)
    H, Hkv, D = spec.n_head, spec.n_head_kv, spec.head_dim
    G = H // Hkv
    eps = float(np.float32(spec.rms_eps))  # the file stores it as f32
    factors = None if "rope_freqs" in ablate else w.get("rope_freqs.weight")
    cos, sin = rope_tables(T, D, spec.rope_base, factors)
    causal = np.tril(np.ones((T, T), bool))
    x = w["token_embd.weight"][np.asarray(ids)]  # [T][E]
    for l in range(spec.n_layer):
        p = f"blk.{l}."
        xn = rmsnorm(x, w[p + "attn_norm.weight"], eps)
        q = act(xn) @ w[p + "attn_q.weight"].T
        k = act(xn) @ w[p + "attn_k.weight"].T
        v = act(xn) @ w[p + "attn_v.weight"].T
        if spec.qkv_bias and "bias" not in ablate:
            q = q + w[p + "attn_q.bias"]
            k = k + w[p + "attn_k.bias"]
            v = v + w[p + "attn_v.bias"]
        q = q.reshape(T, H, D)
        k = k.reshape(T, Hkv, D)
        v = v.reshape(T, Hkv, D)
        if spec.qk_norm and "qk_norm" not in ablate:
            q = rmsnorm(q, w[p + "attn_q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "attn_k_norm.weight"], eps)
        q = f16(rope(q, cos, sin, rope_mode))  # queries rounded to f16 before Q.K
        k = f16(rope(k, cos, sin, rope_mode))  # the cache stores f16
        v = f16(v)
        att = np.empty((T, H, D))
        for h in range(H):
            hk = h % Hkv if "gqa" in ablate else h // G  # query head h reads KV head h / group size
            s = (q[:, h, :] @ k[:, hk, :].T) / np.sqrt(D)
            s = np.where(causal, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            prob = f16(s / s.sum(axis=1, keepdims=True))  # probabilities rounded to f16 before P.V
            att[:, h, :] = prob @ v[:, hk, :]
        x = x + act(att.reshape(T, H * D)) @ w[p + "attn_output.weight"].T
        xn = rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        g = act(xn) @ w[p + "ffn_gate.weight"].T
        u = act(xn) @ w[p + "ffn_up.weight"].T
        x = x + act(g / (1.0 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
    out = w.get("output.weight", w["token_embd.weight"])
    return act(rmsnorm(x, w["output_norm.weight"], eps)) @ out.T


def log_softmax(z):
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def reference_predictions(spec: TinySpec, w, ids, window, rope_mode, ablate=(), act_f16=False):
    """{pos: (logprob of ids[pos], logits row that predicted it)} for every predicted token, cutting ids
    into consecutive windows of `window` tokens that each start from an empty cache (like
    `kvzap perplexity --window`)."""
    out = {}
    for w0 in range(0, len(ids), window):
        chunk = ids[w0:w0 + window]
        if len(chunk) < 2:
            continue
        logits = forward_logits(spec, w, chunk, rope_mode, ablate, act_f16)
        lp = log_softmax(logits)
        for t in range(len(chunk) - 1):
            out[w0 + t + 1] = (float(lp[t, chunk[t + 1]]), logits[t])
    return out
