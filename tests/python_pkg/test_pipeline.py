"""The kvpress-shaped pipeline: one context, questions answered on forks, streaming, statistics."""
import numpy as np
import pytest

import kvzap

from conftest import CONTEXT


def test_kvpress_readme_shape(tiny):
    press = kvzap.KnormPress(compression_ratio=0.5)
    out = tiny(CONTEXT, question="Which lamp was in room 7?", press=press, max_new_tokens=8, temperature=0)
    assert isinstance(out["answer"], str)
    st = out["kv_stats"]
    assert abs(st["evicted_fraction"] - 0.5) < 0.02
    assert 0 < st["kv_bytes"] < st["kv_bytes_full"]
    kl = st["kv_lengths"]
    assert kl.ndim == 2 and kl.shape == (tiny.info["n_layer"], tiny.info["n_head_kv"])
    assert kl.sum() < st["n_context_tokens"] * kl.size
    assert out["details"][0]["stop_reason"] in ("eos", "length", "stop")


def test_questions_are_answered_on_forks(tiny):
    press = kvzap.KnormPress(compression_ratio=0.5)
    q1, q2 = "Which lamp was in room 7?", "What day was record 3 checked?"
    both = tiny(CONTEXT, questions=[q1, q2], press=press, max_new_tokens=10, temperature=0)
    assert len(both["answers"]) == 2
    # Each answer is what that question alone gets: the second question does not see the first answer.
    a1 = tiny(CONTEXT, question=q1, press=press, max_new_tokens=10, temperature=0)["details"][0]["tokens"]
    a2 = tiny(CONTEXT, question=q2, press=press, max_new_tokens=10, temperature=0)["details"][0]["tokens"]
    assert both["details"][0]["tokens"] == a1
    assert both["details"][1]["tokens"] == a2


def test_no_press_keeps_everything(tiny):
    out = tiny(CONTEXT, question="Which lamp?", max_new_tokens=2, temperature=0)
    assert out["kv_stats"]["evicted_fraction"] == 0
    assert out["kv_stats"]["press"] == "none"


def test_max_new_tokens_and_seeded_sampling(tiny):
    kw = dict(question="Tell me about the lamps.", max_new_tokens=5, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = tiny(CONTEXT, seed=7, **kw)["details"][0]
    b = tiny(CONTEXT, seed=7, **kw)["details"][0]
    assert a["tokens"] == b["tokens"]
    assert len(a["tokens"]) <= 5
    outs = {tuple(tiny(CONTEXT, seed=s, **kw)["details"][0]["tokens"]) for s in range(6)}
    assert len(outs) > 1  # the seed matters


def test_streaming_gives_the_same_text(tiny):
    press = kvzap.KnormPress(compression_ratio=0.3)
    full = tiny(CONTEXT, question="Which lamp was in room 7?", press=press, max_new_tokens=12, temperature=0)
    stream = tiny(CONTEXT, question="Which lamp was in room 7?", press=press, max_new_tokens=12, temperature=0,
                  stream=True)
    pieces = list(stream)
    assert "".join(pieces) == full["answer"]
    assert stream.result["answer"] == full["answer"]
    assert stream.result["kv_stats"]["evicted_fraction"] == full["kv_stats"]["evicted_fraction"]


def test_stream_closed_early_stops(tiny):
    it = iter(tiny(CONTEXT, question="Go on.", max_new_tokens=200, temperature=0, stream=True))
    first = next(it, None)
    it.close()  # stops the generation; must not hang or crash
    assert first is None or isinstance(first, str)
    # The pipeline still works afterwards.
    assert isinstance(tiny(CONTEXT, question="Go on.", max_new_tokens=2, temperature=0)["answer"], str)


def test_sequence_level_api(tiny):
    ids = tiny.tokenize(CONTEXT, add_bos=True)
    seq = tiny.new_sequence()
    seq.prefill(ids, tiny.press(kvzap.KnormPress(compression_ratio=0.5)))
    st = seq.kv_stats()
    assert st["n_past"] == len(ids) and abs(st["evicted_fraction"] - 0.5) < 0.02
    assert st["kept"].shape == (tiny.info["n_layer"], tiny.info["n_head_kv"])
    fork = seq.fork()
    seq.start_generation('{"temperature": 0, "max_new_tokens": 4, "stop_at_eog": false}')
    fork.start_generation('{"temperature": 0, "max_new_tokens": 4, "stop_at_eog": false}')
    a = [seq.decode_step()[0] for _ in range(4)]
    b = [fork.decode_step()[0] for _ in range(4)]
    assert a == b
    assert seq.decode_step()[1]  # finished: the limit


def test_save_and_load_compressed_cache(tiny, tmp_path):
    ids = tiny.tokenize(CONTEXT, add_bos=True)
    seq = tiny.new_sequence()
    seq.prefill(ids, tiny.press(kvzap.KnormPress(compression_ratio=0.5)))
    path = str(tmp_path / "ctx.kvzc")
    seq.save(path)
    other = tiny.new_sequence()
    other.load(path)
    assert other.kv_stats()["kv_bytes"] == seq.kv_stats()["kv_bytes"]
    assert np.array_equal(other.kv_stats()["kept"], seq.kv_stats()["kept"])
    assert np.array_equal(other.logits(), seq.logits())


def test_chat_template_and_tokenizer(smol):
    text = smol.apply_chat_template([{"role": "user", "content": "hello there"}])
    assert "hello there" in text and text.index("hello there") > 0
    ids = smol.tokenize("hello there")
    assert len(ids) == 2 and smol.detokenize(ids) == "hello there"


def test_default_model_readme_example(smol):
    context = CONTEXT
    press = kvzap.ExpectedAttentionPress(compression_ratio=0.5)
    answer = smol(context, question="Which lamp was in room 7?", press=press, max_new_tokens=16)["answer"]
    assert isinstance(answer, str) and answer
    answers = smol(context, questions=["Which lamp was in room 7?", "What day was record 3 checked?"],
                   press=kvzap.KVzapPress(model_type="mlp", threshold=-4), max_new_tokens=16)["answers"]
    assert len(answers) == 2


def test_kvpress_readme_example_verbatim(smol):
    # kvpress's README example with only the import changed (device and model_kwargs are torch settings).
    from kvzap import pipeline, ExpectedAttentionPress
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe = pipeline("kv-press-text-generation", model="SmolLM2-135M-Instruct", device="cuda:0",
                        model_kwargs={"attn_implementation": "flash_attention_2"})
    assert any("device" in str(w.message) for w in caught)
    context = "A very long text you want to compress once and for all. " + CONTEXT
    question = "\nA question about the compressed context"  # optional
    press = ExpectedAttentionPress(compression_ratio=0.5)
    answer = pipe(context, question=question, press=press)["answer"]
    assert isinstance(answer, str) and answer
