"""Every press of the engine's registry is a Python class (kvpress's names where kvpress has the press),
built from a press spec the engine checks, and runs in the pipeline."""
import re

import pytest

import kvzap

from conftest import CONTEXT, default_model

KVPRESS_NAMES = ["KnormPress", "RandomPress", "StreamingLLMPress", "SnapKVPress", "TOVAPress",
                 "ObservedAttentionPress", "ExpectedAttentionPress", "PyramidKVPress", "KeyDiffPress", "LagKVPress",
                 "ChunkKVPress", "CURPress", "CompactorPress", "KVzipPress", "KVzapPress", "AdaKVPress", "DMSPress",
                 "SimLayerKVPress", "NonCausalAttnPress", "LeverageScorePress", "CapPress", "EntropyGatedChunkKVPress",
                 "ChunkPress", "BlockPress", "CriticalKVPress", "CriticalAdaKVPress",
                 "PerLayerCompressionPress", "ComposedPress", "DecodingPress", "CompressionRatioDecodingPress",
                 "PrefillDecodingPress"]


def test_kvpress_class_names_exist():
    for name in KVPRESS_NAMES:
        assert issubclass(getattr(kvzap, name), kvzap.BasePress), name


def test_every_registry_press_has_a_class():
    for entry in kvzap.presses():
        cls = getattr(kvzap, entry["python_class"], None)
        assert cls is not None, entry
        assert issubclass(cls, kvzap.BasePress)


def press_classes():
    seen, out = set(), []
    for entry in kvzap.presses():
        if entry["name"].startswith("adakv_") or entry["python_class"] in seen:
            continue
        seen.add(entry["python_class"])
        out.append(entry["python_class"])
    return out


@pytest.mark.parametrize("cls_name", press_classes())
def test_every_press_class_runs(cls_name, tiny):
    cls = getattr(kvzap, cls_name)
    entry = next(e for e in kvzap.presses() if e["python_class"] == cls_name)
    if entry["own_budget"]:  # it takes no ratio (SimLayerKV): the registry's demonstration settings
        with pytest.raises(kvzap.Error, match="ratio"):
            cls(compression_ratio=0.25)
        press = cls(**entry["demo_params"])
        out = tiny(CONTEXT, question="Which lamp?", press=press, max_new_tokens=2, temperature=0)
        assert 0 < out["kv_stats"]["evicted_fraction"] < 1, (cls_name, out["kv_stats"])
        return
    press = cls(compression_ratio=0.25)
    assert press.spec["ratio"] == 0.25
    if entry["needs_query_stats"]:
        # No `kvzap query-stats` file for the tiny model: the engine's message names the command.
        with pytest.raises(kvzap.Error, match="query-stats"):
            tiny(CONTEXT, question="Which lamp?", press=press, max_new_tokens=2)
        return
    if cls_name == "KVzapPress":
        # The tiny model has no shipped surrogate: the engine's message, as a Python exception.
        with pytest.raises(kvzap.Error, match="surrogate"):
            tiny(CONTEXT, question="Which lamp?", press=press, max_new_tokens=2)
        return
    out = tiny(CONTEXT, question="Which lamp?", press=press, max_new_tokens=2, temperature=0)
    st = out["kv_stats"]
    assert st["press"] != "none"
    assert 0.1 < st["evicted_fraction"] < 0.4, (cls_name, st["evicted_fraction"])
    assert st["kv_bytes"] < st["kv_bytes_full"]


def test_kvpress_ratio_scope_comes_from_the_registry():
    scopes = {e["name"]: e["kvpress_ratio_scope"] for e in kvzap.presses()}
    assert kvzap.KVzipPress(compression_ratio=0.5).spec["ratio_scope"] == scopes["kvzip"] == "global"
    assert kvzap.KnormPress(compression_ratio=0.5).spec["ratio_scope"] == scopes["knorm"]


