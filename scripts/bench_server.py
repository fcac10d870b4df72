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
between content chunks) p50/p99, errors (non-200, error frames, streams without [DONE], time limit),
peak RSS of the server process (VmHWM of /proc/PID/status) and /metrics scraped at the end.

Everything is bounded: --requests requests, --timeout seconds for the workload (then every open request is
cancelled), --startup-timeout for /health. Needs httpx (pip install httpx).

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
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

try:
    import httpx
except ImportError:  # pragma: no cover
    sys.exit("error: this script needs httpx: python3 -m pip install httpx")

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def log(msg: str) -> None:
    print(f"bench_server: {msg}", file=sys.stderr, flush=True)


def check_loopback(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.hostname is None:
        sys.exit(f"error: not an http URL: {url}")
    if parts.hostname.lower() not in LOOPBACK:
        sys.exit(f"error: refusing host {parts.hostname!r}: only 127.0.0.1, localhost and ::1 are allowed")
    return url.rstrip("/")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_model(kvzap: Path) -> Path:
    proc = subprocess.run([str(kvzap), "pull"], capture_output=True, text=True, timeout=900)
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        sys.exit(f"error: `{kvzap} pull` failed (rc {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return Path(lines[-1])


def llama_bin_dir(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit)
    log("locating llama.cpp tools with scripts/build_llamacpp.sh (builds them the first time)")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "build_llamacpp.sh")], stdout=subprocess.PIPE,
                          text=True, timeout=7200)
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0 or not lines:
        sys.exit(f"error: scripts/build_llamacpp.sh failed (rc {proc.returncode})")
    return Path(lines[-1])


def proc_status(pid: int) -> dict:
    """VmHWM / VmRSS of a process in MB (None when unreadable)."""
    out = {"vm_hwm_mb": None, "vm_rss_mb": None}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    kb = int(rest.split()[0])
                    out["vm_hwm_mb" if key == "VmHWM" else "vm_rss_mb"] = kb / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return out


def parse_prometheus(text: str) -> dict[str, float]:
    metrics = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        if not name:
            continue
        try:
            metrics[name.strip()] = float(value)
        except ValueError:
            continue
    return metrics


# ---------------------------------------------------------------------------------------------------
# servers
# ---------------------------------------------------------------------------------------------------

class Server:
    def __init__(self, kind: str, cmd: list[str], port: int, log_path: Path):
        self.kind, self.cmd, self.port, self.log_path = kind, cmd, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.t_ready = None

    def start(self, startup_timeout: float) -> None:
        log(f"starting {self.kind}: {' '.join(shlex.quote(c) for c in self.cmd)}")
        logf = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        finally:
            logf.close()
        t0 = time.monotonic()
        deadline = t0 + startup_timeout
        last = ""
        with httpx.Client(trust_env=False, timeout=2.0) as client:
            while time.monotonic() < deadline:  # bounded by --startup-timeout
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.kind} exited with rc {self.proc.returncode} before /health was ok; "
                                       f"log {self.log_path}:\n{self.log_tail()}")
                try:
                    r = client.get(self.url + "/health")
                    if r.status_code == 200:
                        self.t_ready = time.monotonic() - t0
                        log(f"{self.kind} ready on port {self.port} after {self.t_ready:.1f} s (pid {self.proc.pid})")
                        return
                    last = f"HTTP {r.status_code}"
                except httpx.HTTPError as e:
                    last = type(e).__name__
                time.sleep(0.25)
        raise RuntimeError(f"{self.kind}: /health not ok after {startup_timeout:.0f} s ({last}); log {self.log_path}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def memory(self) -> dict:
        return proc_status(self.proc.pid) if self.proc and self.proc.poll() is None else {"vm_hwm_mb": None, "vm_rss_mb": None}

    def stop(self) -> None:
        if not self.proc or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)


