"""kvzap: a KV-cache pruning inference engine with a kvpress-shaped Python API.

    import kvzap
    pipe = kvzap.pipeline("SmolLM2-135M-Instruct")      # a pulled name, a GGUF path or an HF folder
    press = kvzap.ExpectedAttentionPress(compression_ratio=0.5)
    answer = pipe(context, question=question, press=press)["answer"]

This module is a thin layer: presses are JSON press specs handed to the engine (its registry owns every
press and its defaults), the pipeline is the engine's (context compressed once, each question answered on a
copy-on-write fork), and errors are the engine's messages as kvzap.Error. See docs/python.md.
"""
from __future__ import annotations

import json
import queue
import threading
import warnings
from typing import Any, Iterator, Optional

import numpy as np

from . import _kvzap
from ._kvzap import Error


__all__ = ["Error", "Pipeline", "BasePress", "pipeline", "presses", "press_families", "kvpress_gaps", "data_dir", "version", "AdaKVPress", "DMSPress"]

version = _kvzap.version()
data_dir = _kvzap.data_dir

# kvpress argument names -> press spec fields (press/press_spec.h). Anything else is refused by the engine
# with the field's name.
_ARG_FIELDS = {
    "compression_ratio": "ratio",
    "sliding_window_size": "window",
}


def _spec_fields(kwargs: dict) -> dict:
    return {_ARG_FIELDS.get(k, k): v for k, v in kwargs.items() if v is not None}


class BasePress:
    """A press: a JSON press spec (kvzap presses / press_spec.h). Arguments are checked by the engine at
    construction (kvzap.Error names a bad field); the press is built for a model when a pipeline runs it."""

    press_name: str = ""

    def __init__(self, **kwargs: Any):
        self._kwargs = dict(kwargs)
        spec = {"press": self.press_name, **self._scope(), **_spec_fields(kwargs)}
        self.spec = json.loads(_kvzap.press_spec_normalize(json.dumps(spec)))

    def _scope(self) -> dict:
        # kvpress splits a ratio budget its own way per press (the registry's kvpress_ratio_scope).
        scope = _REGISTRY.get(self.press_name, {}).get("kvpress_ratio_scope")
        return {"ratio_scope": scope} if scope else {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._kwargs.items())
        return f"{type(self).__name__}({args})"


_CATALOGUE = json.loads(_kvzap.presses())  # {"presses", "families", "kvpress_gaps"} (kvzap presses --json)
_REGISTRY = {p["name"]: p for p in _CATALOGUE["presses"]}


def _make_class(entry: dict) -> type:
    doc = entry["description"]
    return type(entry["python_class"], (BasePress,), {"press_name": entry["name"], "__doc__": doc})


# kvzap's press specs are flat (one value per parameter name), kvpress's wrappers nest: CriticalKVPress(
# ExpectedAttentionPress(epsilon=...)) has two epsilons. An inner argument that has the name of one of the
# wrapper's own arguments is refused rather than silently taken as the wrapper's. (DMSPress is not here:
# its threshold and window are the spec fields a kvzap press's own threshold= and window= set.)
_WRAPPER_OWN_ARGS = {
    "AdaKVPress": ("alpha_safeguard",),
    "ChunkPress": ("chunk_length",),
    "BlockPress": ("block_size",),
    "CriticalKVPress": ("epsilon", "first_stage_ratio"),
    "CriticalAdaKVPress": ("alpha_safeguard", "epsilon", "first_stage_ratio"),
    "DecodingPress": ("compression_interval", "target_size"),
    "CompressionRatioDecodingPress": ("target_compression_ratio", "compression_interval"),
}


def _refuse_shadowed_args(wrapper: str, press: "BasePress") -> None:
    shadowed = [k for k in _WRAPPER_OWN_ARGS.get(wrapper, ()) if press._kwargs.get(k) is not None]
    if shadowed:
        raise Error(f"{wrapper}({type(press).__name__}({shadowed[0]}=...)): the inner press's {shadowed[0]} has "
                    f"the name of {wrapper}'s own argument, and kvzap's press specs hold one value per name; pass "
                    f"it to {wrapper} if you mean {wrapper}'s, or leave the inner press's at its default")