def test_wrappers():
    ada = kvzap.AdaKVPress(kvzap.SnapKVPress(compression_ratio=0.5))
    assert ada.spec["press"] == "adakv_snapkv" and ada.spec["ratio"] == 0.5
    dms = kvzap.DMSPress(kvzap.KnormPress(), threshold=-3.0, decoding=True, sliding_window_size=64)
    assert dms.spec["press"] == "dms_knorm" and dms.spec["threshold"] == -3.0
    assert dms.spec["decoding"] is True and dms.spec["window"] == 64
    # DMSPress(press) is the registry's dms_<press> around any press; the press's arguments pass through.
    dsnap = kvzap.DMSPress(kvzap.SnapKVPress(window_size=32), threshold=0.001)
    assert dsnap.spec["press"] == "dms_snapkv" and dsnap.spec["window_size"] == 32 and dsnap.spec["window"] == 128
    with pytest.raises(kvzap.Error, match="window_size"):
        kvzap.DMSPress(kvzap.SnapKVPress(), threshold=0.001, window_size=0)
    kz = kvzap.KVzapPress(model_type="linear", threshold=-4)
    assert kz.spec["press"] == "kvzap-linear" and kz.spec["threshold"] == -4
    # kvpress's other wrappers name registered presses: ChunkPress(SnapKVPress) is chunk_snapkv, ...
    ch = kvzap.ChunkPress(kvzap.SnapKVPress(compression_ratio=0.5, window_size=32), chunk_length=256)
    assert ch.spec["press"] == "chunk_snapkv" and ch.spec["ratio"] == 0.5
    assert ch.spec["chunk_length"] == 256 and ch.spec["window_size"] == 32, ch.spec
    assert kvzap.CriticalKVPress(kvzap.ExpectedAttentionPress(compression_ratio=0.5)).spec["press"] == \
        "critical_expected_attention"
    assert kvzap.CriticalAdaKVPress(kvzap.SnapKVPress(compression_ratio=0.5)).spec["press"] == "critical_adakv_snapkv"
    assert kvzap.BlockPress(kvzap.KeyDiffPress(compression_ratio=0.5), block_size=64).spec["press"] == "block_keydiff"
    with pytest.raises(kvzap.Error, match="ChunkPress.*snapkv"):
        kvzap.ChunkPress(kvzap.KVzipPress(compression_ratio=0.5))
    assert kvzap.SimLayerKVPress is not None  # kvpress's class name, not a CamelCase of simlayerkv


def test_adakv_and_dms_run(tiny):
    ada = kvzap.AdaKVPress(kvzap.KnormPress(compression_ratio=0.5))
    st = tiny(CONTEXT, question="Which lamp?", press=ada, max_new_tokens=2, temperature=0)["kv_stats"]
    assert abs(st["evicted_fraction"] - 0.5) < 0.05
    dms = kvzap.DMSPress(kvzap.RandomPress(), threshold=0.5, sliding_window_size=16)
    st = tiny(CONTEXT, question="Which lamp?", press=dms, max_new_tokens=2, temperature=0)["kv_stats"]
    assert 0.2 < st["evicted_fraction"] < 0.8


def test_per_layer_compression_press(tiny):
    p = kvzap.PerLayerCompressionPress(kvzap.SnapKVPress(window_size=16), compression_ratios=[0.0, 0.5])
    assert p.spec["press"] == "per_layer_snapkv" and p.spec["ratios"] == [0.0, 0.5], p.spec
    assert p.spec["window_size"] == 16 and "ratio" not in p.spec and p.compression_ratio == 0.25
    with pytest.raises(kvzap.Error, match=r"ratios.*ratio 1 is 1\.5.*\[0, 1\)"):
        kvzap.PerLayerCompressionPress(kvzap.KnormPress(), compression_ratios=[0.5, 1.5])
    # One ratio per layer of the model, checked when the pipeline builds the press.
    with pytest.raises(kvzap.Error, match=r"one ratio per layer: the model has \d+ layers, 1000 ratios given") as e:
        tiny(CONTEXT, press=kvzap.PerLayerCompressionPress(kvzap.KnormPress(), [0.5] * 1000), max_new_tokens=1)
    n_layer = int(re.search(r"the model has (\d+) layers", str(e.value)).group(1))
    ratios = [0.5] * n_layer
    ratios[0] = 0.0 if n_layer > 1 else 0.5  # a whole layer among them where the model has several
    st = tiny(CONTEXT, question="Which lamp?", press=kvzap.PerLayerCompressionPress(kvzap.KnormPress(), ratios),
              max_new_tokens=2, temperature=0)["kv_stats"]
    want = sum(ratios) / n_layer
    assert abs(st["evicted_fraction"] - want) < 0.05, (st, want)