def server_command(kind: str, args, model: Path, port: int) -> list[str]:
    n = args.parallel
    ctx_slot = args.ctx_per_slot or (args.prompt_tokens + args.max_tokens + 64)
    if kind == "llama":
        exe = args.llama_bin_dir / "llama-server"
        cmd = [str(exe), "-m", str(model), "-t", str(args.threads), "--host", "127.0.0.1", "--port", str(port),
               "-np", str(n), "-c", str(n * ctx_slot), "-cb", "--metrics", "--no-webui"]
        if args.llama_cache_ram is not None:
            cmd += ["--cache-ram", str(args.llama_cache_ram)]
        return cmd + args.llama_arg
    cmd = [str(args.kvzap), "serve", "-m", str(model), "-t", str(args.threads), "--host", "127.0.0.1", "--port", str(port),
           "--parallel", str(n)]
    if args.kv_budget:
        cmd += ["--kv-budget", args.kv_budget]
    if args.press:
        cmd += ["--press", args.press]
        if args.decode_press:
            cmd += ["--decode-press"]
    return cmd + args.kvzap_arg


# ---------------------------------------------------------------------------------------------------
# prompts
# ---------------------------------------------------------------------------------------------------

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


TEXT_WORDS: list[str] = []  # --text-file: prompts are windows of this text's words instead


def make_text(index: int, n_words: int) -> str:
    """Deterministic, distinct English-like text of exactly n_words words; request `index` always gets the same."""
    if TEXT_WORDS and index < 10_000:
        span = max(1, len(TEXT_WORDS) - n_words)
        at = (index * 1543) % span
        return " ".join(TEXT_WORDS[at:at + n_words])
    rng = random.Random(7919 * (index + 1))
    words = [f"Record {index} ({rng.choice(ADJ)} {rng.choice(WORDS)}):"]
    n = 3
    while n < n_words:  # bounded: every sentence adds at least 6 words
        length = rng.randint(6, 14)
        sentence = []
        for k in range(length):
            pool = VERBS if k == 2 else (ADJ if k % 4 == 1 else WORDS)
            sentence.append(rng.choice(pool))
        sentence[0] = sentence[0].capitalize()
        sentence[-1] += "."
        words.append(" ".join(sentence))
        n += length
    text = " ".join(words).split()[:max(n_words, 3)]
    return " ".join(text)


class Tokenizer:
    """Counts tokens: the server's /tokenize, else `kvzap tokenize`, else a words-based estimate."""

    def __init__(self, url: str | None, kvzap: Path, model: Path):
        self.url, self.kvzap, self.model = url, kvzap, model
        self.source = None

    def count(self, text: str) -> int | None:
        if self.url and self.source in (None, "server"):
            try:
                r = httpx.post(self.url + "/tokenize", json={"content": text, "add_special": False},
                               timeout=30, trust_env=False)
                if r.status_code == 200 and isinstance(r.json().get("tokens"), list):
                    self.source = "server"
                    return len(r.json()["tokens"])
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
            if self.source == "server":
                return None
        if self.source in (None, "kvzap") and os.access(self.kvzap, os.X_OK):
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
                f.write(text)
                path = f.name
            try:
                proc = subprocess.run([str(self.kvzap), "tokenize", "-m", str(self.model), "--text-file", path, "--json"],
                                      capture_output=True, text=True, timeout=120)
                data = json.loads(proc.stdout) if proc.returncode == 0 else None
                tokens = data.get("tokens") if isinstance(data, dict) else data
                if isinstance(tokens, list):
                    self.source = "kvzap"
                    return len(tokens)
            except (subprocess.SubprocessError, ValueError):
                pass
            finally:
                os.unlink(path)
        self.source = "estimate"
        return None


