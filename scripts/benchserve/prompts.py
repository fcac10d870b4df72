"""Deterministic, distinct prompt texts fitted to a token length (counted by the server's /tokenize, else
`kvzap tokenize`, else estimated from the word count)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import tempfile
from pathlib import Path

import httpx

WORDS = """time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work government number night
point home water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city community name
president team minute idea kid body information back parent face others level office door health person
art war history party result change morning reason research girl guy moment air teacher force education
river garden winter summer engine bridge letter market island harbor mountain forest village window table
""".split()
VERBS = """finds keeps brings holds turns moves builds reads writes carries follows opens shows plays learns
changes leads meets pays sends expects explains covers marks draws breaks counts lifts""".split()
ADJ = """old new small large early late quiet bright cold warm simple strange common careful open heavy
light narrow wide calm busy distant golden silver green""".split()


def make_text(index: int, n_words: int, text_words: list[str] | None = None) -> str:
    """Exactly n_words words (at least 3), the same for the same `index`: a window of `text_words` (--text-file)
    for index < 10,000, else generated English-like sentences."""
    if text_words and index < 10_000:
        span = max(1, len(text_words) - n_words)
        at = (index * 1543) % span
        return " ".join(text_words[at:at + n_words])
    rng = random.Random(7919 * (index + 1))
    words = [f"Record {index} ({rng.choice(ADJ)} {rng.choice(WORDS)}):"]
    n = 3
    while n < n_words:  # bounded: every sentence adds at least 6 words
        length = rng.randint(6, 14)
        sentence = [rng.choice(VERBS if k == 2 else (ADJ if k % 4 == 1 else WORDS)) for k in range(length)]
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        words.append(" ".join(sentence))
        n += length
    return " ".join(" ".join(words).split()[:max(n_words, 3)])


class Tokenizer:
    """Counts tokens: the server's /tokenize, else `kvzap tokenize`, else None (the caller estimates).
    `source` ends as whichever answered first ("server", "kvzap") or "estimate"."""

    def __init__(self, url: str | None, kvzap: Path, model: Path | None):
        self.url, self.kvzap, self.model = url, kvzap, model
        self.source = None

    def _server(self, text: str) -> int | None:
        try:
            r = httpx.post(self.url + "/tokenize", json={"content": text, "add_special": False},
                           timeout=30, trust_env=False)
            tokens = r.json().get("tokens") if r.status_code == 200 else None
            return len(tokens) if isinstance(tokens, list) else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    def _kvzap(self, text: str) -> int | None:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        try:
            proc = subprocess.run([str(self.kvzap), "tokenize", "-m", str(self.model), "--text-file", f.name, "--json"],
                                  capture_output=True, text=True, timeout=120)
            data = json.loads(proc.stdout) if proc.returncode == 0 else None
            tokens = data.get("tokens") if isinstance(data, dict) else data
            return len(tokens) if isinstance(tokens, list) else None
        except (subprocess.SubprocessError, ValueError):
            return None
        finally:
            os.unlink(f.name)

    def count(self, text: str) -> int | None:
        if self.url and self.source in (None, "server"):
            n = self._server(text)
            if n is not None or self.source == "server":
                self.source = "server"
                return n
        if self.source in (None, "kvzap") and self.model and os.access(self.kvzap, os.X_OK):
            n = self._kvzap(text)
            if n is not None:
                self.source = "kvzap"
                return n
        self.source = "estimate"
        return None


def build_prompts(n: int, target: int, tok: Tokenizer,
                  text_words: list[str] | None = None) -> tuple[list[str], list[int | None], str]:
    """n distinct prompts of about `target` tokens; returns prompts, measured lengths, how they were counted."""
    tokens_per_word = 1.3
    c = tok.count(make_text(10_000, 400))
    if c:
        tokens_per_word = c / 400
    prompts, lengths = [], []
    for i in range(n):
        n_words = max(3, round(target / tokens_per_word))
        text, count = make_text(i, n_words, text_words), None
        for _ in range(5):  # bounded refinement at word granularity
            text = make_text(i, n_words, text_words)
            count = tok.count(text)
            if count is None or abs(count - target) <= max(1, target // 100):
                break
            step = round((target - count) / tokens_per_word) or (1 if target > count else -1)
            n_words = max(3, n_words + step)
        prompts.append(text)
        lengths.append(count)
    return prompts, lengths, tok.source or "estimate"