def test_composed_press(tiny):
    p = kvzap.ComposedPress([kvzap.KnormPress(compression_ratio=0.5), kvzap.KnormPress(compression_ratio=0.5)])
    assert p.spec["press"] == "composed_knorm+knorm" and p.spec["ratios"] == [0.5, 0.5], p.spec
    st = tiny(CONTEXT, question="Which lamp?", press=p, max_new_tokens=2, temperature=0)["kv_stats"]
    assert abs(st["evicted_fraction"] - 0.75) < 0.05, st  # the product of what each keeps
    with pytest.raises(kvzap.Error, match="later stage must score each entry alone"):
        tiny(CONTEXT, press=kvzap.ComposedPress([kvzap.KnormPress(compression_ratio=0.5),
                                                 kvzap.SnapKVPress(compression_ratio=0.5)]), max_new_tokens=1)


def test_decoding_press(tiny):
    # kvpress DecodingPress(base_press, compression_interval, target_size): the base press's ratio is replaced.
    p = kvzap.DecodingPress(kvzap.KnormPress(compression_ratio=0.5), compression_interval=2, target_size=16)
    assert p.spec["press"] == "decoding_knorm" and "ratio" not in p.spec, p.spec
    assert p.spec["compression_interval"] == 2 and p.spec["target_size"] == 16
    r = kvzap.CompressionRatioDecodingPress(kvzap.KnormPress(), target_compression_ratio=0.25, compression_interval=4)
    assert r.spec["press"] == "compression_ratio_decoding_knorm" and r.spec["target_compression_ratio"] == 0.25, r.spec
    with pytest.raises(kvzap.Error, match="target_size"):
        kvzap.DecodingPress(kvzap.KnormPress(), target_size=0)
    with pytest.raises(kvzap.Error, match="token by token"):
        tiny(CONTEXT, press=kvzap.DecodingPress(kvzap.SnapKVPress()), max_new_tokens=1)
    for press in (p, r):
        out = tiny(CONTEXT, question="Which lamp?", press=press, max_new_tokens=6, temperature=0)
        assert isinstance(out["answer"], str)


def test_prefill_decoding_press(tiny):
    # kvpress PrefillDecodingPress(prefilling_press, decoding_press): the context by the first, decoding by the second.
    d = kvzap.DecodingPress(kvzap.KnormPress(), compression_interval=2, target_size=16)
    p = kvzap.PrefillDecodingPress(kvzap.SnapKVPress(compression_ratio=0.5, window_size=8), d)
    assert p.spec["press"] == "prefill_decoding_snapkv+decoding_knorm", p.spec
    assert p.spec["ratio"] == 0.5 and p.spec["window_size"] == 8 and p.spec["target_size"] == 16, p.spec
    out = tiny(CONTEXT, question="Which lamp?", press=p, max_new_tokens=6, temperature=0)
    assert isinstance(out["answer"], str) and out["kv_stats"]["evicted_fraction"] > 0.4, out["kv_stats"]
    # With one side None it is the other press (as kvpress); with neither, refused.
    assert kvzap.PrefillDecodingPress(decoding_press=d).spec == d.spec
    k = kvzap.KnormPress(compression_ratio=0.25)
    assert kvzap.PrefillDecodingPress(prefilling_press=k).spec == k.spec
    with pytest.raises(kvzap.Error, match="give a prefilling_press, a decoding_press or both"):
        kvzap.PrefillDecodingPress()
    with pytest.raises(kvzap.Error, match="DecodingPress or CompressionRatioDecodingPress"):
        kvzap.PrefillDecodingPress(k, kvzap.KnormPress(compression_ratio=0.5))
    with pytest.raises(kvzap.Error, match="cannot use a threshold"):
        tiny(CONTEXT, press=kvzap.PrefillDecodingPress(kvzap.SnapKVPress(threshold=-1.0), d), max_new_tokens=1)
    r = kvzap.PrefillDecodingPress(kvzap.KVzapPress(model_type="linear", threshold=-4),
                                   kvzap.CompressionRatioDecodingPress(kvzap.KnormPress(), compression_interval=4))
    assert r.spec["press"] == "prefill_decoding_kvzap-linear+compression_ratio_decoding_knorm", r.spec
    assert r.spec["threshold"] == -4 and r.spec["compression_interval"] == 4, r.spec


