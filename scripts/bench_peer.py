#!/usr/bin/env python3
"""Speed of kvzap against llama.cpp (llama-cpp-python) on the same model, machine and thread count.

llama.cpp side, measured here:
  prefill: wall time of one eval() of P tokens of real text from an empty cache, best of R reps
  decode:  D single-token evals right after that prompt (one logits row each), best of R reps
kvzap side: `kvzap bench -m M -t T --prefill P --decode D --reps R --json`.

Prints a table with both and the ratios kvzap/llama.cpp (> 1 means kvzap is faster). With --append-md
it appends a markdown block (machine, versions, exact command, table) to docs/BENCHMARKS.md or --md-file.
Run it on an otherwise idle machine: the two engines are measured one after the other, and
llama.cpp's OpenMP threads spin while waiting, so it loses far more than kvzap when cores are shared.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import peer_common as pc  # noqa: E402


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def bench_llama_cpp(model: Path, threads: int, n_prefill: int, n_decode: int, reps: int) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(model), n_ctx=n_prefill + n_decode + 16, n_batch=max(n_prefill, 1),
        n_ubatch=max(n_prefill, 1), n_threads=threads, n_threads_batch=threads, logits_all=False,
        seed=0, verbose=False,
    )
    text = pc.ENGLISH_TEXT.read_text(encoding="utf-8")
    tokens = list(llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))
    while len(tokens) < n_prefill + n_decode:
        tokens += tokens
    prompt, follow = tokens[:n_prefill], tokens[n_prefill:n_prefill + n_decode]

    llm.reset()
    llm.eval(prompt[:16])  # warm-up: page in weights, start the thread pool
    best_prefill = best_decode = float("inf")
    for _ in range(reps):
        llm.reset()  # the next eval() clears the KV cache
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        for tok in follow:  # teacher-forced text: same work per step as sampling, no sampler noise
            llm.eval([tok])
        t2 = time.perf_counter()
        best_prefill = min(best_prefill, t1 - t0)
        best_decode = min(best_decode, t2 - t1)
    return {
        "prefill_tok_s": n_prefill / best_prefill,
        "decode_tok_s": n_decode / best_decode if n_decode else float("nan"),
        "version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
    }


def ratio(a, b) -> str:
    try:
        return f"{float(a) / float(b):.2f}x"
    except (TypeError, ValueError, ZeroDivisionError):
        return "n/a"


def fmt(v) -> str:
    try:
        return f"{float(v):.1f}"
    except (TypeError, ValueError):
        return "n/a"


def markdown_block(args, llama: dict, kv: dict, model: Path) -> str:
    cmd = "python3 scripts/bench_peer.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows = [
        ("prefill tok/s", llama["prefill_tok_s"], kv.get("prefill_tok_s")),
        ("decode tok/s", llama["decode_tok_s"], kv.get("decode_tok_s")),
    ]
    lines = [
        f"### kvzap vs llama.cpp — {datetime.date.today().isoformat()}",
        "",
        f"- machine: {cpu_name()}, {os.cpu_count()} logical CPUs; threads: {args.threads}",
        f"- model: `{model.name}`; prefill {args.prefill} tokens, decode {args.decode} tokens, best of {args.reps}",
        f"- llama-cpp-python {llama['version']}; kvzap isa `{kv.get('isa', '?')}`, "
        f"bandwidth {fmt(kv.get('bandwidth_gb_s'))} GB/s",
        f"- llama.cpp system info: `{llama['system_info']}`",
        f"- command: `{cmd}`",
        "",
        "| metric | llama.cpp | kvzap | kvzap/llama.cpp |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {name} | {fmt(a)} | {fmt(b)} | {ratio(b, a)} |" for name, a, b in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--kvzap-bin", type=Path, default=None)
    ap.add_argument("--skip-kvzap", action="store_true", help="measure llama.cpp only")
    ap.add_argument("--append-md", action="store_true", help="append the result block to the markdown file")
    ap.add_argument("--md-file", type=Path, default=pc.REPO_ROOT / "docs" / "BENCHMARKS.md")
    args = ap.parse_args()

    model = args.model or pc.find_model()
    pc.require_file(model, "model")
    kvzap_bin = args.kvzap_bin or pc.find_kvzap_bin()
    if not args.skip_kvzap:
        pc.require_file(kvzap_bin, "kvzap binary (set KVZAP_BIN or pass --skip-kvzap)")

    print(f"llama.cpp: {args.prefill}-token prefill + {args.decode} decode steps, {args.threads} threads, "
          f"best of {args.reps} ...", flush=True)
    llama = bench_llama_cpp(model, args.threads, args.prefill, args.decode, args.reps)
    kv: dict = {}
    if not args.skip_kvzap:
        print(f"kvzap: {kvzap_bin} bench ...", flush=True)
        kv = pc.Kvzap(kvzap_bin, model, args.threads).bench(args.prefill, args.decode, args.reps)
        if kv.get("threads") not in (None, args.threads):
            print(f"warning: kvzap reports {kv.get('threads')} threads, asked for {args.threads}")

    print()
    print(f"{'metric':<16}{'llama.cpp':>12}{'kvzap':>12}{'kvzap/llama':>14}")
    for name, key in (("prefill tok/s", "prefill_tok_s"), ("decode tok/s", "decode_tok_s")):
        print(f"{name:<16}{fmt(llama[key]):>12}{fmt(kv.get(key)):>12}{ratio(kv.get(key), llama[key]):>14}")
    if kv:
        print(f"kvzap isa {kv.get('isa', '?')}, bandwidth {fmt(kv.get('bandwidth_gb_s'))} GB/s, "
              f"threads {kv.get('threads', '?')}")

    if args.append_md:
        block = markdown_block(args, llama, kv, model)
        args.md_file.parent.mkdir(parents=True, exist_ok=True)
        needs_sep = args.md_file.is_file() and args.md_file.stat().st_size > 0
        with open(args.md_file, "a", encoding="utf-8") as f:
            f.write(("\n" if needs_sep else "") + block)
        print(f"appended to {args.md_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
