#!/usr/bin/env python3
"""decoding_knorm against kvpress DecodingPress(KnormPress(), compression_interval, target_size) (issue 38;
docs/PARITY.md), on the pattern of check_dms_decoding.py: the context prefilled (DecodingPress leaves it
whole), the question in one step (as kvpress's pipeline feeds it), then N_ANSWER answer tokens one per step,
kvzap teacher-forced on kvpress's greedy tokens so both judge the same tokens. The cache is compressed every
COMPRESSION_INTERVAL steps to TARGET_SIZE entries per head; the same for CompressionRatioDecodingPress, whose
target is TARGET_RATIO of the tokens seen so far; and PrefillDecodingPress(prefilling_press=KnormPress(0.5) or
SnapKVPress(0.5), decoding_press=DecodingPress(KnormPress(), ...)) (prefill_decoding_<a>+decoding_knorm), whose
context is cut by the prefilling press first (the kept sets after the context compared too). Compared: every
(layer, KV head)'s kept positions at the end, and kvzap's greedy token at each step against kvpress's.

kvpress keeps no positions (its compression gathers the kept keys in score order): this script follows them by
wrapping DecodingPress.compress and matching each kept key row to the row it was gathered from.

Two halves in two environments: this script runs kvpress (torch, transformers, kvpress: the peers' venv) and
the same script with --kvzap-side under KVZAP_PY (a python with the kvzap package, e.g. the one
scripts/test_python_pkg.sh makes: build/venv-py/bin/python). Prints SKIPPED without them
(fails under KVZAP_REQUIRE_PEERS=1; two_sides.py).
Usage: KVZAP_PY=build/venv-py/bin/python /work/venv-parity/bin/python tests/python/check_decoding_press.py
"""
import os
import sys

import two_sides

COMPRESSION_INTERVAL, TARGET_SIZE, TARGET_RATIO, N_ANSWER = 8, 96, 0.5, 40
PREFILL_RATIO = 0.5
# kvzap press -> kvpress decoding class and arguments (the base press: KnormPress), and the prefilling press's class
# (PrefillDecodingPress; None: the decoding press alone)
_DECODING = ("DecodingPress", dict(compression_interval=COMPRESSION_INTERVAL, target_size=TARGET_SIZE))
VARIANTS = {
    "decoding_knorm": _DECODING + (None,),
    "compression_ratio_decoding_knorm": ("CompressionRatioDecodingPress",
                                         dict(compression_interval=COMPRESSION_INTERVAL,
                                              target_compression_ratio=TARGET_RATIO), None),
    "prefill_decoding_knorm+decoding_knorm": _DECODING + ("KnormPress",),
    "prefill_decoding_snapkv+decoding_knorm": _DECODING + ("SnapKVPress",),
}