def test_key_rerotation_press(tiny):
    # kvpress KeyRerotationPress(press): the press's kept set, its kept keys re-rotated to contiguous positions.
    p = kvzap.KeyRerotationPress(kvzap.SnapKVPress(compression_ratio=0.5, window_size=8))
    assert p.spec["press"] == "key_rerotation_snapkv" and p.spec["ratio"] == 0.5 and p.spec["window_size"] == 8, p.spec
    out = tiny(CONTEXT, question="Which lamp?", press=p, max_new_tokens=6, temperature=0)
    plain = tiny(CONTEXT, question="Which lamp?", press=kvzap.SnapKVPress(compression_ratio=0.5, window_size=8),
                 max_new_tokens=6, temperature=0)
    assert out["kv_stats"]["evicted_fraction"] == plain["kv_stats"]["evicted_fraction"] > 0.4, out["kv_stats"]
    with pytest.raises(kvzap.Error, match="needs a compression_ratio"):
        kvzap.KeyRerotationPress(kvzap.KnormPress(threshold=-3.0))
    with pytest.raises(kvzap.Error, match="must be a kvzap press"):
        kvzap.KeyRerotationPress("knorm")


def test_kvzap_on_the_default_model(smol):
    for model_type in ("mlp", "linear"):
        out = smol(CONTEXT, question="Which lamp was in room 7?", press=kvzap.KVzapPress(model_type=model_type,
                   threshold=-4), max_new_tokens=4, temperature=0)
        assert 0 < out["kv_stats"]["evicted_fraction"] < 1


def test_families_and_kvpress_gaps_are_listed():
    families = {f["kvpress_class"]: f for f in kvzap.press_families()}
    assert set(families) == {"AdaKVPress", "DMSPress", "PerLayerCompressionPress", "ComposedPress", "DecodingPress",
                             "CompressionRatioDecodingPress", "PrefillDecodingPress", "KeyRerotationPress"}
    for cls, f in families.items():
        assert issubclass(getattr(kvzap, cls), kvzap.BasePress), cls  # each family has its Python class
        assert f["example"] not in {p["name"] for p in kvzap.presses()}, f  # a family member, not an entry
    gaps = {g["kvpress_class"]: g for g in kvzap.kvpress_gaps()}
    assert "DuoAttentionPress" in gaps and gaps["DuoAttentionPress"]["reason"]
    assert "QFilterPress" not in gaps and "ExpectedAttentionStatsPress" not in gaps  # landed (issue 38)
    for cls in gaps:
        assert not hasattr(kvzap, cls), f"{cls} is listed as missing but the package has it"


def test_nested_arguments_that_a_flat_spec_cannot_hold_are_refused():
    # CriticalKVPress(ExpectedAttentionPress(epsilon=...)): two epsilons, one spec field; never the inner
    # press's value taken silently as the wrapper's.
    with pytest.raises(kvzap.Error, match="inner press's epsilon has the name of CriticalKVPress's own argument"):
        kvzap.CriticalKVPress(kvzap.ExpectedAttentionPress(compression_ratio=0.5, epsilon=0.05))
    with pytest.raises(kvzap.Error, match="chunk_length"):
        kvzap.ChunkPress(kvzap.ChunkKVPress(compression_ratio=0.5, chunk_length=8))
    p = kvzap.CriticalKVPress(kvzap.ExpectedAttentionPress(compression_ratio=0.5), epsilon=0.05)
    assert p.spec["epsilon"] == 0.05 and p.spec["press"] == "critical_expected_attention", p.spec
    # ComposedPress: an argument one stage sets reaches every stage declaring it, so a different value is refused.
    with pytest.raises(kvzap.Error, match="stage 0 .* sets n_sink=8 and stage 1"):
        kvzap.ComposedPress([kvzap.LagKVPress(compression_ratio=0.5, n_sink=8),
                             kvzap.StreamingLLMPress(compression_ratio=0.5)])
    same = kvzap.ComposedPress([kvzap.LagKVPress(compression_ratio=0.5, n_sink=8),
                                kvzap.StreamingLLMPress(compression_ratio=0.5, n_sink=8)])
    assert same.spec["n_sink"] == 8, same.spec