class KVzapPress(BasePress):
    """KVzap: a surrogate predicts log KVzip+ scores from the hidden states. model_type "mlp" or "linear";
    threshold=T evicts pairs scoring below T (kvpress's DMSPress), compression_ratio=r a fixed fraction."""

    def __init__(self, model_type: str = "mlp", **kwargs: Any):
        if model_type not in ("mlp", "linear"):
            raise Error(f"KVzapPress: model_type must be 'mlp' or 'linear', got {model_type!r}")
        self.press_name = "kvzap-" + model_type
        super().__init__(**kwargs)
        self._kwargs = {"model_type": model_type, **kwargs}


class AdaKVPress(BasePress):
    """AdaKV(press): the ratio budget shared per layer by the heads, each keeping a share (the registry's
    adakv_<press>)."""

    def __init__(self, press: BasePress, **kwargs: Any):
        if not isinstance(press, BasePress):
            raise Error(f"AdaKVPress: press must be a kvzap press, got {type(press).__name__}")
        _refuse_shadowed_args("AdaKVPress", press)
        inner = {k: v for k, v in press.spec.items() if k not in ("press", "ratio_scope")}
        self.press_name = "adakv_" + press.spec["press"] if not press.spec["press"].startswith("adakv_") else press.spec["press"]
        self._kwargs = {"press": press, **kwargs}
        spec = {"press": self.press_name, **inner, **_spec_fields(kwargs)}
        self.spec = json.loads(_kvzap.press_spec_normalize(json.dumps(spec)))


def _wrapped_press(prefix: str, wrapper: str, press: "BasePress", kwargs: dict) -> tuple:
    """kvpress's wrapper presses (ChunkPress(press), CriticalKVPress(press), ...) are registered presses of
    their own, named prefix + the inner press's name (chunk_snapkv, critical_expected_attention, ...)."""
    if not isinstance(press, BasePress):
        raise Error(f"{wrapper}: press must be a kvzap press, got {type(press).__name__}")
    _refuse_shadowed_args(wrapper, press)
    name = prefix + press.spec["press"]
    if name not in _REGISTRY:
        have = sorted(n[len(prefix):] for n in _REGISTRY if n.startswith(prefix))
        raise Error(f"{wrapper}({type(press).__name__}) is not available: kvzap has {wrapper} around "
                    + ", ".join(have) + " (kvzap presses)")
    inner = {k: v for k, v in press.spec.items() if k not in ("press", "ratio_scope")}
    spec = {"press": name, **inner, **_spec_fields(kwargs)}
    return name, json.loads(_kvzap.press_spec_normalize(json.dumps(spec)))


def _wrapper_class(prefix: str, class_name: str, doc: str) -> type:
    def __init__(self, press: BasePress, **kwargs: Any):
        self.press_name, self.spec = _wrapped_press(prefix, class_name, press, kwargs)
        self._kwargs = {"press": press, **kwargs}
    return type(class_name, (BasePress,), {"__init__": __init__, "__doc__": doc})


ChunkPress = _wrapper_class("chunk_", "ChunkPress", "ChunkPress(press, chunk_length=1024): the press on each "
                            "chunk of the context alone, every chunk keeping its share (registry: chunk_<press>).")
BlockPress = _wrapper_class("block_", "BlockPress", "BlockPress(press, block_size=128): the press over the kept "
                            "entries plus each next block, keeping the budget every block (registry: block_<press>).")
CriticalKVPress = _wrapper_class("critical_", "CriticalKVPress", "CriticalKVPress(press, epsilon, first_stage_ratio): "
                                 "half the budget by the press, the rest weighted by ||W_O v|| (registry: critical_<press>).")
