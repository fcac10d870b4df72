"""Shared fixtures for the installed kvzap package's tests (scripts/test_python_pkg.sh)."""
import os
from pathlib import Path

import pytest

import kvzap

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "fuzz" / "data" / "tiny_llama.gguf")
# A context long enough for every press (SnapKV-family presses vote with the last 64 queries).
CONTEXT = " ".join(
    f"Record {i}: the {['red', 'green', 'blue', 'amber'][i % 4]} lamp in room {i * 7 % 31} was checked on day {i}."
    for i in range(12))


def default_model():
    """The pulled SmolLM2-135M-Instruct, or None (the caller prints a SKIPPED line)."""
    try:
        return kvzap._kvzap.resolve_model("SmolLM2-135M-Instruct")
    except kvzap.Error:
        return None


@pytest.fixture(scope="session")
def tiny():
    return kvzap.pipeline(TINY, threads=1, n_ctx=512)


@pytest.fixture(scope="session")
def smol():
    path = default_model()
    if path is None:
        print("SKIPPED: SmolLM2-135M-Instruct is not pulled (kvzap pull)")
        pytest.skip("SmolLM2-135M-Instruct is not pulled")
    return kvzap.pipeline("SmolLM2-135M-Instruct", threads=2, n_ctx=2048)


def kvzap_bin():
    b = os.environ.get("KVZAP_BIN")
    return b if b and os.path.exists(b) else None
