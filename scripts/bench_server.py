#!/usr/bin/env python3
"""Load generator for OpenAI-compatible servers on this machine (loopback only): llama-server vs kvzap serve.

It starts the server itself, waits for /health, sends --requests streaming requests with --streams of
them in flight at once, then stops the server:

  --server llama   llama-server -m GGUF -t T --host 127.0.0.1 --port FREE -np N -c N*CTX_SLOT -cb --metrics
                   --cache-ram 0 --no-webui              (binaries from scripts/build_llamacpp.sh)
  --server kvzap   kvzap serve -m GGUF -t T --host 127.0.0.1 --port FREE --parallel N [--kv-budget SIZE] [--press P --decode-press]
  --server both    both in one run, one after the other (alternating the order when --reps > 1), with the
                   ratios kvzap / llama
  --url URL        an already running server instead (http://127.0.0.1:PORT; other hosts are refused)

Workload: /v1/completions (or /v1/chat/completions with --chat), stream, temperature 0, ignore_eos,
max_tokens --max-tokens, stream_options.include_usage; prompts of about --prompt-tokens tokens of distinct,
deterministic text (checked with the server's /tokenize when it has one, else `kvzap tokenize`); the
same prompts go to every server of a run. One short warm-up request precedes the measurement.

Measured: wall time of the whole workload, aggregate generated tokens/s (usage.completion_tokens, else the
count of content chunks), time to first token (from sending the request) and inter-token latency (gaps
between content chunks) p50/p99 (linear interpolation between the nearest ranks), errors (non-200, error
frames, broken streams, time limit), peak RSS of the server process (VmHWM of /proc/PID/status) and /metrics
scraped at the end (and sampled every 0.25 s for peaks).

Everything is bounded: --requests requests, --timeout seconds for the workload (then every open request is
cancelled), --startup-timeout for /health. Needs httpx (pip install httpx). The pieces are in
scripts/benchserve/.

Examples:
  python3 scripts/bench_server.py --server llama --streams 4 --requests 16 --max-tokens 64 --prompt-tokens 128
  python3 scripts/bench_server.py --server both --streams 16 --requests 64 --reps 3 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shlex
import signal
import sys
import tempfile
from pathlib import Path

try:
    import httpx  # noqa: F401
except ImportError:  # pragma: no cover
    sys.exit("error: this script needs httpx: python3 -m pip install httpx")

from benchserve.client import get_metrics, run_workload
from benchserve.prompts import Tokenizer, build_prompts
from benchserve.report import print_table, summarize
from benchserve.servers import REPO, Server, check_loopback, default_model, free_port, llama_bin_dir, log, server_command


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--server", choices=["llama", "kvzap", "both"], help="start this server (or both)")
    ap.add_argument("--url", help="benchmark a running server instead (loopback only)")
    ap.add_argument("-m", "--model", help="GGUF file (default: the output of `kvzap pull`)")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1, help="server threads")
    ap.add_argument("--parallel", type=int, help="server slots / sequences (default: --streams)")
    ap.add_argument("--ctx-per-slot", type=int, help="context per slot (default: prompt + max tokens + 64)")
    ap.add_argument("--streams", type=int, default=4, help="concurrent requests (default 4)")
    ap.add_argument("--requests", type=int, default=16, help="total requests (default 16)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="about this many prompt tokens (default 128)")
    ap.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    ap.add_argument("--text-file", type=Path, help="prompts are windows of this text (default: generated words)")
    ap.add_argument("--timeout", type=float, default=300, help="hard limit in seconds for one workload (default 300)")
    ap.add_argument("--request-timeout", type=float, default=120, help="read timeout per request (default 120)")
    ap.add_argument("--startup-timeout", type=float, default=120, help="seconds to wait for /health (default 120)")
    ap.add_argument("--reps", type=int, default=1, help="repetitions, a fresh server each (default 1)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the warm-up request")
    ap.add_argument("--kv-budget", help="kvzap serve --kv-budget SIZE")
    ap.add_argument("--press", help="kvzap serve --press P")
    ap.add_argument("--decode-press", action="store_true", help="kvzap serve --decode-press (with --press)")
    ap.add_argument("--kvzap", type=Path, default=REPO / "build" / "kvzap", help="kvzap binary (default build/kvzap)")
    ap.add_argument("--llama-bin", help="folder with llama-server (default: scripts/build_llamacpp.sh)")
    ap.add_argument("--llama-cache-ram", type=int, default=0,
                    help="llama-server --cache-ram MiB (default 0: no idle-prompt RAM cache, which would inflate "
                         "its RSS and does not help distinct prompts; -1 to leave llama-server's default)")
    ap.add_argument("--llama-arg", action="append", default=[], help="extra argument for llama-server")
    ap.add_argument("--kvzap-arg", action="append", default=[], help="extra argument for kvzap serve")
    ap.add_argument("--model-name", default="default", help="the request's model field")
    ap.add_argument("--log-dir", type=Path, help="server logs here (default: a new folder under /tmp)")
    ap.add_argument("--json", dest="json_out", type=Path, help="write all figures (and per-request records) here")
    args = ap.parse_args()
    if bool(args.server) == bool(args.url):
        ap.error("give exactly one of --server and --url")
    for name in ("streams", "requests", "max_tokens", "prompt_tokens", "reps", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    if args.timeout <= 0 or args.timeout > 24 * 3600:
        ap.error("--timeout must be in (0, 86400]")
    if args.llama_cache_ram == -1:
        args.llama_cache_ram = None
    args.parallel = args.parallel or args.streams
    return args


def log_peaks(kind: str, summary: dict, peaks: dict, metrics: dict) -> None:
    """Adds the /metrics peaks to the summary (peak_running, and for kvzap KV usage and preemptions)."""
    if kind == "kvzap":
        summary["peak_running"] = peaks["kvzap:num_requests_running"]
        summary["peak_kv_usage"] = peaks["kvzap:kv_cache_usage_perc"]
        summary["preemptions"] = metrics.get("kvzap:num_preemptions_total")
        log(f"  kvzap peaks while running: {peaks['kvzap:num_requests_running']:.0f} requests running, "
            f"{peaks['kvzap:num_requests_waiting']:.0f} waiting, KV usage {100 * peaks['kvzap:kv_cache_usage_perc']:.1f}% "
            f"of the budget, preemptions {summary['preemptions']}")
    elif kind == "llama":
        summary["peak_running"] = peaks["llamacpp:requests_processing"]
        log(f"  llama-server peaks while running: {peaks['llamacpp:requests_processing']:.0f} requests "
            f"processing, {peaks['llamacpp:requests_deferred']:.0f} deferred")


def measure(kind: str, rep: int, base: str, server: Server | None, args, prompts: list[str]) -> dict:
    """One workload against one server: the JSON's run object."""
    mem_before = server.memory() if server else {}
    log(f"rep {rep + 1}/{args.reps}: {kind}: {args.requests} requests, {args.streams} streams "
        f"(load average {os.getloadavg()[0]:.2f})")
    work = asyncio.run(run_workload(base, args, prompts))
    summary = summarize(work, args.max_tokens)
    mem_end = server.memory() if server else {"vm_hwm_mb": None, "vm_rss_mb": None}
    metrics, metrics_raw = get_metrics(base)
    if kind == "kvzap" and not metrics:
        log("warning: kvzap /metrics gave nothing")
    alive = server is None or server.alive()
    if server:
        server.stop()
    log(f"  {kind}: {summary['ok']}/{summary['requests']} ok, {summary['gen_tok_s'] or 0:.1f} tok/s, "
        f"TTFT p50 {1000 * (summary['ttft_p50_s'] or 0):.0f} ms, ITL p50 {1000 * (summary['itl_p50_s'] or 0):.1f} ms, "
        f"peak RSS {mem_end['vm_hwm_mb'] or 0:.0f} MB")
    log_peaks(kind, summary, work["metric_peaks"], metrics)
    if summary["requests_short_of_max_tokens"]:
        log(f"  warning: {summary['requests_short_of_max_tokens']} requests ended before --max-tokens "
            "(ignore_eos not honoured?)")
    if not alive:
        log(f"  warning: {kind} died during the run; log {server.log_path}")
    return {"kind": kind, "rep": rep, "cmd": server.cmd if server else None, "url": base,
            "startup_s": server.t_ready if server else None, "server_alive_at_end": alive,
            "log": str(server.log_path) if server else None, "summary": summary,
            "memory_before": mem_before, "memory_end": mem_end, "metrics": metrics,
            "metrics_raw": metrics_raw if kind == "kvzap" else None,
            "requests": [{k: v for k, v in rec.items() if k != "gaps"} | {"n_gaps": len(rec["gaps"])}
                         for rec in work["records"]]}


