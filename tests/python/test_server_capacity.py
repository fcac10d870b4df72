"""Pruning as capacity (`kvzap serve`): a threshold press frees a prompt's entries while it is prefilled
(--prefill-evict-every, 128 by default), admission reserves what a request will really hold, and the
scheduler preempts, recomputes or refuses rather than hanging. The real binary on loopback ports."""
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from server_harness import Server

# About 23 KB of f16 KV per token for SmolLM2-135M (30 layers x 3 KV heads x 2 x 64 x 2 bytes + positions).
TEXT = " ".join(f"Note {i}: the harbour master logged {i * 13 % 97} boats and {i * 7 % 31} storms that week." for i in range(200))


def words(n):
    return " ".join(TEXT.split()[:n])


def complete(s, prompt, timeout=120, **kw):
    with s.client(timeout=timeout) as c:
        return c.post("/v1/completions", json={"prompt": prompt, "temperature": 0, **kw})


def test_a_budget_smaller_than_one_full_context_serves_a_request_that_fits_once_pruned():
    # 20 MiB holds about 900 unpruned tokens; the prompt has about 1,700. The random press at threshold
    # 0.75 keeps a quarter of what leaves its window.
    s = Server("--kv-budget", "20MiB", "--prefix-cache", "0", "--press", "random", "--threshold", "0.75", "-c", "4096")
    try:
        prompt = words(1300)
        t0 = time.time()
        r = complete(s, prompt, max_tokens=8)
        assert r.status_code == 200, r.text
        u = r.json()["usage"]
        kv = u["kv_compression"]
        assert u["prompt_tokens"] > 1500
        assert kv["kv_bytes_full"] > 20 * 2**20 > kv["kv_bytes"], kv  # the full cache would not have fit
        assert kv["evicted_fraction"] > 0.5
        m = s.metrics()
        assert m["kvzap:kv_bytes_resident"] == 0 and m["kvzap:num_preemptions_total"] == 0
        # Negative controls: without a press, or judging the prompt only at its end, the same prompt needs
        # its whole unpruned size at once: refused at once with a clear error, never a hang.
        for comp in ({"press": "none"}, {"prefill_evict_every": 0}):
            t0 = time.time()
            r = complete(s, prompt, max_tokens=8, kv_compression=comp)
            assert r.status_code == 400 and "KV budget" in r.json()["error"]["message"], (comp, r.text)
            assert time.time() - t0 < 10
        assert complete(s, "Hello", max_tokens=2).status_code == 200  # still serving
    finally:
        assert s.stop() == 0


def test_a_request_that_cannot_fit_even_pruned_gets_a_clear_error_at_once():
    # 4 MiB holds about 170 tokens: fewer than the window (128) + one interval (128) the press keeps
    # unjudged, so a long prompt cannot fit whatever the press evicts.
    s = Server("--kv-budget", "4MiB", "--prefix-cache", "0", "--press", "random", "--threshold", "0.9")
    try:
        t0 = time.time()
        r = complete(s, words(900), max_tokens=4, timeout=60)
        assert r.status_code == 400, r.text
        assert "even as its press prunes it" in r.json()["error"]["message"], r.text
        assert time.time() - t0 < 30
        m = s.metrics()
        assert m["kvzap:kv_bytes_resident"] == 0 and m["kvzap:num_requests_running"] == 0
        assert complete(s, "Hi", max_tokens=2).status_code == 200
    finally:
        assert s.stop() == 0


def test_200_requests_against_a_tiny_budget_all_end():
    # Prompts of 20-400 tokens, half of them pruned, against a budget of about 250 unpruned tokens:
    # every request ends served (200) or refused (400 too large, 503 queue full), none hangs, and the pool
    # is empty afterwards.
    s = Server("--kv-budget", "6MiB", "--prefix-cache", "0", "--parallel", "8", "--max-queue", "32",
               "--press", "random", "--threshold", "0.8", "--timeout", "120")
    rng = random.Random(7)
    jobs = [(words(rng.randint(20, 300)), rng.random() < 0.5) for _ in range(200)]

    def one(job):
        prompt, pruned = job
        body = {"max_tokens": 3}
        if not pruned:
            body["kv_compression"] = {"press": "none"}
        try:
            return complete(s, prompt, timeout=180, **body).status_code
        except httpx.HTTPError as e:
            return repr(e)

    try:
        t0 = time.time()
        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(one, jobs))
        elapsed = time.time() - t0
        counts = {c: codes.count(c) for c in set(codes)}
        print("200 requests in", round(elapsed, 1), "s:", counts)
        assert set(codes) <= {200, 400, 503}, counts
        assert counts.get(200, 0) >= 100, counts  # every pruned request fits
        m = s.wait_metrics(lambda m: m["kvzap:num_requests_running"] == 0)
        assert m["kvzap:num_requests_running"] == 0 and m["kvzap:kv_bytes_resident"] == 0, m
        assert httpx.get(s.url + "/health", timeout=1).status_code == 200
    finally:
        assert s.stop() == 0


