#!/usr/bin/env python3
"""Writes the hand-made seed inputs of the fuzz harnesses into fuzz/corpus/<harness>/ and the tiny
model fuzz/data/tiny_llama.gguf (the saved-cache harness loads it). Deterministic; re-run after a
format change. The saved-cache seed is written by the harness itself (scripts/fuzz.sh --seeds)."""
import io
import json
import os
import struct
import sys
import zipfile
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"
SEP = b"\n--8<--\n"
rng = np.random.default_rng(12)


def put(harness, name, data):
    d = CORPUS / harness
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def tiny_model(path, arch="llama", pre="smollm"):
    E, H, HKV, D, FF = 32, 2, 1, 16, 32
    tokens = ["a", "b", "c", "\u0120", "ab", "\u0120ab", "\u010a", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
              "user", "assistant", "\u0120a", "bc", "ca", "!"]
    types = [1] * 7 + [3, 3, 3] + [1] * 6
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny " + arch)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(E)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["a b", "\u0120 ab", "\u0120 a", "b c", "c a"])
    w.add_bos_token_id(9)
    w.add_eos_token_id(8)
    w.add_chat_template("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}")

    def f32(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    V = len(tokens)
    w.add_tensor("token_embd.weight", f32(V, E).astype(np.float16))
    w.add_tensor("output_norm.weight", np.ones(E, np.float32))
    p = "blk.0."
    w.add_tensor(p + "attn_norm.weight", np.ones(E, np.float32))
    w.add_tensor(p + "attn_q.weight", quantize(f32(H * D, E), Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor(p + "attn_k.weight", quantize(f32(HKV * D, E), Q.Q4_0), raw_dtype=Q.Q4_0)
    w.add_tensor(p + "attn_v.weight", f32(HKV * D, E))
    w.add_tensor(p + "attn_output.weight", quantize(f32(E, H * D), Q.Q4_1), raw_dtype=Q.Q4_1)
    if arch == "qwen2":
        for n, d in (("q", H * D), ("k", HKV * D), ("v", HKV * D)):
            w.add_tensor(p + f"attn_{n}.bias", f32(d))
    if arch == "qwen3":
        w.add_tensor(p + "attn_q_norm.weight", np.ones(D, np.float32))
        w.add_tensor(p + "attn_k_norm.weight", np.ones(D, np.float32).astype(np.float16))
    w.add_tensor(p + "ffn_norm.weight", np.ones(E, np.float32))
    w.add_tensor(p + "ffn_gate.weight", f32(FF, E).astype(np.float16))
    w.add_tensor(p + "ffn_up.weight", quantize(f32(FF, E), Q.Q5_0), raw_dtype=Q.Q5_0)
    w.add_tensor(p + "ffn_down.weight", quantize(f32(E, FF), Q.Q8_0), raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def safetensors_bytes(tensors, metadata=None):
    header, blobs, off = {}, [], 0
    for name, arr, dtype in tensors:
        b = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def bf16(a):
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def main():
    (ROOT / "data").mkdir(exist_ok=True)
    tiny_model(ROOT / "data" / "tiny_llama.gguf")
    for arch, pre in (("llama", "smollm"), ("qwen2", "qwen2"), ("qwen3", "llama-bpe")):
        p = CORPUS / "gguf" / f"tiny_{arch}.gguf"
        p.parent.mkdir(parents=True, exist_ok=True)
        tiny_model(p, arch, pre)

    # safetensors: every dtype family the reader converts, metadata, an empty tensor.
    put("safetensors", "mixed.safetensors", safetensors_bytes([
        ("a", np.arange(6, dtype=np.float32).reshape(2, 3), "F32"),
        ("b", np.arange(4, dtype=np.float16), "F16"),
        ("c", bf16(np.array([1.5, -2.0], np.float32)), "BF16"),
        ("d", np.array([1, -2, 3], np.int64), "I64"),
        ("e", np.array([1, 0], np.uint8), "BOOL"),
        ("f", np.zeros((0, 3), np.float32), "F32"),
    ], {"format": "pt"}))
    put("safetensors", "f64_i8.safetensors", safetensors_bytes([
        ("x", np.array([0.25, 1e300], np.float64), "F64"), ("y", np.array([-7, 7], np.int8), "I8"),
        ("z", np.array([1, 2], np.int16), "I16"), ("w", np.array([1, 2], np.int32), "I32")]))

    # surrogate folders: linear and MLP, config.json + separator + model.safetensors.
    D, H, L, HD = 8, 2, 2, 4
    lin = [(f"layers.{l}.weight", rng.standard_normal((H, D)).astype(np.float32), "F32") for l in range(L)]
    lin += [(f"layers.{l}.bias", np.zeros(H, np.float32), "F32") for l in range(L)]
    cfg = {"model_type": "kvzap", "input_dim": D, "output_dim": H, "hidden_dim": None, "n_modules": L}
    put("surrogate", "linear", json.dumps(cfg).encode() + SEP + safetensors_bytes(lin))
    mlp = []
    for l in range(L):
        mlp += [(f"layers.{l}.0.weight", bf16(rng.standard_normal((HD, D))), "BF16"),
                (f"layers.{l}.0.bias", np.zeros(HD, np.float16), "F16"),
                (f"layers.{l}.2.weight", rng.standard_normal((H, HD)).astype(np.float32), "F32"),
                (f"layers.{l}.2.bias", np.zeros(H, np.float32), "F32")]
    cfg = dict(cfg, hidden_dim=HD)
    put("surrogate", "mlp", json.dumps(cfg).encode() + SEP + safetensors_bytes(mlp))

    # zip: a wheel-like archive, deflated and stored members, a directory entry; and a ZIP64 one.
    for name, kw in (("wheel.zip", {}), ("zip64.zip", {"force64": True})):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr(zipfile.ZipInfo("pkg/"), b"")
            z.writestr("pkg/model.gguf", b"GGUF" + bytes(range(64)) * 4, compress_type=zipfile.ZIP_DEFLATED)
            z.writestr("pkg-0.1.dist-info/RECORD", b"pkg/model.gguf,sha256=x,260\n", compress_type=zipfile.ZIP_STORED)
            if kw:
                with z.open("big.bin", "w", force_zip64=True) as f:
                    f.write(b"z" * 100)
        put("zip", name, buf.getvalue())

    # .kvzd datasets: f16, f32 and bf16 x, with a partial last record in one.
    def kvzd(L, D, H, dtype, n, partial=0):
        xb = {0: 4, 1: 2, 2: 2}[dtype]
        rec = 8 + L * H * 4 + L * D * xb
        rec = (rec + 7) // 8 * 8
        hdr = b"KVZD" + struct.pack("<IIIIIQI", 1, L, D, H, dtype, n, rec)
        hdr += b"\0" * (64 - len(hdr))
        body = b""
        for i in range(n):
            r = struct.pack("<II", i // 3, i % 3) + np.full(L * H, -float(i), np.float32).tobytes()
            x = rng.standard_normal(L * D).astype(np.float32)
            r += x.tobytes() if dtype == 0 else (x.astype(np.float16).tobytes() if dtype == 1 else bf16(x).tobytes())
            body += r + b"\0" * (rec - len(r))
        return hdr + body + b"\x01" * partial
    put("dataset", "f16.kvzd", kvzd(2, 8, 2, 1, 4))
    put("dataset", "f32_partial.kvzd", kvzd(1, 4, 1, 0, 3, partial=5))
    put("dataset", "bf16.kvzd", kvzd(3, 2, 3, 2, 2))

    # tokenizer: byte 0 selects vocabulary and flags.
    texts = [b"Hello world, it's 2024!\n\n  indented\ttab", "café 日本語 😀 \u00a0nbsp".encode(),
             b"<|im_start|>user\nhi<|im_end|>\n<think>x</think>", b"   12345 6789 (a))", b"\xff\xfe bad utf8 \xc3"]
    for i, t in enumerate(texts):
        for sel in (i % 5, 8 + 16 + (i + 1) % 5):
            put("tokenizer", f"t{i}_{sel}", bytes([sel]) + t)

    # chat templates: selector, template text, then role/content pairs.
    smol = b"{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    llama = b"<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: {{ date_string }}<|eot_id|>"
    qwen3 = b"{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{%- endif %}<|im_start|>"
    conv = SEP.join([b"system", b"Be brief.", b"user", b"Hi there", b"assistant", b"<think>\nhmm\n</think>\n\nHello!", b"user", b"  and?  \n"])
    for i, (tpl, sel) in enumerate(((smol, 4), (llama, 4 + 2), (qwen3, 1 + 8), (b"chatml", 3))):
        put("chat_template", f"c{i}", bytes([sel]) + tpl + SEP + conv)

    # Jinja templates: the default model's own template (when pulled) and hand-written ones covering the
    # constructs of the Llama 3, Qwen and Gemma templates; then the separator and the variables.
    conv_json = json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Hi"},
                                         {"role": "assistant", "content": "<think>\nx\n</think>\n\nHello"},
                                         {"role": "user", "content": [{"type": "text", "text": "more"}]}],
                            "enable_thinking": False, "tools": [{"name": "f", "parameters": {"a": 1}}],
                            "date_string": "26 Jul 2024"}).encode()
    templates = {
        "loop": b"{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<s>{% endif %}"
                b"<|im_start|>{{ message['role'] }}\n{{ message['content'] | trim }}<|im_end|>\n{% endfor %}"
                b"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        "namespace": b"{%- set ns = namespace(found=false, n=0) -%}{%- for m in messages[::-1] -%}{%- if m.role == 'user' "
                     b"and not ns.found -%}{%- set ns.found = true -%}{%- set ns.n = loop.index0 -%}{%- endif -%}"
                     b"{%- endfor -%}{{ ns.n }}{{ messages | length }}{{ (messages[0].content ~ '!') | upper }}",
        "tojson": b"{{- bos_token }}{%- if tools is defined and tools %}{{ tools | tojson(indent=4) }}{% endif %}"
                  b"{%- for m in messages %}{{ m | tojson }}{% if not loop.last %},{% endif %}{% endfor %}",
        "raise": b"{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
                 b"{{ strftime_now('%d %b %Y') }}{{ range(3) | list }}{{ 'a,b' .split(',') | join('|') }}",
        "macro": b"{% macro render(m) %}[{{ m.role }}]{{ m.content if m.content is string else m.content[0].text }}"
                 b"{% endmacro %}{% for m in messages %}{{ render(m) }}{% elif %}{% endfor %}",
        "think": b"{%- if '</think>' in messages[2].content %}{% set c = messages[2].content.split('</think>')[-1]"
                 b".lstrip('\n') %}{% endif %}{{ c | default('none') }}{{ 1 + 2 * 3 // 2 % 5 }}{{ [1,2][1:] }}"
                 b"{{ {'a': 1}.items() | list }}{{ enable_thinking is false }}",
    }
    for name, tpl in templates.items():
        put("jinja", name, tpl + SEP + conv_json)
    for tpl in sorted((ROOT.parent / "tests" / "golden" / "templates").glob("*.jinja")):
        put("jinja", "golden-" + tpl.stem, tpl.read_bytes() + SEP + conv_json)
    model = Path(os.environ.get("KVZAP_MODEL", Path.home() / ".cache/kvzap/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    if model.exists():
        r = gguf.GGUFReader(str(model))
        f = r.fields["tokenizer.chat_template"]
        put("jinja", "smollm2", bytes(f.parts[f.data[0]]) + SEP + conv_json)

    # server requests.
    reqs = [
        {"messages": [{"role": "user", "content": "What is a KV cache?"}], "max_tokens": 64,
         "kv_compression": {"press": "kvzap-mlp", "threshold": -4, "decoding": True}},
        {"model": "kvzap", "messages": [{"role": "system", "content": [{"type": "text", "text": "sys"}]},
                                        {"role": "user", "content": "hi"}],
         "temperature": 0.7, "top_p": 0.9, "min_p": 0.05, "seed": 42, "stop": ["\n", "END"], "stream": True,
         "stream_options": {"include_usage": True}, "n": 1, "response_format": {"type": "text"}},
        {"prompt": "Once upon a time", "max_tokens": 32, "stream": True, "ignore_eos": True},
        {"prompt": [1, 2, 3, 49151], "max_completion_tokens": 5, "kv_compression": {"press": "snapkv", "ratio": 0.5, "window": 8}},
        {"content": "tokenize me <|im_end|>", "add_special": True, "parse_special": False, "with_pieces": True},
        {"tokens": [1, 2, 3]},
        {"filename": "slot-1.bin"},
    ]
    for i, r in enumerate(reqs):
        put("request", f"r{i}.json", json.dumps(r).encode())
    put("request", "bad.json", b'{"messages": [{"role": "user", "content": "\xff"}]')


if __name__ == "__main__":
    sys.exit(main())