CriticalAdaKVPress = _wrapper_class("critical_adakv_", "CriticalAdaKVPress", "CriticalAdaKVPress(press, ...): "
                                    "CriticalKV under AdaKV's per-layer budget (registry: critical_adakv_<press>).")
__all__ += ["ChunkPress", "BlockPress", "CriticalKVPress", "CriticalAdaKVPress"]


class PerLayerCompressionPress(BasePress):
    """PerLayerCompressionPress(press, compression_ratios): the press with one compression ratio per layer of
    the model (kvpress's; registry: per_layer_<press>, the list in the spec's "ratios"). The engine checks
    that there is one ratio per layer, each in [0, 1), when the pipeline builds the press."""

    def __init__(self, press: BasePress, compression_ratios: list):
        if not isinstance(press, BasePress):
            raise Error(f"PerLayerCompressionPress: press must be a kvzap press, got {type(press).__name__}")
        # Its own ratio (kvpress's default compression_ratio 0 included) is replaced layer by layer.
        inner = {k: v for k, v in press.spec.items() if k not in ("press", "ratio_scope", "ratio", "threshold")}
        self.press_name = "per_layer_" + press.spec["press"]
        self._kwargs = {"press": press, "compression_ratios": list(compression_ratios)}
        spec = {**inner, "press": self.press_name, "ratios": [float(r) for r in compression_ratios]}
        self.spec = json.loads(_kvzap.press_spec_normalize(json.dumps(spec)))

    @property
    def compression_ratio(self) -> float:
        """The mean of the per-layer ratios (kvpress's property)."""
        r = self.spec["ratios"]
        return sum(r) / len(r)


class ComposedPress(BasePress):
    """ComposedPress(presses): the presses applied one after the other, each on what the previous kept
    (kvpress's; registry: composed_<a>+<b>, each press's compression_ratio in the spec's "ratios"). The
    presses' own parameters go to every stage that declares them."""

    def __init__(self, presses: list):
        presses = list(presses)
        if len(presses) < 2 or not all(isinstance(p, BasePress) for p in presses):
            raise Error("ComposedPress: presses must be a list of at least two kvzap presses")
        params = {}
        for p in presses:
            params.update({k: v for k, v in p.spec.items() if k not in ("press", "ratio_scope", "ratio", "threshold")})
        # The stages share one flat spec: an argument one stage sets reaches every stage that declares it, so
        # it is refused where another stage declares it too and did not set it to the same value.
        for i, p in enumerate(presses):
            for k, v in p._kwargs.items():
                if k == "compression_ratio" or v is None:
                    continue
                for j, other in enumerate(presses):
                    declared = {q["name"] for q in _REGISTRY.get(other.spec["press"], {}).get("params", [])}
                    if j != i and k in declared and other._kwargs.get(k) != v:
                        raise Error(f"ComposedPress: stage {i} ({type(p).__name__}) sets {k}={v!r} and stage {j} "
                                    f"({type(other).__name__}) declares {k} too; kvzap's press specs hold one "
                                    f"value per name, so give both the same {k}")
        self.press_name = "composed_" + "+".join(p.spec["press"] for p in presses)
        self._kwargs = {"presses": presses}
        spec = {**params, "press": self.press_name, "ratios": [float(p.spec.get("ratio", 0.0)) for p in presses]}
        self.spec = json.loads(_kvzap.press_spec_normalize(json.dumps(spec)))


def _decoding_press(self: BasePress, prefix: str, base_press: BasePress, **params: Any) -> None:
    """The spec of a decoding press: the base press's own arguments (not its budget: the family sets it) and
    the family's parameters, under the registry name prefix + the base press's."""
    if not isinstance(base_press, BasePress):
        raise Error(f"{type(self).__name__}: base_press must be a kvzap press, got {type(base_press).__name__}")
    _refuse_shadowed_args(type(self).__name__, base_press)
    inner = {k: v for k, v in base_press.spec.items() if k not in ("press", "ratio_scope", "ratio", "threshold")}
    self.press_name = prefix + base_press.spec["press"]
    self._kwargs = {"base_press": base_press, **params}
    self.spec = json.loads(_kvzap.press_spec_normalize(json.dumps({**inner, "press": self.press_name, **params})))


