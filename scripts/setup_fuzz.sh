#!/usr/bin/env bash
# Extra Debian packages for the fuzzing and sanitizer jobs only (scripts/fuzz.sh, the sanitizer section
# of scripts/test.sh): clang with its runtimes (libFuzzer, ASan, UBSan, TSan) and llvm-symbolizer for
# readable stack traces. The normal build needs none of this (scripts/setup.sh). Idempotent.
set -euo pipefail
need=0
command -v clang++ >/dev/null 2>&1 || need=1
command -v llvm-symbolizer >/dev/null 2>&1 || need=1
# libFuzzer's runtime ships in libclang-rt-*-dev, only a Recommends of clang.
ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need=1
if [ "$need" = 1 ]; then
  echo "[setup_fuzz] installing clang, libclang-rt-dev, llvm" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-dev llvm >/dev/null
fi
