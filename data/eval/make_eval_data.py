#!/usr/bin/env python3
"""Regenerates the committed offline-eval data under data/eval/ from Debian bookworm packages.

Not part of the product path: the C++ generator (src/eval/) only reads the committed files.
Run (as any user, no R and no dependency install needed):

    mkdir -p /tmp/eval-src && cd /tmp/eval-src
    apt-get download r-cran-janeaustenr wamerican wordnet-base
    for f in *.deb; do dpkg-deb -x "$f" root; done
    python3 data/eval/make_eval_data.py --root /tmp/eval-src/root --out data/eval

Outputs (all ASCII, deterministic for a given package version):
    haystack/persuasion.txt, haystack/northanger_abbey.txt  one paragraph per line
    words/adjectives.txt, words/nouns.txt                    NIAH keys "adjective-noun"
    words/cwe_words.txt                                      CWE vocabulary, substring-free
"""
import argparse
import hashlib
import os
import re
import struct
import zlib

RDB = "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
DICT = "usr/share/dict/american-english"
WORDNET = "usr/share/wordnet"

# Bytes of prose kept per novel (from the first chapter on, cut at a paragraph boundary).
EXTRACT_BYTES = 100_000

# A few words nobody wants to see in a needle key; the WordNet "tagged sense" filter already
# removes most rare or crude words.
BLOCKLIST = {
    "bastard", "bitch", "whore", "slut", "nigger", "negro", "rape", "rapist", "penis", "vagina",
    "sexual", "sexy", "fuck", "shit", "crap", "damn", "kill", "killer", "murder", "suicide",
    "corpse", "dead", "death", "abortion", "drunk", "naked", "nude", "porn", "breast", "bomb",
    "terror", "slave", "slavery", "racist", "jew", "jewish", "christ", "god", "satan", "hell",
    "devil", "nazi", "genocide", "torture", "homosexual", "lesbian", "queer", "idiot", "moron",
    "stupid", "retard", "cripple", "fatal", "disease", "cancer", "tumor",
}


def rdb_records(blob):
    """Rdata.rdb: consecutive records, each a 4-byte big-endian length then one zlib stream."""
    off = 0
    while off < len(blob):
        d = zlib.decompressobj()
        raw = d.decompress(blob[off + 4:])
        off += 4 + (len(blob) - off - 4 - len(d.unused_data))
        yield raw


def r_character_vector(raw):
    """Parses an R XDR serialisation (format 3) holding one character vector (STRSXP)."""
    assert raw[:2] == b"X\n", "not an XDR R serialisation"
    version = struct.unpack(">i", raw[2:6])[0]
    p = 14
    if version == 3:
        nelen = struct.unpack(">i", raw[p:p + 4])[0]
        p += 4 + nelen
    flags, n = struct.unpack(">ii", raw[p:p + 8])
    p += 8
    assert flags & 0xFF == 16, "expected a character vector"
    out = []
    for _ in range(n):
        _fl, ln = struct.unpack(">ii", raw[p:p + 8])
        p += 8
        if ln < 0:
            out.append("")
            continue
        out.append(raw[p:p + ln].decode("utf-8"))
        p += ln
    return out


def paragraphs_of(lines):
    paras, cur = [], []
    for line in lines + [""]:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(re.sub(r"\s+", " ", " ".join(cur)))
            cur = []
    return paras


def prose_extract(lines, limit):
    """Paragraphs from the first chapter heading on, headings dropped, cut at `limit` bytes."""
    paras = paragraphs_of(lines)
    heading = re.compile(r"^(CHAPTER|Chapter)\s+[0-9IVXLC]+\.?$")
    first = next(i for i, p in enumerate(paras) if heading.match(p))
    out, size = [], 0
    for p in paras[first:]:
        if heading.match(p) or p.isupper() or p in ("Finis", "THE END"):
            continue
        assert all(ord(c) < 128 for c in p), "non-ASCII text in extract"
        if size + len(p) + 1 > limit:
            break
        out.append(p)
        size += len(p) + 1
    return out


def wordnet_common(root, pos, min_tagged):
    """Single-word lemmas whose senses were tagged at least `min_tagged` times (a frequency proxy)."""
    out = set()
    with open(os.path.join(root, WORDNET, "index." + pos)) as f:
        for line in f:
            if line.startswith(" "):
                continue
            fields = line.split()
            p_cnt = int(fields[3])
            tagged = int(fields[5 + p_cnt])
            if tagged >= min_tagged:
                out.add(fields[0])
    return out


def stable_order(words):
    """Deterministic pseudo-random order (no RNG state): sort by SHA-256 of the word."""
    return sorted(words, key=lambda w: hashlib.sha256(w.encode()).hexdigest())


def substring_free(words):
    """Greedy: keep a word only if it is not a substring of a kept word and contains none."""
    kept = []
    for w in words:
        if any(w in k or k in w for k in kept):
            continue
        kept.append(w)
    return kept


def write_lines(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for line in lines:
            f.write(line + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True, help="folder the three .deb files were unpacked into")
    ap.add_argument("--out", required=True, help="data/eval")
    args = ap.parse_args()

    with open(os.path.join(args.root, RDB), "rb") as f:
        novels = [r_character_vector(raw) for raw in rdb_records(f.read())]
    by_title = {}
    for lines in novels:
        title = next(l for l in lines if l.strip()).strip().upper()
        by_title[title] = lines
    write_lines(os.path.join(args.out, "haystack", "persuasion.txt"),
                prose_extract(by_title["PERSUASION"], EXTRACT_BYTES))
    write_lines(os.path.join(args.out, "haystack", "northanger_abbey.txt"),
                prose_extract(by_title["NORTHANGER ABBEY"], EXTRACT_BYTES))

    with open(os.path.join(args.root, DICT)) as f:
        dictionary = {w.strip() for w in f if re.fullmatch(r"[a-z]+", w.strip())}

    def pick(pos, lo, hi):
        return {w for w in wordnet_common(args.root, pos, 2)
                if w in dictionary and lo <= len(w) <= hi and w not in BLOCKLIST}

    adjectives = pick("adj", 4, 9)
    nouns = pick("noun", 4, 9)
    verbs = pick("verb", 4, 9)
    write_lines(os.path.join(args.out, "words", "adjectives.txt"), sorted(adjectives))
    write_lines(os.path.join(args.out, "words", "nouns.txt"), sorted(nouns))
    cwe = substring_free(stable_order({w for w in adjectives | nouns | verbs if len(w) <= 8}))
    write_lines(os.path.join(args.out, "words", "cwe_words.txt"), sorted(cwe))


if __name__ == "__main__":
    main()
