"""Converts a Hugging Face checkpoint folder to GGUF with llama.cpp's own convert_hf_to_gguf.py, taken from
the llama.cpp tree vendored in the llama-cpp-python sdist that scripts/build_llamacpp.sh downloads (with its
own gguf-py, so the converter and the writer match). Test-only: the product path never runs Python.

Two stand-ins, because the tiny test checkpoints are not real ones; everything else is the converter's own
code:
- it names a byte-level BPE pre-tokenizer by hashing what the tokenizer makes of a test string; a tiny test
  tokenizer hashes to nothing it knows, so the caller names the pre-tokenizer (`pre`) and the lookup
  returns that;
- for SentencePiece-style vocabularies (Gemma) it reads tokenizer.model through the `sentencepiece`
  package; a tiny checkpoint has only tokenizer.json, so (`spm=True`) a placeholder tokenizer.model is
  written in a copy of the folder and a small `sentencepiece` stand-in serves the pieces of tokenizer.json:
  score -(rank + 1) for the token each merge creates (SentencePiece merges the highest score first, BPE the
  lowest rank), 0 for the rest; <0xXX> pieces are bytes, special added tokens control tokens.
"""
import glob
import os
import subprocess
import sys
import tarfile

VERSION = os.environ.get("LLAMACPP_PY_VERSION", "0.3.36")
PEER_DIR = os.environ.get("KVZAP_PEER_DIR", os.path.expanduser("~/.cache/kvzap/llamacpp-%s" % VERSION))
# scripts/build_llamacpp.sh builds into a prefix ending in -noamx on hosts whose AMX faults; the sdist is there.
PEER_DIRS = [PEER_DIR] if "KVZAP_PEER_DIR" in os.environ else [PEER_DIR, PEER_DIR + "-noamx"]

RUNNER = r"""
import importlib.machinery, json, os, re, sys, types
root, pre = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
sys.path.insert(1, root + "/gguf-py")


class SentencePieceProcessor:
    def LoadFromFile(self, path):
        tj = json.load(open(os.path.join(os.path.dirname(path), "tokenizer.json"), encoding="utf-8"))
        vocab = tj["model"]["vocab"]
        self.pieces = [None] * (max(vocab.values()) + 1)
        for piece, i in vocab.items():
            self.pieces[i] = piece
        self.scores = [0.0] * len(self.pieces)
        for rank, m in enumerate(tj["model"].get("merges", [])):
            a, b = m if isinstance(m, list) else m.split(" ", 1)
            if a + b in vocab and self.scores[vocab[a + b]] == 0.0:
                self.scores[vocab[a + b]] = -(rank + 1.0)
        self.control = {t["id"] for t in tj.get("added_tokens", []) if t.get("special")}
        self.unk = tj["model"].get("unk_token")
    def vocab_size(self): return len(self.pieces)
    def IdToPiece(self, i): return self.pieces[i]
    def GetScore(self, i): return self.scores[i]
    def IsUnknown(self, i): return self.pieces[i] == self.unk
    def IsControl(self, i): return i in self.control
    def IsUnused(self, i): return False
    def IsByte(self, i): return re.fullmatch(r"<0x[0-9A-F]{2}>", self.pieces[i]) is not None


stand_in = types.ModuleType("sentencepiece")
stand_in.SentencePieceProcessor = SentencePieceProcessor
stand_in.__spec__ = importlib.machinery.ModuleSpec("sentencepiece", None)  # transformers looks for one
sys.modules["sentencepiece"] = stand_in
import conversion.base as base
if pre != "-":
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
import convert_hf_to_gguf as convert
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[3:]
convert.main()
"""


def sdist_path():
    for d in PEER_DIRS:
        found = sorted(glob.glob(os.path.join(d, "llama_cpp_python-%s.tar.gz" % VERSION)))
        if found:
            return found[0]
    return None


def converter_root(work):
    """Extracts convert_hf_to_gguf.py, conversion/ and gguf-py/ once under work; returns the folder, or None
    (with the reason) when the sdist is not there."""
    root = os.path.join(work, "llama.cpp-convert")
    if os.path.isfile(os.path.join(root, "convert_hf_to_gguf.py")):
        return root, None
    sdist = sdist_path()
    if not sdist:
        return None, "no llama-cpp-python %s sdist in %s (bash scripts/build_llamacpp.sh fetches it)" % (VERSION, " or ".join(PEER_DIRS))
    prefix = "llama_cpp_python-%s/vendor/llama.cpp/" % VERSION
    wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
    os.makedirs(root, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for m in tar.getmembers():
            if not m.name.startswith(prefix) or not m.isfile():
                continue
            rel = m.name[len(prefix):]
            if rel.startswith(wanted) and ".." not in rel.split("/"):
                dest = os.path.join(root, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with tar.extractfile(m) as src, open(dest, "wb") as out:
                    out.write(src.read())
    return root, None


def convert(root, checkpoint, out, pre=None, spm=False, outtype="f32"):
    """Runs the converter; raises RuntimeError with its last output lines on failure."""
    if spm:  # a copy of the folder with a placeholder tokenizer.model (see the module comment)
        copy = out + ".src"
        os.makedirs(copy, exist_ok=True)
        for name in os.listdir(checkpoint):
            link = os.path.join(copy, name)
            if not os.path.lexists(link):
                os.symlink(os.path.abspath(os.path.join(checkpoint, name)), link)
        open(os.path.join(copy, "tokenizer.model"), "wb").close()
        checkpoint = copy
    r = subprocess.run([sys.executable, "-c", RUNNER, root, pre or "-", checkpoint, "--outfile", out,
                        "--outtype", outtype], capture_output=True, text=True, timeout=600)
    if r.returncode != 0 or not os.path.isfile(out):
        raise RuntimeError("convert_hf_to_gguf.py failed (%d): %s" % (r.returncode, (r.stderr or r.stdout)[-800:]))
    return out
