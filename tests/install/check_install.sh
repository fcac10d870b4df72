#!/usr/bin/env bash
# `cmake --install` produces a tree that works anywhere (issue 35): installs the build folder BUILD into a
# fresh prefix, moves the prefix elsewhere, and checks from an unrelated working directory that
#  * bin/kvzap runs and finds its data (surrogates, eval sets) under the prefix's share/kvzap;
#  * a C11 program built with `pkg-config kvzap` against the installed header and libkvzap.so runs and
#    sees the same data folder through the C API;
#  * with the default model pulled, a KVzap-MLP press (its surrogate read from share/kvzap) generates.
# Usage: tests/install/check_install.sh BUILD_DIR     (ctest runs it as `install_tree`)
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "${1:?usage: check_install.sh BUILD_DIR}" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$work/first" >/dev/null
mv "$work/first" "$work/moved"  # relocatable: nothing may point at the first prefix
prefix="$work/moved"
cd "$work"

version="$("$prefix/bin/kvzap" --version)"
data="$(printf '%s\n' "$version" | sed -n 's/^data: //p')"
[ "$(realpath "$data")" = "$(realpath "$prefix/share/kvzap")" ] || fail "installed kvzap uses data '$data', not $prefix/share/kvzap"
[ -d "$prefix/share/kvzap/surrogates" ] || fail "no surrogates installed"
"$prefix/bin/kvzap" presses | grep '^kvzap-mlp ' >/dev/null || fail "kvzap presses does not list kvzap-mlp"

cat >"$work/probe.c" <<'C'
#include <stdio.h>
#include <string.h>
#include <kvzap/kvzap.h>
int main(void) {
  char* dir = NULL;
  if (kvzap_api_version() != KVZAP_API_VERSION) return 2;
  if (kvzap_get_data_dir(&dir) != KVZAP_OK) return 3;
  printf("%s\n", dir);
  kvzap_free(dir);
  return 0;
}
C
export PKG_CONFIG_PATH="$(dirname "$(find "$prefix" -name kvzap.pc | head -n 1)")"
cc -std=c11 -Wall -Werror "$work/probe.c" -o "$work/probe" $(pkg-config --cflags --libs kvzap) \
  || fail "a C program does not build against the installed header and library"
libdir="$(pkg-config --variable=libdir kvzap)"
c_data="$(LD_LIBRARY_PATH="$libdir" "$work/probe")" || fail "the C probe failed"
[ "$(realpath "$c_data")" = "$(realpath "$prefix/share/kvzap")" ] || fail "libkvzap.so uses data '$c_data'"

model="${KVZAP_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/kvzap/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ -f "$model" ]; then
  out="$("$prefix/bin/kvzap" generate -m "$model" -t 1 -p "The capital of France is" -n 4 --press kvzap-mlp --threshold -4 2>&1)" \
    || fail "installed kvzap could not run kvzap-mlp: $out"
else
  echo "SKIPPED: the generate check (no default model at $model)"
fi
echo "install tree OK: $prefix ($(du -sh "$prefix" | cut -f1))"