class DecodingPress(BasePress):
    """DecodingPress(base_press, compression_interval=512, target_size=2048): nothing evicted while the context
    is prefilled; while decoding, every compression_interval steps each head keeps its target_size best entries
    by the base press's scores (kvpress's; registry: decoding_<press>, a press that scores token by token). The
    base press's own ratio is replaced, as kvpress does; hidden_states_buffer_size is not taken (only presses
    that score the whole context would read it, and those are not available here)."""

    def __init__(self, base_press: BasePress, compression_interval: int = 512, target_size: int = 2048):
        _decoding_press(self, "decoding_", base_press, compression_interval=compression_interval,
                        target_size=target_size)


class CompressionRatioDecodingPress(BasePress):
    """CompressionRatioDecodingPress(base_press, target_compression_ratio=0.5, compression_interval=512): as
    DecodingPress, the target being max(1, int(P (1 - target_compression_ratio))) for the P tokens seen so far
    (kvpress's; registry: compression_ratio_decoding_<press>)."""

    def __init__(self, base_press: BasePress, target_compression_ratio: float = 0.5, compression_interval: int = 512):
        _decoding_press(self, "compression_ratio_decoding_", base_press,
                        target_compression_ratio=target_compression_ratio, compression_interval=compression_interval)


__all__ += ["PerLayerCompressionPress", "ComposedPress", "DecodingPress", "CompressionRatioDecodingPress"]


# The fields of a press spec that are not a press's own parameters (press_spec.h).
_SPEC_FIELDS = ("press", "threshold", "ratio", "ratio_scope", "window", "sink_tokens", "prefill_evict_every", "decoding",
                "sliding_layers", "surrogate", "seed", "ratios")


class PrefillDecodingPress(BasePress):
    """PrefillDecodingPress(prefilling_press=None, decoding_press=None): prefilling_press judges the context,
    decoding_press (a DecodingPress or CompressionRatioDecodingPress) the question and generated tokens, over
    what prefilling_press kept (kvpress's; registry: prefill_decoding_<a>+<b>). With one of them None it is the
    other press, as in kvpress. The prefilling press's ratio or threshold is the spec's; the parameters of both
    share one flat spec, so a name both declare must have one value."""

    def __init__(self, prefilling_press: Optional[BasePress] = None, decoding_press: Optional[BasePress] = None):
        for arg, p in (("prefilling_press", prefilling_press), ("decoding_press", decoding_press)):
            if p is not None and not isinstance(p, BasePress):
                raise Error(f"PrefillDecodingPress: {arg} must be a kvzap press or None, got {type(p).__name__}")
        if prefilling_press is None and decoding_press is None:
            raise Error("PrefillDecodingPress: give a prefilling_press, a decoding_press or both (with neither it "
                        "would compress nothing)")
        if decoding_press is not None and not isinstance(decoding_press, (DecodingPress, CompressionRatioDecodingPress)):
            raise Error(f"PrefillDecodingPress: decoding_press must be a DecodingPress or CompressionRatioDecodingPress, "
                        f"got {type(decoding_press).__name__}")
        self._kwargs = {"prefilling_press": prefilling_press, "decoding_press": decoding_press}
        only = decoding_press if prefilling_press is None else prefilling_press if decoding_press is None else None
        if only is not None:
            self.press_name, self.spec = only.press_name, dict(only.spec)
            return
        a, b = prefilling_press.spec, decoding_press.spec
        # The decoding press's own parameters (and surrogate); the spec's other fields are the prefilling press's.
        own = {k: v for k, v in b.items() if k not in _SPEC_FIELDS or k == "surrogate"}
        for k, v in own.items():
            if k in a and a[k] != v:
                raise Error(f"PrefillDecodingPress: the prefilling press sets {k}={a[k]!r} and the decoding press "
                            f"{k}={v!r}; kvzap's press specs hold one value per name, so give both the same {k}")
        self.press_name = f"prefill_decoding_{a['press']}+{b['press']}"
        spec = {**own, **a, "press": self.press_name}
        self.spec = json.loads(_kvzap.press_spec_normalize(json.dumps(spec)))


