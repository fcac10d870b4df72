#!/usr/bin/env bash
# Build llama.cpp's llama-bench, llama-batched-bench and llama-server for the peer benchmarks
# (scripts/bench_batched.py, scripts/bench_server.py), and llama-tokenize for tokenizer spot checks
# (e.g. `llama-tokenize -m gemma-3-270m-Q4_K_M.gguf -p TEXT --ids --no-bos`).
#
# Source: the llama.cpp tree vendored in the llama-cpp-python sdist, fetched from PyPI with
#   pip download --no-binary :all: --no-deps llama-cpp-python==$LLAMACPP_PY_VERSION
# (default 0.3.36, the version the docs compare against; its vendor/llama.cpp is commit 0c1e570).
# Configured with -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release, static libraries, no tests, no
# examples, no web UI (nothing downloaded at build time), no OpenSSL; llama-server builds on the
# vendored cpp-httplib, so libcurl is never needed. Only these targets are built (-j${JOBS:-2}); an
# install that lacks one of them (an older one without llama-tokenize) is rebuilt.
#
# Installs into ${KVZAP_PEER_DIR:-$HOME/.cache/kvzap/llamacpp-<version>}/bin. A second run finds the
# binaries there and returns at once. Progress goes to stderr; the last line on stdout is the bin folder.
#
# AMX: on a CPU with AMX-INT8 (Sapphire Rapids and later) -march=native turns on ggml's AMX backend, whose
# mat-mul segfaults on Q4_K_M models (ggml_backend_amx_mul_mat; llama.cpp issue #20824, seen here on
# Qwen2.5-Coder-0.5B with 0.3.36). Such hosts get -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 (llama.cpp's
# AVX-512 VNNI path, which kvzap also uses) and a prefix ending in -noamx; LLAMACPP_AMX=1 keeps AMX.
# Environment: LLAMACPP_PY_VERSION, KVZAP_PEER_DIR, JOBS (default 2), PYTHON (default python3),
#              KVZAP_PEER_KEEP_BUILD=1 keeps the extracted source and the build tree.
# Usage:       bash scripts/build_llamacpp.sh            # prints e.g. /root/.cache/kvzap/llamacpp-0.3.36/bin
#              bash scripts/build_llamacpp.sh --force    # rebuild even when the binaries exist
set -euo pipefail

version="${LLAMACPP_PY_VERSION:-0.3.36}"
no_amx=0
if [[ "${LLAMACPP_AMX:-0}" != 1 ]] && grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then no_amx=1; fi
prefix="${KVZAP_PEER_DIR:-$HOME/.cache/kvzap/llamacpp-$version$([[ $no_amx == 1 ]] && echo -noamx)}"
bindir="$prefix/bin"
jobs="${JOBS:-2}"
python="${PYTHON:-python3}"
targets=(llama-bench llama-batched-bench llama-server llama-tokenize)
force=0

# sha256 of the sdist from PyPI, checked by pip (--require-hashes); other versions are taken as pip finds them
declare -A sdist_sha256=(
  [0.3.36]=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
)

for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    -h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { echo "build_llamacpp: $*" >&2; }

have_all() {
  local t
  [[ -f "$prefix/.build-ok" ]] || return 1
  for t in "${targets[@]}"; do [[ -x "$bindir/$t" ]] || return 1; done
  return 0
}

if [[ $force -eq 0 ]] && have_all; then
  echo "$bindir"
  exit 0
fi

mkdir -p "$prefix"
# one build at a time per prefix; a second caller waits, then finds the binaries
exec 9>"$prefix/.lock"
if ! flock -n 9; then
  log "another build holds $prefix/.lock; waiting"
  flock 9
fi
if [[ $force -eq 0 ]] && have_all; then
  echo "$bindir"
  exit 0
fi

# --- build tools: install Debian packages only when missing ------------------------------------------
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
command -v make >/dev/null 2>&1 || command -v ninja >/dev/null 2>&1 || missing+=(make)
command -v tar >/dev/null 2>&1 || missing+=(tar)
command -v flock >/dev/null 2>&1 || missing+=(util-linux)
"$python" -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing Debian packages: ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); else sudo_cmd=(); fi
  "${sudo_cmd[@]}" apt-get update >&2
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi

# --- source ------------------------------------------------------------------------------------------
t_start=$(date +%s)
work="$prefix/work"
rm -rf "$work"
mkdir -p "$work/dl"
sdist=("$prefix"/llama_cpp_python-"$version".tar.gz)
if [[ ! -f "${sdist[0]}" ]]; then
  log "pip download llama-cpp-python==$version (sdist)"
  if [[ -n "${sdist_sha256[$version]:-}" ]]; then
    printf 'llama-cpp-python==%s --hash=sha256:%s\n' "$version" "${sdist_sha256[$version]}" >"$work/req.txt"
    "$python" -m pip download --no-binary :all: --no-deps --require-hashes -r "$work/req.txt" \
      -d "$work/dl" >&2
  else
    "$python" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$work/dl" >&2
  fi
  found=("$work"/dl/llama_cpp_python-*.tar.gz)
  [[ -f "${found[0]}" ]] || { log "error: pip download left no sdist in $work/dl"; exit 1; }
  mv "${found[0]}" "${sdist[0]}"
fi
log "extracting $(basename "${sdist[0]}")"
tar -xzf "${sdist[0]}" -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
[[ -f "$src/CMakeLists.txt" ]] || { log "error: no vendor/llama.cpp in the sdist"; exit 1; }
# the sdist carries the submodule's git metadata: read its HEAD directly (never a surrounding repository's)
commit="$(head -c 12 "$work/llama_cpp_python-$version/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null || true)"

# --- configure and build -----------------------------------------------------------------------------
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake_flags=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=ON
  -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_TOOLS=ON
  -DLLAMA_BUILD_SERVER=ON
  -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_LLGUIDANCE=OFF
  -DLLAMA_BUILD_MTMD=OFF
)
if [[ $no_amx == 1 ]]; then
  amx_off="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cmake_flags+=("-DCMAKE_C_FLAGS=$amx_off" "-DCMAKE_CXX_FLAGS=$amx_off")
  log "AMX-INT8 CPU: building without AMX (llama.cpp #20824; LLAMACPP_AMX=1 keeps it)"
fi
log "configuring (cmake ${cmake_flags[*]})"
cmake -S "$src" -B "$work/build" "${gen[@]}" "${launcher[@]}" "${cmake_flags[@]}" >&2
log "building ${targets[*]} with -j$jobs (takes minutes on 2 cores)"
cmake --build "$work/build" --config Release -j "$jobs" --target "${targets[@]}" >&2

mkdir -p "$bindir"
for t in "${targets[@]}"; do
  bin="$work/build/bin/$t"
  [[ -x "$bin" ]] || { log "error: $t was not built ($bin)"; exit 1; }
  install -m 0755 "$bin" "$bindir/$t"
done
t_end=$(date +%s)
{
  echo "llama-cpp-python $version"
  echo "llama.cpp commit ${commit:-unknown}"
  echo "cmake ${cmake_flags[*]}"
  echo "compiler $(c++ --version | head -n 1)"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $((t_end - t_start)) s with -j$jobs"
} >"$prefix/build-info.txt"
touch "$prefix/.build-ok"
if [[ "${KVZAP_PEER_KEEP_BUILD:-0}" != 1 ]]; then rm -rf "$work"; fi
log "installed ${targets[*]} in $bindir ($((t_end - t_start)) s)"
echo "$bindir"