def build_prompts(n: int, target: int, tok: Tokenizer) -> tuple[list[str], list[int | None], str]:
    """n distinct prompts of about `target` tokens; returns prompts, measured lengths, how they were counted."""
    tokens_per_word = 1.3
    probe = make_text(10_000, 400)
    c = tok.count(probe)
    if c:
        tokens_per_word = c / 400
    prompts, lengths = [], []
    for i in range(n):
        n_words = max(3, round(target / tokens_per_word))
        text, count = make_text(i, n_words), None
        for _ in range(5):  # bounded refinement at word granularity
            text = make_text(i, n_words)
            count = tok.count(text)
            if count is None or abs(count - target) <= max(1, target // 100):
                break
            step = round((target - count) / tokens_per_word) or (1 if target > count else -1)
            n_words = max(3, n_words + step)
        prompts.append(text)
        lengths.append(count)
    return prompts, lengths, tok.source or "estimate"


# ---------------------------------------------------------------------------------------------------
# the workload
# ---------------------------------------------------------------------------------------------------

def request_body(args, prompt: str, max_tokens: int) -> tuple[str, dict]:
    common = {"model": args.model_name, "max_tokens": max_tokens, "temperature": 0, "stream": True,
              "stream_options": {"include_usage": True}, "ignore_eos": True}
    if args.chat:
        return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**common, "prompt": prompt}


def new_record(index: int, t_start: float | None) -> dict:
    return {"index": index, "ok": False, "status": None, "error": None, "t_start": t_start,
            "t_first": None, "t_last": None, "t_end": None, "chunks": 0, "completion_tokens": None,
            "prompt_tokens": None, "finish_reason": None, "gaps": [], "server_timings": None}


async def one_request(client: httpx.AsyncClient, base: str, args, index: int, prompt: str, max_tokens: int,
                      rec: dict | None = None) -> dict:
    """One streamed request; fills `rec` as it goes, so a request cancelled at the time limit keeps its partial figures."""
    path, body = request_body(args, prompt, max_tokens)
    if rec is None:
        rec = new_record(index, None)
    rec["t_start"] = time.perf_counter()
    done = False
    try:
        async with client.stream("POST", base + path, json=body) as resp:
            rec["status"] = resp.status_code
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                rec["error"] = f"HTTP {resp.status_code}: {text[:200]}"
                return rec
            async for line in resp.aiter_lines():
                if not line or line.startswith(":"):
                    continue  # keep-alive comments
                if line.startswith("error:"):
                    rec["error"] = f"error frame: {line[6:].strip()[:200]}"
                    break
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    obj = json.loads(payload)
                except json.JSONDecodeError:
                    rec["error"] = f"bad JSON frame: {payload[:120]}"
                    break
                if not isinstance(obj, dict):
                    continue
                if "error" in obj:
                    rec["error"] = f"error frame: {json.dumps(obj['error'])[:200]}"
                    break
                usage = obj.get("usage")
                if isinstance(usage, dict):
                    if usage.get("completion_tokens") is not None:
                        rec["completion_tokens"] = int(usage["completion_tokens"])
                    if usage.get("prompt_tokens") is not None:
                        rec["prompt_tokens"] = int(usage["prompt_tokens"])
                if isinstance(obj.get("timings"), dict):
                    rec["server_timings"] = obj["timings"]
                for choice in obj.get("choices") or []:
                    if not isinstance(choice, dict):
                        continue
                    if args.chat:
                        text = (choice.get("delta") or {}).get("content")
                    else:
                        text = choice.get("text")
                    if choice.get("finish_reason"):
                        rec["finish_reason"] = choice["finish_reason"]
                    if text:
                        now = time.perf_counter()
                        if rec["t_first"] is None:
                            rec["t_first"] = now
                        else:
                            rec["gaps"].append(now - rec["t_last"])
                        rec["t_last"] = now
                        rec["chunks"] += 1
        if rec["error"] is None and not done:
            rec["error"] = "broken stream (no [DONE])"
    except asyncio.CancelledError:
        rec["error"] = "cancelled at the time limit"
        rec["t_end"] = time.perf_counter()
        raise
    except httpx.HTTPError as e:
        rec["error"] = f"{type(e).__name__}: {str(e)[:160]}"
    finally:
        rec["t_end"] = rec["t_end"] or time.perf_counter()
    rec["ok"] = rec["error"] is None
    return rec