__all__ += ["PrefillDecodingPress"]


class KeyRerotationPress(BasePress):
    """KeyRerotationPress(press): the press compresses the context under its compression_ratio, then each head's
    kept keys are re-rotated to contiguous positions 0..n_kept-1 (kvpress's; registry: key_rerotation_<press>).
    The inner press's ratio and arguments are the spec's."""

    def __init__(self, press: BasePress):
        if not isinstance(press, BasePress):
            raise Error(f"KeyRerotationPress: press must be a kvzap press, got {type(press).__name__}")
        if press.spec.get("ratio") is None:
            raise Error(f"KeyRerotationPress({type(press).__name__}): the press needs a compression_ratio "
                        "(kvpress's KeyRerotationPress wraps a ScorerPress's ratio)")
        self.press_name = "key_rerotation_" + press.spec["press"]
        self._kwargs = {"press": press}
        self.spec = json.loads(_kvzap.press_spec_normalize(json.dumps({**press.spec, "press": self.press_name})))


__all__ += ["KeyRerotationPress"]


class DMSPress(BasePress):
    """DMSPress(press, threshold, sliding_window_size=128, decoding=False): entries the press scores below
    the threshold are evicted, the most recent sliding_window_size tokens kept, as kvpress's DMSPress (the
    registry's dms_<press>; decoding=True needs a per-token press)."""

    def __init__(self, press: BasePress, threshold: Optional[float] = None, decoding: Optional[bool] = None,
                 sliding_window_size: Optional[int] = None, **kwargs: Any):
        if not isinstance(press, BasePress):
            raise Error(f"DMSPress: press must be a kvzap press, got {type(press).__name__}")
        inner = {k: v for k, v in press.spec.items() if k not in ("press", "ratio", "ratio_scope")}
        name = press.spec["press"]
        self.press_name = name if name.startswith("dms_") else "dms_" + name
        self._kwargs = {"press": press, "threshold": threshold, "decoding": decoding,
                        "sliding_window_size": sliding_window_size, **kwargs}
        spec = {"press": self.press_name, **inner, **_spec_fields({"threshold": threshold, "decoding": decoding,
                                         "sliding_window_size": sliding_window_size, **kwargs})}
        self.spec = json.loads(_kvzap.press_spec_normalize(json.dumps(spec)))


for _entry in _REGISTRY.values():
    _cls_name = _entry["python_class"]
    if _cls_name in globals():
        continue
    globals()[_cls_name] = _make_class(_entry)
    __all__.append(_cls_name)
__all__.append("KVzapPress")


def presses() -> list:
    """Every press of the engine's registry: name, description, Python class, whether kvpress has it."""
    return list(_REGISTRY.values())


def press_families() -> list:
    """The name families built around any press (adakv_<press>, dms_<press>, per_layer_<press>,
    composed_<a>+<b>): pattern, kvpress class, an example name, description, kvpress parity."""
    return list(_CATALOGUE["families"])


def kvpress_gaps() -> list:
    """kvpress's presses that kvzap does not have: kvpress class, the name it would have, and why."""
    return list(_CATALOGUE["kvpress_gaps"])


