#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/fuzz_*.cpp; clang, ASan+UBSan) and runs each for SECONDS
# (default 60) on its seed corpus (fuzz/corpus/<name>) plus its regression inputs (fuzz/regressions/
# <name>), with its dictionary (fuzz/dict/<name>.dict). Fails if any harness finds a crash, a leak, an
# allocation over 1 GiB or an input slower than 5 s; the reproducer lands in $FUZZ_BUILD/artifacts.
#
#   scripts/fuzz.sh [SECONDS] [HARNESS...]     e.g. scripts/fuzz.sh 600 gguf zip
# Environment: KVZAP_FUZZ_BUILD_DIR (default build-fuzz), KVZAP_FUZZ_MERGE=1 minimises (set cover) the grown corpus
# back into fuzz/corpus/<name> (to commit it), KVZAP_FUZZ_JOBS (default 1) parallel runs of a harness,
# KVZAP_FUZZ_SKIP_BUILD=1 runs the harnesses already built, KVZAP_FUZZ_PARALLEL (default 1) harnesses run
# at once (one process each; not with KVZAP_FUZZ_JOBS > 1), KVZAP_FUZZ_LEDGER=FILE appends one row per
# harness to FILE (fuzz/ledger.tsv is the project's record of fuzzing; scripts/fuzz_totals.sh sums it),
# labelled with KVZAP_FUZZ_LEDGER_AT (default: the commit); a relative FILE is taken from the repository root.
# Needs the normal build dependencies (scripts/setup.sh); installs clang itself (scripts/setup_fuzz.sh).
# A summary (harness, seconds, CPU seconds, executions, exec/s, corpus files/bytes, result) is printed and kept in
# $FUZZ_BUILD/fuzz-summary.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER="${1:-60}"
shift || true
bash scripts/setup_fuzz.sh
B="${KVZAP_FUZZ_BUILD_DIR:-build-fuzz}"
launcher=""
command -v ccache >/dev/null && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-16 || true)}"
if [ "${KVZAP_FUZZ_SKIP_BUILD:-0}" != 1 ]; then
  CXX="${KVZAP_FUZZ_CXX:-clang++-16}" cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVZAP_FUZZ=ON \
    -DKVZAP_BUILD_TESTS=OFF $launcher >/dev/null
  cmake --build "$B" --target fuzzers -j"${KVZAP_BUILD_JOBS:-$(nproc)}"
fi

if [ "$#" -gt 0 ]; then harnesses=("$@"); else
  harnesses=()
  for f in fuzz/fuzz_*.cpp; do n="$(basename "$f" .cpp)"; harnesses+=("${n#fuzz_}"); done
fi
mkdir -p "$B/artifacts" "$B/work"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
summary="$B/fuzz-summary.tsv"
printf 'harness\tseconds\tcpu_seconds\texecs\texec_per_s\tcorpus_files\tcorpus_bytes\tresult\n' >"$summary"
parallel="${KVZAP_FUZZ_PARALLEL:-1}"
if [ "$parallel" -gt 1 ] && [ "${KVZAP_FUZZ_JOBS:-1}" -gt 1 ]; then
  echo "KVZAP_FUZZ_PARALLEL and KVZAP_FUZZ_JOBS cannot both be above 1" >&2; exit 2
fi

ledger_header=$'date\tat\tcommand\tharness\twall_seconds\tcpu_seconds\tcpu_seconds_at_most\tnote\texecutions\tresult'
if [ -n "${KVZAP_FUZZ_LEDGER:-}" ]; then
  if [ ! -s "$KVZAP_FUZZ_LEDGER" ]; then printf '%s\n' "$ledger_header" >"$KVZAP_FUZZ_LEDGER"
  elif [ "$(head -1 "$KVZAP_FUZZ_LEDGER")" != "$ledger_header" ]; then
    echo "KVZAP_FUZZ_LEDGER=$KVZAP_FUZZ_LEDGER is not a fuzz ledger (its first line is not the header)" >&2; exit 2
  fi
  ledger_at="${KVZAP_FUZZ_LEDGER_AT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  ledger_command="scripts/fuzz.sh $SECONDS_PER (parallel ${KVZAP_FUZZ_PARALLEL:-1}, jobs ${KVZAP_FUZZ_JOBS:-1})"
fi

