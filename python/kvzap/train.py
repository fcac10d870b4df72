"""Training KVzap surrogates from Python on collected KVzip+ targets (Pipeline.kvzip_targets); the solver is
the engine's (`kvzap train`'s ridge regression), the result a kvpress-format folder for KVzapPress."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from . import _kvzap


def pairs(targets) -> tuple:
    """(x, y) training pairs of one Pipeline.kvzip_targets result: x [n_sample, layer, n_embd] (h at the
    sampled positions), y [n_sample, layer, KV head] (their log KVzip+ scores)."""
    x = np.asarray(targets.x)
    y = np.ascontiguousarray(np.asarray(targets.log_scores)[:, :, np.asarray(targets.sample)].transpose(2, 0, 1))
    return x, y


def linear(x, y, out_dir: str, alpha: float = 1.0) -> str:
    """Fits KVzap-Linear (ridge per layer) on x [n, layer, n_embd] and y [n, layer, KV head] (float32 arrays,
    e.g. stacked pairs() of several texts) and writes the surrogate folder; returns out_dir. Use it with
    kvzap.KVzapPress(model_type="linear", surrogate=out_dir, threshold=...)."""
    _kvzap.train_linear_surrogate(np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.float32),
                                  float(alpha), str(out_dir))
    return str(out_dir)


def mlp(x, y, out_dir: str, **options) -> str:
    """Trains KVzap-MLP (the engine's AdamW trainer, `kvzap train --mlp`) on x [n, layer, n_embd] and
    y [n, layer, KV head]; options: hidden_dim, epochs, batch_size, lr, weight_decay, valid_fraction, seed
    (the engine's defaults otherwise). Writes the folder for kvzap.KVzapPress(model_type="mlp",
    surrogate=out_dir); returns out_dir."""
    import json
    _kvzap.train_mlp_surrogate(np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.float32),
                               json.dumps(options), str(out_dir))
    return str(out_dir)


def collect(pipe, texts: Iterable[str], n_sample: int = 64, seed: int = 0) -> tuple:
    """Stacked (x, y) pairs of several texts (Pipeline.kvzip_targets, then pairs())."""
    xs, ys = [], []
    for i, text in enumerate(texts):
        x, y = pairs(pipe.kvzip_targets(text, n_sample=n_sample, seed=seed + i))
        xs.append(x)
        ys.append(y)
    return np.concatenate(xs), np.concatenate(ys)
