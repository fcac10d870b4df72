#!/usr/bin/env python3
"""Builds the offline text corpus for KVzap surrogate training from Debian packages
(docs/ALGORITHMS.md §5.2, docs/TRAINING.md §2).

Input: a folder where the Debian packages were unpacked (`dpkg-deb -x`, see make_corpus.sh) and the
Python standard library sources of the local interpreter (/usr/lib/python3.X).
Output (default data/corpus-build/, ignored by git through its own .gitignore):
  docs/<source>/<source>_NNNNN.txt  clean UTF-8 documents of about --min-chars..--max-chars characters,
                                    cut at paragraph boundaries (each has well over 1,250 tokens, so
                                    `kvzap collect` can cut 750-1,250-token windows from any of them)
  heldout/persuasion.txt, heldout/northanger_abbey.txt
                                    the two Austen novels reserved as evaluation haystacks: whole novels,
                                    never split into training documents
  train.txt, test.txt               document paths (relative to the output folder), one per line
  manifest.tsv                      path, source, split, characters, words, sha256 of every document
  sources.json                      package versions and per-source counts of this build

Everything is deterministic: the same packages give byte-identical output.
Sources and licences are documented in data/corpus/SOURCES.md.
"""
import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

AUSTEN_RDB = "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
AUSTEN_TITLES = {  # first line of each novel in the package -> file stem
    "SENSE AND SENSIBILITY": "sense_and_sensibility",
    "PRIDE AND PREJUDICE": "pride_and_prejudice",
    "MANSFIELD PARK": "mansfield_park",
    "EMMA": "emma",
    "NORTHANGER ABBEY": "northanger_abbey",
    "PERSUASION": "persuasion",
}
HELDOUT = ("persuasion", "northanger_abbey")  # evaluation haystacks: never training text
JARGON_TXT = "usr/share/doc/jargon-text/jargon.txt.gz"
FORTUNE_DIR = "usr/share/games/fortunes"
FORTUNE_SKIP = {"art", "ascii-art"}  # pictures made of characters, not text
DEVIL_DICT = "usr/share/dictd/devil.dict.dz"
BIBLE_BIN = "usr/bin/bible"
KJV_BOOKS = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel",
    "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
    "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel",
    "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah",
    "Haggai", "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians",
    "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James", "1 Peter",
    "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation",
]
PY_SKIP_DIRS = {"test", "tests", "idle_test", "encodings", "pydoc_data", "site-packages", "dist-packages",
                "__pycache__", "__phello__"}


def die(msg):
    sys.exit(f"make_corpus: error: {msg}")


# ----------------------------------------------------------------------------- text helpers

def paragraphs_of_lines(lines):
    """Groups lines into paragraphs separated by blank lines (lists of lines)."""
    paras, cur = [], []
    for line in lines:
        if line.strip():
            cur.append(line.rstrip())
        elif cur:
            paras.append(cur)
            cur = []
    if cur:
        paras.append(cur)
    return paras


def unwrap(lines):
    """Joins hard-wrapped prose lines into one line."""
    return re.sub(r"\s+", " ", " ".join(l.strip() for l in lines)).strip()


def split_long(par, limit):
    """Splits a paragraph longer than `limit` at line or sentence boundaries into pieces <= limit
    (a single sentence longer than limit stays whole)."""
    if len(par) <= limit:
        return [par]
    units = par.split("\n") if "\n" in par else re.split(r"(?<=[.!?;:])\s+", par)
    sep = "\n" if "\n" in par else " "
    out, cur = [], ""
    for u in units:
        if cur and len(cur) + len(sep) + len(u) > limit:
            out.append(cur)
            cur = u
        else:
            cur = cur + sep + u if cur else u
    if cur:
        out.append(cur)
    return out


