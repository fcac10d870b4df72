"""Bad paths and bad arguments raise kvzap.Error with the engine's message, never a crash."""
import pytest

import kvzap

from conftest import CONTEXT


def test_bad_model_path():
    with pytest.raises(kvzap.Error, match="/no/such/model.gguf"):
        kvzap.pipeline("/no/such/model.gguf")


def test_not_a_model_file(tmp_path):
    bad = tmp_path / "junk.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 60)
    with pytest.raises(kvzap.Error):
        kvzap.pipeline(str(bad))


def test_bad_press_arguments():
    with pytest.raises(kvzap.Error, match="ratio"):
        kvzap.KnormPress(compression_ratio=1.5)
    with pytest.raises(kvzap.Error, match="unknown field 'press.window_size'.*parameter of press 'knorm': none"):
        kvzap.KnormPress(compression_ratio=0.5, window_size=64)
    with pytest.raises(kvzap.Error, match="'press.window_size' must be an integer in"):
        kvzap.SnapKVPress(compression_ratio=0.5, window_size=0)
    with pytest.raises(kvzap.Error, match="either 'threshold' or 'ratio'"):
        kvzap.KnormPress(compression_ratio=0.5, threshold=1.0)
    with pytest.raises(kvzap.Error, match="model_type"):
        kvzap.KVzapPress(model_type="transformer")


def test_policy_the_press_does_not_take(tiny):
    with pytest.raises(kvzap.Error):
        tiny(CONTEXT, question="q", press=kvzap.SnapKVPress(threshold=0.1), max_new_tokens=1)


def test_bad_generation_arguments(tiny):
    with pytest.raises(kvzap.Error, match="max_new_tokens"):
        tiny(CONTEXT, question="q", max_new_tokens=-1)
    with pytest.raises(kvzap.Error, match="top_p"):
        tiny(CONTEXT, question="q", top_p=2.0)
    with pytest.raises(kvzap.Error, match="press must be a kvzap press"):
        tiny(CONTEXT, question="q", press="knorm")
    with pytest.raises(kvzap.Error, match="not both"):
        tiny(CONTEXT, question="q", questions=["r"])


def test_context_too_long(tiny):
    with pytest.raises(kvzap.Error, match="longer than the context"):
        tiny(CONTEXT * 40, question="q", max_new_tokens=1)


def test_callback_exception_propagates(tiny):
    def boom(qi, piece):
        raise ValueError("from the callback")
    with pytest.raises(ValueError, match="from the callback"):
        tiny.engine.pipeline_run('{"context": "some text here", "questions": ["q"], "max_new_tokens": 4}', None, boom)


def test_bad_cache_file(tiny, tmp_path):
    seq = tiny.new_sequence()
    p = tmp_path / "bad.kvzc"
    p.write_bytes(b"not a cache")
    with pytest.raises(kvzap.Error, match="bad.kvzc"):
        seq.load(str(p))


def test_bad_token_ids(tiny):
    seq = tiny.new_sequence()
    with pytest.raises(kvzap.Error, match="out of range"):
        seq.prefill([10 ** 8])
