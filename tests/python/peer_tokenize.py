#!/usr/bin/env python3
"""Peer check of kvzap's byte-level BPE tokenizer against llama.cpp (through llama-cpp-python).

Generates a deterministic set of varied strings and tokenizes them with llama.cpp:

  * with the model file as is (tokenizer.ggml.pre = "smollm")   -> tests/golden/tokenize_cases.json
  * with the same vocabulary relabelled as pre = "llama-bpe"     -> tests/golden/tokenize_cases_llama3.json
  * ... and as pre = "qwen2"                                     -> tests/golden/tokenize_cases_qwen2.json

The relabelled copies are vocab-only GGUF files (all metadata, no tensors) written to a temporary
directory: they exercise the Llama 3 and Qwen2 pre-tokenizers on a real vocabulary without needing
those models. Each golden file is a list of {"text", "ids"}; tests/unit/tokenizer/test_tokenizer.cpp replays them.

It also writes tests/golden/tokenize_splits.json: the pre-tokenizer pieces of every case under the
smollm / llama3 / qwen2 / gpt2 rules, computed with the `regex` module from the Hugging Face patterns
(an independent regex engine, not llama.cpp's hand-written splitters).

Qwen2: Hugging Face applies NFC normalisation before splitting; llama.cpp does not. kvzap follows HF,
so the Qwen2 reference ids are llama.cpp's ids for unicodedata.normalize("NFC", text).

Usage:
  peer_tokenize.py [--model PATH]            write the golden files (needs llama-cpp-python)
  peer_tokenize.py [--model PATH] --check    run `kvzap tokenize --json` on every case and compare
                                             with llama.cpp live (binary: $KVZAP_BIN or build/kvzap)
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(ROOT, "tests", "golden")
VARIANTS = [  # (golden file, tokenizer.ggml.pre override or None, normalise to NFC)
    ("tokenize_cases.json", None, False),
    ("tokenize_cases_llama3.json", "llama-bpe", False),
    ("tokenize_cases_qwen2.json", "qwen2", True),
]


def default_model():
    if os.environ.get("KVZAP_MODEL"):
        return os.environ["KVZAP_MODEL"]
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if os.environ.get("KVZAP_MODELS"):
        return os.path.join(os.environ["KVZAP_MODELS"], name)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "kvzap", "models", name)


# ---------------------------------------------------------------------------------------------
# Test strings
# ---------------------------------------------------------------------------------------------

PROSE = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "In 1492, Columbus sailed the ocean blue; in 1969, Apollo 11 landed on the Moon!",
    "It was the best of times, it was the worst of times, it was the age of wisdom...",
    "What's the capital of France? Paris, of course.",
    "Machine learning models can't always explain themselves.",
    "Dr. Smith (PhD) said: \"We'll see.\" Then he left -- quickly.",
    "e-mail: someone@example.com, web: https://example.org/path?q=1&r=two#frag",
    "KV-cache pruning reduces memory by ~70% at long contexts.",
    "ALL CAPS SENTENCE WITH SHOUTING!!!",
    "mIxEd CaSe WoRdS aNd camelCase and snake_case and kebab-case",
    "Once upon a time,\nthere was a princess.\n\nThe End.",
    "Price: $19.99 (was $25.00) - save 20%!",
    "Rock 'n' roll isn't dead; it's just resting.",
    "I'm sure they're here; we've seen them, you'll see, he'd agree.",
    "DON'T SHOUT, I'M LISTENING. THEY'RE HERE. WE'VE WON. YOU'LL SEE. HE'D KNOW. IT'S 'S",
    "O'Neil's dog's bone; the Joneses' house; '90s music; 'tis the season",
    "apostrophes: 's 't 're 've 'm 'll 'd 'x ' s 'S 'T 'RE 'Ve 'lL 'D",
    "Typographic quotes: \u2018single\u2019, \u201cdouble\u201d, don\u2019t, \u00abguillemets\u00bb",
    "Ellipsis\u2026 em\u2014dash en\u2013dash minus\u2212sign",
]

DIGIT_TEXTS = (
    ["".join(str((n * 7 + k) % 10) for k in range(n)) for n in range(1, 26)]
    + [" " + "9" * n for n in (1, 2, 3, 4, 5, 7)]
    + ["x" + "1234567890" * 3 + "y", "3.14159265358979", "1,000,000", "1e-10", "0x1F2E3D",
       "2024-07-26T12:34:56Z", "+1 (555) 123-4567", "v1.2.3-rc4", "10:30am", "50%", "$1,234.56",
       "\u0663\u0664\u0665 Arabic-Indic digits", "\uff11\uff12\uff13 fullwidth", "x\u00b2 + y\u00b3 = z\u00b2",
       "\u00bd \u00bc \u00be fractions", "\u2160\u2161\u2162 roman numerals \u216b", "\u0968\u0966\u0968\u096a Devanagari",
       "\u4e00\u4e8c\u4e09 and \u3007", "\u2460\u2461\u2462 circled", "abc123def456", "a1b2c3", "12abc", "abc12"]
)

WHITESPACE_TEXTS = [
    "", " ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\t", "\t\t", " \t ", "\r\n", "\r\n\r\n", "\r", "\v\f",
    "  leading two", "trailing two  ", "   both sides   ", "\tTabbed\tcolumns\there\t",
    "line one\nline two\n", "para one\n\npara two\n\n\n", "windows\r\nline\r\nendings\r\n",
    "spaces    inside     words", "mixed \t\n whitespace \n\t run", "  \n  indented\n    more\n",
    "end with newline and spaces\n   ", "   \n", " \n ", "\n \n", "a \nb", "a\n b", "a  \n  b",
    "no\u00a0break\u00a0space", "ideographic\u3000space", "line\u2028separator\u2029para",
    "next\u0085line", "thin\u2009space and hair\u200aspace", "zero\u200bwidth", "\u3000\u3000lead",
    "\u00a0 \u00a0", "x \u00a0y", "tab then letter \ty", "two tabs\t\tz", "\n\tindent", "a\t\n\tb",
]

PUNCT_TEXTS = [
    "!!!", "...", "?!?!", "--", "---", "(((nested)))", "[brackets] {braces} <angles>", "@#$%^&*",
    "a,b;c:d.e!f?g", "\"quoted\" 'single'", "path/to/file.txt", "C:\\Windows\\System32", "~/.bashrc",
    "#hashtag @mention", "::std::vector<int>", "=> -> <= >= != ==", "...?!...", " ! ? .", "a . b , c",
    "\u00bfQu\u00e9 tal? \u00a1Bien!", "\u300c\u5f15\u7528\u300d\u3001\u3002", "\u00a7 \u00b6 \u2020 \u2021 \u2022",
]

ACCENT_TEXTS = [
    "caf\u00e9", "na\u00efve r\u00e9sum\u00e9", "Z\u00fcrich \u00d6sterreich Stra\u00dfe", "\u00c5ngstr\u00f6m",
    "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u", "Za\u017c\u00f3\u0142\u0107 g\u0119\u015bl\u0105 ja\u017a\u0144",
    "\u0130stanbul \u0131\u015f\u0131k", "Fran\u00e7ais: \u00e0 \u00e2 \u00e7 \u00e8 \u00e9 \u00ea \u00eb \u00ee \u00ef \u00f4 \u00f9 \u00fb",
    "e\u0301 decomposed", "cafe\u0301 decomposed", "A\u030a ring", "n\u0303 tilde", "o\u0308\u0304 stacked",
    "\u1e9b\u0323 long s", "\ufb01 ligature", "\u212b angstrom sign", "\u2126 ohm", "Dvo\u0159\u00e1k",
    "se\u00f1or ni\u00f1o", "\u00e6sthetic \u0153uvre", "\u00f0\u00fe\u00de\u00d0",
]

CJK_TEXTS = [
    "\u65e5\u672c\u8a9e", "\u4f60\u597d\uff0c\u4e16\u754c\uff01", "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c",
    "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u4e2d\u6587English\u6df7\u5408", "\u6771\u4eac\u306f2024\u5e74\u306b", "\u6f22\u5b57 \u304b\u306a \u30ab\u30ca",
    "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8", "\uff21\uff22\uff23 fullwidth latin",
    "\u5927\u898f\u6a21\u8a00\u8a9e\u30e2\u30c7\u30eb\uff08LLM\uff09\u306fKV\u30ad\u30e3\u30c3\u30b7\u30e5\u3092\u4f7f\u3046\u3002",
    "\U0002030e rare ideograph",
]

EMOJI_TEXTS = [
    "\U0001f642", "I \u2764\ufe0f NY", "\U0001f44d\U0001f3fd thumbs", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
    "\U0001f3f3\ufe0f\u200d\U0001f308 flag", "\U0001f1eb\U0001f1f7\U0001f1e9\U0001f1ea flags", "1\ufe0f\u20e3 keycap",
    "\U0001f600\U0001f603\U0001f604\U0001f601", "emoji\U0001f680in\U0001f525words", " \U0001f389 party ",
    "\U0001f9d1\U0001f3fb\u200d\U0001f4bb coder", "\u2615 coffee \u2603 snow", "\U0001f44b\U0001f3ff\U0001f44b\U0001f3fb",
    "\U0001fae0 melting", "\U0001f469\u200d\u2764\ufe0f\u200d\U0001f48b\u200d\U0001f468",
]

CODE_TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n\tprint(f\"{i:03d}\")\n",
    "#include <vector>\nint main() {\n  std::vector<int> v{1, 2, 3};\n  return v.size();\n}\n",
    "const f = (x) => x ** 2;\nconsole.log([1,2,3].map(f));",
    "fn main() {\n    let s: &str = \"hi\";\n    println!(\"{s}\");\n}",
    "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"go\") }\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done\n",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "    if (x != NULL && *x == '\\0') { return -1; }\n",
    "x = y if y is not None else 0  # comment\n",
    "class Foo:\n    '''Docstring.'''\n    def __init__(self):\n        self._x = 0x7fff\n",
    "\t\t}\n\t}\n}\n", "a[i][j] += b[j][k] * c[k][i];",
    "template <typename T> T max(T a, T b) { return a > b ? a : b; }",
    "$ echo $HOME && ls -la | grep '^d'", "// TODO(me): fix this\n/* block */",
    "import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\n",
    "let re = /^[a-z]+\\d{2,}$/gi;",
]

CHAT_TEXTS = [
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|><|im_start|><|im_end|>",
    "text<|endoftext|>more text",
    "<|endoftext|>",
    "<|im_start",
    "<|im_end|",
    "|im_start|>",
    "<|im_start|> leading space",
    "trailing space <|im_end|>",
    "<|im_start|>\n\n<|im_end|>\n\n",
    "<repo_name>kvzap<file_sep>src/main.cpp\nint main() {}",
    "<reponame>x<filename>y<gh_stars>10",
    "<issue_start>bug<issue_comment>fixed<issue_closed>",
    "<jupyter_start><jupyter_code>print(1)<jupyter_output>1<empty_output>",
    "<jupyter_text>md<jupyter_script>",
    "< |im_start| >",
    "<|IM_START|>",
    "<<|im_start|>>",
    "<|im_start|>user\n\u4f60\u597d<|im_end|>\n<|im_start|>assistant\n\u3053\u3093\u306b\u3061\u306f<|im_end|>",
    "x<|im_end|>y<|im_start|>z<|endoftext|>w",
    "<think>\nreasoning\n</think>\n\nanswer",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
]

MIXED_TEXTS = [
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! Hello!", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03ba\u03b5\u03af\u03bc\u03b5\u03bd\u03bf",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 123", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0", "\u0531\u0580\u0574\u0565\u0576\u056b\u0561",
    "English \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u4e2d\u6587 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \U0001f642 123",
    "Latin\u0410Cyrillic mixed\u03b1\u03b2\u03b3", "\u1200\u1208\u1218 Ethiopic", "\u13a0\u13a1\u13a2 Cherokee",
    "\u0d2e\u0d32\u0d2f\u0d3e\u0d33\u0d02", "\u0bb5\u0ba3\u0b95\u0bcd\u0b95\u0bae\u0bcd", "\u1780\u1798\u17d2\u1796\u17bb\u1787\u17b6",
    "Soft\u00adhyphen", "BOM\ufeffinside", "ctrl\x01\x02\x1c\x1d\x1e\x1f chars", "del\x7fchar", "nul\x00byte",
    "\U00010348 gothic \U0001d400 math bold", "\U000e0041 tag char", "\uffff\ufffe noncharacters", "\ue000 private use",
    "\u0378 unassigned", "\U0001f9ff\U0001faf8 newer emoji",
]


def random_texts(rng, n):
    """Random mixtures of characters from many classes (digits, blanks, marks, specials, ...)."""
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789", " ", "  \t\n\r", ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`",
        "\u00e9\u00e8\u00fc\u00f1\u00e7\u00df\u00f8\u00e5", "\u0301\u0308\u0303",
        "\u65e5\u672c\u8a9e\u4e2d\u6587\u3042\u30a2\ud55c", "\u0430\u0431\u0432\u03b1\u03b2\u05d0\u0627",
        "\u0663\u00b2\u00bd\u2160\uff11", "\u00a0\u3000\u2028\u0085",
        "\U0001f642\U0001f44d\U0001f3fd\u200d\u2764\ufe0f",
    ]
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>"]
    words = ["the", "kv", "cache", "token", "don't", "it's", "we'll", "HELLO", "naïve", "日本", "123", "  "]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.08:
                parts.append(rng.choice(specials))
            elif r < 0.4:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
            if rng.random() < 0.5:
                parts.append(rng.choice([" ", "", "\n", "  ", "\t"]))
        out.append("".join(parts))
    return out


def make_cases():
    rng = random.Random(20240726)
    texts = (PROSE + DIGIT_TEXTS + WHITESPACE_TEXTS + PUNCT_TEXTS + ACCENT_TEXTS + CJK_TEXTS + EMOJI_TEXTS +
             CODE_TEXTS + CHAT_TEXTS + MIXED_TEXTS)
    # Digit runs of every length inside text, and long runs of one kind.
    texts += ["id %s end" % ("".join(rng.choice("0123456789") for _ in range(n))) for n in range(1, 41, 3)]
    texts += ["a" * 300, "ab" * 150, " " * 40 + "x", "\n" * 25, "9" * 100, "\U0001f642" * 20,
              "\u65e5" * 50, "word " * 60, "-" * 80, "=" * 33 + "\n" + "#" * 17]
    # Contractions glued to various neighbours.
    texts += [p + c + s for p in ("", "I", " x", "9") for c in ("'s", "'T", "'re", "'LL", "'d", "'ve", "'M")
              for s in ("", " ok", "x")][:60]
    texts += random_texts(rng, 150)
    seen, cases = set(), []
    for t in texts:
        if t not in seen:
            seen.add(t)
            cases.append(t)
    return cases


# ---------------------------------------------------------------------------------------------
# Vocab-only GGUF copies with another tokenizer.ggml.pre
# ---------------------------------------------------------------------------------------------

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_gguf_metadata(path):
    """Returns [(key, type, value)] in file order; arrays are (elem_type, [values])."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, data, off)[0]
        off += struct.calcsize("<" + fmt)
        return v

    def string():
        nonlocal off
        n = take("Q")
        s = data[off:off + n]
        off += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et = take("I")
            return (et, [value(et) for _ in range(take("Q"))])
        return take(_SCALAR[t])

    if data[:4] != b"GGUF":
        raise SystemExit(f"{path}: not a GGUF file")
    off = 4
    take("I")
    take("Q")  # tensor count (ignored: the copy has none)
    kvs = []
    for _ in range(take("Q")):
        k = string().decode()
        t = take("I")
        kvs.append((k, t, value(t)))
    return kvs


