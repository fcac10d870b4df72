"""`kvzap serve` end to end: the real binary on a loopback port with the default model, called with the
OpenAI Python client and httpx. Covers both endpoints streamed and not, usage and kv_compression, greedy
equality with `kvzap generate`, batching invariance, prefix reuse, metrics, disconnects, preemption,
the wait queue, slot files and shutdown."""
import json
import signal
import threading
import time

import httpx
import pytest

from server_harness import Server, generate_cli

LONG_TEXT = " ".join(
    f"Paragraph {i}: the lighthouse keeper counted {i * 7} ships passing the northern rocks before dawn." for i in range(40))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    slots = tmp_path_factory.mktemp("slots")
    s = Server("--parallel", "4", "--slot-save-path", str(slots))
    s.slot_dir = slots
    yield s
    assert s.stop() == 0, s.log_text()


def chat(server, content, **kw):
    return server.openai().chat.completions.create(model="kvzap", messages=[{"role": "user", "content": content}], **kw)


def test_health_and_models(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    models = server.openai().models.list()
    assert len(models.data) == 1 and models.data[0].id.endswith(".gguf")


def test_chat_completion_usage(server):
    r = chat(server, "Name a colour.", max_tokens=12, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 12
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    kv = u.model_extra["kv_compression"]
    assert kv["press"] == "none" and kv["evicted_fraction"] == 0
    assert kv["kv_bytes"] == kv["kv_bytes_full"] > 0


def test_chat_stream_with_usage(server):
    stream = chat(server, "Count to five.", max_tokens=10, temperature=0, stream=True,
                  stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = chat(server, "Count to five.", max_tokens=10, temperature=0)
    assert text == whole.choices[0].message.content


def test_stream_frames_end_with_done(server):
    with server.client() as c, c.stream("POST", "/v1/completions",
                                         json={"prompt": "Once upon a time", "max_tokens": 5, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    objs = [json.loads(f) for f in frames[:-1]]
    assert all(o["object"] == "text_completion" for o in objs)
    assert objs[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in o for o in objs)  # no usage chunk unless asked for


def test_completion_stream_and_not(server):
    o = server.openai()
    r = o.completions.create(model="kvzap", prompt="The sky is", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens == 8
    text = "".join(c.choices[0].text for c in o.completions.create(
        model="kvzap", prompt="The sky is", max_tokens=8, temperature=0, stream=True) if c.choices)
    assert text == r.choices[0].text


@pytest.mark.parametrize("chat_mode", [False, True])
def test_greedy_equals_generate(server, chat_mode):
    prompt, n = "Write one sentence about the sea.", 40
    ref = generate_cli(prompt, n, chat=chat_mode)
    if chat_mode:
        got = chat(server, prompt, max_tokens=n, temperature=0)
        text, usage = got.choices[0].message.content, got.usage
    else:
        got = server.openai().completions.create(model="kvzap", prompt=prompt, max_tokens=n, temperature=0)
        text, usage = got.choices[0].text, got.usage
    assert text == ref["text"]
    assert usage.prompt_tokens == ref["n_prompt_tokens"]
    assert usage.completion_tokens == ref["n_generated"]


def test_batching_does_not_change_greedy_output(server):
    prompts = [f"Tell me a fact about the number {i}." for i in range(6)]
    alone = [chat(server, p, max_tokens=24, temperature=0).choices[0].message.content for p in prompts]
    together = [None] * len(prompts)

    def run(i):
        together[i] = chat(server, prompts[i], max_tokens=24, temperature=0).choices[0].message.content

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


def test_kv_compression_round_trip(server):
    r = chat(server, "Summarize: " + LONG_TEXT, max_tokens=8, temperature=0,
             extra_body={"kv_compression": {"press": "kvzap-mlp", "threshold": -4, "decoding": True}})
    kv = r.usage.model_extra["kv_compression"]
    assert kv["press"] == "kvzap-mlp"
    assert 0 < kv["evicted_fraction"] < 1
    assert 0 < kv["kv_bytes"] < kv["kv_bytes_full"]
    r2 = chat(server, "Summarize: " + LONG_TEXT, max_tokens=8, temperature=0,
              extra_body={"kv_compression": {"press": "knorm", "ratio": 0.5}})
    kv2 = r2.usage.model_extra["kv_compression"]
    assert kv2["press"] == "knorm" and kv2["evicted_fraction"] == pytest.approx(0.5, abs=0.05)


def test_decoding_press_frees_pages_while_decoding(server):
    # kvpress DecodingPress: the prompt prefilled whole, then every 4 generated tokens each head cut to 64 entries.
    r = chat(server, "Summarize: " + LONG_TEXT, max_tokens=9, temperature=0,
             extra_body={"kv_compression": {"press": "decoding_knorm", "compression_interval": 4, "target_size": 64}})
    kv = r.usage.model_extra["kv_compression"]
    assert kv["press"] == "decoding_knorm"
    assert r.usage.completion_tokens == 9
    assert 0 < kv["kv_bytes"] < kv["kv_bytes_full"] / 4
    with pytest.raises(Exception) as e:
        chat(server, "Hi", max_tokens=2, extra_body={"kv_compression": {"press": "decoding_knorm", "ratio": 0.5}})
    assert "takes no ratio" in str(e.value)


def test_compressed_prefix_is_reused(server):
    body = dict(max_tokens=6, temperature=0,
                extra_body={"kv_compression": {"press": "kvzap-mlp", "threshold": -3.5}})
    before = server.metrics()
    # Settings a request brings are cached from their second request on (one-off settings would fill
    # the cache with entries nobody reuses): the first is not kept, the second is, the third reuses it.
    first = chat(server, "Reuse me: " + LONG_TEXT, **body)
    second = chat(server, "Reuse me: " + LONG_TEXT, **body)
    assert second.usage.prompt_tokens_details.cached_tokens == 0
    mid = server.metrics()
    assert mid["kvzap:prefix_cache_hits_total"] == before["kvzap:prefix_cache_hits_total"]
    third = chat(server, "Reuse me: " + LONG_TEXT, **body)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert third.usage.prompt_tokens_details.cached_tokens == third.usage.prompt_tokens
    assert third.choices[0].message.content == first.choices[0].message.content == second.choices[0].message.content
    after = server.metrics()
    assert after["kvzap:prefix_cache_hits_total"] - mid["kvzap:prefix_cache_hits_total"] == third.usage.prompt_tokens
    # Other press settings do not share the entry.
    other = chat(server, "Reuse me: " + LONG_TEXT, max_tokens=6, temperature=0)
    assert other.usage.prompt_tokens_details.cached_tokens == 0


def test_metrics_follow_requests(server):
    before = server.metrics()
    r = server.openai().completions.create(model="kvzap", prompt="Metrics are", max_tokens=7, temperature=0)
    after = server.wait_metrics(lambda m: m["kvzap:num_requests_running"] == 0)
    assert after["kvzap:prompt_tokens_total"] - before["kvzap:prompt_tokens_total"] == r.usage.prompt_tokens
    assert after["kvzap:generation_tokens_total"] - before["kvzap:generation_tokens_total"] == r.usage.completion_tokens
    assert after["kvzap:time_to_first_token_seconds_count"] - before["kvzap:time_to_first_token_seconds_count"] == 1
    assert (after["kvzap:inter_token_latency_seconds_count"] - before["kvzap:inter_token_latency_seconds_count"]
            == r.usage.completion_tokens - 1)
    assert after["kvzap:num_requests_waiting"] == 0
    assert 0 <= after["kvzap:kv_cache_usage_perc"] <= 1
    assert after["kvzap:kv_bytes_full"] == 0  # nothing running
    for name in ("kvzap:kv_bytes_resident", "kvzap:kv_evicted_entries_total", "kvzap:num_preemptions_total",
                 "kvzap:prefix_cache_hits_total", 'kvzap:time_to_first_token_seconds_bucket{le="+Inf"}'):
        assert name in after


def test_disconnect_frees_pages(server):
    idle = server.wait_metrics(lambda m: m["kvzap:num_requests_running"] == 0)
    with server.client() as c, c.stream("POST", "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Write a very long story. " + LONG_TEXT[:400]}],
            "max_tokens": 3000, "stream": True, "temperature": 1, "seed": 1, "ignore_eos": True}) as r:
        lines = r.iter_lines()  # kept alive: a closed generator would close the response early
        got = 0
        while got < 5:
            got += next(lines).startswith("data: ")
        busy = server.metrics()
        assert busy["kvzap:num_requests_running"] == 1
        assert busy["kvzap:kv_bytes_resident"] > idle["kvzap:kv_bytes_resident"]
    after = server.wait_metrics(lambda m: m["kvzap:num_requests_running"] == 0, timeout=20)
    assert after["kvzap:num_requests_running"] == 0
    assert after["kvzap:kv_bytes_resident"] == idle["kvzap:kv_bytes_resident"]
    assert after["kvzap:request_cancelled_total"] == idle["kvzap:request_cancelled_total"] + 1
    assert after["kvzap:generation_tokens_total"] - idle["kvzap:generation_tokens_total"] < 3000


def test_stop_strings_and_seed(server):
    r = server.openai().completions.create(model="kvzap", prompt="1, 2, 3, 4,", max_tokens=30, temperature=0, stop=[" 7"])
    assert r.choices[0].finish_reason == "stop" and " 7" not in r.choices[0].text
    a = chat(server, "Invent a word.", max_tokens=12, temperature=1.0, seed=123).choices[0].message.content
    b = chat(server, "Invent a word.", max_tokens=12, temperature=1.0, seed=123).choices[0].message.content
    assert a == b


def test_tokenize_detokenize(server):
    with server.client() as c:
        toks = c.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
        assert toks and all(isinstance(t, int) for t in toks)
        pieces = c.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
        assert [p["id"] for p in pieces] == toks and "".join(p["piece"] for p in pieces) == "Hello world"
        assert c.post("/detokenize", json={"tokens": toks}).json() == {"content": "Hello world"}


def test_slots_save_and_restore(server, tmp_path):
    ctx = "Saved context: " + LONG_TEXT
    body = {"filename": "ctx.kvc", "messages": [{"role": "user", "content": ctx}],
            "kv_compression": {"press": "kvzap-mlp", "threshold": -4}}
    with server.client() as c:
        saved = c.post("/slots/save", json=body)
        assert saved.status_code == 200, saved.text
        info = saved.json()
        assert info["n_tokens"] > 100 and 0 < info["kv_bytes"] < info["kv_bytes_full"]
    assert (server.slot_dir / "ctx.kvc").is_file()
    # A fresh server restores the file and serves the same prompt from it.
    fresh = Server("--slot-save-path", str(server.slot_dir))
    try:
        with fresh.client() as c:
            r = c.post("/slots/restore", json={"filename": "ctx.kvc"})
            assert r.status_code == 200, r.text
            assert r.json()["n_tokens"] == info["n_tokens"]
            reply = c.post("/v1/chat/completions", json={
                "messages": body["messages"], "max_tokens": 5, "temperature": 0,
                "kv_compression": body["kv_compression"]}).json()
            assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == info["n_tokens"]
            direct = chat(server, ctx, max_tokens=5, temperature=0, extra_body={"kv_compression": body["kv_compression"]})
            assert reply["choices"][0]["message"]["content"] == direct.choices[0].message.content
    finally:
        assert fresh.stop() == 0


def test_preemption_recomputes_and_matches(tmp_path):
    # A KV budget that holds about two of these requests at full length: the others are preempted.
    prompts = [f"List {i + 3} animals and describe each one in detail." for i in range(4)]
    ref = Server("--parallel", "1", "--prefix-cache", "0")
    try:
        alone = [ref.openai().chat.completions.create(model="k", messages=[{"role": "user", "content": p}],
                                                       max_tokens=160, temperature=0).choices[0].message.content
                 for p in prompts]
    finally:
        ref.stop()
    tight = Server("--parallel", "4", "--kv-budget", "9MiB", "--prefix-cache", "0")
    try:
        out = [None] * 4

        def run(i):
            out[i] = tight.openai().chat.completions.create(
                model="k", messages=[{"role": "user", "content": prompts[i]}], max_tokens=160, temperature=0)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        m = tight.metrics()
        assert m["kvzap:num_preemptions_total"] > 0, tight.log_text()
        for r, ref_text in zip(out, alone):
            assert r.usage.completion_tokens == 160 and r.choices[0].finish_reason == "length"
            # Up to the preemption the text is the unpreempted one; the recompute replays the generated
            # tokens as one prefill chunk, whose float sums may differ from one-token decode steps.
            common = next((i for i, (a, b) in enumerate(zip(r.choices[0].message.content, ref_text)) if a != b), len(ref_text))
            print("common prefix", common, "of", len(ref_text))
            assert common >= 150, (r.choices[0].message.content, ref_text)
        assert m["kvzap:kv_bytes_resident"] == 0 and m["kvzap:num_requests_running"] == 0
    finally:
        assert tight.stop() == 0


def test_prefill_chunk_bounds_steps_while_decoding():
    # A long prompt arriving while another request decodes is fed in --prefill-chunk pieces, so no step
    # (whose time is about its token count) stalls the decoding stream for the whole prompt; with the cap
    # off (0) the same prompt goes into one big step (the negative control).
    long_prompt = " ".join(f"word{i}" for i in range(300))
    for cap, bound in (("16", 32), ("0", None)):
        s = Server("--parallel", "2", "--prefill-chunk", cap, "--prefix-cache", "0")
        try:
            stop = threading.Event()

            def long_stream():
                with s.client() as c, c.stream("POST", "/v1/completions", json={
                        "prompt": "Forever", "max_tokens": 4000, "stream": True, "ignore_eos": True}) as r:
                    for _ in r.iter_lines():
                        if stop.is_set():
                            break

            first = threading.Thread(target=long_stream)
            first.start()
            s.wait_metrics(lambda m: m["kvzap:generation_tokens_total"] >= 2)
            with s.client() as c:
                r = c.post("/v1/completions", json={"prompt": long_prompt, "max_tokens": 1})
            assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] >= 300, r.text
            still_decoding = s.metrics()["kvzap:num_requests_running"] == 1
            stop.set()
            first.join()
            assert still_decoding  # the whole prompt was prefilled beside the decoding stream
            m = s.metrics()
            steps = m["kvzap:iteration_tokens_total_count"]
            if bound is not None:
                over = steps - m[f'kvzap:iteration_tokens_total_bucket{{le="{bound}"}}']
                assert over == 0, f"{over:.0f} of {steps:.0f} steps took more than {bound} tokens"
            else:
                assert steps - m['kvzap:iteration_tokens_total_bucket{le="256"}'] >= 1
        finally:
            assert s.stop() == 0


def test_wait_queue_is_bounded():
    s = Server("--parallel", "1", "--max-queue", "1")
    try:
        def long_stream(stop):
            with s.client() as c, c.stream("POST", "/v1/completions", json={
                    "prompt": "Forever", "max_tokens": 4000, "stream": True, "ignore_eos": True}) as r:
                for _ in r.iter_lines():
                    if stop.is_set():
                        break

        stop = threading.Event()
        first = threading.Thread(target=long_stream, args=(stop,))
        first.start()
        s.wait_metrics(lambda m: m["kvzap:num_requests_running"] == 1)
        second = threading.Thread(target=long_stream, args=(stop,))
        second.start()
        s.wait_metrics(lambda m: m["kvzap:num_requests_waiting"] == 1)
        with s.client() as c:
            r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "unavailable_error" and "--max-queue" in r.json()["error"]["message"]
        stop.set()
        first.join()
        second.join()
        assert httpx.get(s.url + "/health").status_code == 200
    finally:
        assert s.stop() == 0


def test_api_key():
    s = Server(api_key="sk-test-123")
    try:
        assert httpx.get(s.url + "/health").status_code == 200  # open
        body = {"prompt": "hi", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "sk-test-12"}, {"Authorization": "sk-test-123"}):
            r = httpx.post(s.url + "/v1/completions", json=body, headers=headers)
            assert r.status_code == 401, headers
            assert r.json()["error"]["type"] == "authentication_error"
        assert httpx.post(s.url + "/v1/completions", json=body, headers={"X-Api-Key": "sk-test-123"}).status_code == 200
        assert httpx.get(s.url + "/metrics").status_code == 401
        r = s.openai().completions.create(model="k", prompt="hi", max_tokens=2)
        assert r.usage.completion_tokens == 2
        import openai
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="k", prompt="hi", max_tokens=2)
    finally:
        assert s.stop() == 0


