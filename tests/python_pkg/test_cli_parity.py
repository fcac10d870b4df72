"""Same model, press and seed: the Python pipeline keeps the same entries and generates the same tokens as
`kvzap generate --json` (the CLI)."""
import json
import subprocess

import pytest

import kvzap

from conftest import CONTEXT, TINY, default_model, kvzap_bin


def cli(model, tmp_path, args):
    ctx = tmp_path / "context.txt"
    ctx.write_text(CONTEXT)
    cmd = [kvzap_bin(), "generate", "-m", model, "-t", "1", "-c", "512", "--context-file", str(ctx), "--json",
           "--chat"] + args
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


@pytest.mark.parametrize("press_args, press", [
    (["--press", "knorm", "--ratio", "0.5", "--ratio-scope", "head"], lambda: kvzap.KnormPress(compression_ratio=0.5)),
    (["--press", "snapkv", "--ratio", "0.4", "--ratio-scope", "head"], lambda: kvzap.SnapKVPress(compression_ratio=0.4)),
    (["--press", "kvzip", "--ratio", "0.5", "--ratio-scope", "global"], lambda: kvzap.KVzipPress(compression_ratio=0.5)),
    ([], lambda: None),
])
def test_same_kept_sets_and_tokens_as_the_cli(tmp_path, press_args, press):
    if kvzap_bin() is None:
        print("SKIPPED: CLI parity (KVZAP_BIN is not set to the kvzap binary)")
        pytest.skip("no KVZAP_BIN")
    qs = ["Which lamp was in room 7?", "What day was record 3 checked?"]
    sampling = ["--temp", "0.7", "--seed", "11", "-n", "16"]
    c = cli(TINY, tmp_path, press_args + sampling + sum((["--question", q] for q in qs), []))
    pipe = kvzap.pipeline(TINY, threads=1, n_ctx=512)
    p = pipe(CONTEXT, questions=qs, press=press(), temperature=0.7, seed=11, max_new_tokens=16)
    assert p["kv_stats"]["kv_lengths"].tolist() == c["kv_lengths"]
    assert p["kv_stats"]["evicted_fraction"] == c["evicted_fraction"]
    assert [d["tokens"] for d in p["details"]] == [a["tokens"] for a in c["answers"]]


def test_kvzap_press_matches_the_cli_on_the_default_model(tmp_path):
    path = default_model()
    if kvzap_bin() is None or path is None:
        print("SKIPPED: KVzap CLI parity (needs KVZAP_BIN and the pulled SmolLM2-135M-Instruct)")
        pytest.skip("no KVZAP_BIN or model")
    c = cli(path, tmp_path, ["--press", "kvzap-mlp", "--threshold", "-4", "--temp", "0", "-n", "24",
                             "--question", "Which lamp was in room 7?"])
    pipe = kvzap.pipeline("SmolLM2-135M-Instruct", threads=1, n_ctx=1024)
    p = pipe(CONTEXT, question="Which lamp was in room 7?", press=kvzap.KVzapPress(model_type="mlp", threshold=-4),
             temperature=0, max_new_tokens=24)
    assert p["kv_stats"]["kv_lengths"].tolist() == c["kv_lengths"]
    assert p["details"][0]["tokens"] == c["answers"][0]["tokens"]