def write_vocab_only_gguf(kvs, path, pre):
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)))

    def put_value(t, v):
        if t == 8:
            out.extend(struct.pack("<Q", len(v)) + v)
        elif t == 9:
            et, items = v
            out.extend(struct.pack("<IQ", et, len(items)))
            for item in items:
                put_value(et, item)
        else:
            out.extend(struct.pack("<" + _SCALAR[t], v))

    for k, t, v in kvs:
        if k == "tokenizer.ggml.pre":
            v = pre.encode()
        kb = k.encode()
        out.extend(struct.pack("<Q", len(kb)) + kb + struct.pack("<I", t))
        put_value(t, v)
    out.extend(b"\0" * (-len(out) % 32))
    with open(path, "wb") as f:
        f.write(out)


def pre_is_native(golden):
    return golden == VARIANTS[0][0]


def variant_models(model, tmpdir):
    kvs = None
    paths = []
    for golden, pre, nfc in VARIANTS:
        if pre is None:
            paths.append((golden, model, nfc))
            continue
        if kvs is None:
            kvs = read_gguf_metadata(model)
        p = os.path.join(tmpdir, f"vocab-{pre}.gguf")
        write_vocab_only_gguf(kvs, p, pre)
        paths.append((golden, p, nfc))
    return paths


