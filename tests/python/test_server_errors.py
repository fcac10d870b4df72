"""The bad-request catalogue for `kvzap serve`: every case gets the right 4xx in OpenAI's error shape
({"error": {"message", "type", "code"}}) and the server still answers /health and real requests after it."""
import hashlib
import json

import httpx
import pytest

from server_harness import Server

KEY = "sk-catalogue"
CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    slots = tmp_path_factory.mktemp("slots")
    s = Server("-c", "256", "--max-body", "64KiB", "--max-tokens-limit", "1000", "--slot-save-path", str(slots),
               api_key=KEY)
    s.slot_dir = slots
    with s.client() as c:  # a valid slot file to damage in the catalogue
        r = c.post("/slots/save", json={"filename": "good.kvc", "prompt": "A short saved context about owls."})
        assert r.status_code == 200, r.text
    slots = slots / ("key-" + hashlib.sha256(KEY.encode()).hexdigest()[:16])  # the key's own slot folder
    good = (slots / "good.kvc").read_bytes()
    (slots / "garbage.kvc").write_bytes(b"this is not a cache file at all" * 10)
    (slots / "truncated.kvc").write_bytes(good[: len(good) // 2])
    (slots / "tiny.kvc").write_bytes(good[:40])
    version = bytearray(good)
    version[8] = 7
    (slots / "version.kvc").write_bytes(bytes(version))
    corrupt = bytearray(good)
    corrupt[-3] ^= 0xFF
    (slots / "corrupt.kvc").write_bytes(bytes(corrupt))
    foreign = bytearray(good)
    foreign[16] ^= 0x5A  # the model fingerprint; the header checksum is resealed so the model check is what fails
    foreign[132:140] = hashlib.sha256(bytes(foreign[:132])).digest()[:8]  # version 2 header: checksum at 132
    (slots / "foreign.kvc").write_bytes(bytes(foreign))
    size = bytearray(good)
    size[92:100] = (len(good) * 2).to_bytes(8, "little")  # payload size field (after the kv type)
    size[132:140] = hashlib.sha256(bytes(size[:132])).digest()[:8]
    (slots / "badsize.kvc").write_bytes(bytes(size))
    yield s
    assert s.stop() == 0, s.log_text()


AUTH = {"Authorization": f"Bearer {KEY}"}

# (name, path, body: dict -> JSON, bytes -> raw, headers, status, error type, message fragment)
CASES = [
    ("malformed JSON", CHAT, b'{"messages": [', AUTH, 400, "invalid_request_error", "malformed JSON"),
    ("empty body", CHAT, b"", AUTH, 400, "invalid_request_error", "empty"),
    ("trailing comma", CHAT, b'{"messages": [],}', AUTH, 400, "invalid_request_error", "malformed JSON"),
    ("NaN literal", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', AUTH, 400,
     "invalid_request_error", "malformed JSON"),
    ("body is an array", CHAT, [1, 2], AUTH, 400, "invalid_request_error", "JSON object"),
    ("missing messages", CHAT, {"model": "x"}, AUTH, 400, "invalid_request_error", "'messages' is required"),
    ("messages not an array", CHAT, {"messages": "hi"}, AUTH, 400, "invalid_request_error", "must be an array"),
    ("empty messages", CHAT, {"messages": []}, AUTH, 400, "invalid_request_error", "must not be empty"),
    ("message without role", CHAT, {"messages": [{"content": "x"}]}, AUTH, 400, "invalid_request_error", "role"),
    ("unknown role", CHAT, {"messages": [{"role": "robot", "content": "x"}]}, AUTH, 400, "invalid_request_error", "role"),
    ("content wrong type", CHAT, {"messages": [{"role": "user", "content": 42}]}, AUTH, 400, "invalid_request_error", "content"),
    ("image part", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     AUTH, 400, "not_supported_error", "only text"),
    ("negative max_tokens", CHAT, {"messages": MSG, "max_tokens": -5}, AUTH, 400, "invalid_request_error", "max_tokens"),
    ("huge max_tokens", CHAT, {"messages": MSG, "max_tokens": 10 ** 12}, AUTH, 400, "invalid_request_error", "max_tokens"),
    ("max_tokens over the limit", CHAT, {"messages": MSG, "max_tokens": 1001}, AUTH, 400, "invalid_request_error", "1000"),
    ("max_tokens as string", CHAT, {"messages": MSG, "max_tokens": "5"}, AUTH, 400, "invalid_request_error", "integer"),
    ("negative temperature", CHAT, {"messages": MSG, "temperature": -1}, AUTH, 400, "invalid_request_error", "temperature"),
    ("huge temperature", CHAT, {"messages": MSG, "temperature": 1e308}, AUTH, 400, "invalid_request_error", "temperature"),
    ("top_p above 1", CHAT, {"messages": MSG, "top_p": 1.5}, AUTH, 400, "invalid_request_error", "top_p"),
    ("negative top_k", CHAT, {"messages": MSG, "top_k": -1}, AUTH, 400, "invalid_request_error", "top_k"),
    ("seed as string", CHAT, {"messages": MSG, "seed": "x"}, AUTH, 400, "invalid_request_error", "seed"),
    ("n = 3", CHAT, {"messages": MSG, "n": 3}, AUTH, 400, "not_supported_error", "'n' must be 1"),
    ("too many stop strings", CHAT, {"messages": MSG, "stop": [str(i) for i in range(17)]}, AUTH, 400,
     "invalid_request_error", "at most 16"),
    ("stop wrong type", CHAT, {"messages": MSG, "stop": {"a": 1}}, AUTH, 400, "invalid_request_error", "stop"),
    ("stream wrong type", CHAT, {"messages": MSG, "stream": "true"}, AUTH, 400, "invalid_request_error", "stream"),
    ("unknown press", CHAT, {"messages": MSG, "kv_compression": {"press": "zip-it"}}, AUTH, 400,
     "invalid_request_error", "unknown press"),
    ("kv_compression not an object", CHAT, {"messages": MSG, "kv_compression": "kvzap-mlp"}, AUTH, 400,
     "invalid_request_error", "kv_compression"),
    ("ratio out of range", CHAT, {"messages": MSG, "kv_compression": {"press": "knorm", "ratio": 1.5}}, AUTH, 400,
     "invalid_request_error", "ratio"),
    ("negative ratio", CHAT, {"messages": MSG, "kv_compression": {"press": "knorm", "ratio": -0.2}}, AUTH, 400,
     "invalid_request_error", "ratio"),
    ("threshold as string", CHAT, {"messages": MSG, "kv_compression": {"press": "kvzap-mlp", "threshold": "low"}}, AUTH,
     400, "invalid_request_error", "threshold"),
    ("huge threshold", CHAT, {"messages": MSG, "kv_compression": {"press": "kvzap-mlp", "threshold": 1e300}}, AUTH,
     400, "invalid_request_error", "threshold"),
    ("threshold and ratio", CHAT, {"messages": MSG, "kv_compression": {"press": "knorm", "ratio": 0.5, "threshold": 1}},
     AUTH, 400, "invalid_request_error", "not both"),
    ("threshold on a ratio-only press", CHAT, {"messages": MSG, "kv_compression": {"press": "kvzip", "threshold": 1}},
     AUTH, 400, "invalid_request_error", "kv_compression"),
    ("negative window", CHAT, {"messages": MSG, "kv_compression": {"press": "kvzap-mlp", "window": -1}}, AUTH, 400,
     "invalid_request_error", "window"),
    ("unknown kv_compression field", CHAT, {"messages": MSG, "kv_compression": {"press": "knorm", "ration": 0.5}}, AUTH,
     400, "invalid_request_error", "unknown field"),
    ("no press and no default", CHAT, {"messages": MSG, "kv_compression": {"threshold": -4}}, AUTH, 400,
     "invalid_request_error", "press"),
    ("prompt over the context", CMPL, {"prompt": "word " * 400}, AUTH, 400, "exceed_context_size_error", "context size"),
    ("chat over the context", CHAT, {"messages": [{"role": "user", "content": "word " * 400}]}, AUTH, 400,
     "exceed_context_size_error", "context size"),
    ("missing prompt", CMPL, {"max_tokens": 3}, AUTH, 400, "invalid_request_error", "'prompt' is required"),
    ("negative token id", CMPL, {"prompt": [1, -1]}, AUTH, 400, "invalid_request_error", "out of range"),
    ("token id past the vocabulary", CMPL, {"prompt": [1, 10 ** 9]}, AUTH, 400, "invalid_request_error", "out of range"),
    ("token id as float", CMPL, {"prompt": [1.5]}, AUTH, 400, "invalid_request_error", "token id"),
    ("several prompts", CMPL, {"prompt": ["a", "b"]}, AUTH, 400, "not_supported_error", "one prompt"),
    ("invalid UTF-8", CMPL, b'{"prompt": "caf\xc3"}', AUTH, 400, "invalid_request_error", "malformed JSON"),
    ("invalid UTF-8 in chat", CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', AUTH, 400,
     "invalid_request_error", "malformed JSON"),
    ("oversized body", CMPL, json.dumps({"prompt": "x" * 100_000}).encode(), AUTH, 413, "invalid_request_error", "limit"),
    ("no API key", CHAT, {"messages": MSG}, {}, 401, "authentication_error", "API Key"),
    ("wrong API key", CHAT, {"messages": MSG}, {"Authorization": "Bearer sk-wrong"}, 401, "authentication_error", "API Key"),
    ("key prefix only", CHAT, {"messages": MSG}, {"X-Api-Key": KEY[:-1]}, 401, "authentication_error", "API Key"),
    ("tokenize wrong type", "/tokenize", {"content": 5}, AUTH, 400, "invalid_request_error", "content"),
    ("detokenize bad id", "/detokenize", {"tokens": [10 ** 9]}, AUTH, 400, "invalid_request_error", "out of range"),
    ("detokenize not a list", "/detokenize", {"tokens": "1 2"}, AUTH, 400, "invalid_request_error", "tokens"),
    ("slot path traversal", "/slots/restore", {"filename": "../../etc/passwd"}, AUTH, 400, "invalid_request_error", "filename"),
    ("slot absolute path", "/slots/save", {"filename": "/tmp/x.kvc", "prompt": "hi"}, AUTH, 400, "invalid_request_error", "file name"),
    ("slot traversal inside", "/slots/restore", {"filename": "a/../../b.kvc"}, AUTH, 400, "invalid_request_error", "file name"),
    ("slot hidden name", "/slots/restore", {"filename": ".."}, AUTH, 400, "invalid_request_error", "filename"),
    ("slot name wrong type", "/slots/restore", {"filename": 7}, AUTH, 400, "invalid_request_error", "filename"),
    ("slot file missing", "/slots/restore", {"filename": "missing.kvc"}, AUTH, 404, "not_found_error", "missing.kvc"),
    ("slot garbage file", "/slots/restore", {"filename": "garbage.kvc"}, AUTH, 400, "invalid_request_error", "not a kvzap cache file"),
    ("slot truncated file", "/slots/restore", {"filename": "truncated.kvc"}, AUTH, 400, "invalid_request_error", "truncated"),
    ("slot shorter than header", "/slots/restore", {"filename": "tiny.kvc"}, AUTH, 400, "invalid_request_error", "truncated"),
    ("slot wrong version", "/slots/restore", {"filename": "version.kvc"}, AUTH, 400, "invalid_request_error", "version 7"),
    ("slot corrupt payload", "/slots/restore", {"filename": "corrupt.kvc"}, AUTH, 400, "invalid_request_error", "checksum"),
    ("slot foreign model", "/slots/restore", {"filename": "foreign.kvc"}, AUTH, 400, "invalid_request_error", "another model"),
    ("slot wrong payload size", "/slots/restore", {"filename": "badsize.kvc"}, AUTH, 400, "invalid_request_error", "truncated"),
    ("unknown route", "/v1/embeddings", {"input": "x"}, AUTH, 404, "not_found_error", "no route"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, case):
    name, path, body, headers, status, etype, fragment = case
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=raw, headers={**headers, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == status, (name, r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"}, err
    assert err["type"] == etype, err
    assert err["code"] == status
    assert fragment in err["message"], err
    assert "\n" not in err["message"]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    if etype == "exceed_context_size_error":
        assert err["n_ctx"] == 256 and err["n_prompt_tokens"] > 256


def test_catalogue_is_large_enough():
    assert len(CASES) >= 30


def test_still_serving_after_the_catalogue(server):
    with server.client() as c:
        r = c.post(CMPL, json={"prompt": "Still alive?", "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        restored = c.post("/slots/restore", json={"filename": "good.kvc"})
        assert restored.status_code == 200, restored.text
    m = server.metrics()
    assert m["kvzap:num_requests_running"] == 0 and m["kvzap:request_rejected_total"] >= 30


def test_stream_error_after_admission_is_an_sse_error_frame(server):
    # A stream request that is refused before it starts gets a plain 4xx, not a half stream.
    r = httpx.post(server.url + CHAT, json={"messages": MSG, "stream": True, "n": 2}, headers=AUTH)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
