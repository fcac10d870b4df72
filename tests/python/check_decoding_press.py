#!/usr/bin/env python3
"""decoding_knorm against kvpress DecodingPress(KnormPress(), compression_interval, target_size) (issue 38;
docs/PARITY.md), on the pattern of check_dms_decoding.py: the context prefilled (DecodingPress leaves it
whole), the question in one step (as kvpress's pipeline feeds it), then N_ANSWER answer tokens one per step,
kvzap teacher-forced on kvpress's greedy tokens so both judge the same tokens. The cache is compressed every
COMPRESSION_INTERVAL steps to TARGET_SIZE entries per head; the same for CompressionRatioDecodingPress, whose
target is TARGET_RATIO of the tokens seen so far. Compared: every (layer, KV head)'s kept positions
at the end, and kvzap's greedy token at each step against kvpress's.

kvpress keeps no positions (its compression gathers the kept keys in score order): this script follows them by
wrapping DecodingPress.compress and matching each kept key row to the row it was gathered from.

Two halves in two environments: this script runs kvpress (torch, transformers, kvpress: the peers' venv) and
the same script with --kvzap-side under KVZAP_PY (a python with the kvzap package, e.g. the one
scripts/test_python_pkg.sh makes: build/venv-py/bin/python). Prints SKIPPED without them.
Usage: KVZAP_PY=build/venv-py/bin/python /work/venv-parity/bin/python tests/python/check_decoding_press.py
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
COMPRESSION_INTERVAL, TARGET_SIZE, TARGET_RATIO, N_ANSWER = 8, 96, 0.5, 40
# kvzap press -> kvpress class and arguments (the base press: KnormPress)
VARIANTS = {
    "decoding_knorm": ("DecodingPress", dict(compression_interval=COMPRESSION_INTERVAL, target_size=TARGET_SIZE)),
    "compression_ratio_decoding_knorm": ("CompressionRatioDecodingPress",
                                         dict(compression_interval=COMPRESSION_INTERVAL,
                                              target_compression_ratio=TARGET_RATIO)),
}


def kvpress_side(tmp):
    sys.path.insert(0, HERE)
    saved, sys.argv = sys.argv, [sys.argv[0]]
    import check_kvpress_parity as C
    sys.argv = saved
    import torch
    import kvpress as K
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, DynamicCache
    import transformers
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.set_num_threads(2)
    out = {}
    for kind, seed in (("llama", 11), ("smollm2", 12)):
        d = os.path.join(tmp, kind)
        C.write_model(d, kind, seed)
        tok = PreTrainedTokenizerFast.from_pretrained(d)
        m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="sdpa", dtype=torch.float32).eval()
        n_layer, n_kv = m.config.num_hidden_layers, m.config.num_key_value_heads
        for (variant, (cls, kw)), (c, text) in ((v, t) for v in VARIANTS.items() for t in enumerate(C.contexts())):
            ids, q = C.pipeline_ids(tok, text, C.QUESTION)
            press = getattr(K, cls)(K.KnormPress(), **kw)
            # pos[l][h]: the position of each cache row, in the cache's order.
            pos = [[[] for _ in range(n_kv)] for _ in range(n_layer)]
            n_compressions = [0]
            inner = press.compress

            def compress(module, hidden_states, keys, values, attentions, kwargs, inner=inner, pos=pos):
                k2, v2 = inner(module, hidden_states, keys, values, attentions, kwargs)
                l = module.layer_idx
                n_compressions[0] += 1
                for h in range(keys.shape[1]):
                    eq = (k2[0, h][:, None, :] == keys[0, h][None, :, :]).all(-1)  # [kept, T]
                    assert bool(eq.any(-1).all()), "a kept key matches no row"
                    pos[l][h] = [pos[l][h][i] for i in eq.float().argmax(-1).tolist()]
                return k2, v2

            press.compress = compress

            def step(tokens, first):
                for layer in pos:
                    for p in layer:
                        p.extend(range(first, first + len(tokens)))
                return m(input_ids=torch.tensor([tokens]), past_key_values=cache,
                         position_ids=torch.tensor([list(range(first, first + len(tokens)))]))

            cache, T, ans = DynamicCache(), len(ids), []
            with torch.no_grad(), press(m):
                step(ids, 0)
                o = step(q, T)
                for i in range(N_ANSWER):
                    ans.append(int(o.logits[0, -1].argmax()))
                    o = step([ans[-1]], T + len(q) + i)
            n = T + len(q) + N_ANSWER
            for l in range(n_layer):
                assert cache.layers[l].keys.shape[2] == len(pos[l][0])
            kept = [[sorted(pos[l][h]) for h in range(n_kv)] for l in range(n_layer)]
            out["%s/%s/%d" % (variant, kind, c)] = dict(model=d, ids=ids, q=q, ans=ans, kept=kept, n=n,
                                                        compressions=n_compressions[0], variant=variant)
    return out


def kvzap_side(ref):
    import numpy as np
    import kvzap
    pipes, res = {}, {}
    for key, r in ref.items():
        if r["model"] not in pipes:
            pipes[r["model"]] = kvzap.pipeline(r["model"], kv_type="f32", threads=2, n_ctx=4096)
        pipe = pipes[r["model"]]
        seq = pipe.new_sequence()
        press = getattr(kvzap, VARIANTS[r["variant"]][0])(kvzap.KnormPress(), **VARIANTS[r["variant"]][1])
        seq.prefill(r["ids"], pipe.press(press))
        seq.feed(r["q"])
        ans = []
        for t in r["ans"]:
            ans.append(int(np.argmax(seq.logits())))
            seq.feed([t])
        mask = seq.kept_mask()
        res[key] = dict(ans=ans, kept=[[np.nonzero(mask[l, h])[0].tolist() for h in range(mask.shape[1])]
                                       for l in range(mask.shape[0])])
    return res


def main():
    if "--kvzap-side" in sys.argv:
        json.dump(kvzap_side(json.load(open(sys.argv[-2]))), open(sys.argv[-1], "w"))
        return 0
    py = os.environ.get("KVZAP_PY")
    try:
        import torch  # noqa: F401
        import kvpress  # noqa: F401
    except Exception as e:  # noqa: BLE001
        print("SKIPPED: decoding press parity needs torch and kvpress (%s)" % e)
        return 0
    if not py or not os.path.exists(py):
        print("SKIPPED: decoding press parity needs KVZAP_PY, a python with the kvzap package")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        ref = kvpress_side(tmp)
        a, b = os.path.join(tmp, "ref.json"), os.path.join(tmp, "kvzap.json")
        json.dump(ref, open(a, "w"))
        subprocess.run([py, os.path.abspath(__file__), "--kvzap-side", a, b], check=True, cwd=tmp)
        got = json.load(open(b))
    heads = ident = answers = 0
    jac = []
    for key, r in ref.items():
        g = got[key]
        for l in range(len(r["kept"])):
            for h in range(len(r["kept"][l])):
                x, y = set(g["kept"][l][h]), set(r["kept"][l][h])
                jac.append(len(x & y) / len(x | y))
                heads += 1
                ident += int(x == y)
        answers += int(g["ans"] == r["ans"])
        sizes = sorted({len(h) for layer in r["kept"] for h in layer})
        print("%s: %d positions, kvpress kept %s per head after %d layer compressions, kept sets identical %s, "
              "greedy tokens identical %s" % (key, r["n"], sizes, r["compressions"], g["kept"] == r["kept"],
                                              g["ans"] == r["ans"]))
    ok = ident == heads and answers == len(ref)
    print("%s decoding_knorm (interval %d, target %d) and compression_ratio_decoding_knorm (interval %d, ratio %g): "
          "Jaccard mean %.4f min %.4f (%d/%d heads identical), greedy tokens (%d) identical %d/%d"
          % ("ok  " if ok else "FAIL", COMPRESSION_INTERVAL, TARGET_SIZE, COMPRESSION_INTERVAL, TARGET_RATIO,
             sum(jac) / len(jac), min(jac), ident, heads, N_ANSWER, answers, len(ref)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