# ---------------------------------------------------------------------------------------------
# Pre-tokenizer pieces from the HF patterns with a real regex engine
# ---------------------------------------------------------------------------------------------

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")


def isolated_split(pattern, text):
    """HF Split(behavior="Isolated"): every match is a piece, and so is every gap between matches."""
    import regex
    pieces, last = [], 0
    for m in regex.finditer(pattern, text):
        if m.start() > last:
            pieces.append(text[last:m.start()])
        if m.end() > m.start():
            pieces.append(m.group())
        last = m.end()
    if last < len(text):
        pieces.append(text[last:])
    return pieces


def reference_splits(text):
    smollm = [q for p in isolated_split(r"\p{N}", text) for q in isolated_split(GPT2_PATTERN, p)]
    return {"text": text, "smollm": smollm, "llama3": isolated_split(LLAMA3_PATTERN, text),
            "qwen2": isolated_split(QWEN2_PATTERN, text), "gpt2": isolated_split(GPT2_PATTERN, text)}


# ---------------------------------------------------------------------------------------------
# Reference and comparison
# ---------------------------------------------------------------------------------------------

def reference_ids(model_path, texts, nfc, special=True):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
    out = []
    for t in texts:
        s = unicodedata.normalize("NFC", t) if nfc else t
        out.append(llm.tokenize(s.encode("utf-8"), add_bos=False, special=special))
    del llm
    return out