def kvpress_side(tmp):
    C = two_sides.parity_module()
    torch, K, _ = two_sides.peer_imports()
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, DynamicCache
    out = {}
    for kind, seed in (("llama", 11), ("smollm2", 12)):
        d = os.path.join(tmp, kind)
        C.write_model(d, kind, seed)
        tok = PreTrainedTokenizerFast.from_pretrained(d)
        m = AutoModelForCausalLM.from_pretrained(d, attn_implementation="sdpa", dtype=torch.float32).eval()
        n_layer, n_kv = m.config.num_hidden_layers, m.config.num_key_value_heads
        for (variant, (cls, kw, pre)), (c, text) in ((v, t) for v in VARIANTS.items() for t in enumerate(C.contexts())):
            ids, q = C.pipeline_ids(tok, text, C.QUESTION)
            press = dec = getattr(K, cls)(K.KnormPress(), **kw)
            if pre is not None:
                prefill = getattr(K, pre)(compression_ratio=PREFILL_RATIO)
                press = K.PrefillDecodingPress(prefilling_press=prefill, decoding_press=dec)
            # pos[l][h]: the position of each cache row, in the cache's order.
            pos = [[[] for _ in range(n_kv)] for _ in range(n_layer)]
            n_compressions = [0]
            # rounds[l][c]: layer l's compression c, its kept positions per head and KnormPress's scores
            rounds = [[] for _ in range(n_layer)]
            inner = dec.compress

            def follow(l, keys, k2):
                """pos[l] after a compression that kept k2 of keys (gathered in score order)."""
                for h in range(keys.shape[1]):
                    eq = (k2[0, h][:, None, :] == keys[0, h][None, :, :]).all(-1)  # [kept, T]
                    assert bool(eq.any(-1).all()), "a kept key matches no row"
                    pos[l][h] = [pos[l][h][i] for i in eq.float().argmax(-1).tolist()]

            # The prefilling press's cut of the context: followed the same way, KnormPress's scores kept for ties.
            prefill_scores = [None] * n_layer
            if pre is not None:
                inner_pre = prefill.compress

                def compress_pre(module, hidden_states, keys, values, attentions, kwargs, inner_pre=inner_pre):
                    k2, v2 = inner_pre(module, hidden_states, keys, values, attentions, kwargs)
                    score = -keys[0].norm(dim=-1)  # [H, T]
                    prefill_scores[module.layer_idx] = [{str(pos[module.layer_idx][h][i]): float(score[h, i])
                                                         for i in range(keys.shape[2])} for h in range(keys.shape[1])]
                    follow(module.layer_idx, keys, k2)
                    return k2, v2

                prefill.compress = compress_pre

            def compress(module, hidden_states, keys, values, attentions, kwargs, inner=inner, pos=pos, rounds=rounds):
                k2, v2 = inner(module, hidden_states, keys, values, attentions, kwargs)
                l = module.layer_idx
                n_compressions[0] += 1
                score = -keys[0].norm(dim=-1)  # [H, T], KnormPress.score
                rounds[l].append(dict(scores=[{str(pos[l][h][i]): float(score[h, i]) for i in range(keys.shape[2])}
                                              for h in range(keys.shape[1])]))
                follow(l, keys, k2)
                rounds[l][-1]["kept"] = [sorted(p) for p in pos[l]]
                return k2, v2

            dec.compress = compress

            def step(tokens, first):
                for layer in pos:
                    for p in layer:
                        p.extend(range(first, first + len(tokens)))
                return m(input_ids=torch.tensor([tokens]), past_key_values=cache,
                         position_ids=torch.tensor([list(range(first, first + len(tokens)))]))

            cache, T, ans = DynamicCache(), len(ids), []
            with torch.no_grad(), press(m):
                step(ids, 0)
                prefill_kept = [[sorted(pos[l][h]) for h in range(n_kv)] for l in range(n_layer)]
                o = step(q, T)
                for i in range(N_ANSWER):
                    ans.append(int(o.logits[0, -1].argmax()))
                    o = step([ans[-1]], T + len(q) + i)
            n = T + len(q) + N_ANSWER
            for l in range(n_layer):
                assert cache.layers[l].keys.shape[2] == len(pos[l][0])
            kept = [[sorted(pos[l][h]) for h in range(n_kv)] for l in range(n_layer)]
            out["%s/%s/%d" % (variant, kind, c)] = dict(model=d, ids=ids, q=q, ans=ans, kept=kept, n=n,
                                                        compressions=n_compressions[0], variant=variant,
                                                        rounds=rounds, prefill_kept=prefill_kept,
                                                        prefill_scores=prefill_scores if pre == "KnormPress" else None)
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
        cls, kw, pre = VARIANTS[r["variant"]]
        press = getattr(kvzap, cls)(kvzap.KnormPress(), **kw)
        if pre is not None:
            press = kvzap.PrefillDecodingPress(getattr(kvzap, pre)(compression_ratio=PREFILL_RATIO), press)
            assert press.spec["press"] == r["variant"], press.spec
        seq.prefill(r["ids"], pipe.press(press))
        m = seq.kept_mask()
        prefill_kept = [[np.nonzero(m[l, h])[0].tolist() for h in range(m.shape[1])] for l in range(m.shape[0])]
        seq.feed(r["q"])
        ans, rounds = [], []
        for i, t in enumerate(r["ans"]):
            if (i + 1) % COMPRESSION_INTERVAL == 0:  # the question's step and i answer tokens: a compression
                m = seq.kept_mask()
                rounds.append([[np.nonzero(m[l, h])[0].tolist() for h in range(m.shape[1])] for l in range(m.shape[0])])
            ans.append(int(np.argmax(seq.logits())))
            seq.feed([t])
        mask = seq.kept_mask()
        res[key] = dict(ans=ans, rounds=rounds, prefill_kept=prefill_kept, kept=[[np.nonzero(mask[l, h])[0].tolist() for h in range(mask.shape[1])]
                                       for l in range(mask.shape[0])])
    return res


