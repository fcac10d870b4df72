#!/usr/bin/env python3
"""dms_knorm while decoding against kvpress DMSPress(KnormPress(), threshold, sliding_window_size=32,
decoding=True) (issue 38; docs/PARITY.md). check_kvpress_parity.py compares kept sets after the context
only (`kvzap generate --kept-positions`); this check follows the sequence on: the context prefilled, then
the question and 40 answer tokens fed one token per step (kvpress's fake key needs single-token steps on
these random models), the answer teacher-forced on kvpress's greedy tokens on the kvzap side, so both judge
the same tokens. Compared: every (layer, KV head)'s kept positions at the end, and kvzap's greedy token at
each step against kvpress's.

Two halves in two environments: this script runs kvpress (torch, transformers, kvpress: the peers' venv) and
the same script with --kvzap-side under KVZAP_PY (a python with the kvzap package, e.g. the one
scripts/test_python_pkg.sh makes: build/venv-py/bin/python). Prints SKIPPED without them
(fails under KVZAP_REQUIRE_PEERS=1; two_sides.py).
Usage: KVZAP_PY=build/venv-py/bin/python /work/venv-parity/bin/python tests/python/check_dms_decoding.py
"""
import os
import sys

import two_sides

THRESHOLD, WINDOW, N_ANSWER = -4.6, 32, 40


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
        for c, text in enumerate(C.contexts()):
            ids, q = C.pipeline_ids(tok, text, C.QUESTION)
            press = K.DMSPress(K.KnormPress(), threshold=THRESHOLD, sliding_window_size=WINDOW, decoding=True)
            cache, T, ans = DynamicCache(), len(ids), []
            with torch.no_grad(), press(m):
                m(input_ids=torch.tensor([ids]), past_key_values=cache)
                for j, qt in enumerate(q):
                    o = m(input_ids=torch.tensor([[qt]]), past_key_values=cache, position_ids=torch.tensor([[T + j]]))
                for i in range(N_ANSWER):
                    ans.append(int(o.logits[0, -1].argmax()))
                    o = m(input_ids=torch.tensor([[ans[-1]]]), past_key_values=cache,
                          position_ids=torch.tensor([[T + len(q) + i]]))
            n = cache.layers[0].keys.shape[2]  # kvpress removes nothing: cache index = position
            kept = []
            for l, layer in enumerate(m.model.layers):
                H = cache.layers[l].keys.shape[1]
                mk = getattr(layer.self_attn, "masked_key_indices", None)
                masked = [set() for _ in range(H)]
                if mk is not None:
                    for h, s in zip(mk[1].tolist(), mk[2].tolist()):
                        masked[h].add(s)
                kept.append([[p for p in range(n) if p not in masked[h]] for h in range(H)])
                layer.self_attn.masked_key_indices = None
            out["%s/%d" % (kind, c)] = dict(model=d, ids=ids, q=q, ans=ans, kept=kept, n=n)
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
        press = kvzap.DMSPress(kvzap.KnormPress(), threshold=THRESHOLD, sliding_window_size=WINDOW, decoding=True)
        seq.prefill(r["ids"], pipe.press(press))
        for t in r["q"]:
            seq.feed([t])
        ans = []
        for t in r["ans"]:
            ans.append(int(np.argmax(seq.logits())))
            seq.feed([t])
        mask = seq.kept_mask()
        res[key] = dict(ans=ans, kept=[[np.nonzero(mask[l, h])[0].tolist() for h in range(mask.shape[1])]
                                       for l in range(mask.shape[0])])
    return res


def main():
    sides = two_sides.run(__file__, "dms decoding parity", kvpress_side, kvzap_side)
    if sides is None:
        return 0
    ref, got = sides
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
        evicted = 1 - sum(len(h) for layer in r["kept"] for h in layer) / (r["n"] * sum(len(layer) for layer in r["kept"]))
        print("%s: %d positions, kvpress evicted %.2f, kept sets identical %s, greedy tokens identical %s"
              % (key, r["n"], evicted, g["kept"] == r["kept"], g["ans"] == r["ans"]))
    ok = ident == heads and answers == len(ref)
    print("%s dms_knorm decoding: Jaccard mean %.4f min %.4f (%d/%d heads identical), greedy tokens (%d) identical %d/%d"
          % ("ok  " if ok else "FAIL", sum(jac) / len(jac), min(jac), ident, heads, N_ANSWER, answers, len(ref)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
