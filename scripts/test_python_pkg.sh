#!/usr/bin/env bash
# The Python package against the tree's build: a fresh virtual environment, `pip install .` with
# KVZAP_PREBUILT_DIR (only the nanobind binding compiles; libkvzap.so comes from the build), then
# tests/python_pkg/ (pytest) against the installed package. KVZAP_BIN enables the CLI parity tests.
# Build dependencies (scikit-build-core, nanobind) come from PyPI into the venv once; later runs reuse it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BUILD_DIR="${KVZAP_BUILD_DIR:-build}"
VENV="$(realpath -m "${KVZAP_PY_VENV:-$BUILD_DIR/venv-py}")"
cmake --build "$BUILD_DIR" --target kvzap_shared -j"$(nproc)" >/dev/null
if [ ! -x "$VENV/bin/python" ] && ! python3 -m venv "$VENV" >/dev/null 2>&1; then
  rm -rf "$VENV"
  echo "SKIPPED: python package tests (python3 -m venv does not work here: apt install python3-venv)"
  exit 0
fi
"$VENV/bin/python" -c "import scikit_build_core, nanobind, numpy, pytest" 2>/dev/null ||
  "$VENV/bin/pip" install -q scikit-build-core nanobind numpy pytest
"$VENV/bin/pip" uninstall -q -y kvzap >/dev/null 2>&1 || true
launcher=()
command -v ccache >/dev/null && launcher=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
KVZAP_PREBUILT_DIR="$ROOT/$BUILD_DIR" "$VENV/bin/pip" install -q --no-build-isolation "${launcher[@]}" \
  -C build-dir="$BUILD_DIR/python-prebuilt" .
export KVZAP_BIN="${KVZAP_BIN:-$ROOT/$BUILD_DIR/kvzap}"
# From outside the source tree, so `import kvzap` can only be the installed package.
cd "$(mktemp -d)"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -rs "$ROOT/tests/python_pkg" "$@"
