"""The GIL is released while the engine runs: another Python thread makes progress during a prefill, and two
pipelines (two engines) run at the same time."""
import json
import threading
import time

import pytest

import kvzap

from conftest import CONTEXT, default_model


def model_or_skip():
    path = default_model()
    if path is None:
        print("SKIPPED: thread tests need the pulled SmolLM2-135M-Instruct (kvzap pull)")
        pytest.skip("no default model")
    return path


def run_timed(pipe, out, key):
    t0 = time.perf_counter()
    pipe(CONTEXT * 3, question="Which lamp?", press=kvzap.SnapKVPress(compression_ratio=0.5), max_new_tokens=16,
         temperature=0)
    out[key] = (t0, time.perf_counter())


def test_main_thread_runs_during_a_call():
    pipe = kvzap.pipeline(model_or_skip(), threads=1, n_ctx=4096)
    times = {}
    th = threading.Thread(target=run_timed, args=(pipe, times, "a"))
    ticks = []
    th.start()
    while th.is_alive():
        ticks.append(time.perf_counter())
        time.sleep(0.001)
    th.join()
    t0, t1 = times["a"]
    inside = [t for t in ticks if t0 + 0.02 < t < t1 - 0.02]
    assert t1 - t0 > 0.1, "the call is too short to tell"
    # With the GIL held for the whole call, no tick could land inside it.
    assert len(inside) >= 5, (len(inside), t1 - t0)


def test_two_pipelines_overlap():
    # Each engine streams its pieces through a callback that runs inside its C call. If a call held the GIL
    # throughout, the other engine could produce nothing between that call's first and last piece.
    path = model_or_skip()
    pipes = [kvzap.pipeline(path, threads=1, n_ctx=4096) for _ in range(2)]
    stamps = {0: [], 1: []}
    # A short context and a long answer: both calls spend most of their time decoding, side by side.
    request = json.dumps({"context": CONTEXT, "questions": ["Write a long story about these lamps."],
                          "max_new_tokens": 64, "temperature": 1.0, "seed": 3})
    barrier = threading.Barrier(2)

    def run(i):
        barrier.wait()
        pipes[i].engine.pipeline_run(request, None, lambda qi, piece: stamps[i].append(time.perf_counter()))

    ths = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert len(stamps[0]) > 10 and len(stamps[1]) > 10, "too few pieces to tell"
    a0, a1 = stamps[0][0], stamps[0][-1]
    b_inside_a = [t for t in stamps[1] if a0 < t < a1]
    b0, b1 = stamps[1][0], stamps[1][-1]
    a_inside_b = [t for t in stamps[0] if b0 < t < b1]
    assert b_inside_a or a_inside_b, "the two pipelines ran one after the other"
    assert len(b_inside_a) + len(a_inside_b) >= 5


def test_one_pipeline_shared_by_threads_queues_calls():
    # The C API runs one call per engine at a time; the binding queues threads on a shared pipeline (no race,
    # no crash) and each gets the answer it gets alone.
    from conftest import TINY
    pipe = kvzap.pipeline(TINY, threads=1, n_ctx=512)
    press = kvzap.KnormPress(compression_ratio=0.5)
    questions = [f"Which lamp was in room {i}?" for i in range(6)]
    alone = {q: pipe(CONTEXT, question=q, press=press, max_new_tokens=8, temperature=0)["details"][0]["tokens"]
             for q in questions}
    got, errors = {}, []

    def ask(q):
        try:
            got[q] = pipe(CONTEXT, question=q, press=press, max_new_tokens=8, temperature=0)["details"][0]["tokens"]
            seq = pipe.new_sequence()
            seq.prefill(pipe.tokenize(CONTEXT, add_bos=True))
            seq.fork().kv_stats()
        except Exception as e:  # reported below
            errors.append(e)

    ths = [threading.Thread(target=ask, args=(q,)) for q in questions]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert not errors, errors
    assert got == alone