def main() -> int:
    args = parse_args()
    text_words = args.text_file.read_text(encoding="utf-8").split() if args.text_file else None
    url = check_loopback(args.url) if args.url else None
    kinds = {"llama": ["llama"], "kvzap": ["kvzap"], "both": ["llama", "kvzap"]}.get(args.server, ["external"])
    model = Path(args.model) if args.model else (default_model(args.kvzap) if os.access(args.kvzap, os.X_OK) else None)
    if args.server and (model is None or not model.is_file()):
        sys.exit(f"error: model not found: {model} (pass -m)")
    if "llama" in kinds:
        args.llama_bin_dir = llama_bin_dir(args.llama_bin)
        if not os.access(args.llama_bin_dir / "llama-server", os.X_OK):
            sys.exit(f"error: no llama-server in {args.llama_bin_dir}")
    if "kvzap" in kinds and not os.access(args.kvzap, os.X_OK):
        sys.exit(f"error: kvzap binary not executable: {args.kvzap}")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="kvzap-bench-server-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    live: list[Server] = []

    def on_signal(signum, _frame):
        for s in live:
            s.stop()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    prompts = lengths = count_source = None
    runs: list[dict] = []
    try:
        for rep in range(args.reps):
            for kind in (kinds if rep % 2 == 0 else kinds[::-1]):
                server = None
                if kind != "external":
                    port = free_port()
                    server = Server(kind, server_command(kind, args, model, port), port, log_dir / f"{kind}-rep{rep}.log")
                    live.append(server)
                    server.start(args.startup_timeout)
                base = server.url if server else url
                if prompts is None:  # the same prompts for every server of the run
                    prompts, lengths, count_source = build_prompts(args.requests, args.prompt_tokens,
                                                                   Tokenizer(base, args.kvzap, model), text_words)
                    known = [n for n in lengths if n is not None]
                    log(f"{len(prompts)} prompts, tokens counted by {count_source}: "
                        + (f"{min(known)}–{max(known)} (target {args.prompt_tokens})" if known else "estimated"))
                runs.append(measure(kind, rep, base, server, args, prompts))
                if server:
                    live.remove(server)
    except RuntimeError as e:
        log(f"error: {e}")
        return 2
    finally:
        for s in live:
            s.stop()

    medians = print_table(kinds, runs, args)
    if args.json_out:
        doc = {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "cpu_count": os.cpu_count(), "model": str(model) if model else None,
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "prompt_token_counts": lengths, "prompt_count_source": count_source,
            "runs": runs, "medians": medians,
        }
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        log(f"wrote {args.json_out}")
    failed = sum(r["summary"]["errors"] for r in runs)
    return 1 if failed and all(r["summary"]["ok"] == 0 for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
