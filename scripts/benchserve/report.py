"""Figures of one workload (summarize), the medians table over runs (print_table)."""

from __future__ import annotations

import statistics


def percentile(values: list[float], pct: int) -> float | None:
    """The pct-th percentile by linear interpolation between the two nearest ranks, at rank (n-1)*pct/100:
    statistics.quantiles' "inclusive" method, numpy.percentile's default (the definition every figure in
    docs/BENCHMARKS.md used)."""
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(work: dict, max_tokens: int) -> dict:
    """The JSON run's "summary": counts, throughput, TTFT / ITL / e2e percentiles, TPOT mean, errors by kind."""
    recs = work["records"]
    wall = work["t1"] - work["t0"]
    ok = [r for r in recs if r["ok"]]

    def tokens(r):
        return r["completion_tokens"] if r["completion_tokens"] is not None else r["chunks"]

    gen_all = sum(tokens(r) for r in recs)
    ttft = [r["t_first"] - r["t_start"] for r in ok if r["t_first"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    e2e = [r["t_end"] - r["t_start"] for r in ok]
    tpot = [(r["t_last"] - r["t_first"]) / (tokens(r) - 1) for r in ok if r["t_first"] is not None and tokens(r) > 1]
    errors: dict[str, int] = {}
    for r in recs:
        if not r["ok"]:
            key = (r["error"] or "?").split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    return {
        "requests": len(recs), "ok": len(ok), "errors": len(recs) - len(ok), "error_kinds": errors,
        "timed_out": work["timed_out"], "wall_s": wall,
        "generated_tokens": gen_all, "generated_tokens_ok": sum(tokens(r) for r in ok),
        "gen_tok_s": gen_all / wall if wall > 0 else None,
        "requests_per_s": len(ok) / wall if wall > 0 else None,
        "token_count_source": "usage" if ok and all(r["completion_tokens"] is not None for r in ok) else "chunks",
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(gaps, 50), "itl_p99_s": percentile(gaps, 99),
        "tpot_mean_s": mean(tpot),
        "e2e_p50_s": percentile(e2e, 50), "e2e_p99_s": percentile(e2e, 99),
        "prompt_tokens_mean": mean([r["prompt_tokens"] for r in ok if r["prompt_tokens"] is not None]),
        "requests_short_of_max_tokens": sum(1 for r in ok if tokens(r) < max_tokens),
    }


ROWS = [  # key, label, scale, digits
    ("ok", "requests ok", 1, 0), ("errors", "errors", 1, 0), ("wall_s", "wall s", 1, 2),
    ("gen_tok_s", "generated tok/s", 1, 1), ("requests_per_s", "requests/s", 1, 2),
    ("ttft_p50_s", "TTFT p50 ms", 1000, 1), ("ttft_p99_s", "TTFT p99 ms", 1000, 1),
    ("itl_p50_s", "ITL p50 ms", 1000, 2), ("itl_p99_s", "ITL p99 ms", 1000, 2),
    ("tpot_mean_s", "TPOT mean ms", 1000, 2), ("e2e_p50_s", "latency p50 s", 1, 2),
    ("vm_hwm_mb", "server peak RSS MB", 1, 1),
]


def print_table(kinds: list[str], runs: list[dict], args) -> dict:
    """Markdown table of the medians over repetitions per server (and kvzap / llama); returns the medians."""
    def value(run, key):
        return run["memory_end"]["vm_hwm_mb"] if key == "vm_hwm_mb" else run["summary"].get(key, run.get(key))

    medians = {k: {key: median([value(r, key) for r in runs if r["kind"] == k]) for key, *_ in ROWS} for k in kinds}
    both = {"kvzap", "llama"} <= set(kinds)
    print(f"{args.streams} streams, {args.requests} requests, prompt ~{args.prompt_tokens} tokens, "
          f"{args.max_tokens} generated each, {args.threads} threads, {args.parallel} slots, "
          f"{'chat' if args.chat else 'completions'}; median of {args.reps}")
    print()
    head = "| metric | " + " | ".join(kinds) + (" | kvzap / llama |" if both else " |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for key, label, scale, digits in ROWS:
        cells = ["n/a" if medians[k][key] is None else f"{medians[k][key] * scale:.{digits}f}" for k in kinds]
        line = f"| {label} | " + " | ".join(cells) + " |"
        if both:
            a, b = medians["kvzap"][key], medians["llama"][key]
            line += f" {a / b:.2f}x |" if a is not None and b not in (None, 0) else " n/a |"
        print(line)
    return medians