def test_preempted_requests_with_a_decode_press_recompute_the_same_tokens():
    # KVzap-MLP pruning prompts while prefilling and generated tokens while decoding: after a preemption
    # the recompute judges the prompt at the same positions and replays the generated tokens one per step,
    # so the pruned state, and with it every greedy token, is the one an unpreempted run has.
    press = ["--press", "kvzap-mlp", "--decode-press", "--window", "32", "--prefill-evict-every", "64"]
    prompts = [words(150 + 40 * i) for i in range(4)]
    ref = Server("--parallel", "1", "--prefix-cache", "0", *press)
    try:
        alone = [complete(ref, p, max_tokens=120, ignore_eos=True).json()["choices"][0]["text"] for p in prompts]
    finally:
        ref.stop()
    tight = Server("--parallel", "4", "--kv-budget", "5MiB", "--prefix-cache", "0", *press)
    try:
        out = [None] * 4

        def run(i):
            out[i] = complete(tight, prompts[i], max_tokens=120, ignore_eos=True)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        m = tight.metrics()
        assert m["kvzap:num_preemptions_total"] > 0, tight.log_text()
        for r, ref_text in zip(out, alone):
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == ref_text
        assert m["kvzap:kv_bytes_resident"] == 0
    finally:
        assert tight.stop() == 0


def test_the_prefix_cache_yields_to_running_requests_and_reports_its_hit_rate():
    # The prefix cache may take the whole budget; a request that then needs the pages gets them.
    s = Server("--kv-budget", "12MiB", "--prefix-cache", "12MiB", "--press", "random", "--threshold", "0.5")
    try:
        for i in range(6):
            assert complete(s, f"Story {i}: " + words(200), max_tokens=2).status_code == 200
        m = s.metrics()
        assert m["kvzap:prefix_cache_bytes"] > 6 * 2**20, m["kvzap:prefix_cache_bytes"]
        assert m["kvzap:prefix_cache_hit_rate"] == 0
        # About 370 kept tokens (8.7 MB): more than the cache leaves free.
        r = complete(s, words(200), max_tokens=150, ignore_eos=True)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 150, r.text
        m = s.metrics()
        assert m["kvzap:prefix_cache_evictions_total"] >= 1
        # The last prompt, compressed and cached, serves its repeat.
        r = complete(s, words(200), max_tokens=2)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, r.text
        m = s.metrics()
        assert 0 < m["kvzap:prefix_cache_hit_rate"] < 1
    finally:
        assert s.stop() == 0


def test_a_restored_slot_keeps_pruning_while_decoding(tmp_path):
    # A context saved under a decode press and restored by a fresh server: the request served from it
    # still prunes its generated tokens (the restored sequence gets the request's press). The saved
    # context's last window was not judged when it was saved, and stays unjudged.
    comp = {"press": "kvzap-mlp", "threshold": -4, "decoding": True, "window": 16}
    body = {"filename": "dec.kvc", "prompt": words(300), "kv_compression": comp}
    s = Server("--slot-save-path", str(tmp_path))
    try:
        with s.client() as c:
            saved = c.post("/slots/save", json=body)
            assert saved.status_code == 200, saved.text
            info = saved.json()
    finally:
        assert s.stop() == 0
    fresh = Server("--slot-save-path", str(tmp_path))
    try:
        with fresh.client() as c:
            assert c.post("/slots/restore", json={"filename": "dec.kvc"}).status_code == 200
            r = c.post("/v1/completions", json={"prompt": body["prompt"], "max_tokens": 200, "temperature": 0,
                                                "ignore_eos": True, "kv_compression": comp})
            assert r.status_code == 200, r.text
            u = r.json()["usage"]
            assert u["prompt_tokens_details"]["cached_tokens"] == info["n_tokens"]
            per_token = info["kv_bytes_full"] / info["n_tokens"]
            grown = u["kv_compression"]["kv_bytes"] - info["kv_bytes"]
            # Unpruned, 200 generated tokens would add 200 tokens' bytes; the decode press frees most of them.
            assert grown < 0.8 * 200 * per_token, (grown, per_token)
    finally:
        assert fresh.stop() == 0
