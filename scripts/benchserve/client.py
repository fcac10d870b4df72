"""The streamed workload (--streams requests in flight over httpx, SSE parsed here) and the /metrics sampler."""

from __future__ import annotations

import asyncio
import json
import time
from typing import AsyncIterator

import httpx

from .prompts import make_text
from .servers import log

# /metrics gauges whose peaks are kept while the workload runs (capacity runs): kvzap's, and llama-server's
# (requests_processing = slots busy, requests_deferred = queued).
PEAK_METRICS = ("kvzap:num_requests_running", "kvzap:kv_cache_usage_perc", "kvzap:num_requests_waiting",
                "kvzap:kv_bytes_resident", "llamacpp:requests_processing", "llamacpp:requests_deferred")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format -> {'name' or 'name{labels}': value}, names as the server wrote them; lines that do
    not parse are skipped. Not prometheus_client's parser: it renames counters declared without the _total
    suffix (llama-server's llamacpp:n_tokens_max becomes llamacpp:n_tokens_max_total, changing the JSON's keys)
    and drops the whole scrape at the first line it rejects."""
    metrics = {}
    for line in text.splitlines():
        name, _, value = line.strip().rpartition(" ")
        if name and not name.startswith("#"):
            try:
                metrics[name.strip()] = float(value)
            except ValueError:
                pass
    return metrics


def get_metrics(base: str) -> tuple[dict[str, float], str | None]:
    """/metrics once: parsed and raw ({}, None when the server has none)."""
    try:
        r = httpx.get(base + "/metrics", timeout=10, trust_env=False)
        if r.status_code == 200:
            return parse_metrics(r.text), r.text
    except httpx.HTTPError:
        pass
    return {}, None


def new_record(index: int) -> dict:
    return {"index": index, "ok": False, "status": None, "error": None, "t_start": None,
            "t_first": None, "t_last": None, "t_end": None, "chunks": 0, "completion_tokens": None,
            "prompt_tokens": None, "finish_reason": None, "gaps": [], "server_timings": None}


class StreamError(Exception):
    """A request that failed; the message is its record's error (the part before ':' is its kind)."""


async def sse_objects(resp: httpx.Response) -> AsyncIterator[dict]:
    """The JSON objects of a streamed response, up to `data: [DONE]`.

    Parsed here, not with openai's AsyncOpenAI client: that client ends its iteration at [DONE] and at a
    clean end of the body alike, so a stream without [DONE] (an error, counted as one) would pass, and its
    per-chunk pydantic objects cost ~75 us of CPU against ~3 us for json.loads (a mocked stream of 3,000
    chunks), on the cores the server shares."""
    async for line in resp.aiter_lines():
        if line.startswith("error:"):  # llama-server's older error event
            raise StreamError(f"error frame: {line[6:].strip()[:200]}")
        if not line.startswith("data:"):
            continue  # frame separators, `: ping` keep-alive comments
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError:
            raise StreamError(f"bad JSON frame: {payload[:120]}") from None
        if isinstance(obj, dict) and "error" in obj:
            raise StreamError(f"error frame: {json.dumps(obj['error'])[:200]}")
        if isinstance(obj, dict):
            yield obj
    raise StreamError("broken stream (no [DONE])")


def on_chunk(rec: dict, obj: dict, chat: bool) -> None:
    """One streamed chunk: arrival time of content, usage (the final chunk), finish_reason, llama-server's timings."""
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
    for key in ("completion_tokens", "prompt_tokens"):
        if usage.get(key) is not None:
            rec[key] = int(usage[key])
    if isinstance(obj.get("timings"), dict):
        rec["server_timings"] = obj["timings"]
    for choice in obj.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
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


async def one_request(client: httpx.AsyncClient, base: str, args, prompt: str, max_tokens: int, rec: dict) -> dict:
    """One streamed request (temperature 0, ignore_eos, usage in the last chunk); fills `rec` as it goes, so a
    request cancelled at the time limit keeps its partial figures. Every failure is an error string in rec."""
    body = {"model": args.model_name, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    if args.chat:
        path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": prompt}]
    else:
        path, body["prompt"] = "/v1/completions", prompt
    rec["t_start"] = time.perf_counter()
    try:
        async with client.stream("POST", base + path, json=body) as resp:
            rec["status"] = resp.status_code
            if resp.status_code != 200:
                raise StreamError(f"HTTP {resp.status_code}: {(await resp.aread()).decode('utf-8', 'replace')[:200]}")
            async for obj in sse_objects(resp):
                on_chunk(rec, obj, args.chat)
    except asyncio.CancelledError:
        rec["error"] = "cancelled at the time limit"
        rec["t_end"] = time.perf_counter()
        raise
    except StreamError as e:
        rec["error"] = str(e)
    except httpx.HTTPError as e:
        rec["error"] = f"{type(e).__name__}: {str(e)[:160]}"
    finally:
        rec["t_end"] = rec["t_end"] or time.perf_counter()
    rec["ok"] = rec["error"] is None
    return rec


async def sample_metrics(client: httpx.AsyncClient, base: str, peaks: dict[str, float], every: float = 0.25) -> None:
    """/metrics every `every` seconds until cancelled, keeping each PEAK_METRICS gauge's maximum in `peaks`."""
    while True:  # bounded: cancelled at the end of the workload
        try:
            r = await client.get(base + "/metrics", timeout=5)
            m = parse_metrics(r.text) if r.status_code == 200 else {}
            for k in peaks:
                peaks[k] = max(peaks[k], m.get(k, peaks[k]))
        except httpx.HTTPError:
            pass
        await asyncio.sleep(every)


async def run_workload(base: str, args, prompts: list[str]) -> dict:
    """--requests requests over --streams workers, within --timeout seconds (then every open request is
    cancelled, and the ones not started are recorded as such); /metrics sampled meanwhile."""
    limits = httpx.Limits(max_connections=args.streams + 2, max_keepalive_connections=args.streams + 2)
    timeout = httpx.Timeout(connect=10.0, read=args.request_timeout, write=30.0, pool=args.timeout)
    records: list[dict] = []
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as client:
        if args.warmup:
            w = await one_request(client, base, args, make_text(99_999, 24), 8, new_record(-1))
            if not w["ok"]:
                log(f"warning: warm-up request failed: {w['error']}")
        indices = iter(range(args.requests))  # shared by the workers (one event loop: no lock needed)

        async def worker() -> None:
            for i in indices:
                rec = new_record(i)
                records.append(rec)  # appended first: a cancelled request keeps what it received
                await one_request(client, base, args, prompts[i % len(prompts)], args.max_tokens, rec)

        peaks = dict.fromkeys(PEAK_METRICS, 0.0)
        t0 = time.perf_counter()
        sampling = asyncio.create_task(sample_metrics(client, base, peaks))
        tasks = [asyncio.create_task(worker()) for _ in range(min(args.streams, args.requests))]
        _, pending = await asyncio.wait(tasks, timeout=args.timeout)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        t1 = time.perf_counter()
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
    for r in records:
        if r["t_end"] is None or (r["error"] is None and not r["ok"]):
            r["error"], r["ok"], r["t_end"] = "cancelled at the time limit", False, r["t_end"] or t1
    started = {r["index"] for r in records}
    records += [new_record(i) | {"error": "not started (time limit)", "t_end": t1}
                for i in range(args.requests) if i not in started]
    records.sort(key=lambda r: r["index"])
    return {"t0": t0, "t1": t1, "timed_out": bool(pending), "records": records, "metric_peaks": peaks}
