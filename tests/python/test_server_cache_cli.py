"""`kvzap generate --save-cache/--load-cache`: a context compressed once by the CLI continues exactly as
the run that saved it, a damaged file is a one-line error, and the server restores the same file
(/slots/restore) and serves the matching prompt from it."""
import json
import subprocess

from server_harness import THREADS, Server, kvzap_bin, model_args

CONTEXT = " ".join(f"Item {i}: the ferry left pier {i % 7} at {i % 12 + 1} o'clock." for i in range(40))
PROMPT = CONTEXT + " Question: which pier did item 5 leave from?"
PRESS = ["--press", "kvzap-mlp", "--threshold", "-4"]


def generate(*args):
    cmd = [kvzap_bin(), "generate", *model_args(), "-t", THREADS, "--temp", "0", "-n", "12", "--json", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_save_then_load_continues_identically(tmp_path):
    path = tmp_path / "ctx.kvc"
    saved = generate("--chat", "-p", PROMPT, *PRESS, "--save-cache", str(path))
    assert saved.returncode == 0, saved.stderr
    first = json.loads(saved.stdout)
    loaded = generate("--load-cache", str(path))
    assert loaded.returncode == 0, loaded.stderr
    again = json.loads(loaded.stdout)
    assert again["text"] == first["text"]
    assert again["n_cached_tokens"] == first["n_prompt_tokens"]
    assert again["evicted_fraction"] == first["evicted_fraction"] > 0

    path.write_bytes(path.read_bytes()[:5000])
    bad = generate("--load-cache", str(path))
    assert bad.returncode == 1 and "truncated" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1

    # The server restores a CLI-saved file and reuses it for the same prompt and press settings.
    saved = generate("--chat", "-p", PROMPT, *PRESS, "--save-cache", str(path))
    assert saved.returncode == 0, saved.stderr
    s = Server("--slot-save-path", str(tmp_path))
    try:
        with s.client() as c:
            r = c.post("/slots/restore", json={"filename": "ctx.kvc"})
            assert r.status_code == 200, r.text
            reply = c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12, "temperature": 0,
                # generate judges a context once it is complete; the server's default judges it every 128
                # positions while prefilling: the same settings as the saved file's are asked for.
                "kv_compression": {"press": "kvzap-mlp", "threshold": -4, "prefill_evict_every": 0}}).json()
        assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == first["n_prompt_tokens"]
        assert reply["choices"][0]["message"]["content"] == first["text"]
    finally:
        assert s.stop() == 0