class Pipeline:
    """The kvpress pipeline on the engine: pipe(context, question=..., press=...) -> {"answer": ...}."""

    def __init__(self, model: Optional[str] = None, *, threads: int = 0, n_ctx: int = 0, n_batch: int = 0,
                 kv_type: Optional[str] = None, quantize: Optional[str] = None, kv_budget: Optional[int] = None):
        load = {"quantize": quantize} if quantize else {}
        self.model = _kvzap.Model(model or "", json.dumps(load))
        opts = {"threads": threads, "n_ctx": n_ctx, "n_batch": n_batch}
        if kv_type:
            opts["kv_type"] = kv_type
        if kv_budget is not None:
            opts["kv_budget"] = kv_budget
        self.engine = _kvzap.Engine(self.model, json.dumps(opts))
        self.info = json.loads(self.model.info())
        self._presses: dict = {}

    def _press(self, press: Optional[BasePress]):
        if press is None:
            return None
        if not isinstance(press, BasePress):
            raise Error(f"press must be a kvzap press (kvzap.presses()), got {type(press).__name__}")
        key = json.dumps(press.spec, sort_keys=True)
        if key not in self._presses:
            self._presses[key] = _kvzap.Press(self.model, key)
        return self._presses[key]

    def _request(self, context, question, questions, gen) -> dict:
        if question is not None and questions is not None:
            raise Error("give question or questions, not both")
        qs = [question] if question is not None else list(questions or [])
        req = {"context": context, "questions": qs}
        req.update({k: v for k, v in gen.items() if v is not None})
        return req

    @staticmethod
    def _stats(r: dict) -> dict:
        keys = ("n_context_tokens", "context_seconds", "press", "press_spec", "evicted_fraction", "kv_bytes",
                "kv_bytes_full", "evicted_fraction_end", "kv_bytes_end", "kv_bytes_full_end")
        stats = {k: r[k] for k in keys}
        stats["kv_lengths"] = np.asarray(r["kv_lengths"], dtype=np.int64)
        return stats

    def __call__(self, context: str, question: Optional[str] = None, questions: Optional[list] = None,
                 press: Optional[BasePress] = None, *, max_new_tokens: Optional[int] = None,
                 temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
                 min_p: Optional[float] = None, seed: Optional[int] = None, stop: Optional[list] = None,
                 chat: Optional[bool] = None, answer_prefix: Optional[str] = None, stream: bool = False):
        """Compress `context` once under `press`, answer each question on its own fork. Returns
        {"answer": text} for question=..., {"answers": [...]} for questions=[...], with "kv_stats" and the
        per-answer "details" (tokens, stop reason, timings). stream=True returns an iterator of text pieces
        instead (its .result is that dictionary once exhausted). Sampling defaults are `kvzap generate`'s;
        temperature=0 is greedy."""
        gen = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                   seed=seed, stop=stop, chat=chat, answer_prefix=answer_prefix)
        req = self._request(context, question, questions, gen)
        p = self._press(press)
        single = question is not None
        if stream:
            return _Stream(self, json.dumps(req), p, single)
        return self._result(json.loads(self.engine.pipeline_run(json.dumps(req), p, None)), single)

    def _result(self, r: dict, single: bool) -> dict:
        answers = [a["text"] for a in r["answers"]]
        out: dict = {"answer": answers[0]} if single else {"answers": answers}
        out["details"] = r["answers"]
        out["kv_stats"] = self._stats(r)
        out["context_tokens"] = r["context_tokens"]
        return out

    # Lower-level access: tokenizer, chat template, sequences (prefill under a press, fork, decode).
    def tokenize(self, text: str, add_bos: bool = False, parse_special: bool = True) -> list:
        return self.model.tokenize(text, add_bos, parse_special)

    def detokenize(self, ids: list, skip_special: bool = False) -> str:
        return self.model.detokenize(ids, skip_special).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list, add_generation_prompt: bool = True) -> str:
        return self.model.apply_chat_template(json.dumps(messages), add_generation_prompt)

    def record(self, text_or_ids, add_bos: bool = True):
        """Prefills a context without a press and records what a press sees, per layer: .tensor("h", layer)
        is a read-only numpy view [n_tok, n_embd] of the post-norm hidden states KVzap scores; "q", "k", "v"
        give [n_tok, heads, head_dim] (after RoPE). step= selects a forward step when n_batch cut the
        context (.n_steps)."""
        ids = self.tokenize(text_or_ids, add_bos=add_bos) if isinstance(text_or_ids, str) else list(text_or_ids)
        return self.engine.record_context(ids)

    def kvzap_scores(self, recording, press: "BasePress", layer: int, step: int = 0):
        """The scores `press` (a KVzapPress) gives the tokens of a recording (Pipeline.record) at one layer:
        [n_tok, KV head] predicted log KVzip+ scores, what its threshold is compared with."""
        return _kvzap.kvzap_scores(self.model, json.dumps(press.spec), recording, layer, step)

    def kvzip_targets(self, text: str, n_sample: int = 64, seed: int = 0):
        """KVzip+ targets of a text (what `kvzap collect` stores): .log_scores [layer, KV head, n_text] numpy
        view of the log KVzip+ score of every text position, .x [n_sample, layer, n_embd] the hidden states h
        at .sample (text offsets): the surrogate's training pairs are (x[s, l], log_scores[l, :, sample[s]])."""
        return self.engine.kvzip_targets(text, n_sample, seed)

    def new_sequence(self):
        return self.engine.new_sequence()

    def press(self, press: Optional[BasePress]):
        """The engine-side press for a spec (validated against this model), for Sequence.prefill."""
        return self._press(press)


