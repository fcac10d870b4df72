"""Evaluation from Python: the engine's offline RULER-style suite (`kvzap eval --suite ruler`)."""
from __future__ import annotations

import json
from typing import Any, Optional

from . import BasePress, Pipeline


def ruler(pipe: Pipeline, press: Optional[BasePress] = None, *, length: int = 4096, samples: Optional[int] = None,
          tasks: Optional[list] = None, seed: Optional[int] = None, first_index: Optional[int] = None) -> Any:
    """Runs the RULER-style suite on the pipeline's model under `press` (kvpress protocol: each context
    compressed once, questions answered greedily). Returns a pandas DataFrame (one row per sample: task, index,
    score 0..100, prediction, answers, evicted_fraction, kv_bytes, ...) when pandas is installed, else the
    list of row dictionaries (pandas.DataFrame(rows) makes the table)."""
    opts = {"length": length, "samples": samples, "tasks": tasks, "seed": seed, "first_index": first_index}
    rows = json.loads(pipe.engine.eval_ruler(pipe._press(press), json.dumps({k: v for k, v in opts.items()
                                                                              if v is not None})))
    try:
        import pandas as pd
    except ImportError:
        return rows
    return pd.DataFrame(rows)