def kvzap_ids(binary, model_path, text, tmpdir, special=True):
    p = os.path.join(tmpdir, "case.txt")
    with open(p, "wb") as f:
        f.write(text.encode("utf-8"))
    cmd = [binary, "tokenize", "-m", model_path, "--text-file", p, "--json"] + ([] if special else ["--no-special"])
    r = subprocess.run(cmd, capture_output=True, timeout=60)
    if r.returncode != 0:
        return "error: " + r.stderr.decode(errors="replace").strip()
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--check", action="store_true", help="compare kvzap tokenize live instead of writing")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        sys.exit(f"model not found: {args.model} (set KVZAP_MODEL or run `kvzap pull`)")
    texts = make_cases()
    if not args.check:
        with open(os.path.join(GOLDEN, "tokenize_splits.json"), "w", encoding="utf-8") as f:
            json.dump([reference_splits(t) for t in texts], f, ensure_ascii=True, indent=0)
            f.write("\n")
        print(f"wrote {len(texts)} cases to tests/golden/tokenize_splits.json")
    binary = os.environ.get("KVZAP_BIN") or os.path.join(ROOT, "build", "kvzap")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for golden, model_path, nfc in variant_models(args.model, tmp):
            ref = reference_ids(model_path, texts, nfc)
            # Plain-text mode (control tokens not parsed) for the model as is.
            plain = reference_ids(model_path, texts, nfc, special=False) if pre_is_native(golden) else None
            if not args.check:
                os.makedirs(GOLDEN, exist_ok=True)
                entries = []
                for i, (t, ids) in enumerate(zip(texts, ref)):
                    e = {"text": t, "ids": ids}
                    if plain is not None:
                        e["ids_no_special"] = plain[i]
                    entries.append(e)
                with open(os.path.join(GOLDEN, golden), "w", encoding="utf-8") as f:
                    json.dump(entries, f, ensure_ascii=True, indent=0)
                    f.write("\n")
                print(f"wrote {len(texts)} cases to tests/golden/{golden}")
                continue
            bad = n = 0
            for i, (t, want) in enumerate(zip(texts, ref)):
                runs = [(True, want)]
                if plain is not None and "<" in t:  # --no-special only matters around markup
                    runs.append((False, plain[i]))
                for special, expected in runs:
                    n += 1
                    got = kvzap_ids(binary, model_path, t, tmp, special)
                    if got != expected:
                        bad += 1
                        if bad <= 10:
                            print(f"[{golden}{'' if special else ' --no-special'}] MISMATCH {t!r}\n"
                                  f"  llama.cpp: {expected}\n  kvzap:     {got}")
            print(f"[{golden}] {n - bad}/{n} identical")
            failures += bad
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
