#!/usr/bin/env bash
# Extra Debian packages for the fuzzing job only (scripts/fuzz.sh): clang 16 with its runtimes
# (libFuzzer, ASan, UBSan) and llvm-symbolizer for readable stack traces. clang 16, not Debian 12's
# default clang 14: the kernels use _Float16, which clang only supports on x86 from version 15.
# The normal build and the GCC sanitizer builds need none of this (scripts/setup.sh). Idempotent.
set -euo pipefail
need=0
for pkg in clang-16 libclang-rt-16-dev llvm-16; do dpkg -s "$pkg" >/dev/null 2>&1 || need=1; done
if [ "$need" = 1 ]; then
  echo "[setup_fuzz] installing clang-16, libclang-rt-16-dev, llvm-16" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-16 libclang-rt-16-dev llvm-16 >/dev/null
fi