async def run_workload(base: str, args, prompts: list[str]) -> dict:
    limits = httpx.Limits(max_connections=args.streams + 2, max_keepalive_connections=args.streams + 2)
    timeout = httpx.Timeout(connect=10.0, read=args.request_timeout, write=30.0, pool=args.timeout)
    records: list[dict] = []
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        if args.warmup:
            w = await one_request(client, base, args, -1, make_text(99_999, 24), 8)
            if not w["ok"]:
                log(f"warning: warm-up request failed: {w['error']}")
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(args.requests):
            queue.put_nowait(i)
        async def worker() -> None:
            while True:  # bounded: the queue holds --requests items
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                rec = new_record(i, None)
                records.append(rec)  # appended first: a cancelled request keeps what it received
                await one_request(client, base, args, i, prompts[i % len(prompts)], args.max_tokens, rec)

        # /metrics sampled while the workload runs: peak concurrency and KV use (capacity runs). kvzap's
        # names, and llama-server's (requests_processing = slots busy, requests_deferred = queued).
        peaks = {"kvzap:num_requests_running": 0.0, "kvzap:kv_cache_usage_perc": 0.0,
                 "kvzap:num_requests_waiting": 0.0, "kvzap:kv_bytes_resident": 0.0,
                 "llamacpp:requests_processing": 0.0, "llamacpp:requests_deferred": 0.0}
        stop_sampling = asyncio.Event()

        async def sampler() -> None:
            while not stop_sampling.is_set():  # bounded: stops with the workload
                try:
                    r = await client.get(base + "/metrics", timeout=5)
                    if r.status_code == 200:
                        m = parse_prometheus(r.text)
                        for k in peaks:
                            if k in m:
                                peaks[k] = max(peaks[k], m[k])
                except (httpx.HTTPError, ValueError):
                    pass
                try:
                    await asyncio.wait_for(stop_sampling.wait(), timeout=0.25)
                except asyncio.TimeoutError:
                    pass

        t0 = time.perf_counter()
        sampling = asyncio.create_task(sampler())
        tasks = [asyncio.create_task(worker()) for _ in range(min(args.streams, args.requests))]
        _, pending = await asyncio.wait(tasks, timeout=args.timeout)
        timed_out = bool(pending)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        t1 = time.perf_counter()
        stop_sampling.set()
        await sampling
    started = {r["index"] for r in records}
    for r in records:
        if r["t_end"] is None or (r["error"] is None and not r["ok"]):
            r["error"], r["ok"], r["t_end"] = "cancelled at the time limit", False, r["t_end"] or t1
    for i in range(args.requests):
        if i not in started:
            rec = new_record(i, None)
            rec["error"], rec["t_end"] = "not started (time limit)", t1
            records.append(rec)
    records.sort(key=lambda r: r["index"])
    return {"t0": t0, "t1": t1, "timed_out": timed_out, "records": records, "metric_peaks": peaks}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def summarize(work: dict, args) -> dict:
    recs = work["records"]
    wall = work["t1"] - work["t0"]
    ok = [r for r in recs if r["ok"]]

    def tokens(r):
        return r["completion_tokens"] if r["completion_tokens"] is not None else r["chunks"]

    gen_all = sum(tokens(r) for r in recs)
    gen_ok = sum(tokens(r) for r in ok)
    ttft = [r["t_first"] - r["t_start"] for r in ok if r["t_first"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    e2e = [r["t_end"] - r["t_start"] for r in ok]
    tpot = [(r["t_last"] - r["t_first"]) / (tokens(r) - 1) for r in ok
            if r["t_first"] is not None and tokens(r) > 1]
    errors: dict[str, int] = {}
    for r in recs:
        if not r["ok"]:
            key = (r["error"] or "?").split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    short = [r["index"] for r in ok if tokens(r) < args.max_tokens]
    return {
        "requests": len(recs), "ok": len(ok), "errors": len(recs) - len(ok), "error_kinds": errors,
        "timed_out": work["timed_out"], "wall_s": wall,
        "generated_tokens": gen_all, "generated_tokens_ok": gen_ok,
        "gen_tok_s": gen_all / wall if wall > 0 else None,
        "requests_per_s": len(ok) / wall if wall > 0 else None,
        "token_count_source": "usage" if ok and all(r["completion_tokens"] is not None for r in ok) else "chunks",
        "ttft_p50_s": percentile(ttft, 0.5), "ttft_p99_s": percentile(ttft, 0.99),
        "itl_p50_s": percentile(gaps, 0.5), "itl_p99_s": percentile(gaps, 0.99),
        "tpot_mean_s": statistics.fmean(tpot) if tpot else None,
        "e2e_p50_s": percentile(e2e, 0.5), "e2e_p99_s": percentile(e2e, 0.99),
        "prompt_tokens_mean": statistics.fmean([r["prompt_tokens"] for r in ok if r["prompt_tokens"] is not None])
        if any(r["prompt_tokens"] is not None for r in ok) else None,
        "requests_short_of_max_tokens": len(short),
    }


# ---------------------------------------------------------------------------------------------------

ROWS = [  # key, label, scale, digits
    ("ok", "requests ok", 1, 0), ("errors", "errors", 1, 0), ("wall_s", "wall s", 1, 2),
    ("gen_tok_s", "generated tok/s", 1, 1), ("requests_per_s", "requests/s", 1, 2),
    ("ttft_p50_s", "TTFT p50 ms", 1000, 1), ("ttft_p99_s", "TTFT p99 ms", 1000, 1),
    ("itl_p50_s", "ITL p50 ms", 1000, 2), ("itl_p99_s", "ITL p99 ms", 1000, 2),
    ("tpot_mean_s", "TPOT mean ms", 1000, 2), ("e2e_p50_s", "latency p50 s", 1, 2),
    ("vm_hwm_mb", "server peak RSS MB", 1, 1),
]
HIGHER_BETTER = {"gen_tok_s", "requests_per_s", "ok"}


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def print_table(kinds: list[str], runs: list[dict], args) -> dict:
    medians = {k: {key: med([r["summary"].get(key, r.get(key)) if key != "vm_hwm_mb" else r["memory_end"]["vm_hwm_mb"]
                            for r in runs if r["kind"] == k]) for key, *_ in ROWS} for k in kinds}
    print(f"{args.streams} streams, {args.requests} requests, prompt ~{args.prompt_tokens} tokens, "
          f"{args.max_tokens} generated each, {args.threads} threads, {args.parallel} slots, "
          f"{'chat' if args.chat else 'completions'}; median of {args.reps}")
    print()
    head = "| metric | " + " | ".join(kinds) + (" | kvzap / llama |" if {"kvzap", "llama"} <= set(kinds) else " |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for key, label, scale, digits in ROWS:
        cells = []
        for k in kinds:
            v = medians[k][key]
            cells.append("n/a" if v is None else f"{v * scale:.{digits}f}")
        line = f"| {label} | " + " | ".join(cells) + " |"
        if {"kvzap", "llama"} <= set(kinds):
            a, b = medians["kvzap"][key], medians["llama"][key]
            line += (f" {a / b:.2f}x |" if a is not None and b not in (None, 0) else " n/a |")
        print(line)
    return medians


def main() -> int:
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
    if args.text_file:
        TEXT_WORDS.extend(args.text_file.read_text(encoding="utf-8").split())

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

    prompts = lengths = None
    count_source = None
    runs: list[dict] = []
    try:
        for rep in range(args.reps):
            order = kinds if rep % 2 == 0 else kinds[::-1]
            for kind in order:
                server = None
                if kind == "external":
                    base = url
                else:
                    port = free_port()
                    server = Server(kind, server_command(kind, args, model, port), port,
                                    log_dir / f"{kind}-rep{rep}.log")
                    live.append(server)
                    server.start(args.startup_timeout)
                    base = server.url
                if prompts is None:
                    tok = Tokenizer(base, args.kvzap, model) if model else Tokenizer(base, Path("/nonexistent"), Path())
                    prompts, lengths, count_source = build_prompts(args.requests, args.prompt_tokens, tok)
                    known = [n for n in lengths if n is not None]
                    log(f"{len(prompts)} prompts, tokens counted by {count_source}: "
                        + (f"{min(known)}–{max(known)} (target {args.prompt_tokens})" if known else "estimated"))
                mem_before = server.memory() if server else {}
                log(f"rep {rep + 1}/{args.reps}: {kind}: {args.requests} requests, {args.streams} streams "
                    f"(load average {os.getloadavg()[0]:.2f})")
                work = asyncio.run(run_workload(base, args, prompts))
                summary = summarize(work, args)
                mem_end = server.memory() if server else {"vm_hwm_mb": None, "vm_rss_mb": None}
                metrics, metrics_raw = {}, None
                try:
                    r = httpx.get(base + "/metrics", timeout=10, trust_env=False)
                    if r.status_code == 200:
                        metrics_raw = r.text
                        metrics = parse_prometheus(r.text)
                except httpx.HTTPError:
                    pass
                if kind == "kvzap" and not metrics:
                    log("warning: kvzap /metrics gave nothing")
                alive = server is None or server.proc.poll() is None
                if server:
                    server.stop()
                    live.remove(server)
                log(f"  {kind}: {summary['ok']}/{summary['requests']} ok, {summary['gen_tok_s'] or 0:.1f} tok/s, "
                    f"TTFT p50 {1000 * (summary['ttft_p50_s'] or 0):.0f} ms, ITL p50 {1000 * (summary['itl_p50_s'] or 0):.1f} ms, "
                    f"peak RSS {mem_end['vm_hwm_mb'] or 0:.0f} MB")
                if kind == "kvzap":
                    pk = work["metric_peaks"]
                    summary["peak_running"] = pk["kvzap:num_requests_running"]
                    summary["peak_kv_usage"] = pk["kvzap:kv_cache_usage_perc"]
                    summary["preemptions"] = metrics.get("kvzap:num_preemptions_total")
                    log(f"  kvzap peaks while running: {pk['kvzap:num_requests_running']:.0f} requests running, "
                        f"{pk['kvzap:num_requests_waiting']:.0f} waiting, KV usage {100 * pk['kvzap:kv_cache_usage_perc']:.1f}% "
                        f"of the budget, preemptions {summary['preemptions']}")
                if kind == "llama":
                    pk = work["metric_peaks"]
                    summary["peak_running"] = pk["llamacpp:requests_processing"]
                    log(f"  llama-server peaks while running: {pk['llamacpp:requests_processing']:.0f} requests "
                        f"processing, {pk['llamacpp:requests_deferred']:.0f} deferred")
                if summary["requests_short_of_max_tokens"]:
                    log(f"  warning: {summary['requests_short_of_max_tokens']} requests ended before --max-tokens "
                        "(ignore_eos not honoured?)")
                if not alive:
                    log(f"  warning: {kind} died during the run; log {server.log_path}")
                runs.append({"kind": kind, "rep": rep, "cmd": server.cmd if server else None, "url": base,
                             "startup_s": server.t_ready if server else None, "server_alive_at_end": alive,
                             "log": str(server.log_path) if server else None, "summary": summary,
                             "memory_before": mem_before, "memory_end": mem_end, "metrics": metrics,
                             "metrics_raw": metrics_raw if kind == "kvzap" else None,
                             "requests": [{k: v for k, v in rec.items() if k != "gaps"} | {"n_gaps": len(rec["gaps"])}
                                          for rec in work["records"]]})
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