def pack(paragraphs, min_chars, max_chars):
    """Greedily packs paragraphs (in order) into documents of min_chars..~max_chars characters.
    A short tail joins the previous document when that stays near max_chars, else it is dropped."""
    pieces = [p for par in paragraphs for p in split_long(par, max_chars // 2)]
    docs, cur, size = [], [], 0
    for p in pieces:
        if cur and size >= min_chars and size + 2 + len(p) > max_chars:
            docs.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(p)
        size += len(p) + (2 if size else 0)
    if cur and size >= min_chars:
        docs.append("\n\n".join(cur))
    elif cur and docs and len(docs[-1]) + size <= max_chars + min_chars // 2:
        docs[-1] += "\n\n" + "\n\n".join(cur)  # a short tail joins the previous document
    return docs


def clean(text):
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x0c", "\n")
    text = "\n".join(l.rstrip() for l in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


# ----------------------------------------------------------------------------- sources

def read_r_strings(raw):
    """Decodes an R XDR serialisation (format 2 or 3) of a plain character vector."""
    if raw[:2] != b"X\n":
        die("janeaustenr data is not XDR-serialised R data")
    p = 2
    version = struct.unpack(">i", raw[p:p + 4])[0]
    p += 12  # version, writer R version, minimal reader R version
    if version == 3:
        n = struct.unpack(">i", raw[p:p + 4])[0]
        p += 4 + n  # native encoding name
    flags, length = struct.unpack(">ii", raw[p:p + 8])
    p += 8
    if flags & 0xFF != 16:  # STRSXP
        die("janeaustenr record is not a character vector")
    out = []
    for _ in range(length):
        f, n = struct.unpack(">ii", raw[p:p + 8])
        p += 8
        if f & 0xFF != 9:  # CHARSXP
            die("janeaustenr character vector holds a non-string")
        if n == -1:
            out.append("")
            continue
        out.append(raw[p:p + n].decode("utf-8"))
        p += n
    return out


def austen_novels(pkg_root):
    """The six novels of r-cran-janeaustenr: Rdata.rdb holds records of a 4-byte big-endian length and
    a zlib stream, each an R character vector with one element per printed line."""
    path = os.path.join(pkg_root, AUSTEN_RDB)
    if not os.path.exists(path):
        die(f"{path} not found (unpack r-cran-janeaustenr into --pkg-root)")
    data = open(path, "rb").read()
    novels, off = {}, 0
    while off < len(data):
        d = zlib.decompressobj()
        raw = d.decompress(data[off + 4:])
        off = len(data) - len(d.unused_data)
        lines = read_r_strings(raw)
        title = lines[0].strip().upper()
        if title not in AUSTEN_TITLES:
            die(f"unexpected janeaustenr record starting with {lines[0]!r}")
        novels[AUSTEN_TITLES[title]] = lines
    if set(novels) != set(AUSTEN_TITLES.values()):
        die(f"janeaustenr: found {sorted(novels)}, expected the six novels")
    return novels


def austen_paragraphs(lines):
    # Underscores mark italics in these Gutenberg-derived texts.
    return [unwrap(p).replace("_", "") for p in paragraphs_of_lines(lines)]


def kjv_paragraphs(pkg_root):
    """One paragraph per chapter: 'Book N' then one numbered verse per line, via the bible program."""
    binary = os.path.join(pkg_root, BIBLE_BIN)
    libdir = os.path.join(pkg_root, "usr/lib")
    if not os.path.exists(binary):
        die(f"{binary} not found (unpack bible-kjv and bible-kjv-text into --pkg-root)")
    out = subprocess.run([binary, "-f", "-p", libdir, "-d", "bible.data", "gen1:1-rev22:21"],
                         capture_output=True, text=True, check=True, timeout=300).stdout
    chapters, order = {}, []
    for line in out.splitlines():
        m = re.match(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$", line)
        if not m:
            if line.strip():
                die(f"unexpected line from bible: {line[:60]!r}")
            continue
        abbr, ch, verse, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()
        if abbr not in order:
            order.append(abbr)
        chapters.setdefault((abbr, ch), []).append(f"{verse} {text}")
    if len(order) != len(KJV_BOOKS):
        die(f"bible printed {len(order)} books, expected 66")
    names = dict(zip(order, KJV_BOOKS))
    return [f"{names[a]} {c}\n" + "\n".join(v) for (a, c), v in chapters.items()]


def jargon_paragraphs(pkg_root):
    path = os.path.join(pkg_root, JARGON_TXT)
    if not os.path.exists(path):
        die(f"{path} not found (unpack jargon-text into --pkg-root)")
    lines = gzip.open(path, "rt", encoding="utf-8").read().split("\n")
    # Skip the table of contents: the body starts at the second "Welcome to the Jargon File".
    starts = [i for i, l in enumerate(lines) if l.strip() == "Welcome to the Jargon File"]
    lines = lines[starts[1]:] if len(starts) > 1 else lines
    out = []
    for p in paragraphs_of_lines(lines):
        text = "\n".join(p)
        if re.search(r"[\u2500-\u257f]", text):  # box-drawn tables
            continue
        indents = {len(l) - len(l.lstrip(" ")) for l in p}
        out.append(unwrap(p) if indents <= {0, 3} else "\n".join(l[min(indents):] for l in p))
    return out


def fortune_paragraphs(pkg_root):
    folder = os.path.join(pkg_root, FORTUNE_DIR)
    if not os.path.isdir(folder):
        die(f"{folder} not found (unpack fortunes and fortunes-min into --pkg-root)")
    out = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if "." in name or name in FORTUNE_SKIP or os.path.islink(path) or not os.path.isfile(path):
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        for entry in re.split(r"(?m)^%\s*$", text):
            entry = "\n".join(l.rstrip() for l in entry.strip("\n").split("\n")).strip("\n")
            if entry.strip():
                out.append(entry)
    return out


def devil_paragraphs(pkg_root):
    path = os.path.join(pkg_root, DEVIL_DICT)
    if not os.path.exists(path):
        die(f"{path} not found (unpack dict-devil into --pkg-root)")
    text = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
    lines = [l for l in text.split("\n") if not l.startswith("00-database") and not l.startswith("http://")]
    return [unwrap(p) for p in paragraphs_of_lines(lines)]


def python_lib_dir(explicit):
    if explicit:
        return explicit
    cands = [os.path.join("/usr/lib", d) for d in os.listdir("/usr/lib") if re.fullmatch(r"python3\.\d+", d)]
    cands = [c for c in cands if os.path.exists(os.path.join(c, "email", "parser.py"))]
    if not cands:
        die("no /usr/lib/python3.X with the standard library found (apt-get install libpython3-stdlib)")
    return max(cands, key=lambda c: int(c.rsplit(".", 1)[1]))


def python_paragraphs(libdir):
    """Standard-library modules in path order, each preceded by a '# file: <path>' line, split at
    blank lines (code blocks stay intact)."""
    out = []
    for root, dirs, files in os.walk(libdir):
        dirs[:] = sorted(d for d in dirs if d not in PY_SKIP_DIRS and not d.startswith("config-"))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(root, f)
            try:
                text = open(path, encoding="utf-8").read()
            except (UnicodeDecodeError, OSError):
                continue
            rel = os.path.relpath(path, libdir)
            blocks = [b.strip("\n") for b in re.split(r"\n[ \t]*\n", text.replace("\t", "    ")) if b.strip()]
            if blocks:
                out.append(f"# file: {rel}")
                out.extend(blocks)
    return out


def spread(n, k):
    """k indices spread evenly over range(n)."""
    return sorted({min(n - 1, int((i + 0.5) * n / k)) for i in range(k)}) if k > 0 else []


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pkg-root", required=True, help="folder the Debian packages were unpacked into")
    ap.add_argument("--out", required=True, help="output folder (e.g. data/corpus-build)")
    ap.add_argument("--python-lib", help="Python standard library folder (default: newest /usr/lib/python3.X)")
    ap.add_argument("--min-chars", type=int, default=6500, help="minimum document size (default 6500)")
    ap.add_argument("--max-chars", type=int, default=9000, help="target maximum document size (default 9000)")
    ap.add_argument("--max-docs-per-source", type=int, default=800,
                    help="cap per source, documents kept evenly spread (default 800; 0 = no cap)")
    ap.add_argument("--test-fraction", type=float, default=0.05,
                    help="held-out share per source, at least 5 documents (default 0.05)")
    args = ap.parse_args()
    if args.min_chars <= 0 or args.max_chars < args.min_chars:
        die("need 0 < --min-chars <= --max-chars")

    novels = austen_novels(args.pkg_root)
    py_lib = python_lib_dir(args.python_lib)
    sources = {
        "austen": [p for name in sorted(novels) if name not in HELDOUT for p in austen_paragraphs(novels[name])],
        "kjv": kjv_paragraphs(args.pkg_root),
        "jargon": jargon_paragraphs(args.pkg_root),
        "fortunes": fortune_paragraphs(args.pkg_root),
        "devil": devil_paragraphs(args.pkg_root),
        "python": python_paragraphs(py_lib),
    }

    for sub in ("docs", "heldout"):
        shutil.rmtree(os.path.join(args.out, sub), ignore_errors=True)
    os.makedirs(os.path.join(args.out, "heldout"), exist_ok=True)
    with open(os.path.join(args.out, ".gitignore"), "w") as f:
        f.write("# generated by scripts/make_corpus.py\n*\n")

    held = {}
    for name in HELDOUT:
        text = clean("\n\n".join(austen_paragraphs(novels[name])))
        with open(os.path.join(args.out, "heldout", name + ".txt"), "w", encoding="utf-8") as f:
            f.write(text)
        held[name] = {"chars": len(text), "words": len(text.split())}

    manifest, train, test, stats = [], [], [], {}
    for source, paras in sources.items():
        docs = [clean(d) for d in pack(paras, args.min_chars, args.max_chars)]
        total = len(docs)
        if args.max_docs_per_source and total > args.max_docs_per_source:
            docs = [docs[i] for i in spread(total, args.max_docs_per_source)]
        if len(docs) < 10:
            die(f"source {source} produced only {len(docs)} documents")
        n_test = max(5, round(args.test_fraction * len(docs)))
        test_idx = set(spread(len(docs), n_test))
        folder = os.path.join(args.out, "docs", source)
        os.makedirs(folder, exist_ok=True)
        for i, text in enumerate(docs):
            rel = f"docs/{source}/{source}_{i:05d}.txt"
            with open(os.path.join(args.out, rel), "w", encoding="utf-8") as f:
                f.write(text)
            split = "test" if i in test_idx else "train"
            (test if split == "test" else train).append(rel)
            manifest.append((rel, source, split, len(text), len(text.split()),
                             hashlib.sha256(text.encode("utf-8")).hexdigest()))
        sizes = [len(d) for d in docs]
        stats[source] = {"documents": len(docs), "documents_before_cap": total, "test": len(test_idx),
                         "chars": sum(sizes), "min_chars": min(sizes), "max_chars": max(sizes)}

    with open(os.path.join(args.out, "train.txt"), "w") as f:
        f.write("".join(p + "\n" for p in train))
    with open(os.path.join(args.out, "test.txt"), "w") as f:
        f.write("".join(p + "\n" for p in test))
    with open(os.path.join(args.out, "manifest.tsv"), "w") as f:
        f.write("path\tsource\tsplit\tchars\twords\tsha256\n")
        f.writelines("\t".join(map(str, row)) + "\n" for row in manifest)
    versions = {}
    versions_file = os.path.join(args.pkg_root, "..", "versions.txt")
    if os.path.exists(versions_file):
        for line in open(versions_file):
            if line.strip():
                name, ver = line.split()[:2]
                versions[name] = ver
    with open(os.path.join(args.out, "sources.json"), "w") as f:
        json.dump({"packages": versions, "python_stdlib": py_lib, "min_chars": args.min_chars,
                   "max_chars": args.max_chars, "sources": stats, "heldout": held}, f, indent=2, sort_keys=True)
        f.write("\n")
    for source, s in stats.items():
        print(f"{source:9s} {s['documents']:5d} docs ({s['test']} test)  {s['chars'] / 1e6:6.2f} MB  "
              f"sizes {s['min_chars']}-{s['max_chars']}")
    for name, h in held.items():
        print(f"heldout  {name}: {h['words']} words")
    print(f"train {len(train)} / test {len(test)} documents -> {args.out}")


if __name__ == "__main__":
    main()