class _Stream:
    """Text pieces of a pipeline call as the engine produces them. The call runs in a worker thread with the
    GIL released; pieces cross through a queue. Closing the iterator early stops the generation."""

    _END = object()

    def __init__(self, pipe: Pipeline, request: str, press, single: bool):
        self._pipe, self._single = pipe, single
        self._q: queue.Queue = queue.Queue()
        self._stop = False
        self.result: Optional[dict] = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, args=(request, press), daemon=True)
        self._thread.start()

    def _run(self, request, press):
        def on_text(qi, piece):
            self._q.put((qi, piece))
            return not self._stop

        try:
            self.result = self._pipe._result(json.loads(self._pipe.engine.pipeline_run(request, press, on_text)),
                                             self._single)
        except BaseException as e:  # re-raised in the consumer
            self._error = e
        finally:
            self._q.put(self._END)

    def __iter__(self) -> Iterator[str]:
        return self._pieces()

    def _pieces(self) -> Iterator[str]:
        try:
            while True:
                item = self._q.get()
                if item is self._END:
                    break
                yield item[1] if self._single else item
        finally:
            self._stop = True
            self._thread.join()
        if self._error is not None:
            raise self._error


def pipeline(model_or_task: Optional[str] = None, *args: Any, **kwargs: Any) -> Pipeline:
    """A pulled model name, a GGUF file or a Hugging Face checkpoint folder (None: the default pulled model).
    Keyword arguments: threads, n_ctx, n_batch, kv_type, quantize, kv_budget.

    kvpress's own call shape also works: pipeline("kv-press-text-generation", model=..., device=...,
    model_kwargs=...). The engine runs on the CPU: `device` and `model_kwargs` (torch settings) are accepted
    and ignored, with a warning when they ask for something else."""
    if model_or_task == "kv-press-text-generation" or model_or_task is None:
        model = kwargs.pop("model", None)
    else:
        model = model_or_task
    device = kwargs.pop("device", None)
    model_kwargs = kwargs.pop("model_kwargs", None)
    kwargs.pop("torch_dtype", None)
    if args:
        raise Error(f"pipeline: unexpected positional arguments {args!r}")
    if device is not None and str(device) not in ("cpu", "auto"):
        warnings.warn(f"kvzap runs on the CPU; device={device!r} is ignored", stacklevel=2)
    if model_kwargs:
        warnings.warn(f"kvzap ignores model_kwargs={model_kwargs!r} (torch settings)", stacklevel=2)
    return Pipeline(model, **kwargs)


from . import eval  # noqa: E402  (kvzap.eval.ruler)
from . import train  # noqa: E402  (kvzap.train.linear)