# One harness: run, clean up, merge if asked, append its summary row. Returns non-zero on a finding.
fuzz_one() {
  local h="$1" bin="$B/fuzz_$1"
  [ -x "$bin" ] || { echo "!! no harness $bin"; return 1; }
  local seeds="fuzz/corpus/$h" regress="fuzz/regressions/$h" work="$B/work/$h"
  mkdir -p "$seeds" "$work"
  local dirs=("$work" "$seeds"); [ -d "$regress" ] && dirs+=("$regress")
  local dict=(); [ -f "fuzz/dict/$h.dict" ] && dict=(-dict="fuzz/dict/$h.dict")
  local log="$B/artifacts/$h.log" cpu_file="$B/artifacts/$h.cpu"
  local jobs=(); [ "${KVZAP_FUZZ_JOBS:-1}" -gt 1 ] && jobs=(-jobs="$KVZAP_FUZZ_JOBS" -workers="$KVZAP_FUZZ_JOBS")
  echo "== fuzz_$h for ${SECONDS_PER}s"
  local rc=0
  # CPU seconds (user + system, the harness and its workers) next to the wall-clock limit: the CPU
  # time is what the 1 CPU-hour per harness of docs/RELIABILITY.md counts.
  { TIMEFORMAT='%U %S'; time "$bin" "${dict[@]}" -max_total_time="$SECONDS_PER" -timeout=5 -rss_limit_mb=2560 \
      -malloc_limit_mb=1024 -max_len=65536 "${jobs[@]}" -print_final_stats=1 \
      -artifact_prefix="$B/artifacts/$h-" "${dirs[@]}" >"$log" 2>&1; } 2>"$cpu_file" || rc=$?
  local cpu; cpu="$(awk 'NF == 2 {printf "%.0f", $1 + $2}' "$cpu_file")"
  if [ "${#jobs[@]}" -gt 0 ]; then cat fuzz-*.log >>"$log" 2>/dev/null || true; rm -f fuzz-*.log; fi
  # libFuzzer leaves through _exit, so the harness's scratch folder (fuzz/fuzz_common.h) stays: remove it.
  local d
  for d in /dev/shm/kvzap_fuzz_* "${TMPDIR:-/tmp}"/kvzap_fuzz_*; do
    if [ -e "$d" ] && ! kill -0 "${d##*_}" 2>/dev/null; then rm -rf "$d"; fi
  done
  local execs eps
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | awk '{s += $2} END {print s + 0}' || true)"
  eps="$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | awk '{s += $2} END {print s + 0}' || true)"
  if [ "${KVZAP_FUZZ_MERGE:-0}" = 1 ] && [ "$rc" = 0 ]; then
    local merged="$B/work/$h.merged"; rm -rf "$merged"; mkdir -p "$merged"
    # set_cover_merge keeps the same coverage features as merge=1 in far fewer bytes (greedy set cover:
    # 2,209 request inputs, 2.0 MB, became 973, 1.1 MB), which keeps the committed corpus small.
    "$bin" -set_cover_merge=1 -timeout=5 -rss_limit_mb=2560 -malloc_limit_mb=1024 -max_len=65536 "$merged" "$seeds" "$work" \
      >>"$log" 2>&1
    rm -rf "$seeds"; mv "$merged" "$seeds"
  fi
  local files bytes result=ok
  files="$(find "$seeds" "$work" -type f | wc -l)"
  bytes="$(du -scb "$seeds" "$work" | tail -1 | cut -f1)"
  if [ "$rc" -ne 0 ]; then
    result="FAILED (exit $rc)"
    grep -E 'ERROR|SUMMARY|Test unit written|deadly|timeout|leak|out-of-memory' "$log" | head -20 || true
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$h" "$SECONDS_PER" "$cpu" "$execs" "$eps" "$files" "$bytes" "$result" >>"$summary"
  if [ -n "${KVZAP_FUZZ_LEDGER:-}" ]; then
    local verdict=clean; [ "$rc" -ne 0 ] && verdict="finding: $result"
    # One short line per write with O_APPEND: harnesses running in parallel do not tear each other's rows.
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%F)" "$ledger_at" "$ledger_command" "$h" \
      "$SECONDS_PER" "$cpu" "$cpu" "" "$execs" "$verdict" >>"$KVZAP_FUZZ_LEDGER"
  fi
  echo "   fuzz_$h: $execs execs ($eps/s, ${cpu} CPU s), result: $result (log: $log)"
  [ "$rc" -eq 0 ]
}

# KVZAP_FUZZ_PARALLEL=N runs N harnesses at a time (each on one core), so CI's 2 cores fuzz every
# harness for SECONDS in half the wall-clock time.
failed=0
pids=()
for h in "${harnesses[@]}"; do
  if [ "$parallel" -le 1 ]; then
    fuzz_one "$h" || failed=$((failed + 1))
    continue
  fi
  fuzz_one "$h" &
  pids+=("$!")
  if [ "${#pids[@]}" -ge "$parallel" ]; then
    wait "${pids[0]}" || failed=$((failed + 1))
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
column -t -s $'\t' "$summary" 2>/dev/null || cat "$summary"
[ -n "${KVZAP_FUZZ_LEDGER:-}" ] && bash scripts/fuzz_totals.sh "$KVZAP_FUZZ_LEDGER"
if [ "$failed" -ne 0 ]; then echo "$failed harness(es) failed"; exit 1; fi
echo "all harnesses clean"