def stream_long_completion(s, got):
    """Streams a 4000-token completion from server s, appending each SSE line to got, until it ends."""
    try:
        with s.client() as c, c.stream("POST", "/v1/completions", json={
                "prompt": "Go on", "max_tokens": 4000, "stream": True, "ignore_eos": True}) as r:
            for line in r.iter_lines():
                got.append(line)
    except httpx.HTTPError:
        pass


def test_second_signal_stops_at_once():
    """A long grace period, a running stream, then SIGTERM twice: the second one ends the drain at once and
    the server exits 0 (the watcher thread and main's shutdown must not race over the scheduler)."""
    s = Server("--shutdown-grace", "600")
    t = threading.Thread(target=stream_long_completion, args=(s, []))
    t.start()
    s.wait_metrics(lambda m: m["kvzap:num_requests_running"] == 1)
    start = time.time()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert s.proc.poll() is None, "exited before the grace period on the first signal"
    assert s.stop(signal.SIGTERM) == 0, s.log_text()
    assert time.time() - start < 20
    t.join(10)


def test_sigterm_mid_stream_exits_cleanly():
    s = Server("--shutdown-grace", "1")
    got = []
    t = threading.Thread(target=stream_long_completion, args=(s, got))
    t.start()
    s.wait_metrics(lambda m: m["kvzap:num_requests_running"] == 1)
    start = time.time()
    assert s.stop(signal.SIGINT) == 0, s.log_text()
    assert time.time() - start < 15
    t.join(10)
    assert any("shutting down" in line for line in got)
