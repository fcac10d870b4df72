#!/usr/bin/env python3
"""Cross-checks kvzap surrogate export and ridge training against numpy (independent of the C++ code).

The gtests Surrogate.ExportForPythonRoundTrip and Ridge.ExportForPythonCheck write, into
$KVZAP_ROUNDTRIP_DIR:
  linear/, mlp/          kvpress-format surrogate folders (config.json + model.safetensors)
  inputs.f32             float32 [L][n_tok][input_dim]
  linear_pred.f32, mlp_pred.f32   the engine's predictions, float32 [L][n_tok][output_dim]
  meta.json              {"n_tok", "n_layers", "input_dim", "output_dim"}
  ridge/                 x.f32 [n][d], y.f32 [n][k], coef.f32 [k][d], intercept.f32 [k], meta.json

This script re-reads the folders with the `safetensors` package, checks that they follow the kvpress
KVzapConfig / KVzapModel layout, recomputes the predictions in float64 (exact erf GELU) and the
ridge solution with numpy (and scikit-learn when installed), and compares.

With --run it also checks the shipped folders under data/surrogates/ (layout, shapes, hidden = D/8).

Usage:
  python3 tests/python/check_surrogate_roundtrip.py DIR
  python3 tests/python/check_surrogate_roundtrip.py --run build/kvzap_tests   # runs the gtests into a temp dir
Requires: pip install numpy safetensors
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

TOL = 1e-5


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def gelu(z):
    erf = np.vectorize(math.erf)
    return 0.5 * z * (1.0 + erf(z / math.sqrt(2.0)))


def check_folder(folder, kind, meta):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    for key, want in (("model_type", "kvzap"), ("input_dim", meta["input_dim"]),
                      ("output_dim", meta["output_dim"]), ("n_modules", meta["n_layers"]),
                      ("architectures", ["KVzapModel"])):
        if cfg.get(key) != want:
            fail(f"{folder}/config.json: {key} = {cfg.get(key)!r}, expected {want!r}")
    hidden = cfg.get("hidden_dim", "absent")
    if (kind == "linear") != (hidden is None):
        fail(f"{folder}/config.json: hidden_dim = {hidden!r} for a {kind} model")
    path = os.path.join(folder, "model.safetensors")
    with safe_open(path, framework="numpy") as f:
        if (f.metadata() or {}).get("format") != "pt":
            fail(f"{path}: __metadata__ format is not 'pt'")
    w = load_file(path)
    L, D, H = meta["n_layers"], meta["input_dim"], meta["output_dim"]
    if kind == "linear":
        names = {f"layers.{l}.{p}" for l in range(L) for p in ("weight", "bias")}
        shapes = {"weight": (H, D), "bias": (H,)}
    else:
        names = {f"layers.{l}.{p}" for l in range(L) for p in ("0.weight", "0.bias", "2.weight", "2.bias")}
        shapes = {"0.weight": (hidden, D), "0.bias": (hidden,), "2.weight": (H, hidden), "2.bias": (H,)}
    if set(w) != names:
        fail(f"{path}: tensor names {sorted(w)} differ from the kvpress layout")
    for name, t in w.items():
        part = name.split(".", 2)[2]
        if t.shape != shapes[part] or t.dtype != np.float32:
            fail(f"{path}: {name} has {t.dtype} {t.shape}, expected float32 {shapes[part]}")
    return w


def predict(w, kind, layer, h):
    h = h.astype(np.float64)
    if kind == "linear":
        return h @ w[f"layers.{layer}.weight"].astype(np.float64).T + w[f"layers.{layer}.bias"]
    a = gelu(h @ w[f"layers.{layer}.0.weight"].astype(np.float64).T + w[f"layers.{layer}.0.bias"])
    return a @ w[f"layers.{layer}.2.weight"].astype(np.float64).T + w[f"layers.{layer}.2.bias"]


def check_predictions(root):
    with open(os.path.join(root, "meta.json")) as f:
        meta = json.load(f)
    L, n, D, H = meta["n_layers"], meta["n_tok"], meta["input_dim"], meta["output_dim"]
    h = np.fromfile(os.path.join(root, "inputs.f32"), dtype="<f4").reshape(L, n, D)
    for kind in ("linear", "mlp"):
        w = check_folder(os.path.join(root, kind), kind, meta)
        got = np.fromfile(os.path.join(root, f"{kind}_pred.f32"), dtype="<f4").reshape(L, n, H)
        worst = 0.0
        for l in range(L):
            ref = predict(w, kind, l, h[l])
            err = np.max(np.abs(got[l] - ref) / np.maximum(1.0, np.abs(ref)))
            if not err <= TOL:
                fail(f"{kind} layer {l}: engine vs numpy max error {err:.3g} > {TOL}")
            worst = max(worst, err)
        print(f"ok: {kind} surrogate folder and predictions ({L} layers x {n} tokens) match numpy "
              f"(max error {worst:.2g})")


def check_ridge(root):
    folder = os.path.join(root, "ridge")
    if not os.path.isdir(folder):
        fail("no ridge/ export (run Ridge.ExportForPythonCheck with KVZAP_ROUNDTRIP_DIR set)")
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    n, d, k, alpha = meta["n"], meta["d"], meta["k"], meta["alpha"]
    rd = lambda name, shape: np.fromfile(os.path.join(folder, name), dtype="<f4").reshape(shape).astype(np.float64)
    x, y = rd("x.f32", (n, d)), rd("y.f32", (n, k))
    coef, icpt = rd("coef.f32", (k, d)), rd("intercept.f32", (k,))
    xm, ym = x.mean(0), y.mean(0)
    xc, yc = x - xm, y - ym
    w = np.linalg.solve(xc.T @ xc + alpha * np.eye(d), xc.T @ yc)  # [d][k]
    ref_coef, ref_icpt = w.T, ym - xm @ w
    e1 = np.max(np.abs(coef - ref_coef)) / max(1.0, np.max(np.abs(ref_coef)))
    e2 = np.max(np.abs(icpt - ref_icpt)) / max(1.0, np.max(np.abs(ref_icpt)))
    if not (e1 <= TOL and e2 <= TOL):
        fail(f"ridge: engine vs numpy error coef {e1:.3g}, intercept {e2:.3g}")
    print(f"ok: ridge (n={n}, d={d}, k={k}, alpha={alpha}) matches numpy (max error {max(e1, e2):.2g})")
    try:
        from sklearn.linear_model import Ridge
    except ImportError:
        print("SKIPPED: ridge vs sklearn.linear_model.Ridge (sklearn is not installed; numpy check above ran)")
        return
    r = Ridge(alpha=alpha).fit(x, y)
    if not np.allclose(r.coef_, coef, atol=1e-4) or not np.allclose(r.intercept_, icpt, atol=1e-4):
        fail("ridge: engine differs from sklearn.linear_model.Ridge")
    print("ok: ridge matches sklearn.linear_model.Ridge")


def check_shipped(root):
    """Every shipped folder data/surrogates/NAME/{linear,mlp} follows the kvpress layout (the same checks as
    the exported ones), the two kinds agree on their shape, the MLP's hidden width is input_dim / 8, and
    kvzap.json's default threshold is a number."""
    base = os.path.join(root, "data", "surrogates")
    names = sorted(n for n in os.listdir(base) if os.path.isdir(os.path.join(base, n)))
    if not names:
        fail(f"no shipped surrogate folders under {base}")
    for name in names:
        metas = []
        for kind in ("linear", "mlp"):
            folder = os.path.join(base, name, kind)
            with open(os.path.join(folder, "config.json")) as f:
                cfg = json.load(f)
            meta = {"input_dim": cfg.get("input_dim"), "output_dim": cfg.get("output_dim"),
                    "n_layers": cfg.get("n_modules")}
            check_folder(folder, kind, meta)
            if kind == "mlp" and cfg.get("hidden_dim") * 8 != cfg.get("input_dim"):
                fail(f"{folder}/config.json: hidden_dim {cfg.get('hidden_dim')} is not input_dim / 8")
            with open(os.path.join(folder, "kvzap.json")) as f:
                thr = json.load(f).get("default_threshold")
            if not isinstance(thr, (int, float)) or not math.isfinite(thr):
                fail(f"{folder}/kvzap.json: default_threshold {thr!r} is not a number")
            metas.append(meta)
        if metas[0] != metas[1]:
            fail(f"{name}: linear {metas[0]} and mlp {metas[1]} differ in shape")
        m = metas[0]
        print(f"ok: shipped {name}: linear + mlp in the kvpress layout ({m['n_layers']} modules, input "
              f"{m['input_dim']}, output {m['output_dim']})")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--run":
        check_shipped(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, KVZAP_ROUNDTRIP_DIR=tmp)
            subprocess.run([sys.argv[2], "--gtest_filter=Surrogate.ExportForPythonRoundTrip:Ridge.ExportForPythonCheck"],
                           env=env, check=True, stdout=subprocess.DEVNULL)
            check_predictions(tmp)
            check_ridge(tmp)
        return
    root = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("KVZAP_ROUNDTRIP_DIR")
    if not root:
        fail(__doc__)
    check_predictions(root)
    check_ridge(root)


if __name__ == "__main__":
    main()