def main():
    sides = two_sides.run(__file__, "decoding press parity", kvpress_side, kvzap_side)
    if sides is None:
        return 0
    ref, got = sides
    heads = ident = answers = 0
    n_ok = 0
    jac = []
    explained_by_ties = two_sides.parity_module().explained_by_ties
    for key, r in ref.items():
        g = got[key]
        # Compressions in order: identical kept sets on every (layer, KV head), until the first where a head
        # differs; there every difference must be a tie (positions KnormPress scores equal within 1e-5), whose
        # order neither side defines; from there the caches differ. The greedy tokens up to that compression's
        # step (each compression comes after the step's attention) must be identical.
        n_rounds = len(r["rounds"][0])
        first_diff, ties_only = None, True
        # PrefillDecodingPress: the prefilling press's kept sets, identical (or differing by KnormPress's ties).
        prefill_same = True
        for l, layer in enumerate(r["prefill_kept"]):
            for h, want in enumerate(layer):
                if set(g["prefill_kept"][l][h]) != set(want):
                    prefill_same = False
                    sc = r["prefill_scores"]
                    row = {int(p): v for p, v in sc[l][h].items()} if sc else None
                    ties_only &= bool(row) and explained_by_ties(g["prefill_kept"][l][h], want, row)
        if not prefill_same:
            first_diff = -1
        for c in range(min(n_rounds, len(g["rounds"])) if prefill_same else 0):
            for l in range(len(r["rounds"])):
                for h, want in enumerate(r["rounds"][l][c]["kept"]):
                    if set(g["rounds"][c][l][h]) != set(want):
                        first_diff = c
                        row = {int(p): v for p, v in r["rounds"][l][c]["scores"][h].items()}
                        ties_only &= explained_by_ties(g["rounds"][c][l][h], want, row)
            if first_diff is not None:
                break
        n_same = COMPRESSION_INTERVAL * (first_diff + 1) if first_diff is not None else N_ANSWER
        if not prefill_same:
            n_same = 0  # the context's cut differs: the question already attends to other caches
        key_ok = ties_only and g["ans"][:n_same] == r["ans"][:n_same]
        n_ok += int(key_ok)
        print("%s %s: compressions identical %d/%d%s, greedy tokens identical for the first %d" % (
            "ok  " if key_ok else "FAIL", key, first_diff if first_diff is not None else n_rounds, n_rounds,
            ", then a tie broken the other way" if first_diff is not None and ties_only else "", n_same)
            + ("" if prefill_same else " (the prefilling press's kept sets differ)"))
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
    ok = n_ok == len(ref)
    print("%s %d/%d runs identical up to the first tie broken the other way" % ("ok  " if ok else "FAIL", n_ok, len(ref)))
    print("info after %d answer tokens (compressions every %d steps; a tie broken the other way changes the cache, "
          "so both sides drift apart from there):" % (N_ANSWER, COMPRESSION_INTERVAL))
    print("%s decoding_knorm (interval %d, target %d), compression_ratio_decoding_knorm (interval %d, ratio %g) and "
          "prefill_decoding_{knorm,snapkv}+decoding_knorm (prefill ratio %g): "
          "Jaccard mean %.4f min %.4f (%d/%d heads identical), greedy tokens (%d) identical %d/%d"
          % ("    " if ok else "FAIL", COMPRESSION_INTERVAL, TARGET_SIZE, COMPRESSION_INTERVAL, TARGET_RATIO, PREFILL_RATIO,
             sum(jac) / len(jac), min(jac), ident, heads, N_ANSWER, answers, len(ref)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
